"""A blocking remoting connection: one plain TCP socket, one request at a time.

:class:`~rmqha.client.blocking_producer.BlockingProducer` makes a message's first attempt
over a :class:`BlockingLink` from a thread that runs no event loop.  Driving an asyncio loop with
``run_until_complete`` for that costs a task, an epoll wait and the transport's callbacks
on every call (about 200 us of client CPU a send, one at a time, on the project's 2-core
VM); a blocking ``send`` and ``recv`` are two system calls.

Frames go through rmqha's own codec (:func:`rmqha.protocol.command.encode`,
:func:`rmqha.protocol.command.decode_frame`), or for a send (:meth:`BlockingLink.send`)
through the client send codec (``rmqha._core.send_codec``: the request encoded already, the
answer's fields read in one call).  A length read from the socket is checked against
``max_frame_bytes`` before anything is buffered for its frame, and a malformed frame is a
:class:`~rmqha.errors.ProtocolError` as everywhere else.

One request is in flight at a time, so every frame but the awaited response is stray:

- a response with another opaque answers an earlier request that failed (the link is
  closed on every failure, so this needs a peer that answers twice): dropped;
- a request from the server: one that expects an answer gets REQUEST_CODE_NOT_SUPPORTED,
  as :mod:`rmqha.net.connection` answers a code it has no handler for, so the server does not
  hold it until its own timeout; a one-way request is dropped.  Nothing on a producer's
  link asks anything today (transaction check-backs go to the producer that heartbeats,
  which is the shared loop's, never a blocking link).  Such a request is only read while
  a request of ours waits, since no one reads the socket between calls.

Any failure closes the socket (after a timeout the late answer must not be taken for the
next request's, and after a malformed frame the stream has no frame boundary left); the
next request connects again.  A link belongs to one thread: it is not thread-safe.

With a :class:`~rmqha.net.client_security.ClientSecurity` a link signs each request with
its hook, as :class:`~rmqha.net.client.RemotingClient` does (a send's encoded frame is
signed in place by its credentials, :meth:`BlockingLink.signed`), and speaks TLS when it has a
context.  TLS is kept in memory (:class:`~rmqha.net.memory_tls.MemoryTls`) and the socket
stays the plaintext link's, its deadline kept by SO_RCVTIMEO/SO_SNDTIMEO: a frame is sealed
into its records, which leave in one ``send`` (a batch reaches the broker whole, not a
record at a time), and an answer is one ``recv`` opened after; the handshake is the same
sends and receives, within the connect's deadline.  (An ``SSLSocket`` over such a socket had
to be told it was non-blocking, so SSL_read gave up on a record without data, TLS 1.3's
session tickets, as if the kernel timeout had run out, and SSL_write went on after one had
cut a write short, so a frame went one record per SSL_write.)
"""
from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable, Mapping

from rmqha._core import load
from rmqha._core.send_codec_py import Answer
from rmqha.errors import ProtocolError, RemotingError, RemotingTimeoutError
from rmqha.net.client import split_address
from rmqha.net.client_security import ClientSecurity, current
from rmqha.net.memory_tls import MemoryTls
from rmqha.protocol.command import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_RESPONSE,
    RemotingCommand,
    decode_frame,
    encode,
    not_supported,
)

log = logging.getLogger(__name__)

#: struct timeval (tv_sec, tv_usec as C longs: Linux and macOS), for SO_RCVTIMEO/SO_SNDTIMEO.
_TIMEVAL = struct.Struct("@ll")
#: Bytes asked of one recv: a send's answer is a few hundred, a route a few KiB.
_RECV_BYTES = 64 * 1024
_LENGTH = struct.Struct(">i")
#: Plaintext sealed per send: a frame up to this (every batch) is one send of its records,
#: a bigger one (up to max_frame_bytes) is not copied whole into ciphertext at once.
_SEAL_BYTES = 1 << 20
#: The client send codec: a send's answer read in one call (:meth:`BlockingLink.send`).
_CODEC = load("send_codec")


