"""The asyncio TCP server of remoting frames (broker, name server and controller ports).

Without TLS (``tls`` None or ``tls.server.mode=disabled``) the loop's own server accepts.
With TLS the server accepts by itself and looks at each connection's first byte before
serving it (:func:`rmqha.security.tls.accept_connection`): PERMISSIVE serves a TLS
handshake over TLS and anything else as plaintext, ENFORCING closes plaintext.  Each TLS
connection gets the context as it is at its handshake, so renewed certificate files serve
the next connection without a restart.

Every connection holds a place in its peer host's count (:mod:`rmqha.net.peer_limit`)
from the accept (with TLS, before the handshake) to its close; one past
``max_connections_per_peer`` is closed at once.

With ``channels`` (a :class:`~rmqha.security.channel_auth.ChannelKey`) a connection that
opens with the channel preface is authenticated by the cluster secret and MACs every frame
(:mod:`rmqha.net.channel`; ``conn.channel_peer`` names the peer); others are served plain.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Mapping

from rmqha.errors import AuthenticationError
from rmqha.net.channel import accepting_layer
from rmqha.net.connection import DEFAULT_FRAME_READ_TIMEOUT_S, Connection
from rmqha.net.dispatcher import Dispatcher, Handler, ImmediateHandler
from rmqha.net.peer_limit import DEFAULT_MAX_PER_PEER, PeerLimit, Slot, host_of
from rmqha.protocol.command import DEFAULT_MAX_FRAME_BYTES
from rmqha.security.channel_auth import ChannelKey
from rmqha.security.tls import ReloadingContext, TlsMode, TlsSettings, accept_connection

log = logging.getLogger(__name__)

#: A new connection must open (and finish its TLS handshake) within this many seconds,
#: and send its first bytes within as long after that (a silent peer is dropped).
HANDSHAKE_TIMEOUT_S = 10.0



class RemotingServer:
    """An asyncio TCP server of remoting frames.

    ``handler`` is either one callable ``handler(cmd, conn) -> awaitable response|None``
    used for every code not registered with :meth:`register`, or a mapping code ->
    handler; without a handler for a code the answer is REQUEST_CODE_NOT_SUPPORTED.
    ``conn`` (a :class:`Connection`) can also send requests and one-ways back to the peer;
    over TLS, ``conn.peer_identity`` names the peer by its certificate.
    ``tls``: the port's TLS settings (``tls.server.*``); their files are checked here, so
    a missing certificate fails the constructor with a ConfigError naming its key.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        handler: Handler | Mapping[int, Handler] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        frame_read_timeout: float | None = DEFAULT_FRAME_READ_TIMEOUT_S,
        tls: TlsSettings | None = None,
        channels: ChannelKey | None = None,
        max_connections_per_peer: int = DEFAULT_MAX_PER_PEER,
    ) -> None:
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.frame_read_timeout = frame_read_timeout
        self.dispatcher = Dispatcher(handler)
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._connect_callbacks: list[Callable[[Connection], None]] = []
        self.tls_mode = tls.server_mode if tls is not None else TlsMode.DISABLED
        #: The port's TLS context, rebuilt when its files change (None: plaintext only).
        self.tls_context = (ReloadingContext.server(tls)
                            if tls is not None and tls.serves_tls else None)
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._channel_layer = accepting_layer(channels) if channels is not None else None
        self.peer_limit = PeerLimit(f"remoting port {host}:{port}", max_connections_per_peer)

    def register(self, code: int, handler: Handler) -> None:
        self.dispatcher.register(code, handler)

    def register_immediate(self, code: int, handler: ImmediateHandler) -> None:
        self.dispatcher.register_immediate(code, handler)

    def on_connect(self, cb: Callable[[Connection], None]) -> None:
        self._connect_callbacks.append(cb)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _connection(self, slot: Slot | None = None) -> Connection:
        conn = Connection(self.dispatcher, self.max_frame_bytes, frame_read_timeout=self.frame_read_timeout,
                          on_made=lambda made: self._accept(made, slot))
        if self._channel_layer is not None:
            conn.use_layer(self._channel_layer(conn))
        return conn

    async def start(self) -> None:
        if self.tls_context is None:
            self._server = await asyncio.get_running_loop().create_server(
                self._connection, self.host, self.port)
            sock = self._server.sockets[0]
        else:
            sock = self._listener = _listen(self.host, self.port)
            self._accepting = asyncio.get_running_loop().create_task(
                self._accept_loop(sock), name=f"accept-{self.host}:{sock.getsockname()[1]}")
        self.port = sock.getsockname()[1]
        self.peer_limit.where = f"remoting port {self.address}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._stop_accepting()
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

    def _accept(self, conn: Connection, slot: Slot | None) -> None:
        if slot is None:  # accepted by the loop's server: counted now
            slot = self.peer_limit.admit(host_of(conn.peer))
            if slot is None:
                conn.drop(f"more than {self.peer_limit.max_per_peer} connections from {host_of(conn.peer)}")
                return
        conn.add_close_callback(slot.release)
        asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, _drop_if_silent, conn, self.address)
        self.connections.add(conn)
        conn.add_close_callback(self.connections.discard)
        for cb in self._connect_callbacks:
            cb(conn)

    # --- accepting by the first byte (TLS on) --------------------------------------------

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: the listener itself is fine
                log.warning("accept on %s failed: %s", self.address, exc)
                await asyncio.sleep(0.1)
                continue
            slot = self.peer_limit.admit(_peer_host(sock))
            if slot is None:
                sock.close()
                continue
            task = loop.create_task(self._serve_accepted(sock, slot))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _serve_accepted(self, sock: socket.socket, slot: Slot) -> None:
        """Serve one accepted socket; its slot passes to the connection once made (which
        releases it at its close) and is released here if none is."""
        peer = _peer_text(sock)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await accept_connection(sock, lambda: self._connection(slot), self.tls_mode, self.tls_context,
                                    timeout=HANDSHAKE_TIMEOUT_S)
        except AuthenticationError as exc:
            slot.release()
            log.info("%s: closed connection from %s: %s", self.address, peer, exc)
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
            slot.release()
            log.info("%s: TLS handshake with %s failed: %s", self.address, peer,
                     exc or type(exc).__name__)
        except asyncio.CancelledError:
            slot.release()
            raise

    async def _stop_accepting(self) -> None:
        tasks = [t for t in (self._accepting, *self._handshakes) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _drop_if_silent(conn: Connection, where: str) -> None:
    """Close ``conn`` if its peer has not sent a byte since it was accepted."""
    if not conn.heard and not conn.closed:
        log.info("%s: closed connection from %s: nothing received within %.0f s", where, conn.peer,
                 HANDSHAKE_TIMEOUT_S)
        conn.drop(f"nothing received within {HANDSHAKE_TIMEOUT_S:.0f} s")


def _listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket on ``host:port`` (an IPv6 literal listens on v6)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=100)
    sock.setblocking(False)
    return sock


def _peer_host(sock: socket.socket) -> str:
    try:
        return host_of(sock.getpeername())
    except OSError:
        return "?"


def _peer_text(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
