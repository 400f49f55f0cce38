"""An attacker's tools for tests/security: a raw remoting client and a heartbeat flooder.

Frames are built with :mod:`rmqha.protocol.command` and sent over a plain socket, never
through rmqha's client classes: what an outside tester on the same network can do.
Signing (for the negative controls, "the same probe with the right secret") uses
:mod:`rmqha.protocol.request_auth` directly; an insider's authenticated channel
(``RawClient(..., channel=secret)``) runs :mod:`rmqha.security.channel_auth`'s sans-I/O
endpoint over the same socket.  :class:`Relay` is a man in the middle: a TCP relay that
may rewrite what the server answers or send a client's bytes twice.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import FrameDecoder, RemotingCommand, decode_frame, encode
from rmqha.protocol.request_auth import SharedSecretAuth
from rmqha.security.channel_auth import ChannelEndpoint, key_from_text
from rmqha.security.identity import Identity

#: Who an insider's raw channel claims to be by default.
RAW_IDENTITY = Identity.admin("raw")
#: A secret no process of the tests' clusters has.
WRONG_SECRET = "not-the-cluster-secret"


class RawClient:
    """One TCP connection; ``request`` sends a frame and reads until its answer."""

    def __init__(self, address: str, timeout: float = 5.0, *, channel: str | None = None,
                 identity: Identity = RAW_IDENTITY, source: str | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self._decoder = FrameDecoder()
        self._ready: list[RemotingCommand] = []
        self._endpoint: ChannelEndpoint | None = None
        if channel is not None:
            self._open_channel(channel, identity)

    def _open_channel(self, secret: str, identity: Identity) -> None:
        endpoint = ChannelEndpoint(key_from_text(secret, identity), dialler=True,
                                   max_frame_bytes=1 << 24)
        self.sock.sendall(endpoint.start())
        while not endpoint.established:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the peer closed the connection during the channel handshake")
            reply, _ = endpoint.feed(data)
            if reply:
                self.sock.sendall(reply)
        self._endpoint = endpoint

    def send(self, cmd: RemotingCommand) -> None:
        data = encode(cmd)
        self.sock.sendall(data if self._endpoint is None else self._endpoint.seal(data))

    def _received(self, data: bytes) -> list[RemotingCommand]:
        if self._endpoint is None:
            return self._decoder.feed(data)
        _, frames = self._endpoint.feed(data)
        return [decode_frame(memoryview(f)[4:]) for f in frames]

    def request(self, cmd: RemotingCommand) -> RemotingCommand:
        self.send(cmd)
        return self._answer(cmd.opaque, cmd.describe())

    def request_bytes(self, data: bytes, opaque: int) -> RemotingCommand:
        """Send a whole frame as it is (plain connections) and read the answer to ``opaque``."""
        self.sock.sendall(data)
        return self._answer(opaque, f"frame of opaque {opaque}")

    def _answer(self, opaque: int, what: str) -> RemotingCommand:
        while True:
            for i, got in enumerate(self._ready):
                if got.is_response and got.opaque == opaque:
                    return self._ready.pop(i)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"{what}: the peer closed the connection")
            self._ready += self._received(data)

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
        secret: str | None = None, channel: str | None = None,
        identity: Identity = RAW_IDENTITY) -> RemotingCommand:
    """One request on a fresh connection (an authenticated channel with ``channel``, on
    which the client claims ``identity``)."""
    with RawClient(address, channel=channel, identity=identity) as client:
        return client.request(frame(code, ext, body, secret=secret))


class Relay:
    """A man in the middle on 127.0.0.1: every connection to :attr:`address` is relayed to
    ``upstream``; ``rewrite`` changes each chunk the server sends, and once
    ``replay_after`` chunks of the server's were relayed on a connection, every chunk of
    the client's is sent twice."""

    def __init__(self, upstream: str, *, rewrite: Callable[[bytes], bytes] = lambda b: b,
                 replay_after: int | None = None) -> None:
        self.upstream = upstream
        self.rewrite = rewrite
        self.replay_after = replay_after
        self.address = ""
        #: Server chunks that ``rewrite`` changed.
        self.rewritten = 0
        self._server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.upstream.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        answered = [0]

        def client_chunk(chunk: bytes, n: int) -> bytes:
            replay = self.replay_after is not None and answered[0] >= self.replay_after
            return chunk * 2 if replay else chunk

        def server_chunk(chunk: bytes, n: int) -> bytes:
            answered[0] += 1
            out = self.rewrite(chunk)
            self.rewritten += out != chunk
            return out

        await asyncio.gather(self._pump(reader, up_writer, client_chunk),
                             self._pump(up_reader, writer, server_chunk), return_exceptions=True)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    change: Callable[[bytes, int], bytes]) -> None:
        n = 0
        try:
            while chunk := await src.read(65536):
                dst.write(change(chunk, n))
                n += 1
                await dst.drain()
        finally:
            dst.close()


class HeartbeatFlood:
    """A thread sending BROKER_HEARTBEAT for one broker every ``period_s`` until stopped,
    keeping every answer (code, ext fields): an attacker keeping a broker "alive"."""

    def __init__(self, controller: str, ext: Mapping[str, Any], *, secret: str | None = None,
                 period_s: float = 0.1, channel: str | None = None) -> None:
        self.controller = controller
        self.ext = dict(ext)
        self.secret = secret
        self.channel = channel
        self.period_s = period_s
        self.answers: list[tuple[int, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-flood", daemon=True)

    def _run(self) -> None:
        with RawClient(self.controller, channel=self.channel) as client:
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


def start_master_and_slave(c: Any, group: str) -> None:
    """One controller, a name server and ``group``'s master (id 1) and slave (id 2, which
    asks the controller for its role only once a minute, so notices are what move it),
    both in the SyncStateSet."""
    c.start_controllers(1)
    c.start_namesrv()
    c.a = c.start_broker(group)
    c.wait_role(c.a, "master")
    c.b = c.start_broker(group, sync_broker_metadata_period_ms=60_000)
    c.wait_role(c.b, "slave")
    c.wait_for(lambda: (i := c.replica_info(group)) is not None and i.sync_state_set == [1, 2],
               30, what="SyncStateSet {1, 2}")
