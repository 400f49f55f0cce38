"""Mutual TLS under the controllers' Raft links (pysyncobj): who may be at the other end
(:class:`RaftTls`), the TLS layer under pysyncobj's connections (:class:`TlsSocket`) and
the transport that puts it there (:func:`tls_transport`).

When a controller serves TLS (``tls.server.mode`` not ``disabled``), every Raft link is
mutual TLS with the controller's own certificate pair and CA, both ways verified
(:meth:`rmqha.security.tls.TlsSettings.for_internal_link`), whatever the RPC port's mode:

- a dialled peer's certificate must name the controller whose Raft address was dialled
  (``rmqha:controller/<id>``, the id the controller config gives that address);
- an accepted peer's certificate must name a controller of this group, and the node
  address pysyncobj's first message then claims must be that controller's own (a
  controller may only speak as itself).  Read-only nodes and pysyncobj's utility
  commands are refused on a TLS link.

A refused link logs one warning naming the peer address and why, and is dropped before
pysyncobj reads a byte of it: pysyncobj reads only what :class:`TlsSocket` decrypted, and
it decrypts nothing before the handshake and the identity check passed, so nothing from
the network is unpickled before that.  pysyncobj's password, when set too, still runs
inside the TLS (its key exchange, then every frame authenticated).

pysyncobj drives non-blocking sockets from its poller thread through ``TcpConnection``,
which calls only ``send``, ``recv``, ``getsockopt``, ``setsockopt``, ``fileno`` and
``close`` on its socket.  :class:`TlsSocket` answers those calls with an ``ssl.SSLObject``
over two ``ssl.MemoryBIO`` (every system call on the raw socket), keeping the meaning a
plain socket's answers have for pysyncobj:

- ``recv`` hands out plaintext already decrypted first (the poller will not wake for it),
  then reads the socket until a record is complete or it is empty; BlockingIOError(EAGAIN)
  when there is nothing, b"" at the end of the stream.  pysyncobj calls it until EAGAIN.
- ``send``: pysyncobj keeps its own write buffer, always hands over *all* of it, and asks
  the poller for WRITE events only while that buffer is not empty.  So the buffer must
  stay non-empty exactly while bytes have not reached the kernel.  Plaintext is encrypted
  (up to :data:`_SEAL_BUDGET` a call) and pushed to the socket; ciphertext the socket does
  not take waits in a backlog, and then ``send`` reports one byte *fewer* than it took.
  That byte is *owed*: the next call's data starts with it; that call first flushes the
  backlog (reporting 0 while it cannot, as a full socket would), then counts the owed
  byte as sent and skips it.  pysyncobj's buffer thus keeps one byte while the backlog
  waits, just as it keeps the bytes a plain socket refused.
- during the handshake ``send`` takes everything into a plaintext buffer and reports it
  all taken: pysyncobj's buffer empties and its poller does not spin on WRITE while the
  peer's reply is on its way.  When the handshake completes (in ``recv``) that plaintext
  is encrypted and flushed; what the socket does not take then leaves on the next
  ``recv`` or ``send`` (a leader sends at least every heartbeat), as pysyncobj's own
  buffer waits for its next send after a plain socket's EAGAIN.
"""
from __future__ import annotations

import errno
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from rmqha.errors import AuthenticationError, ConfigError, PeerIdentityError
from rmqha.net.memory_tls import drain
from rmqha.protocol.request_auth import RefusalLog
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import ReloadingContext, TlsSettings, require_peer

log = logging.getLogger(__name__)

#: pysyncobj 0.3.17's name for a TcpConnection's socket (rmqha.controller.raft's version
#: guard covers it).
_SOCKET_ATTR = "_TcpConnection__socket"
#: Ciphertext taken from the socket per read.
_CIPHER_READ = 64 << 10
#: Plaintext one send call encrypts at most (the rest stays in pysyncobj's buffer).
_SEAL_BUDGET = 256 << 10

PeerCheck = Callable[[ssl.SSLObject], Identity]
_T = TypeVar("_T")
_R = TypeVar("_R")


