"""One HA TCP link on the asyncio loop: scatter/gather sends and a reusable receive buffer.

Sends take a list of buffers (frame headers and memoryviews of the mmap-ed commitlog) and
hand them to ``socket.sendmsg`` as they are, so log bytes go from the page cache to the
kernel without a Python-level copy; a partial send keeps views of the rest, never copies.
Large log ranges can go as :class:`FileRange` parts instead, sent with ``sendfile``: the
kernel then attaches the page-cache pages to the socket without copying them at all.
Receives go into one growable buffer with ``recv_into``; frames are parsed in place and
only the unparsed tail of a read is moved to the front.  Both directions take timeouts
built from loop callbacks, not extra tasks, because the link's loops wake very often.

Live traffic is one small block and one ack at a time, where the cost of a message is the
number of event-loop turns and syscalls it takes, not its bytes.  So the socket stays
registered for reading between waits (no epoll_ctl pair per wait), a caller can send
without a task (:meth:`Link.try_send`), and a reader can take data in the loop turn that
finds it (:meth:`Link.watch`) instead of waking a task, which costs a turn of its own.
"""
from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rmqha.security.identity import Identity

#: sendmsg takes at most IOV_MAX (1024 on Linux) buffers per call.
_IOV_BATCH = 512
_MSG_MORE = getattr(socket, "MSG_MORE", 0)
_SO_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", None)
#: Whether file ranges can go out with sendfile (else callers send mmap views).
HAVE_SENDFILE = hasattr(os, "sendfile")


class FileRange(NamedTuple):
    """``count`` bytes of the open file ``fd`` from ``offset``, for :meth:`Link.send_parts`."""

    fd: int
    offset: int
    count: int


class LinkClosed(ConnectionError):
    """The peer closed the link (EOF) or the link was closed locally."""


class LinkTimeout(TimeoutError):
    """Nothing arrived within the wait."""


