"""One consume queue's files, in RocketMQ's ConsumeQueue format.

Layout (what RocketMQ's ``ConsumeQueue`` and ``MappedFileQueue`` write, so its tools read
these stores): a directory ``<root>/<topic>/<queueId>/`` of files named by the 20-digit
*byte* offset of their first unit in the queue (queue offset x 20), each
``units_per_file`` x 20 bytes (RocketMQ's ``mappedFileSizeConsumeQueue``, 300,000 units by
default).  A unit is 20 bytes, big-endian: commitlog offset (int64), record size (int32),
tag hash (int64).  Unit ``k`` of the queue is at byte ``(k - start) * 20`` of the file
starting at queue offset ``start``.  A queue that begins past a file's start (after
retention or on a slave that joined late) has the units before its first one filled with
RocketMQ's "pre-blank" unit (offset 0, size ``Integer.MAX_VALUE``, tag 0).  After the last
unit the file is zeros: RocketMQ's recovery stops at the first unit whose size is not
positive, and so does :meth:`QueueFiles.first_not`.

Files are created sparse and memory mapped; blocks are allocated ahead of the writes
(:data:`RESERVE_BYTES` at a time), so a full disk is an :class:`OSError` here and never a
SIGBUS in a write to the mapping.  Mappings come from a :class:`MappingCache` shared by all
queues, which bounds how many stay open (a queue's old files are mapped only while read).
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import shutil
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmqha._core.queue_scan_py import UNIT, UNIT_SIZE
from rmqha.store.segments import fsync_dir

log = logging.getLogger(__name__)

#: RocketMQ's default ``mappedFileSizeConsumeQueue`` in units.
DEFAULT_UNITS_PER_FILE = 300_000
INT32_MAX = (1 << 31) - 1
#: RocketMQ's ``fillPreBlank`` unit.
BLANK_UNIT = UNIT.pack(0, INT32_MAX, 0)
ZERO_UNIT = bytes(UNIT_SIZE)
#: Blocks are allocated ahead of the writes this much at a time.
RESERVE_BYTES = 1 << 16
#: Mappings kept open at most (each holds a file descriptor).
DEFAULT_MAX_MAPPED = 1024

_FILE_NAME = re.compile(r"^\d{20}$")
#: RocketMQ's valid topic characters; other names get a "~<hex>" directory.
_PLAIN_TOPIC = re.compile(rb"^[%|a-zA-Z0-9_-]+$")


def topic_dir_name(raw_topic: bytes) -> str:
    """The directory of a topic: its name when RocketMQ would accept it, else ``~`` and the
    hex of its bytes (``~`` is not a topic character, so the two never collide)."""
    if _PLAIN_TOPIC.match(raw_topic):
        return raw_topic.decode("ascii")
    return "~" + raw_topic.hex()


def topic_from_dir_name(name: str) -> bytes | None:
    """The raw topic a directory holds, None for a name no topic has."""
    if name.startswith("~"):
        try:
            return bytes.fromhex(name[1:])
        except ValueError:
            return None
    raw = name.encode("utf-8", errors="surrogateescape")
    return raw if _PLAIN_TOPIC.match(raw) else None


class MappingCache:
    """Open mappings of queue files, least recently used closed first beyond ``limit``."""

    def __init__(self, limit: int = DEFAULT_MAX_MAPPED) -> None:
        self.limit = limit
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()

    def get(self, path: str, size: int) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is not None:
            self._maps.move_to_end(path)
            return mm
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[path] = mm
        while len(self._maps) > self.limit:
            _, old = self._maps.popitem(last=False)
            old.close()
        return mm

    def drop(self, path: str) -> None:
        mm = self._maps.pop(path, None)
        if mm is not None:
            mm.close()

    def close(self) -> None:
        for mm in self._maps.values():
            mm.close()
        self._maps.clear()


class QueueFileError(Exception):
    """A queue directory that cannot be read as RocketMQ's layout (the message says why);
    the index rebuilds that queue from the commitlog."""


class QueueFiles:
    """The files of one topic/queue and the queue offsets they hold.

    ``min_offset``: the first unit that points into the log (RocketMQ's ``minLogicOffset``);
    ``max_offset``: the next unit to write.  ``dirty`` collects the paths (files and new
    directories) a flush must fdatasync.
    """

    def __init__(self, directory: Path, units_per_file: int, cache: MappingCache,
                 dirty: set[str]) -> None:
        self.dir = directory
        self._dir_prefix = str(directory) + os.sep
        self.upf = units_per_file
        self.file_bytes = units_per_file * UNIT_SIZE
        self.cache = cache
        self.dirty = dirty
        #: Queue offsets at which the files start, ascending and contiguous.
        self.starts: list[int] = []
        self.min_offset = 0
        self.max_offset = 0
        self._reserved = 0  # units of the queue with blocks allocated (in the last file)
        #: The queue's ``queue_scan.QueueSink`` (set by its owner), armed by :meth:`arm`:
        #: every method here that moves the end or the files disarms it first, so the
        #: compiled dispatch never writes through a stale one.
        self.sink: Any = None

    # --- geometry -------------------------------------------------------------------------

    def path(self, start: int) -> str:
        return f"{self._dir_prefix}{start * UNIT_SIZE:020d}"

    def file_start(self, queue_offset: int) -> int:
        return queue_offset - queue_offset % self.upf

    def _mm(self, start: int) -> mmap.mmap:
        return self.cache.get(self.path(start), self.file_bytes)

    @property
    def first_start(self) -> int:
        return self.starts[0] if self.starts else self.max_offset

    # --- reads ----------------------------------------------------------------------------

    def unit(self, queue_offset: int) -> tuple[int, int, int]:
        """(commitlog offset, size, tag hash) of any unit the files hold."""
        start = self.file_start(queue_offset)
        return UNIT.unpack_from(self._mm(start), (queue_offset - start) * UNIT_SIZE)

    def units(self, queue_offset: int, count: int) -> bytes:
        """Up to ``count`` units from ``queue_offset`` (below ``max_offset``), from one file."""
        start = self.file_start(queue_offset)
        stop = min(queue_offset + count, self.max_offset, start + self.upf)
        if stop <= queue_offset:
            return b""
        mm = self._mm(start)
        return mm[(queue_offset - start) * UNIT_SIZE:(stop - start) * UNIT_SIZE]

    def first_not(self, lo: int, hi: int, ok: Callable[[tuple[int, int, int]], bool]) -> int:
        """The first queue offset in [lo, hi) whose unit fails ``ok`` (hi if none); ``ok``
        must hold for a prefix of the range and fail for the rest."""
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(self.unit(mid)):
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- writes ---------------------------------------------------------------------------

    def _disarm(self) -> None:
        if self.sink is not None:
            self.sink.limit = 0

    def arm(self) -> None:
        """Point the sink at the file of the next unit, writable up to the blocks
        allocated (allocating ahead when none are) and the file's end; left disarmed
        when that file is not made yet or no block can be had."""
        s = self.sink
        if s is None:
            return
        s.limit = 0
        start = self.file_start(self.max_offset)
        if not self.starts or self.starts[-1] != start:
            return
        if self._reserved <= self.max_offset:
            try:
                self._reserve(self.max_offset + 1)
            except OSError:
                return  # the general way reports it on the next unit
        s.mm = self._mm(start)
        s.start = start
        s.next = self.max_offset
        s.limit = min(self._reserved, start + self.upf)

    def took(self) -> bool:
        """Take the units the compiled dispatch wrote through the sink; whether any."""
        s = self.sink
        if s is None or s.next <= self.max_offset:
            return False
        self.max_offset = s.next
        self.dirty.add(self.path(s.start))
        return True

    def begin_at(self, queue_offset: int) -> None:
        """Start an empty queue at ``queue_offset``: units before it in its file are
        RocketMQ's pre-blank units."""
        self.destroy()
        start = self.file_start(queue_offset)
        self._create(start)
        self.min_offset = self.max_offset = start
        self._reserved = start
        if queue_offset > start:
            self.append(BLANK_UNIT * (queue_offset - start))
        self.min_offset = queue_offset

    def append(self, units: bytes | memoryview) -> None:
        """Write units at ``max_offset`` on (rolling to new files as they fill)."""
        self._disarm()
        view = memoryview(units)
        while len(view):
            start = self.file_start(self.max_offset)
            if not self.starts or self.starts[-1] != start:
                self._create(start)
            room = (start + self.upf - self.max_offset) * UNIT_SIZE
            chunk = view[:room]
            n = len(chunk) // UNIT_SIZE
            self._reserve(self.max_offset + n)
            pos = (self.max_offset - start) * UNIT_SIZE
            path = self.path(start)
            self.cache.get(path, self.file_bytes)[pos:pos + len(chunk)] = chunk
            self.dirty.add(path)
            self.max_offset += n
            view = view[len(chunk):]

    def _create(self, start: int) -> None:
        new_dir = not self.dir.exists()
        if new_dir:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.dirty.add(str(self.dir.parent))
            self.dirty.add(str(self.dir.parent.parent))
        path = self.path(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self.file_bytes)
        finally:
            os.close(fd)
        self.starts.append(start)
        self._reserved = start
        self.dirty.add(str(self.dir))

    def _reserve(self, up_to: int) -> None:
        """Allocate blocks for the last file's units below queue offset ``up_to``."""
        if up_to <= self._reserved:
            return
        start = self.starts[-1]
        want = min(start + self.upf,
                   max(up_to, self._reserved + RESERVE_BYTES // UNIT_SIZE))
        fd = os.open(self.path(start), os.O_RDWR)
        try:
            at = (max(self._reserved, start) - start) * UNIT_SIZE
            try:
                os.posix_fallocate(fd, at, (want - start) * UNIT_SIZE - at)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    want = up_to  # nearly full: just what is needed, or fail
                    os.posix_fallocate(fd, at, (want - start) * UNIT_SIZE - at)
        finally:
            os.close(fd)
        self._reserved = want

    def zero(self, lo: int, hi: int) -> None:
        """Zero the units [lo, hi) (all in the files held)."""
        self._disarm()
        while lo < hi:
            start = self.file_start(lo)
            stop = min(hi, start + self.upf)
            mm = self._mm(start)
            mm[(lo - start) * UNIT_SIZE:(stop - start) * UNIT_SIZE] = bytes((stop - lo) * UNIT_SIZE)
            self.dirty.add(self.path(start))
            lo = stop

    def cut(self, queue_offset: int) -> int:
        """Drop the units from ``queue_offset`` on: zeroed, files past it deleted; returns
        how many were dropped."""
        self._disarm()
        old = self.max_offset
        if queue_offset >= old:
            return 0
        keep = max(queue_offset, self.first_start)
        for start in [s for s in self.starts if s >= keep and s > self.first_start]:
            self._delete(start)
        if self.starts:
            self.zero(keep, min(old, self.starts[-1] + self.upf))
        self.max_offset = keep
        self.min_offset = min(self.min_offset, keep)
        self._reserved = min(self._reserved, keep)
        return old - keep

    def drop_files_below(self, queue_offset: int) -> int:
        """Delete the files whose units all lie below ``queue_offset``, never the last one
        (it keeps the queue's max offset); returns how many were deleted."""
        victims = [s for s in self.starts[:-1] if s + self.upf <= queue_offset]
        for start in victims:
            self._delete(start)
        return len(victims)

    def _delete(self, start: int) -> None:
        self._disarm()
        path = self.path(start)
        self.cache.drop(path)
        self.dirty.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.starts.remove(start)

    def destroy(self) -> None:
        """Delete every file of the queue (and its directory)."""
        self._disarm()
        for start in list(self.starts):
            self._delete(start)
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            fsync_dir(str(self.dir.parent))
        self.dirty.discard(str(self.dir))
        self.min_offset = self.max_offset = self._reserved = 0

    # --- opening ----------------------------------------------------------------------------

    def load(self) -> None:
        """List the files; QueueFileError when they are not RocketMQ's layout (a name that
        is not a file start, a wrong size, a file missing between two others)."""
        self._disarm()
        starts = []
        for entry in os.scandir(self.dir):
            name = entry.name
            if name.endswith(".tmp"):
                continue
            if not _FILE_NAME.match(name):
                raise QueueFileError(f"{entry.path} is not a consume queue file name")
            byte_offset = int(name)
            if byte_offset % self.file_bytes:
                raise QueueFileError(f"{entry.path} does not start at a multiple of "
                                     f"{self.file_bytes} bytes ({self.upf} units)")
            size = entry.stat().st_size
            if size != self.file_bytes:
                raise QueueFileError(f"{entry.path} is {size} bytes, not {self.file_bytes}")
            starts.append(byte_offset // UNIT_SIZE)
        starts.sort()
        for prev, nxt in zip(starts, starts[1:]):
            if nxt != prev + self.upf:
                raise QueueFileError(f"{self.path(prev + self.upf)} is missing (the queue has "
                                     f"{self.path(prev)} and then {self.path(nxt)})")
        self.starts = starts
        self.min_offset = self.max_offset = starts[0] if starts else 0
        self._reserved = self.max_offset

    def settle_end(self, max_offset: int, thorough: bool) -> int:
        """Make ``max_offset`` the queue's end after a restart: zero what follows it in its
        file (units written after the last checkpoint) and delete later files.  Only the
        units up to the first zero one are looked at, unless ``thorough`` (after a reboot
        pages can reach the disk in any order, so units may follow a zero one).  Returns
        how many units were dropped (zeroed, or in the deleted files)."""
        self._disarm()
        zeroed = 0
        for start in [s for s in self.starts if s > max_offset
                      or (s == max_offset and s > self.first_start)]:
            zeroed += self._first_zero_unit(self._mm(start), 0) // UNIT_SIZE
            self._delete(start)
        self.max_offset = max_offset
        self._reserved = max_offset
        if not self.starts:
            return zeroed
        start = self.starts[-1]
        mm = self._mm(start)
        at = (max_offset - start) * UNIT_SIZE
        stop = self._first_zero_unit(mm, at) if not thorough else self.file_bytes
        pos = at
        while pos < stop:
            step = min(stop - pos, 1 << 20)
            chunk = mm[pos:pos + step]
            if chunk.count(0) != len(chunk):
                zeroed += sum(1 for i in range(0, len(chunk), UNIT_SIZE)
                              if chunk[i:i + UNIT_SIZE] != ZERO_UNIT)
                mm[pos:pos + step] = bytes(step)
                self.dirty.add(self.path(start))
            pos += step
        return zeroed

    def _first_zero_unit(self, mm: mmap.mmap, at: int) -> int:
        """Byte position of the first all-zero unit at or after ``at`` (the file size if
        none)."""
        pos = at
        while pos < self.file_bytes:
            hit = mm.find(ZERO_UNIT, pos)
            if hit < 0:
                return self.file_bytes
            aligned = hit + (-(hit - at)) % UNIT_SIZE
            if aligned == hit or mm[aligned:aligned + UNIT_SIZE] == ZERO_UNIT:
                return aligned
            pos = aligned
        return self.file_bytes
