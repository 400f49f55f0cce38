"""TLS in memory for a blocking socket: records sealed and opened by an ``ssl.SSLObject``
over two ``ssl.MemoryBIO``, every system call left to the socket's owner.

:class:`~rmqha.client.blocking_link.BlockingLink` keeps its deadline with the kernel's
SO_SNDTIMEO/SO_RCVTIMEO on a blocking socket.  An ``ssl.SSLSocket`` makes that awkward:
SSL_write carries on after a write the kernel timeout cut short (so a frame had to go one
record per SSL_write, and the broker read a batch in pieces), and Python must be told
the socket is non-blocking, which also makes SSL_read give up (SSLWantReadError) on a
record that carries no data, such as TLS 1.3's session tickets in front of the first
answer.  Here the TLS object never touches the socket: :meth:`MemoryTls.seal` turns a
frame into its records, which leave in one ``send`` under the kernel timeout like a
plaintext frame, and :meth:`MemoryTls.open` turns what one ``recv`` read into the
plaintext it completes (possibly none).  Certificate checks are the context's, as for a
wrapped socket (``server_hostname`` given to the handshake).
"""
from __future__ import annotations

import socket
import ssl

from rmqha.errors import RemotingError

#: A TLS record's most plaintext: what one SSL_read returns at most.
_RECORD = 16 * 1024


class MemoryTls:
    """The client end of one TLS connection, in memory (see the module docstring)."""

    __slots__ = ("_incoming", "_outgoing", "_tls")

    def __init__(self, context: ssl.SSLContext, server_hostname: str | None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing,
                                     server_hostname=server_hostname)

    def handshake(self) -> bool:
        """Advance the handshake: True when it is done, False when it waits for the peer
        (send :meth:`records`, then :meth:`feed` what the socket reads).  ssl.SSLError
        (an ``SSLCertVerificationError`` for a certificate refused) when it fails."""
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        return True

    def records(self) -> bytes:
        """The records made since the last call, to send (b"" when none)."""
        return self._outgoing.read() if self._outgoing.pending else b""

    def feed(self, cipher: bytes) -> None:
        """Bytes read from the socket, for the handshake."""
        self._incoming.write(cipher)

    def seal(self, plain: bytes | memoryview) -> bytes:
        """``plain`` as the records that carry it (with any record made before)."""
        self._tls.write(plain)
        return self._outgoing.read()

    def open(self, cipher: bytes) -> bytes:
        """The plaintext that ``cipher`` (read from the socket) completes: b"" when it
        ends no record with data.  RemotingError when the peer closed its TLS,
        ssl.SSLError for a record that does not decrypt."""
        incoming = self._incoming
        incoming.write(cipher)
        read, tls = self._tls.read, self._tls
        chunks: list[bytes] = []
        while True:
            left = incoming.pending
            try:
                chunk = read(_RECORD)
            except ssl.SSLWantReadError:
                # A record without data (a session ticket) may come before others: go on
                # while the BIO is being drained (what stays is a part of a record).
                if incoming.pending and incoming.pending != left:
                    continue
                break
            except ssl.SSLZeroReturnError:  # (Python returns b"" for it, but not always)
                chunk = b""
            if not chunk:
                raise RemotingError("the peer closed its TLS (close_notify)")
            chunks.append(chunk)
            if not incoming.pending and not tls.pending():
                break
        if len(chunks) == 1:
            return chunks[0]  # nearly always: the answer was one record
        return b"".join(chunks)

    @property
    def version(self) -> str | None:
        """The TLS version agreed (None before the handshake)."""
        return self._tls.version()


def drain(sock: socket.socket, backlog: bytearray) -> bool:
    """Send ``backlog`` (records a non-blocking socket did not take yet) until it is empty
    (True) or the socket is full (False); what went is cut from its front.  The TLS layers
    over non-blocking sockets (the HA links', Raft's) keep such a backlog."""
    while backlog:
        try:
            n = sock.send(backlog)
        except (BlockingIOError, InterruptedError):
            return False
        del backlog[:n]
    return True