def tune_socket(sock: socket.socket) -> None:
    """Non-blocking, no Nagle (headers and acks are small), big buffers for bulk blocks."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass  # the kernel caps it; the default still works


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


class Link:
    """A connected non-blocking socket with zero-copy sends and timed receives."""

    #: Whether the bytes go through TLS (:class:`rmqha.ha.tls_link.TlsLink`).
    tls = False
    #: Whether :class:`FileRange` parts go out with sendfile (else callers send mmap views).
    sends_files = HAVE_SENDFILE

    def __init__(self, sock: socket.socket, *, recv_bytes: int = 1 << 20) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.recv_bytes = recv_bytes
        self.closed = False
        #: The future a task is parked on (at most one reader and one writer at a time).
        self._waits: set[asyncio.Future[bool]] = set()
        #: The socket's read registration: None, "wait" (resolves _read_fut) or "watch".
        self._reader: str | None = None
        self._read_fut: asyncio.Future[bool] | None = None
        self._watch_end: asyncio.Future[None] | None = None
        self.bytes_in = 0
        self.bytes_out = 0
        #: Who the peer's verified certificate names (TLS links only).
        self.peer_identity: Identity | None = None
        try:
            self.peer = "%s:%d" % sock.getpeername()[:2]
        except OSError:
            self.peer = "?"

    def channel_binding(self) -> bytes:
        """What binds an authentication run over this link to it: nothing in plaintext
        (TLS links give their session's ``tls-unique``)."""
        return b""

    # --- receive -----------------------------------------------------------------------------

    async def recv(self, timeout: float | None) -> bytes:
        """What is available (at least one byte, at most ``recv_bytes``); LinkClosed on EOF.

        Immutable ``bytes`` on purpose: the frame decoders slice blocks out of them without
        copying, and the commitlog copies each block once, into its mmap.
        """
        while True:
            if self.closed:
                raise LinkClosed("link closed")
            try:
                data = self.sock.recv(self.recv_bytes)
            except (BlockingIOError, InterruptedError):
                await self._wait(readable=True, timeout=timeout)
                continue
            if not data:
                raise LinkClosed(f"peer {self.peer} closed the link")
            self.bytes_in += len(data)
            return data

    async def recv_exactly(self, nbytes: int, timeout: float | None) -> bytes:
        """Exactly ``nbytes`` (never a byte more: what follows stays in the socket for
        whoever reads next); LinkClosed on EOF, LinkTimeout when a wait runs out."""
        got = b""
        while len(got) < nbytes:
            if self.closed:
                raise LinkClosed("link closed")
            try:
                data = self.sock.recv(nbytes - len(got))
            except (BlockingIOError, InterruptedError):
                await self._wait(readable=True, timeout=timeout)
                continue
            if not data:
                raise LinkClosed(f"peer {self.peer} closed the link")
            self.bytes_in += len(data)
            got += data
        return got

    def try_recv(self) -> bytes:
        """What is queued (at most ``recv_bytes``) without waiting: ``b""`` when nothing is;
        LinkClosed on EOF."""
        if self.closed:
            raise LinkClosed("link closed")
        try:
            data = self.sock.recv(self.recv_bytes)
        except (BlockingIOError, InterruptedError):
            return b""
        if not data:
            raise LinkClosed(f"peer {self.peer} closed the link")
        self.bytes_in += len(data)
        return data

    def watch(self, on_readable: Callable[[], None]) -> asyncio.Future[None]:
        """Call ``on_readable`` in every loop turn that finds data queued, until the link
        closes; the returned future then fails with LinkClosed (the owner awaits it to learn
        the link ended).  No task wakes per read: acks are handled in the turn that sees them.
        Not to be mixed with the waiting receives on the same link."""
        if self._reader is not None:
            self._unregister_reader()
        fut: asyncio.Future[None] = self.loop.create_future()
        self._watch_end = fut
        if self.closed:
            fut.set_exception(LinkClosed("link closed"))
            return fut
        self.loop.add_reader(self.fd, on_readable)
        self._reader = "watch"
        return fut

    def unwatch(self) -> None:
        """Stop calling the :meth:`watch` callback."""
        if self._reader == "watch":
            self._unregister_reader()

    def try_recv_into(self, view: memoryview) -> int:
        """Read what is queued into ``view`` without waiting: 0 when nothing is (the
        stream paused); LinkClosed on EOF."""
        if self.closed:
            raise LinkClosed("link closed")
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        if n == 0:
            raise LinkClosed(f"peer {self.peer} closed the link")
        self.bytes_in += n
        return n

    def try_recvmsg_into(self, buffers: Sequence[memoryview]) -> int:
        """Scatter what is queued over ``buffers`` in order, without waiting: 0 when
        nothing is; LinkClosed on EOF."""
        if self.closed:
            raise LinkClosed("link closed")
        try:
            n = self.sock.recvmsg_into(buffers)[0]
        except (BlockingIOError, InterruptedError):
            return 0
        if n == 0:
            raise LinkClosed(f"peer {self.peer} closed the link")
        self.bytes_in += n
        return n

    def set_rcvlowat(self, nbytes: int) -> int:
        """Readiness (and so a wake-up) only once ``nbytes`` are queued (SO_RCVLOWAT);
        returns the value in force (1 where the option is missing)."""
        if _SO_RCVLOWAT is None or self.closed:
            return 1
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, nbytes)
        except OSError:
            return 1
        return nbytes

    async def wait_readable(self, timeout: float | None) -> None:
        """Until data is queued (LinkTimeout after ``timeout``; LinkClosed when closed)."""
        await self._wait(readable=True, timeout=timeout)

    async def recv_into(self, view: memoryview, timeout: float | None) -> int:
        """Read into ``view`` (at least one byte); LinkClosed on EOF."""
        while True:
            if self.closed:
                raise LinkClosed("link closed")
            try:
                n = self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                await self._wait(readable=True, timeout=timeout)
                continue
            if n == 0:
                raise LinkClosed(f"peer {self.peer} closed the link")
            self.bytes_in += n
            return n

    # --- send ----------------------------------------------------------------------------------

    async def send(self, buffers: Sequence[Any], timeout: float | None = None) -> int:
        """Send every buffer in order without copying; returns the bytes sent."""
        return await self._send_buffers(buffers, timeout, 0)

    def try_send(self, buffers: Sequence[Any]) -> list[memoryview]:
        """Send what the socket takes now, without waiting; returns views of what is left
        (empty: all sent), for :meth:`send` to finish.  LinkClosed when closed."""
        if self.closed:
            raise LinkClosed("link closed")
        pending = [b if isinstance(b, memoryview) else memoryview(b) for b in buffers]
        try:
            n = self.sock.sendmsg(pending[:_IOV_BATCH])
        except (BlockingIOError, InterruptedError):
            return pending
        self.bytes_out += n
        i = 0
        while n > 0:
            size = pending[i].nbytes
            if n >= size:
                n -= size
                i += 1
            else:
                pending[i] = pending[i][n:]
                n = 0
        return pending[i:]

    async def send_parts(self, parts: Sequence[Any], timeout: float | None = None) -> int:
        """Send buffers and :class:`FileRange` parts in order; returns the bytes sent.

        Runs of buffers go out with one ``sendmsg``; a file range with ``sendfile``, which
        hands the page-cache pages to the socket without any copy (the receiver's copy is
        the only one).  Buffers right before a file range carry MSG_MORE, so a frame
        header and its body leave in the same TCP segments despite TCP_NODELAY.
        """
        total = 0
        run: list[Any] = []
        for part in parts:
            if type(part) is FileRange:
                if run:
                    total += await self._send_buffers(run, timeout, _MSG_MORE)
                    run = []
                total += await self._send_file(part, timeout)
            else:
                run.append(part)
        if run:
            total += await self._send_buffers(run, timeout, 0)
        return total

    async def _send_buffers(self, buffers: Sequence[Any], timeout: float | None, flags: int) -> int:
        pending = [b if isinstance(b, memoryview) else memoryview(b) for b in buffers]
        total = 0
        i = 0
        while i < len(pending):
            if self.closed:
                raise LinkClosed("link closed")
            try:
                n = self.sock.sendmsg(pending[i : i + _IOV_BATCH], (), flags)
            except (BlockingIOError, InterruptedError):
                await self._wait(readable=False, timeout=timeout)
                continue
            total += n
            while n > 0:
                first = pending[i]
                size = first.nbytes
                if n >= size:
                    n -= size
                    i += 1
                else:
                    pending[i] = first[n:]
                    n = 0
            if i < len(pending):
                await self._wait(readable=False, timeout=timeout)
        self.bytes_out += total
        return total

    async def _send_file(self, part: FileRange, timeout: float | None) -> int:
        sent = 0
        while sent < part.count:
            if self.closed:
                raise LinkClosed("link closed")
            try:
                n = os.sendfile(self.fd, part.fd, part.offset + sent, part.count - sent)
            except (BlockingIOError, InterruptedError):
                await self._wait(readable=False, timeout=timeout)
                continue
            if n == 0:
                raise OSError(errno.EIO, f"file ends at {part.offset + sent}, inside a range to send")
            sent += n
            if sent < part.count:
                await self._wait(readable=False, timeout=timeout)
        self.bytes_out += sent
        return sent

    # --- waiting -------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        fut = self._read_fut
        if fut is None:
            # Nobody waits: stop watching, or level-triggered epoll calls this every turn.
            self._unregister_reader()
            return
        self._read_fut = None
        if not fut.done():
            fut.set_result(True)

    def _unregister_reader(self) -> None:
        if self._reader is not None and not self.closed:
            self.loop.remove_reader(self.fd)
        self._reader = None

    async def _wait(self, *, readable: bool, timeout: float | None) -> None:
        fut: asyncio.Future[bool] = self.loop.create_future()
        if readable:
            if self._reader == "watch":
                raise RuntimeError("a watched link is read by its callback, not by waiting")
            # The registration outlives this wait (the next one reuses it): a link that is
            # read again and again pays no epoll_ctl pair per wait.
            if self._reader is None:
                self.loop.add_reader(self.fd, self._on_readable)
                self._reader = "wait"
            self._read_fut = fut
        else:
            self.loop.add_writer(self.fd, _set_result, fut, True)
        timer = self.loop.call_later(timeout, _set_result, fut, False) if timeout is not None else None
        self._waits.add(fut)
        try:
            ready = await fut
        finally:
            self._waits.discard(fut)
            if readable:
                if self._read_fut is fut:
                    self._read_fut = None
            elif not self.closed:
                self.loop.remove_writer(self.fd)
            if timer is not None:
                timer.cancel()
        if self.closed:
            raise LinkClosed("link closed")
        if not ready:
            raise LinkTimeout(f"no {'data from' if readable else 'room to send to'} {self.peer} in {timeout:.3f}s")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
        except (ValueError, OSError):
            pass
        # Wake tasks parked on this socket so they see the close now, not at their timeout.
        for fut in list(self._waits):
            _set_result(fut, False)
        self._reader = None
        self._read_fut = None
        end = self._watch_end
        if end is not None and not end.done():
            end.set_exception(LinkClosed("link closed"))
        try:
            self.sock.close()
        except OSError:
            pass


