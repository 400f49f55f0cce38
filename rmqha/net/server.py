"""The asyncio TCP server of remoting frames (broker, name server and controller ports)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from rmqha.net.connection import (
    DEFAULT_FRAME_READ_TIMEOUT_S,
    Connection,
    Dispatcher,
    Handler,
    ImmediateHandler,
)
from rmqha.protocol.command import DEFAULT_MAX_FRAME_BYTES


class RemotingServer:
    """An asyncio TCP server of remoting frames.

    ``handler`` is either one callable ``handler(cmd, conn) -> awaitable response|None``
    used for every code not registered with :meth:`register`, or a mapping code ->
    handler; without a handler for a code the answer is REQUEST_CODE_NOT_SUPPORTED.
    ``conn`` (a :class:`Connection`) can also send requests and one-ways back to the peer.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        handler: Handler | Mapping[int, Handler] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        frame_read_timeout: float | None = DEFAULT_FRAME_READ_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.frame_read_timeout = frame_read_timeout
        self.dispatcher = Dispatcher(handler)
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._connect_callbacks: list[Callable[[Connection], None]] = []

    def register(self, code: int, handler: Handler) -> None:
        self.dispatcher.register(code, handler)

    def register_immediate(self, code: int, handler: ImmediateHandler) -> None:
        self.dispatcher.register_immediate(code, handler)

    def on_connect(self, cb: Callable[[Connection], None]) -> None:
        self._connect_callbacks.append(cb)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self.dispatcher, self.max_frame_bytes,
                               frame_read_timeout=self.frame_read_timeout, on_made=self._accept),
            self.host, self.port)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            await conn.close("server stopping")
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _accept(self, conn: Connection) -> None:
        self.connections.add(conn)
        conn.add_close_callback(self.connections.discard)
        for cb in self._connect_callbacks:
            cb(conn)