class BlockingLink:
    """A blocking connection to one remoting server, connected on first use."""

    def __init__(self, addr: str, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 security: ClientSecurity | None = None) -> None:
        self.addr = addr
        self.security = security
        self.host, self.port = split_address(addr)
        self.max_frame_bytes = max_frame_bytes
        self._sock: socket.socket | None = None
        #: The TLS of the connection (None: plaintext).
        self._tls: MemoryTls | None = None
        #: Bytes read but not yet split into frames.
        self._buf = bytearray()
        #: The socket's SO_RCVTIMEO and SO_SNDTIMEO, in ms (0: not set).
        self._timeout_ms = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``cmd`` and return the response with its opaque, all within ``timeout``
        seconds (connecting included).  RemotingTimeoutError when it does not come in time,
        RemotingError when the connection cannot be made or is lost, ProtocolError when
        the server sends a malformed frame; each closes the socket."""
        if cmd.is_oneway or cmd.is_response:
            raise ValueError("request() needs a two-way request command")
        if self.security is not None and self.security.rpc_hook is not None:
            self.security.rpc_hook(cmd)
        frame = encode(cmd)  # a header that cannot be encoded is our error: the link stays
        answer = self._exchange(frame, cmd.opaque, timeout, cmd.describe, False)
        assert isinstance(answer, RemotingCommand)
        return answer

    @property
    def signs(self) -> bool:
        """Whether requests are signed (a hook that needs the command, not its bytes)."""
        return self.security is not None and self.security.rpc_hook is not None

    def signed(self, frame: bytes, ext_fields: Mapping[str, str], body: bytes) -> bytes | None:
        """A send's ``frame`` (its ``ext_fields`` and ``body``) signed in place by this
        link's credentials (:meth:`Credentials.sign_send_frame`); None when only the
        signing hook can sign it, which needs the command."""
        creds = self.security.frame_signer if self.security is not None else None
        return None if creds is None else creds.sign_send_frame(frame, ext_fields, body)

    def send(self, frame: bytes, opaque: int, timeout: float) -> Answer:
        """:meth:`request` of a send request encoded already (``SendRequest.frame``, which
        must not need signing: see :attr:`signs`), its answer read by the send codec in
        one call: ``(code, opaque, flag, remark, msgId, queueId, queueOffset, putStatus,
        masterAddress)``.  The same errors as :meth:`request`."""
        answer = self._exchange(frame, opaque, timeout, lambda: f"send opaque={opaque}", True)
        assert isinstance(answer, tuple)
        return answer

    def _exchange(self, frame: bytes, opaque: int, timeout: float,
                  describe: Callable[[], str], fields: bool) -> RemotingCommand | Answer:
        deadline = time.monotonic() + timeout
        done = False
        try:
            sock = self._sock if self._sock is not None else self._connect(deadline)
            self._send(sock, frame, deadline)
            response = self._receive(sock, opaque, deadline, fields)
            done = True
            return response
        # BlockingIOError: SO_RCVTIMEO/SNDTIMEO ran out (see _arm)
        except (TimeoutError, BlockingIOError):
            raise RemotingTimeoutError(
                f"no response from {self.addr} to {describe()} within {timeout:.3f}s"
            ) from None
        except ProtocolError as exc:
            raise ProtocolError(f"malformed frame from {self.addr} (connection closed): "
                                f"{exc}") from exc
        except OSError as exc:
            raise RemotingError(f"connection {self.addr} lost: {exc}") from exc
        finally:
            if not done:  # an error, or an interrupt in the middle of a frame
                self.close()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._tls = None
        self._timeout_ms = 0
        # Bytes of a frame of the old connection mean nothing on the next one.
        self._buf = bytearray()
        if sock is not None:
            sock.close()

    def __enter__(self) -> BlockingLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------

    def _connect(self, deadline: float) -> socket.socket:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RemotingTimeoutError(f"connect to {self.addr} timed out")
        try:
            sock = socket.create_connection((self.host, self.port), timeout=remaining)
        except TimeoutError:
            raise RemotingTimeoutError(f"connect to {self.addr} timed out") from None
        except OSError as exc:
            raise RemotingError(f"cannot connect to {self.addr}: {exc}") from exc
        # A request is one small write answered at once: Nagle would hold it back.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking mode: the deadline is kept by the kernel's send and receive timeouts
        # (see _arm), not by Python's per-call poll() (settimeout costs an ioctl per call
        # and a poll() before every send and recv: four system calls of the six a request
        # took).
        sock.settimeout(None)
        context = current(self.security.ssl_context) if self.security is not None else None
        if context is not None:
            self._tls = self._handshake(sock, context, deadline)
        self._sock = sock
        return sock

    def _handshake(self, sock: socket.socket, context: ssl.SSLContext,
                   deadline: float) -> MemoryTls:
        """The TLS of ``sock`` after a handshake by ``deadline`` (the socket closed, and
        RemotingError when the handshake fails, RemotingTimeoutError when it is late)."""
        tls = MemoryTls(context, self.host)
        try:
            while not tls.handshake():
                self._write(sock, tls.records(), deadline)
                self._arm(sock, deadline)
                data = sock.recv(_RECV_BYTES)
                if not data:
                    raise RemotingError(f"TLS handshake with {self.addr} failed: "
                                        "connection closed by the peer")
                tls.feed(data)
            self._write(sock, tls.records(), deadline)  # our last flight
        except ssl.SSLError as exc:
            sock.close()
            raise RemotingError(f"TLS handshake with {self.addr} failed: {exc}") from exc
        except (TimeoutError, BlockingIOError):
            sock.close()
            raise RemotingTimeoutError(f"TLS handshake with {self.addr} timed out") from None
        except BaseException:
            sock.close()
            raise
        return tls

    def _arm(self, sock: socket.socket, deadline: float) -> None:
        """Make the socket's next blocking send or recv give up by ``deadline``.

        SO_RCVTIMEO/SO_SNDTIMEO are set in whole milliseconds, rounded down, and only
        when the time left is not that or 1 ms less: with one send timeout per producer
        they are set once, not on every request (nor between a request's write and its
        read), and a call gives up at most 1 ms past the deadline.  The kernel rounds them
        up to its clock tick, as poll() does."""
        ms = int((deadline - time.monotonic()) * 1000)
        if ms <= 0:  # (0 would mean "wait forever" to the kernel)
            raise TimeoutError
        if not 0 <= self._timeout_ms - ms <= 1:
            timeval = _TIMEVAL.pack(ms // 1000, ms % 1000 * 1000)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            self._timeout_ms = ms

    def _send(self, sock: socket.socket, frame: bytes, deadline: float) -> None:
        tls = self._tls
        if tls is None:
            self._write(sock, frame, deadline)
        elif len(frame) <= _SEAL_BYTES:
            self._write(sock, tls.seal(frame), deadline)
        else:
            with memoryview(frame) as view:
                for at in range(0, len(frame), _SEAL_BYTES):
                    self._write(sock, tls.seal(view[at:at + _SEAL_BYTES]), deadline)

    def _write(self, sock: socket.socket, data: bytes, deadline: float) -> None:
        """All of ``data`` by ``deadline``."""
        if not data:  # a handshake's step that made no record
            return
        # Not sendall: each of its sends would wait the whole timeout again.
        self._arm(sock, deadline)
        sent = sock.send(data)
        if sent < len(data):  # a big batch, or a peer that stopped reading
            view = memoryview(data)
            while sent < len(data):
                self._arm(sock, deadline)
                sent += sock.send(view[sent:])

    def _read(self, sock: socket.socket, deadline: float) -> bytes:
        """The plaintext one read by ``deadline`` brings (b"" when it ends no TLS record
        with data); RemotingError when the peer closed the connection."""
        self._arm(sock, deadline)
        data = sock.recv(_RECV_BYTES)
        if not data:
            raise RemotingError(f"connection {self.addr} closed by the peer")
        tls = self._tls
        if tls is None:
            return data
        try:
            plain = tls.open(data)
        except RemotingError as exc:  # the peer closed its TLS
            raise RemotingError(f"connection {self.addr}: {exc}") from None
        records = tls.records()  # TLS's own answer, e.g. to a key update
        if records:
            self._write(sock, records, deadline)
        return plain

    def _receive(self, sock: socket.socket, opaque: int, deadline: float,
                 fields: bool) -> RemotingCommand | Answer:
        """The response with ``opaque``: decoded whole, or (``fields``) its fields as the
        send codec reads them; a frame the codec does not read (a binary header) is
        decoded whole and its fields taken from the command."""
        while True:
            data = self._read(sock, deadline)
            found: RemotingCommand | Answer | None = None
            for frame in self._frames(data):  # ProtocolError past max_frame_bytes
                answer = _CODEC.decode_send_answer(frame) if fields else None
                if answer is not None and answer.flag & FLAG_RESPONSE and answer.opaque == opaque:
                    found = answer
                    continue
                cmd = decode_frame(frame)
                if cmd.is_response and cmd.opaque == opaque:
                    found = answer_of(cmd) if fields else cmd
                else:
                    self._stray(sock, cmd, deadline)
            if found is not None:
                return found

    def _frames(self, data: bytes) -> list[bytes]:
        """The whole frames (without their length) that ``data`` completes; a length
        below 4 or above ``max_frame_bytes`` is a ProtocolError before anything of its
        frame is kept (as :class:`~rmqha.protocol.command.FrameDecoder` checks)."""
        buf = self._buf
        if not buf and len(data) >= 4:
            (total,) = _LENGTH.unpack_from(data, 0)
            if total == len(data) - 4 and 4 <= total <= self.max_frame_bytes:
                return [data[4:]]  # nearly always: one answer, whole, in one read
        buf += data
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 4:
            (total,) = _LENGTH.unpack_from(buf, pos)
            if total < 4 or total > self.max_frame_bytes:
                raise ProtocolError(f"frame length {total} outside [4, {self.max_frame_bytes}]")
            if len(buf) - pos - 4 < total:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + total]))
            pos += 4 + total
        if pos:
            del buf[:pos]
        return out

    def _stray(self, sock: socket.socket, cmd: RemotingCommand, deadline: float) -> None:
        if cmd.is_response:
            log.debug("%s: dropping response with unknown opaque %d", self.addr, cmd.opaque)
        elif cmd.is_oneway:
            log.debug("%s: dropping one-way %s (no handler on a blocking link)",
                      self.addr, cmd.describe())
        else:
            log.debug("%s: answering %s: not supported on a blocking link",
                      self.addr, cmd.describe())
            self._send(sock, encode(not_supported(cmd)), deadline)


def answer_of(cmd: RemotingCommand) -> Answer:
    """A decoded command as the send codec's :class:`Answer` (the fields a producer reads)."""
    ext = cmd.ext_fields
    return Answer(cmd.code, cmd.opaque, cmd.flag, cmd.remark, ext.get("msgId"),
                  ext.get("queueId"), ext.get("queueOffset"), ext.get("putStatus"),
                  ext.get("masterAddress"))
