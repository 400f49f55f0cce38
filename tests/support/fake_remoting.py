"""A scripted remoting server on plain sockets, for client tests that need a peer which
misbehaves on purpose (stray frames, no answer, malformed or over-long frames).

Each accepted connection runs ``serve(conn)`` on its own daemon thread; ``conn`` reads
whole commands with a deadline and writes raw bytes, so a script can answer, stay silent
or send anything at all::

    def serve(conn: FakeConn) -> None:
        while (cmd := conn.read()) is not None:
            conn.write(encode(cmd.response(ResponseCode.SUCCESS)))

    with FakeServer(serve) as server:
        ...  # connect to server.address
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from rmqha.errors import ProtocolError
from rmqha.protocol.command import FrameDecoder, RemotingCommand


class FakeConn:
    """One accepted connection of a :class:`FakeServer`."""

    def __init__(self, sock: socket.socket, server: FakeServer) -> None:
        self.sock = sock
        self.server = server
        self._decoder = FrameDecoder()
        self._ready: list[RemotingCommand] = []

    def read(self, timeout: float = 20.0) -> RemotingCommand | None:
        """The next command from the client; None when it closed the connection (or the
        server is closing).  Fails the script (TimeoutError) after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the client sent nothing in time")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except (ConnectionError, OSError):
                return None
            if not data:
                return None
            self._ready += self._decoder.feed(data)
        cmd = self._ready.pop(0)
        self.server.record(cmd)
        return cmd

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)


class FakeServer:
    """Listens on a free 127.0.0.1 port until closed; counts connections and records
    every command read."""

    def __init__(self, serve: Callable[[FakeConn], None]) -> None:
        self._serve = serve
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self.connections = 0
        self.commands: list[RemotingCommand] = []
        self.errors: list[BaseException] = []
        self._socks: list[socket.socket] = []
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="fake-remoting", daemon=True)
        self._thread.start()

    def record(self, cmd: RemotingCommand) -> None:
        with self._lock:
            self.commands.append(cmd)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self.connections += 1
                self._socks.append(sock)
            threading.Thread(target=self._run, args=(FakeConn(sock, self),), daemon=True).start()

    def _run(self, conn: FakeConn) -> None:
        try:
            self._serve(conn)
        except (OSError, ProtocolError) as exc:
            if not self._closed:
                self.errors.append(exc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        # shutdown() wakes a thread blocked in accept() or recv(); close() alone does not.
        for s in [self._listener, *socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected (any more)
            s.close()
        self._thread.join(10)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
