"""Mutual TLS under an HA link (:class:`TlsLink`) and who may be at its other end (:class:`HATls`).

When a broker serves TLS, its HA port and its slave's dial speak TLS with the broker's own
certificate pair and CA, both ways verified (:meth:`rmqha.security.tls.TlsSettings.for_internal_link`),
and the peer's certificate must name a broker of the same cluster and group
(:class:`rmqha.net.peer_check.Need`); a refused peer is closed before a byte of the HA
protocol moves.

:class:`rmqha.ha.link.Link` drives a raw non-blocking socket from loop callbacks (sendmsg of
mmap views, recv_into a reusable buffer, reader callbacks in the turn that finds data).
The TLS layer keeps that shape: an ``ssl.SSLObject`` over two ``ssl.MemoryBIO`` stands in
for the socket (:class:`_TlsStream`, with the socket calls Link makes and their
non-blocking meaning), so every Link method runs unchanged over it:

- sends encrypt the parts into the outgoing BIO in full records (parts are joined only
  to fill a record: a block's header rides in the first record of its data, a live block
  and its header make one record; larger data is written as the memoryview it is) and
  hand the ciphertext to the socket in one send; what it does not take waits in a backlog
  that the next send, or a writer callback, flushes first.  File ranges are read, not
  sendfile-d (the kernel cannot encrypt them);
- receives take what the socket holds in one read (a read that did not fill the buffer
  emptied the socket, so no second read is tried in that call) into the incoming BIO and
  decrypt straight into the caller's buffer, asking the TLS object only while the BIO
  holds something (no exception per call for "nothing there"); plaintext of a record the
  caller had no room for is kept, and counts as readiness (waits return at once, a watch
  callback is called again next turn), since the socket will not signal it.

The handshake runs on the same loop (:meth:`TlsLink.handshake`).  No session tickets or
key updates are asked for, so nothing but the handshake writes outside a send.
"""
from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rmqha.errors import AuthenticationError, ConfigError, PeerIdentityError
from rmqha.ha.link import FileRange, Link, LinkClosed, LinkTimeout
from rmqha.net.memory_tls import drain
from rmqha.net.peer_check import Need
from rmqha.security.identity import Identity
from rmqha.security.tls import ReloadingContext, TlsSettings, peer_identity

#: Ciphertext taken from the socket per read (a catch-up window in one read).
_CIPHER_READ = 1 << 20
#: Plaintext decrypted per call when no caller's buffer waits for it.
_PLAIN_CHUNK = 64 << 10
#: A TLS record's most plaintext: smaller parts are joined up to this, one record each.
_RECORD = 16 << 10
#: Plaintext one send call encrypts at most (the rest waits until the socket took it).
_SEAL_BUDGET = 1 << 20
#: File ranges go out in reads of this size.
_FILE_CHUNK = 256 << 10


@dataclass(frozen=True)
class HATls:
    """This broker's HA TLS: the contexts of its port and of its slave's dial (rebuilt when
    the files change), and the cluster and group a peer's certificate must name."""

    server: ReloadingContext
    client: ReloadingContext
    cluster: str
    group: str

    @classmethod
    def from_settings(cls, settings: TlsSettings, cluster: str, group: str) -> HATls | None:
        """TLS on the HA port when the broker serves TLS at all (any mode but disabled);
        None otherwise.  ConfigError when the files are missing or unreadable."""
        if not settings.serves_tls:
            return None
        link = settings.for_internal_link()
        return cls(ReloadingContext.server(link), ReloadingContext.client(link), cluster, group)

    @property
    def need(self) -> Need:
        return Need.broker(self.cluster, self.group)

    def check_peer(self, tls: ssl.SSLObject) -> Identity:
        """The identity the peer's verified certificate names, if it may join this group's
        HA links (AuthenticationError / PeerIdentityError saying why not)."""
        peer = peer_identity(tls)
        if not self.need.allows(peer):
            raise PeerIdentityError(f"its certificate names {peer}; only {self.need.describe()} "
                                    "may join this group's HA links")
        return peer

    async def accept(self, sock: socket.socket, timeout: float) -> TlsLink:
        """The master's side of an accepted socket: handshake, then the slave's identity."""
        link = TlsLink(sock, self.server.get(), server_side=True)
        await self._secure(link, timeout)
        return link

    async def _secure(self, link: TlsLink, timeout: float) -> None:
        try:
            await link.handshake(timeout)
            link.peer_identity = self.check_peer(link.tls_object)
        except BaseException:
            link.close()
            raise

    def dial(self, sock: socket.socket) -> TlsLink:
        """The slave's side of a connected socket, before its :meth:`secure`."""
        return TlsLink(sock, self.client.get(), server_side=False)

    async def secure(self, link: TlsLink, timeout: float) -> None:
        """Handshake on a dialled link and check the master's identity (the link is
        closed when either fails)."""
        await self._secure(link, timeout)