async def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A tuned, connected non-blocking socket to host:port."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tune_socket(sock)
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
    except BaseException:
        sock.close()
        raise
    return sock


class Waker:
    """A wake-up flag one task waits on with a timeout (cheaper than Event + wait_for)."""

    __slots__ = ("_loop", "_fut", "_flag")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fut: asyncio.Future[bool] | None = None
        self._flag = False

    def wake(self) -> None:
        self._flag = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(True)

    async def wait(self, timeout: float) -> bool:
        """True when woken (or a wake was pending), False when the timeout passed."""
        if self._flag:
            self._flag = False
            return True
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._fut = fut
        timer = self._loop.call_later(max(timeout, 0.0), _set_result, fut, False)
        try:
            woke = await fut
        finally:
            timer.cancel()
            self._fut = None
        self._flag = False
        return woke


class RecvBuffer:
    """A receive buffer whose frames are parsed and consumed in place.

    ``buf[start:end]`` holds unparsed bytes.  :meth:`make_room` guarantees a frame of a known
    size fits from ``start``: normally by moving the one partial frame at the tail to the
    front (rare: the buffer is many frames long), growing only for a frame larger than the
    buffer (callers bound frame sizes first).
    """

    __slots__ = ("buf", "view", "start", "end", "filled")

    def __init__(self, capacity: int) -> None:
        self.buf = bytearray(capacity)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        #: Whether the last read took all the room it was given (more is probably queued).
        self.filled = False

    @property
    def pending(self) -> int:
        return self.end - self.start

    def consume(self, n: int) -> None:
        self.start += n
        if self.start == self.end:
            self.start = self.end = 0

    def make_room(self, frame_bytes: int) -> None:
        if self.start + frame_bytes <= len(self.buf) and self.end < len(self.buf):
            return
        n = self.end - self.start  # at most one partial frame
        if frame_bytes <= len(self.buf) and n <= self.start:
            # The usual case: the tail moves to the front with one memcpy (no overlap).
            self.buf[0:n] = self.view[self.start : self.end]
        else:
            tail = bytes(self.view[self.start : self.end])
            if frame_bytes > len(self.buf):
                self.view.release()
                self.buf = bytearray(frame_bytes)
                self.view = memoryview(self.buf)
            self.buf[0:n] = tail
        self.start = 0
        self.end = n

    def try_fill(self, link: Link, limit: int | None = None) -> int:
        """Read what is already queued on ``link``, at most ``limit`` bytes (0: nothing,
        the stream paused)."""
        if self.end == len(self.buf):
            self.make_room(self.pending + 1)
        stop = len(self.buf) if limit is None else min(len(self.buf), self.end + limit)
        n = link.try_recv_into(self.view[self.end : stop])
        self.end += n
        self.filled = n == stop - (self.end - n)
        return n

    async def fill(self, link: Link, timeout: float | None) -> bool:
        """Read more bytes from ``link``; True when the read filled all the room it had
        (more is probably queued in the socket)."""
        if self.end == len(self.buf):
            self.make_room(self.pending + 1)
        room = len(self.buf) - self.end
        n = await link.recv_into(self.view[self.end :], timeout)
        self.end += n
        self.filled = n == room
        return n == room