class TlsSocket:
    """The socket calls pysyncobj's ``TcpConnection`` makes, over TLS (see the module
    docstring): plaintext in and out, ciphertext on :attr:`sock`.  ``check`` decides on
    the verified peer when the handshake completes (AuthenticationError to refuse)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 peer_address: str, check: PeerCheck, refusals: RefusalLog | None = None) -> None:
        self.sock = sock
        self._refusals = refusals or RefusalLog(log)
        self.peer_address = peer_address
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._server_side = server_side
        self._check = check
        #: The identity the peer's certificate names, once the handshake and check passed.
        self.peer: Identity | None = None
        self._established = False
        self._pending = bytearray()  # plaintext taken during the handshake
        self._backlog = bytearray()  # ciphertext the socket has not taken yet
        self._owed = False  # the next send's first byte was taken but not reported
        self._eof = False
        self._refusal: str | None = None

    # --- the socket calls pysyncobj makes -----------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    def getsockopt(self, *args: Any) -> Any:
        return self.sock.getsockopt(*args)

    def setsockopt(self, *args: Any) -> None:
        self.sock.setsockopt(*args)

    def close(self) -> None:
        self.sock.close()

    def recv(self, bufsize: int) -> bytes:
        """Plaintext (at most ``bufsize``), b"" at the end of the stream; BlockingIOError
        when none is ready, ConnectionResetError when the link is refused or TLS fails."""
        self._raise_if_refused()
        if self._backlog or self._outgoing.pending:
            self._flush()  # a read is as good a moment as a send to move the backlog on
        return self._guarded(self._recv, bufsize)

    def send(self, data: bytes) -> int:
        """How many bytes of ``data`` (pysyncobj's whole buffer) count as sent; see the
        module docstring for the handshake and the owed byte."""
        self._raise_if_refused()
        if not self._established:
            return self._guarded(self._send_early, data)
        return self._guarded(self._send_sealed, memoryview(data))

    # --- receive ------------------------------------------------------------------------------

    def _recv(self, bufsize: int) -> bytes:
        while True:
            if self._established or self._handshake():
                plain = self._plain(bufsize)
                if plain or self._eof:
                    return plain
            if not self._take_cipher():
                raise BlockingIOError(errno.EAGAIN, "no complete TLS record yet")

    def _take_cipher(self) -> bool:
        """Move what the socket holds into the incoming BIO; False when it held nothing."""
        if self._eof:
            return False
        try:
            data = self.sock.recv(_CIPHER_READ)
        except (BlockingIOError, InterruptedError):
            return False
        if data:
            self._incoming.write(data)
        else:
            self._eof = True
            self._incoming.write_eof()
        return True

    def _plain(self, bufsize: int) -> bytes:
        """Plaintext the BIO's whole records hold (b"" when none)."""
        while self._incoming.pending or self._tls.pending():
            left = self._incoming.pending
            try:
                data = self._tls.read(bufsize)
            except ssl.SSLWantReadError:
                if self._incoming.pending == left:
                    return b""  # part of a record: the rest is still on its way
                continue  # a record without data (a session ticket) was consumed
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                data = b""
            if not data:
                self._eof = True
            return data
        return b""

    def _handshake(self) -> bool:
        """Advance the handshake; True once it is done and the peer passed the check."""
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return False
        self._established = True
        self.peer = self._check(self._tls)
        if self._pending:
            self._tls.write(self._pending)
            self._pending.clear()
        self._flush()
        return True

    # --- send ---------------------------------------------------------------------------------

    def _send_early(self, data: bytes) -> int:
        self._pending += data
        self._handshake()  # the dialler's first call writes its ClientHello
        return len(data)

    def _send_sealed(self, view: memoryview) -> int:
        if self._backlog and not self._flush():
            return 0  # the owed byte, if any, stays owed
        taken = 0
        if self._owed:
            self._owed = False
            taken, view = 1, view[1:]
        if not view:
            return taken
        chunk = view[:_SEAL_BUDGET]
        self._tls.write(chunk)
        if self._flush():
            return taken + len(chunk)
        self._owed = True
        return taken + len(chunk) - 1

    def _flush(self) -> bool:
        """Hand what TLS wrote and the backlog to the socket; True when all went."""
        if self._outgoing.pending:
            self._backlog += self._outgoing.read()
        return drain(self.sock, self._backlog)

    @property
    def backlog(self) -> int:
        """Ciphertext bytes waiting for room in the socket."""
        return len(self._backlog)

    # --- refusal ------------------------------------------------------------------------------

    def _guarded(self, call: Callable[[_T], _R], arg: _T) -> _R:
        """``call(arg)``, a TLS failure or a refused peer turned into the refusal."""
        try:
            return call(arg)
        except ssl.SSLEOFError:
            # A peer stopping, or refusing us (it logs why): no warning here.
            raise self._refuse("the peer closed the link during the TLS handshake", "closed",
                               logging.INFO) from None
        except ssl.SSLError as exc:
            raise self._refuse(f"TLS failed: {exc}", "TLS failed") from None
        except AuthenticationError as exc:
            raise self._refuse(str(exc), "identity") from None

    def _refuse(self, why: str, kind: str = "", level: int = logging.WARNING) -> ConnectionResetError:
        """Log the refusal once for this link (and at most once per kind and period for the
        controller); the error that makes pysyncobj drop the link."""
        if self._refusal is None:
            self._refusal = why
            side = "from" if self._server_side else "to"
            self._refusals.warn((side, kind, why), "Raft link %s %s refused: %s", side, self.peer_address, why,
                                level=level)
        return ConnectionResetError(errno.ECONNRESET, f"Raft TLS link refused: {self._refusal}")

    def _raise_if_refused(self) -> None:
        if self._refusal is not None:
            raise self._refuse(self._refusal)


@dataclass(frozen=True)
class RaftTls:
    """This controller's Raft TLS: the contexts of its Raft port and of its dials (rebuilt
    when the files change), and the controller id of each member's Raft address."""

    server: ReloadingContext
    client: ReloadingContext
    ids: dict[str, str] = field(default_factory=dict)
    #: Refused links of this controller, logged at most once per kind per period.
    refusals: RefusalLog = field(default_factory=lambda: RefusalLog(log), compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: TlsSettings, ids: dict[str, str]) -> RaftTls | None:
        """TLS on the Raft links when the controller serves TLS at all (any mode but
        disabled); None otherwise.  ConfigError naming the key when the CA is not set or
        a file cannot be loaded."""
        if not settings.serves_tls:
            return None
        if not settings.server_trust_cert_path:
            raise ConfigError("tls.server.trustCertPath is not set: a controller serving TLS runs "
                              "its Raft links over mutual TLS and needs the cluster CA")
        link = settings.for_internal_link()
        return cls(ReloadingContext.server(link), ReloadingContext.client(link), dict(ids))

    def dial(self, sock: socket.socket, address: str) -> TlsSocket:
        """The TLS side of a socket dialled to the member at Raft ``address``."""
        return TlsSocket(sock, self.client.get(), server_side=False, peer_address=address,
                         check=lambda tls: self.check_dialled(tls, address), refusals=self.refusals)

    def accept(self, sock: socket.socket) -> TlsSocket:
        """The TLS side of an accepted socket."""
        return TlsSocket(sock, self.server.get(), server_side=True,
                         peer_address=_peer_name(sock), check=self.check_accepted, refusals=self.refusals)

    def check_dialled(self, tls: ssl.SSLObject, address: str) -> Identity:
        """The dialled peer's identity if it is the controller ``address`` belongs to."""
        member = self.ids.get(address)
        if member is None:
            raise PeerIdentityError(f"{address} is not a Raft address of this group")
        return require_peer(tls, roles=(Role.CONTROLLER,), expected=Identity.controller(member))

    def check_accepted(self, tls: ssl.SSLObject) -> Identity:
        """The accepted peer's identity if it names a controller of this group."""
        peer = require_peer(tls, roles=(Role.CONTROLLER,))
        if peer.name not in self.ids.values():
            members = ", ".join(sorted(set(self.ids.values())))
            raise PeerIdentityError(f"peer is {peer}, not a controller of this group ({members})")
        return peer

    def claim_refusal(self, peer: Identity | None, claim: object) -> str | None:
        """Why an accepted peer may not speak as the node ``claim`` (pysyncobj's first
        message on a link), or None when ``claim`` is the peer's own Raft address."""
        if peer is None:
            return "no verified certificate"
        if not isinstance(claim, str) or claim not in self.ids:
            return f"{peer} opened with {_short(claim)}, not the Raft address of a member"
        if self.ids[claim] != peer.name:
            return (f"{peer} claims Raft address {claim}, which is "
                    f"rmqha:controller/{self.ids[claim]}'s")
        return None


class TlsTransport(TCPTransport):
    """pysyncobj's TCP transport with every connection's socket under a :class:`TlsSocket`
    (mixed into the transport class a node uses, see :func:`tls_transport`)."""

    raft_tls: RaftTls

    def _connectIfNecessarySingle(self, node: Any) -> bool:  # noqa: N802 (pysyncobj's name)
        result = bool(super()._connectIfNecessarySingle(node))
        conn = self._connections.get(node)
        if conn is not None and conn.state == CONNECTION_STATE.CONNECTING:
            raw = getattr(conn, _SOCKET_ATTR)
            if isinstance(raw, socket.socket):  # dialled just now: no event has run yet
                setattr(conn, _SOCKET_ATTR, self.raft_tls.dial(raw, node.address))
        return result

    def _onNewIncomingConnection(self, conn: Any) -> None:  # noqa: N802
        setattr(conn, _SOCKET_ATTR, self.raft_tls.accept(getattr(conn, _SOCKET_ATTR)))
        super()._onNewIncomingConnection(conn)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:  # noqa: N802
        key_exchange = self._syncObj.encryptor and not conn.sendRandKey
        if not key_exchange:
            sock = getattr(conn, _SOCKET_ATTR, None)
            peer = sock.peer if isinstance(sock, TlsSocket) else None
            why = self.raft_tls.claim_refusal(peer, message)
            if why is not None:
                where = sock.peer_address if isinstance(sock, TlsSocket) else "?"
                self.raft_tls.refusals.warn(("claim", why), "Raft link from %s refused: %s", where, why)
                conn.disconnect()
                self._unknownConnections.discard(conn)
                return
        super()._onIncomingMessageReceived(conn, message)


def tls_transport(base: type[TCPTransport], tls: RaftTls) -> type[TCPTransport]:
    """``base`` (pysyncobj's transport or a subclass) with its links under ``tls``."""
    return type(f"Tls{base.__name__}", (TlsTransport, base), {"raft_tls": tls})


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "an unknown address"
    return f"{host}:{port}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