def check_tls_group(tls: HATls | None, group: str) -> None:
    """ConfigError unless ``tls`` (when given) admits peers of broker group ``group``."""
    if tls is not None and tls.group != group:
        raise ConfigError(f"HA TLS is set up for broker group {tls.group!r}, not {group!r}")


class _TlsStream:
    """The socket calls :class:`Link` makes, over TLS: plaintext in and out, ciphertext on
    ``sock``.  Non-blocking as the socket is: BlockingIOError when no plaintext is ready
    (or the backlog leaves no room for a send), a read of 0 at the end of the stream."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool) -> None:
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side)
        #: Decrypted bytes nobody read yet, and ciphertext the socket did not take yet.
        self.plain = bytearray()
        self.backlog = bytearray()
        self.eof = False
        #: Whether the last socket read found the socket empty or left it so (a short read).
        self.drained = False
        self._cipher = bytearray(_CIPHER_READ)
        self._cipher_view = memoryview(self._cipher)
        self._scratch = memoryview(bytearray(_PLAIN_CHUNK))

    def fileno(self) -> int:
        return self.sock.fileno()

    def getpeername(self) -> Any:
        return self.sock.getpeername()

    def close(self) -> None:
        self.sock.close()

    # --- ciphertext ----------------------------------------------------------------------------

    def take_cipher(self) -> bool:
        """Move what the socket holds into the incoming BIO; False when it held nothing."""
        if self.eof:
            return False
        try:
            n = self.sock.recv_into(self._cipher_view)
        except (BlockingIOError, InterruptedError):
            self.drained = True
            return False
        self.drained = n < _CIPHER_READ
        if n == 0:
            self.eof = True
            self.incoming.write_eof()
        else:
            self.incoming.write(self._cipher_view[:n])
        return True

    def flush(self) -> bool:
        """Hand the backlog (and what the TLS object wrote) to the socket; True when all went."""
        if self.outgoing.pending:
            cipher = self.outgoing.read()
            if not self.backlog:
                # The usual case: straight to the socket, no copy into the backlog.
                try:
                    n = self.sock.send(cipher)
                except (BlockingIOError, InterruptedError):
                    n = 0
                if n == len(cipher):
                    return True
                self.backlog += memoryview(cipher)[n:]
                return False
            self.backlog += cipher
        return drain(self.sock, self.backlog)

    # --- receive -------------------------------------------------------------------------------

    def _take_plain(self, view: memoryview) -> int:
        k = min(len(self.plain), len(view))
        if k:
            with memoryview(self.plain) as held:
                view[:k] = held[:k]
            del self.plain[:k]
        return k

    def _feed(self, fed: bool) -> bool:
        """Take ciphertext from the socket unless a read of this call emptied it already;
        False when there is none."""
        return not (fed and self.drained) and self.take_cipher()

    def _decrypt_into(self, view: memoryview) -> int:
        """Plaintext into ``view`` as far as the BIO and the socket have it."""
        n = self._take_plain(view)
        size = len(view)
        read: Any = self.tls.read  # with a buffer it returns a count (typeshed says bytes)
        incoming, tls = self.incoming, self.tls
        fed = False
        while n < size:
            if not incoming.pending and not tls.pending():
                if not self._feed(fed):
                    break
                fed = True
                continue
            try:
                got = read(size - n, view[n:])
            except ssl.SSLWantReadError:  # part of a record: the rest may be in the socket
                if not self._feed(fed):
                    break
                fed = True
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self.eof = True
                break
            if got == 0:
                self.eof = True
                break
            n += got
        return n

    def settle(self) -> None:
        """Decrypt whatever whole records the BIO still holds into :attr:`plain`, so that
        ready plaintext never hides where no socket readiness would reveal it."""
        while self.tls.pending() or self.incoming.pending:
            try:
                chunk = self.tls.read(_PLAIN_CHUNK)
            except ssl.SSLWantReadError:
                return
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self.eof = True
                return
            if not chunk:
                self.eof = True
                return
            self.plain += chunk

    def _result(self, n: int) -> int:
        self.settle()
        if n or self.eof:
            return n
        raise BlockingIOError

    def recv_into(self, view: memoryview) -> int:
        return self._result(self._decrypt_into(view))

    def recvmsg_into(self, buffers: Sequence[memoryview]) -> tuple[int, list[Any], int, Any]:
        total = 0
        for buf in buffers:
            n = self._decrypt_into(buf)
            total += n
            if n < len(buf):
                break
        return self._result(total), [], 0, None

    def recv(self, nbytes: int) -> bytes:
        if not self.plain:
            view = self._scratch[: min(nbytes, _PLAIN_CHUNK)]
            return bytes(view[: self._result(self._decrypt_into(view))])
        n = self._result(min(nbytes, len(self.plain)))
        out = bytes(self.plain[:n])
        del self.plain[:n]
        return out

    # --- send ----------------------------------------------------------------------------------

    def _seal(self, buffers: Sequence[Any]) -> int:
        """Encrypt ``buffers`` in order, at most :data:`_SEAL_BUDGET` bytes of them, in
        full records: what is under a record waits to be joined with what follows (one
        record instead of one each), whole records of a large buffer go as they are.
        Returns the bytes taken."""
        total = 0
        write = self.tls.write
        small: list[Any] = []  # together under one record
        small_bytes = 0
        for buf in buffers:
            view = buf if isinstance(buf, memoryview) else memoryview(buf)
            view = view[: _SEAL_BUDGET - total]
            size = view.nbytes
            total += size
            if small_bytes + size < _RECORD:
                small.append(view)
                small_bytes += size
            else:
                if small:  # the record begun fills up from this buffer
                    cut = _RECORD - small_bytes
                    small.append(view[:cut])
                    write(b"".join(small))
                    view = view[cut:]
                whole = view.nbytes - view.nbytes % _RECORD
                if whole:
                    write(view[:whole])
                small = [view[whole:]] if whole < view.nbytes else []
                small_bytes = view.nbytes - whole
            if total >= _SEAL_BUDGET:
                break
        if small_bytes:
            write(small[0] if len(small) == 1 else b"".join(small))
        return total

    def sendmsg(self, buffers: Sequence[Any], ancdata: Any = (), flags: int = 0) -> int:
        if not self.flush():
            raise BlockingIOError
        taken = self._seal(buffers)
        self.flush()
        return taken


class TlsLink(Link):
    """A :class:`Link` whose bytes go through TLS (see the module docstring)."""

    tls = True
    sends_files = False

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 recv_bytes: int = 1 << 20) -> None:
        self._stream = _TlsStream(sock, context, server_side)
        super().__init__(self._stream, recv_bytes=recv_bytes)  # type: ignore[arg-type]
        self._draining = False
        self._watch_token: object | None = None
        self._refire_pending = False

    @property
    def tls_object(self) -> ssl.SSLObject:
        return self._stream.tls

    def channel_binding(self) -> bytes:
        """The session's ``tls-unique`` (its first Finished message): the same at both ends
        of one session, different on every other (AuthenticationError before the handshake)."""
        binding = self._stream.tls.get_channel_binding("tls-unique")
        if not binding:
            raise AuthenticationError(f"the TLS session with {self.peer} has no channel binding yet")
        return binding

    async def handshake(self, timeout: float) -> None:
        """The TLS handshake, on this loop; LinkTimeout when it takes over ``timeout``,
        ``ssl.SSLError`` when it fails (a certificate not verified, say)."""
        stream = self._stream
        deadline = self.loop.time() + timeout
        while True:
            try:
                stream.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            await self._drain(self._left(deadline))
            if not stream.take_cipher():
                await super()._wait(readable=True, timeout=self._left(deadline))
        await self._drain(self._left(deadline))
        stream.settle()  # what the peer sent right behind its last handshake message

    def _left(self, deadline: float) -> float:
        left = deadline - self.loop.time()
        if left <= 0:
            raise LinkTimeout(f"TLS handshake with {self.peer} unfinished")
        return left

    # --- readiness -----------------------------------------------------------------------------

    async def _wait(self, *, readable: bool, timeout: float | None) -> None:
        if readable and self._stream.plain:
            if self.closed:
                raise LinkClosed("link closed")
            return
        if not readable:
            self._stop_draining()  # the waiting task flushes the backlog itself
        await super()._wait(readable=readable, timeout=timeout)

    def watch(self, on_readable: Callable[[], None]) -> asyncio.Future[None]:
        """As :meth:`Link.watch`; plaintext left over after a call is as good as socket
        readiness: the callback is called again in the next turn."""
        token = self._watch_token = object()

        def fire(scheduled: bool = False) -> None:
            if scheduled:
                self._refire_pending = False
            if self._watch_token is not token:
                return
            on_readable()
            self._refire_if_buffered(token, fire)

        end = super().watch(fire)
        self._refire_if_buffered(token, fire)
        return end

    def _refire_if_buffered(self, token: object, fire: Callable[[bool], None]) -> None:
        if (self._stream.plain and not self._refire_pending and self._watch_token is token
                and self._reader == "watch"):
            self._refire_pending = True
            self.loop.call_soon(fire, True)

    def unwatch(self) -> None:
        self._watch_token = None
        super().unwatch()

    def set_rcvlowat(self, nbytes: int) -> int:
        """Not over TLS: socket readiness counts ciphertext, and plaintext may wait here."""
        return 1

    # --- send ----------------------------------------------------------------------------------

    def try_send(self, buffers: Sequence[Any]) -> list[memoryview]:
        """As :meth:`Link.try_send`; what is encrypted but not taken by the socket goes out
        from a writer callback (or the next send, which flushes it first)."""
        rest = super().try_send(buffers)
        if self._stream.backlog:
            self._start_draining()
        return rest

    async def _send_buffers(self, buffers: Sequence[Any], timeout: float | None, flags: int) -> int:
        total = await super()._send_buffers(buffers, timeout, flags)
        await self._drain(timeout)
        return total

    async def _send_file(self, part: FileRange, timeout: float | None) -> int:
        """A file range read in chunks (TLS must see the bytes: no sendfile)."""
        sent = 0
        while sent < part.count:
            chunk = os.pread(part.fd, min(_FILE_CHUNK, part.count - sent), part.offset + sent)
            if not chunk:
                raise OSError(f"file ends at {part.offset + sent}, inside a range to send")
            sent += await self._send_buffers([chunk], timeout, 0)
        return sent

    async def _drain(self, timeout: float | None) -> None:
        """Until the socket took every byte of ciphertext."""
        while not self._stream.flush():
            await self._wait(readable=False, timeout=timeout)

    def _start_draining(self) -> None:
        if not self._draining and not self.closed:
            self._draining = True
            self.loop.add_writer(self.fd, self._drain_now)

    def _drain_now(self) -> None:
        try:
            done = self._stream.flush()
        except OSError:
            self.close()  # the link's reader sees the close and reports it
            return
        if done:
            self._stop_draining()

    def _stop_draining(self) -> None:
        if self._draining:
            self._draining = False
            if not self.closed:
                self.loop.remove_writer(self.fd)

    def close(self) -> None:
        self._draining = False
        self._watch_token = None
        super().close()
