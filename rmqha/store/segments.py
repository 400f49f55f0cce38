"""Segment files and the pre-fault window ahead of the writer.

A segment is one file named by the 20-digit offset of its first byte, ``segment_bytes``
long and mapped shared.  Segments are sparse: a new one is only ``ftruncate``-d to its
size, and disk blocks are reserved (``posix_fallocate``) a window ahead of the writer,
never the whole file, so an idle log costs a few MiB of disk, not two segments.  Every
byte written through a mapping lies in reserved blocks: a write through a mapping into a
hole of a full filesystem is a SIGBUS, while a failed ``fallocate`` is a clean ENOSPC.

:class:`PrefaultWindow` is the warm-up thread: it reserves and faults in (first touch of a
page costs 8-16 us on this class of VM) ``[max offset, max offset + window)`` and moves the
window on as the writer crosses its middle; a writer that overtakes it reserves its blocks
itself (see ``CommitLog._allocate``).

With ``flush = sync`` the warm-up also writes the window's (zero) pages to disk ahead of the
writer, as RocketMQ's ``warmMappedFile`` does: fallocated blocks are *unwritten* extents,
and the first ``fdatasync`` after a write into one must commit the extent's conversion
through the filesystem journal (shared with every other file: up to ~4 ms on this VM's
ext4 when other work keeps the journal busy, against ~0.1 ms into blocks written before).  The warm-up pays that, off the hot path.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from rmqha._core._protocols import RecordsTwin
from rmqha.errors import StoreError

log = logging.getLogger(__name__)

SEGMENT_NAME = re.compile(r"^[0-9]{20}$")
PAGE = mmap.PAGESIZE
#: Default bytes reserved and faulted in ahead of the writer.
DEFAULT_PREFAULT_WINDOW = 32 << 20
#: With sync-ahead, the warm-up faults in and syncs this much at a time: the faulted-in
#: zero pages are dirty until synced, and the writer's own fdatasync would otherwise write
#: (and wait for) a whole window of them.
SYNC_AHEAD_CHUNK = 1 << 20
NEVER = 1 << 62


def page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def segment_path(directory: str, base: int) -> str:
    return os.path.join(directory, f"{base:020d}")


def sidecar_path(log_dir: str, name: str) -> str:
    """Where a commitlog directory's own file ``name`` lives: beside the directory, named after
    it (``store/commitlog.checkpoint`` for ``store/commitlog``), never inside it.  RocketMQ's
    loader takes every file in the commitlog directory for a segment and refuses to start on
    a store holding any other (``length not matched message store config value``), so a
    store rmqha wrote opens in RocketMQ only if segments are all the directory holds."""
    log_dir = os.path.abspath(log_dir)
    return os.path.join(os.path.dirname(log_dir), f"{os.path.basename(log_dir)}.{name}")


#: What rmqha before 0.14 kept inside the commitlog directory -> the sidecar name now.
LEGACY_SIDECARS = {"commitlog.checkpoint": "checkpoint", "queue_offsets.json": "queue_offsets.json",
                   "queue_offsets.snapshot": "queue_offsets.snapshot"}


def adopt_legacy_sidecars(log_dir: str) -> None:
    """Move the files an older rmqha left inside ``log_dir`` to their sidecar paths (a store
    written before the move opens unchanged); where both exist the sidecar is the newer."""
    moved = False
    for old_name, name in LEGACY_SIDECARS.items():
        old = os.path.join(log_dir, old_name)
        if not os.path.exists(old):
            continue
        new = sidecar_path(log_dir, name)
        if os.path.exists(new):
            os.unlink(old)
        else:
            os.replace(old, new)
        moved = True
    if moved:
        fsync_dir(os.path.dirname(os.path.abspath(log_dir)))
        fsync_dir(log_dir)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """One sparse segment file and its shared mapping.

    ``allocated``: every block of ``[0, allocated)`` is reserved on disk (fallocate), so
    writes there through the mapping cannot fault for want of space.  It only grows, and
    is only ever set to a bound some thread actually reserved (a racing update may leave
    it lower than the truth, which costs a redundant fallocate, never a hole).
    """

    __slots__ = ("base", "path", "fd", "mm", "view", "size", "allocated")

    def __init__(self, path: str, base: int, size: int, *, create: bool) -> None:
        self.base = base
        self.path = path
        new = create and not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            if new:
                # The file's name must survive a power loss as surely as its bytes.
                fsync_dir(os.path.dirname(path) or ".")
            have = os.fstat(fd).st_size
            if have > size:
                raise StoreError(
                    f"segment {path} is {have} bytes, larger than segment_bytes={size}: "
                    "was the log written with another segment size?")
            if have < size:
                if not create:
                    log.warning("segment %s is %d bytes, short of %d: extending with zeros",
                                path, have, size)
                os.ftruncate(fd, size)  # sparse: blocks are reserved as the writer nears
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.view = memoryview(self.mm)
        self.size = size
        self.allocated = 0

    def allocate(self, upto: int) -> None:
        """Reserve the blocks of ``[allocated, upto)`` (page-rounded, within the file);
        OSError (ENOSPC on a full filesystem) when they cannot be."""
        have = self.allocated
        upto = min(self.size, page_up(upto))
        if upto <= have:
            return
        os.posix_fallocate(self.fd, have, upto - have)
        if upto > self.allocated:
            self.allocated = upto

    def data_end(self, start: int, stop: int) -> int:
        """Where the bytes of ``[start, stop)`` that may be non-zero end: at the first hole.
        Past a blank record's header a segment is a hole (it reads as zeros), and zeroing
        it through the mapping would take blocks, or fault on a full disk.  Filesystems
        without SEEK_HOLE report none: then everything up to ``stop`` counts."""
        try:
            hole = os.lseek(self.fd, start, os.SEEK_HOLE)
        except OSError:
            return stop
        return min(stop, max(start, hole))

    def close(self) -> None:
        # Our own view first: mmap.close() raises BufferError while any view is exported.
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            # A reader still holds a zero-copy view; the mapping goes when that view does.
            log.debug("segment %s still has readers' views; unmapping deferred", self.path)
        os.close(self.fd)
        self.fd = -1  # the warm-up checks this (under the io lock) before using the fd


class PrefaultWindow:
    """The warm-up thread and the window it keeps ahead of the writer.

    The window ``[max offset, max offset + window)`` (within the writer's segment and the
    next one) is reserved and faulted in; when the writer crosses ``next_at`` (the
    window's middle) the next half is requested.  A whole segment ahead (the former design)
    cost two segments of disk per idle broker; a writer faster than the warm-up reserves
    its blocks itself and takes the page faults (the slave's receive path then uses pwrite:
    see ``CommitLog.tail_is_warm``).

    ``sync_ahead`` (the log's ``flush = sync``): each faulted-in chunk is also synced, so
    the window's blocks are written extents before the writer reaches them (see the module
    docstring).  Faulting in writes no byte (the pages read as the zeros the blocks hold),
    so nothing the writer wrote meanwhile can be overwritten; the sync goes through a file
    description of the warm-up's own, so a write-back error it meets is still reported to
    the flusher's descriptor (errors are reported once per open file description).

    ``segments`` is the log's own dict of open segments; ``ready`` holds the next segment
    once warm-up created it, until the writer takes it.  ``lock`` guards both against the
    warm-up thread; ``io_lock`` is the log's (segments close under it).  ``writer_offset``
    and ``closing`` read the log's max offset and closing flag.
    """

    def __init__(self, directory: str, segment_bytes: int, codec: RecordsTwin,
                 segments: dict[int, Segment], io_lock: threading.Lock,
                 writer_offset: Callable[[], int], closing: Callable[[], bool], *,
                 window: int, enabled: bool, sync_ahead: bool = False) -> None:
        self._dir = directory
        self._sb = segment_bytes
        self._codec = codec
        self._segments = segments
        self._io_lock = io_lock
        self._writer_offset = writer_offset
        self._closing = closing
        self.window = window
        self._enabled = enabled
        self._sync_ahead = sync_ahead
        self.synced_chunks = 0  # chunks written ahead of the writer (evidence for tests)
        self.lock = threading.RLock()
        self.ready: dict[int, Segment] = {}
        self._queue: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self.upto = 0          # global offset up to which warm-up was requested
        #: Global offset up to which warm-up has faulted the window in (a hint, never a
        #: guarantee: a writer copying below it into the mapping takes no page fault).
        self.faulted = 0
        self.next_at = NEVER   # max offset at which the window moves on
        self._thread = threading.Thread(target=self._loop, name="commitlog-warm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(("stop",))
        self._thread.join()

    def take(self, base: int) -> Segment:
        """The writer's segment at ``base``: the one warm-up created, or a new file; it
        joins the log's segments under the lock (no warm-up job sees it in neither)."""
        with self.lock:
            seg = self.ready.pop(base, None)
            if seg is None:
                seg = Segment(segment_path(self._dir, base), base, self._sb, create=True)
            self._segments[base] = seg
        return seg

    def writer_entered(self, base: int) -> None:
        """The writer moved into a new segment at ``base``."""
        if self.upto <= self._writer_offset():
            self.advance()  # the writer got here before its warm-up
        # The next file now (sparse: costs no blocks), so the window can run into it.
        self._request(("create", base + self._sb))

    def discard_ready(self) -> bool:
        """Close and delete the warmed-up next segment(s) (a truncate); whether any went."""
        removed = False
        with self.lock:
            for b in list(self.ready):
                seg = self.ready.pop(b)
                seg.close()
                os.unlink(seg.path)
                removed = True
        return removed

    def pop_ready(self) -> list[Segment]:
        """Take the warmed-up segments out (for the caller to remove, holding ``lock``)."""
        with self.lock:
            return [self.ready.pop(b) for b in sorted(self.ready)]

    def close_ready(self) -> None:
        for seg in self.ready.values():
            seg.close()
        self.ready.clear()

    def restart(self) -> None:
        """Warm a fresh window from the max offset (after open, truncate and reset: the
        writer may go fast from here, and zeroed pages were left write-protected)."""
        self.upto = self.faulted = self._writer_offset()
        self.advance()

    def advance(self) -> None:
        """The writer crossed the window's middle: request the window from here on (within
        the active segment and the next one)."""
        mx = self._writer_offset()
        upto = min(mx + self.window, mx - mx % self._sb + 2 * self._sb)
        start = max(self.upto, mx)
        if start < upto:
            self._request(("range", start, upto))
            self.upto = upto
        # Half a window on (less when the next segment's end caps the window).
        self.next_at = max(upto - self.window // 2, (mx + upto) // 2 + 1)

    def wait(self, timeout: float | None = None) -> bool:
        return self._idle.wait(timeout)

    def _request(self, job: tuple[Any, ...]) -> None:
        if not self._enabled:
            return
        with self.lock:
            self._idle.clear()
            self._pending += 1
        self._queue.put(job)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job[0] == "stop":
                    return
                if job[0] == "create":
                    self._segment(job[1])
                elif job[0] == "range":
                    self._warm_range(job[1], job[2])
            except (OSError, ValueError) as exc:
                # Warming is an optimisation; a failure shows up again, loudly, on the writer.
                log.warning("commitlog warm-up %s failed: %s", job[0], exc)
            finally:
                with self.lock:
                    self._pending -= 1
                    if self._pending <= 0:
                        self._idle.set()

    def _warm_range(self, start: int, end: int) -> None:
        """Reserve and fault in the global range ``[start, end)`` (and sync it, with
        sync-ahead), segment by segment."""
        while start < end and not self._closing():
            base = start - start % self._sb
            seg = self._segment(base)
            if seg is None:
                return
            stop = min(end, base + self._sb)
            sync_fd = -1
            with self._io_lock:  # segments close (fd -1) under this lock
                if seg.fd < 0:
                    return
                seg.allocate(stop - base)
                if self._sync_ahead:
                    sync_fd = os.open(seg.path, os.O_RDONLY)
            try:
                pos = start - base
                while pos < stop - base and not self._closing():
                    upto = stop - base if sync_fd < 0 else min(stop - base, pos + SYNC_AHEAD_CHUNK)
                    # Only reserved blocks are touched (no SIGBUS on a full disk).
                    self._codec.prefault(seg.mm, pos, upto)
                    self.faulted = base + upto
                    if sync_fd >= 0:
                        # Writes the dirty zero pages and commits their extents' conversion;
                        # the fd outlives a truncate's unlink harmlessly.
                        os.fdatasync(sync_fd)
                        self.synced_chunks += 1
                    pos = upto
            finally:
                if sync_fd >= 0:
                    os.close(sync_fd)
            start = stop

    def _segment(self, base: int) -> Segment | None:
        """The segment at ``base`` for warm-up, creating the writer's next one if needed."""
        with self.lock:
            seg = self._segments.get(base) or self.ready.get(base)
            if seg is not None or self._closing():
                return seg
            # Only ever the segment right after the writer's: a job queued before a
            # truncate or reset must not leave a file beyond a gap.
            mx = self._writer_offset()
            if base != mx - mx % self._sb + self._sb:
                return None
            seg = Segment(segment_path(self._dir, base), base, self._sb, create=True)
            self.ready[base] = seg
            return seg
