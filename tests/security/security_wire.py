"""An attacker's tools for tests/security: a raw remoting client and a heartbeat flooder.

Frames are built with :mod:`rmqha.protocol.command` and sent over a plain socket, never
through rmqha's client classes: what an outside tester on the same network can do.
Signing (for the negative controls, "the same probe with the right secret") uses
:mod:`rmqha.protocol.request_auth` directly.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import FrameDecoder, RemotingCommand, encode
from rmqha.protocol.request_auth import SharedSecretAuth

#: A secret no process of the tests' clusters has.
WRONG_SECRET = "not-the-cluster-secret"


class RawClient:
    """One TCP connection; ``request`` sends a frame and reads until its answer."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._decoder = FrameDecoder()
        self._ready: list[RemotingCommand] = []

    def send(self, cmd: RemotingCommand) -> None:
        self.sock.sendall(encode(cmd))

    def request(self, cmd: RemotingCommand) -> RemotingCommand:
        self.send(cmd)
        while True:
            for i, got in enumerate(self._ready):
                if got.is_response and got.opaque == cmd.opaque:
                    return self._ready.pop(i)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"{cmd.describe()}: the peer closed the connection")
            self._ready += self._decoder.feed(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frame(code: int, ext: Mapping[str, Any] | None = None, body: Any = b"", *,
          secret: str | None = None, timestamp_ms: int | None = None) -> RemotingCommand:
    """A request; signed with ``secret`` when one is given."""
    cmd = RemotingCommand.request(code, ext, body)
    if secret is not None:
        SharedSecretAuth(secret).sign(cmd, timestamp_ms=timestamp_ms)
    return cmd


def ask(address: str, code: int, ext: Mapping[str, Any] | None = None, body: Any = b"", *,
        secret: str | None = None) -> RemotingCommand:
    """One request on a fresh connection."""
    with RawClient(address) as client:
        return client.request(frame(code, ext, body, secret=secret))


class HeartbeatFlood:
    """A thread sending BROKER_HEARTBEAT for one broker every ``period_s`` until stopped,
    keeping every answer (code, ext fields): an attacker keeping a broker "alive"."""

    def __init__(self, controller: str, ext: Mapping[str, Any], *, secret: str | None = None,
                 period_s: float = 0.1) -> None:
        self.controller = controller
        self.ext = dict(ext)
        self.secret = secret
        self.period_s = period_s
        self.answers: list[tuple[int, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-flood", daemon=True)

    def _run(self) -> None:
        with RawClient(self.controller) as client:
            while not self._stop.is_set():
                resp = client.request(frame(RequestCode.BROKER_HEARTBEAT, self.ext, secret=self.secret))
                self.answers.append((resp.code, dict(resp.ext_fields)))
                self._stop.wait(self.period_s)

    def start(self) -> HeartbeatFlood:
        self._thread.start()
        return self

    def wait_answers(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.answers) < n:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError(f"the flood got {len(self.answers)} answers, wanted {n}")
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def codes(self) -> set[int]:
        return {code for code, _ in self.answers}
