"""The asyncio client of one remoting address: one reused connection, reconnected on demand."""
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Mapping

from rmqha.errors import RemotingError, RemotingTimeoutError, ServerIdentityError
from rmqha.net.channel import dial
from rmqha.net.client_security import ClientSecurity, ServerRole, current
from rmqha.net.connection import Connection
from rmqha.net.dispatcher import Dispatcher, Handler
from rmqha.protocol.command import DEFAULT_MAX_FRAME_BYTES, RemotingCommand


def split_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RemotingError(f"bad address {addr!r}; expected host:port")
    return host, int(port)


class RemotingClient:
    """Client of one address: one reused connection, reconnected on demand.

    ``handler`` (optional) answers requests the server sends over this connection.
    ``security`` (optional, :class:`~rmqha.net.client_security.ClientSecurity`): TLS for
    new connections, an authenticated channel (its handshake done before the connection
    is used; a connection whose handshake fails is closed and the call raises
    RemotingError), and a hook that sees (and signs) every request before it is sent.
    ``expect``: what the server is dialled as; when ``security.checks_roles``, a TLS
    server whose certificate does not name it is dropped before anything is written
    (ServerIdentityError).  May be set later (a route names a broker's group): it holds
    from the next connection on.
    """

    def __init__(
        self,
        addr: str,
        *,
        connect_timeout: float = 3.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        handler: Handler | Mapping[int, Handler] | None = None,
        security: ClientSecurity | None = None,
        expect: ServerRole | None = None,
    ) -> None:
        self.addr = addr
        self.security = security
        self.expect = expect
        self._hook = security.rpc_hook if security is not None else None
        self.host, self.port = split_address(addr)
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self._dispatcher = Dispatcher(handler) if handler is not None else None
        self._conn: Connection | None = None
        self._connect_lock: asyncio.Lock | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def connection(self) -> Connection:
        """The live connection, opening a new one if needed."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
            loop = asyncio.get_running_loop()
            context = current(self.security.ssl_context) if self.security is not None else None
            try:
                transport, conn = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: Connection(self._dispatcher, self.max_frame_bytes, name=self.addr),
                        self.host, self.port, ssl=context,
                        ssl_handshake_timeout=self.connect_timeout if context else None),
                    self.connect_timeout,
                )
            except asyncio.TimeoutError:
                raise RemotingTimeoutError(f"connect to {self.addr} timed out") from None
            except ssl.SSLError as exc:
                raise RemotingError(f"TLS handshake with {self.addr} failed: {exc}") from exc
            except OSError as exc:
                raise RemotingError(f"cannot connect to {self.addr}: {exc}") from exc
            # Some loops (uvloop) call connection_made a turn after create_connection
            # returns; the connection must be usable now.
            conn.connection_made(transport)
            if context is not None:
                self._check_server(conn)
            if self.security is not None and self.security.channel is not None:
                await dial(conn, self.security.channel, self.connect_timeout)
            self._conn = conn
            return conn

    def _check_server(self, conn: Connection) -> None:
        """Drop ``conn`` unless its certificate names what the server was dialled as."""
        if self.expect is None or self.security is None or not self.security.checks_roles:
            return
        try:
            self.expect.check(self.addr, conn.peer_identity)
        except ServerIdentityError:
            conn.drop("the server's certificate names another identity")
            raise

    def open_connection(self) -> Connection | None:
        """The connection if it is open, without I/O (:meth:`connection` opens one)."""
        conn = self._conn
        return conn if conn is not None and not conn.closed else None

    async def request(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self.connection()
        if self._hook is not None:
            self._hook(cmd)
        return await conn.request(cmd, timeout)

    def request_frame(self, frame: bytes, opaque: int, timeout: float = 3.0, *,
                      signed: bool = False) -> Awaitable[bytes]:
        """A request encoded already; its response's frame undecoded (see
        :meth:`Connection.request_frame`).  A request hook needs the command: with one,
        send commands (ValueError here) unless the frame is ``signed`` already as the hook
        would sign it (``Credentials.sign_send_frame``).  Connected, this is the
        connection's own awaitable (one coroutine less on every send)."""
        if self._hook is not None and not signed:
            raise ValueError(f"{self.addr}: requests to be signed by a hook go as commands")
        conn = self._conn
        if conn is None or conn.closed:
            return self._connect_and_request_frame(frame, opaque, timeout)
        return conn.request_frame(frame, opaque, timeout)

    async def _connect_and_request_frame(self, frame: bytes, opaque: int, timeout: float) -> bytes:
        conn = await self.connection()
        return await conn.request_frame(frame, opaque, timeout)

    async def oneway(self, cmd: RemotingCommand) -> None:
        conn = await self.connection()
        if self._hook is not None:
            self._hook(cmd)
        await conn.oneway(cmd)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
