"""The HA master's port (:class:`Acceptor`): accept, handshake, then serve the link.

Every accepted connection holds a place in its peer host's count
(:mod:`rmqha.net.peer_limit`) until its task ends; one past ``max_connections_per_peer``
is closed at accept.  Every accepted connection goes, in one task, through: the :class:`rmqha.ha.link.Link`
around the socket (with TLS, :class:`rmqha.ha.tls_link.HATls`: a TLS link, its handshake
and the slave's certificate, which must name a broker of this cluster and group; a
plaintext connection is refused, whatever the client port's mode); the admission
(:func:`rmqha.ha.auth.admit`: with a cluster secret the link authenticates first; a
refused link, at either step, is logged in one line naming the peer and why, and closed
before it touches anything); the handshake's hello
(:meth:`rmqha.ha.handshake.MasterHandshake.introduce`);
the claim of the slave's id (:meth:`rmqha.ha.sync_service.SyncService.admit`); the rest of
the handshake and the transfer's start; then the slave's acks until the link ends, when
the connection is dropped with the reason it ended (logged at WARNING for bad frames and
I/O errors and frames failing their MAC, at INFO for closes and silence).
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from rmqha.errors import AuthenticationError, ProtocolError, ReplicationError, StoreError
from rmqha.ha.auth import HAAuth, Proof, admit
from rmqha.ha.connection import SlaveConnection
from rmqha.ha.handshake import MasterHandshake
from rmqha.ha.link import Link, LinkClosed, LinkTimeout, tune_socket
from rmqha.ha.sync_service import SyncService
from rmqha.ha.tls_link import HATls
from rmqha.net.peer_limit import DEFAULT_MAX_PER_PEER, PeerLimit
from rmqha.protocol.request_auth import RefusalLog
from rmqha.security.tls import TlsMode, accepted_kind

# The master side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.master")


class Acceptor:
    """Listens on the HA port and runs one task per connection."""

    def __init__(self, handshake: MasterHandshake, service: SyncService, auth: HAAuth | None = None,
                 tls: HATls | None = None, *, max_connections_per_peer: int = DEFAULT_MAX_PER_PEER) -> None:
        self._handshake = handshake
        #: Refused links, logged at most once per kind per period (a scan or a flood of
        #: bad dials must not flood the log).
        self._refusals = RefusalLog(log)
        self._service = service
        self._auth = auth
        self._tls = tls
        self._server: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.peer_limit = PeerLimit("HA port", max_connections_per_peer)

    @property
    def refused(self) -> int:
        """Links refused so far (logged or only counted), before or at the slave's hello."""
        return self._refusals.refused + self._handshake.refusals.refused

    def listen(self, host: str, port: int) -> int:
        """Bind and start accepting; returns the bound port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._server = sock
        self.peer_limit.where = f"HA port {host}:{sock.getsockname()[1]}"
        self._accept_task = asyncio.ensure_future(self._accept_loop(sock))
        return int(sock.getsockname()[1])

    def close(self) -> list[asyncio.Task[Any]]:
        """Close the port; returns the tasks to cancel and await (accept and serve)."""
        self._closed = True
        if self._server is not None:
            self._server.close()
        tasks: list[asyncio.Task[Any]] = list(self._tasks)
        if self._accept_task is not None:
            tasks.append(self._accept_task)
        return tasks

    async def _accept_loop(self, server: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                conn, _ = await loop.sock_accept(server)
            except OSError as exc:
                if self._closed:
                    return
                log.warning("HA accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            slot = self.peer_limit.admit(_peer_of(conn).rpartition(":")[0])
            if slot is None:
                conn.close()
                continue
            tune_socket(conn)
            task = asyncio.ensure_future(self.serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(slot.release)

    async def serve(self, sock: socket.socket) -> None:
        """One connection, from accept to its end."""
        link = Link(sock) if self._tls is None else await self._open_tls(sock)
        if link is None:
            return
        admitted = await self._admit(link)
        if admitted is None:
            return
        proof, head = admitted
        held: list[SlaveConnection] = []  # the link's state once the slave introduced itself
        reason = ""
        try:
            await self._run(link, held, proof, head)
        except LinkClosed as exc:
            reason = str(exc)
        except LinkTimeout as exc:
            reason = f"housekeeping: {exc}"
        except (ProtocolError, ReplicationError) as exc:
            reason = f"bad frame: {exc}"
            log.warning("closing HA link %s: %s", link.peer, reason)
        except AuthenticationError as exc:
            reason = f"frame failed authentication: {exc}"
            log.warning("closing HA link %s: %s", link.peer, reason)
        except (OSError, StoreError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("closing HA link %s: %s", link.peer, reason)
        finally:
            link.close()
            for conn in held:
                self._service.drop(conn, conn.close_reason or reason)

    async def _open_tls(self, sock: socket.socket) -> Link | None:
        """The TLS link of an accepted socket, or None when it is refused (logged in one
        line naming the peer and why, closed before a byte of the HA protocol)."""
        assert self._tls is not None
        peer = _peer_of(sock)
        timeout = self._handshake.timeout
        try:
            await accepted_kind(sock, TlsMode.ENFORCING, timeout)
        except (AuthenticationError, OSError, asyncio.TimeoutError) as exc:
            kind, why = "not TLS", f"{exc} (the HA port is internal: TLS only, whatever tls.server.mode)"
        else:
            try:
                return await self._tls.accept(sock, timeout)
            except AuthenticationError as exc:
                kind, why = "TLS identity", str(exc)
            except ssl.SSLError as exc:
                kind, why = "TLS failed", f"TLS handshake failed: {exc}"
            except (LinkClosed, LinkTimeout, OSError) as exc:
                kind, why = "TLS cut", f"{type(exc).__name__} during the TLS handshake: {exc}"
        sock.close()
        self._refusals.warn((kind, why), "refusing HA link from %s: %s", peer, why)
        return None

    async def _admit(self, link: Link) -> tuple[Proof | None, bytes] | None:
        """The link's proof and the hello bytes read, or None when the link is refused
        (logged and closed: it never reaches the link table)."""
        try:
            return await admit(link, self._auth, self._handshake.timeout)
        except AuthenticationError as exc:
            kind, why = "authentication", f"authentication failed: {exc}"
        except ProtocolError as exc:
            kind, why = "first bytes", f"bad first bytes: {exc}"
        except (LinkClosed, LinkTimeout, OSError) as exc:
            kind, why = type(exc).__name__, f"{type(exc).__name__} before it was admitted: {exc}"
        except asyncio.CancelledError:
            link.close()
            raise
        # A connection that closes without a byte is a port probe, not an attack.
        level = logging.WARNING if link.bytes_in else logging.INFO
        self._refusals.warn((kind, level, why), "refusing HA link from %s: %s", link.peer, why, level=level)
        link.close()
        return None

    async def _run(self, link: Link, held: list[SlaveConnection], proof: Proof | None, head: bytes) -> None:
        handshake = self._handshake
        service = self._service
        intro = await handshake.introduce(link, head, proof)
        if intro is None:
            return
        conn = service.admit(link, intro)
        held.append(conn)
        offset = await handshake.agree(link, intro)
        if not service.links.holds(conn):
            raise LinkClosed("replaced by a newer link from the same broker id during the handshake")
        service.start_transfer(conn, offset, handshake.transfer_start(intro.hello, offset), intro.pending)
        await conn.read_acks(service.on_ack)


def _peer_of(sock: socket.socket) -> str:
    try:
        return "%s:%d" % sock.getpeername()[:2]
    except OSError:
        return "?"
