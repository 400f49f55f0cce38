"""One consume queue in memory: :class:`QueueIndex`, a queue's units (commitlog offset,
size, tag hash) over its files' mappings, read by queue offset.

Its reads go back to the index that owns it (:class:`QueueOwner`, which
:class:`rmqha.store.consume_queue.ConsumeQueueIndex` is): a unit is checked against the
record it points at before it is served, and a queue that fails the check is rebuilt from
the commitlog there, where the log is. The owner is named by that Protocol, not imported,
since it imports this module.
"""
from __future__ import annotations

import logging
import struct
from array import array
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Protocol

from rmqha import _core
from rmqha.store.consume_queue_file import (
    INT32_MAX,
    QueueFiles,
)

log = logging.getLogger(__name__)

_queue_scan = _core.load("queue_scan")
#: A unit of a queue's file: commitlog offset, size, tag hash (20 bytes, big-endian).
UNIT = struct.Struct(">qiq")


def is_blank(unit: tuple[int, int, int]) -> bool:
    """RocketMQ's pre-blank unit (offset 0, size Integer.MAX_VALUE) before a queue's first."""
    return unit[1] == INT32_MAX and unit[0] == 0



@dataclass(frozen=True)
class IndexEntry:
    queue_offset: int
    commit_offset: int
    size: int
    tag_hash: int




class QueueOwner(Protocol):
    """What a queue asks of the index that owns it: its units checked against the log."""

    def checked_unit(self, q: QueueIndex, k: int) -> tuple[int, int, int]: ...

    def checked_slice(self, q: QueueIndex, k: int, count: int) -> tuple[array[int], array[int], array[int]]: ...

    def read_answer(self, q: QueueIndex, k: int, count: int, hashes: Container[int] | None,
                    max_bytes: int) -> tuple[bytes, int] | None: ...


class _Column:
    """``q.phys[i]`` / ``q.sizes[i]`` / ``q.tags[i]``: field ``f`` of unit ``base + i``,
    read from the mapping as asked (no check against the log: see :meth:`QueueIndex.get`)."""

    __slots__ = ("_q", "_f")

    def __init__(self, q: QueueIndex, f: int) -> None:
        self._q = q
        self._f = f

    def __len__(self) -> int:
        return len(self._q)

    def __getitem__(self, i: int) -> int:
        n = len(self._q)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"unit {i} of a queue holding {n}")
        return self._q.files.unit(self._q.min_offset + i)[self._f]


class PartialWrite(Exception):
    """A queue took only the units before ``next_offset`` (the filesystem is full)."""

    def __init__(self, next_offset: int, cause: OSError) -> None:
        super().__init__(str(cause))
        self.next_offset = next_offset


class QueueIndex:
    """The index of one topic/queue: consecutive queue offsets from ``min_offset``."""

    __slots__ = ("topic", "raw_topic", "queue_id", "files", "_owner", "phys", "sizes", "tags")

    def __init__(self, owner: QueueOwner, topic: str, raw_topic: bytes, queue_id: int,
                 files: QueueFiles) -> None:
        self.topic = topic
        self.raw_topic = raw_topic
        self.queue_id = queue_id
        self.files = files
        self._owner = owner
        files.sink = _queue_scan.QueueSink((topic, queue_id), raw_topic, queue_id)
        self.phys = _Column(self, 0)
        self.sizes = _Column(self, 1)
        self.tags = _Column(self, 2)

    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def base(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        """The next queue offset to be indexed (RocketMQ's "max offset")."""
        return self.files.max_offset

    def __len__(self) -> int:
        return self.files.max_offset - self.files.min_offset

    # --- writes -------------------------------------------------------------------------

    def extend(self, first: int, units: bytes) -> int:
        """Append a run of units with consecutive queue offsets from ``first``; returns how
        many leading ones were already held.  A queue holding nothing starts where the
        run does; a gap (records lost below us) restarts the queue there rather than
        invent entries (consumers get PULL_OFFSET_MOVED for the hole)."""
        f = self.files
        end = f.max_offset
        skip = 0
        if first != end:
            if not len(self) or not f.starts:
                self._restart(first)
            elif first < end:
                skip = min(len(units) // UNIT.size, end - first)
                log.warning("index %s/%d: queue offsets %d..%d already indexed (next %d); "
                            "skipped", self.topic, self.queue_id, first, first + skip - 1, end)
            else:
                log.warning("index %s/%d: gap from %d to %d; restarting the index there",
                            self.topic, self.queue_id, end, first)
                self._restart(first)
        elif not f.starts:
            self._restart(first)
        written_from = f.max_offset
        try:
            f.append(units[UNIT.size * skip:] if skip else units)
        except OSError as exc:
            raise PartialWrite(f.max_offset if f.max_offset >= written_from else first,
                                exc) from exc
        return skip

    def _restart(self, first: int) -> None:
        try:
            self.files.begin_at(first)
        except OSError as exc:
            self.files.destroy()
            raise PartialWrite(first, exc) from exc

    # --- reads --------------------------------------------------------------------------

    def get(self, queue_offset: int) -> IndexEntry | None:
        """The entry at ``queue_offset``, checked against its record; None outside."""
        if not self.min_offset <= queue_offset < self.max_offset:
            return None
        phys, size, tag = self._owner.checked_unit(self, queue_offset)
        return IndexEntry(queue_offset, phys, size, tag)

    def slice(self, queue_offset: int, count: int) -> tuple[array[int], array[int], array[int]]:
        """Up to ``count`` entries from ``queue_offset`` (which must be within the index),
        each checked against its record (a damaged queue is rebuilt first)."""
        return self._owner.checked_slice(self, queue_offset, count)

    def answer(self, queue_offset: int, count: int, hashes: Container[int] | None,
               max_bytes: int) -> tuple[bytes, int] | None:
        """A pull answer from ``queue_offset`` (within the index) in one checked pass: see
        :meth:`ConsumeQueueIndex.read_answer`."""
        return self._owner.read_answer(self, queue_offset, count, hashes, max_bytes)

    def entries(self, start: int | None = None) -> Iterator[IndexEntry]:
        """Every entry from ``start`` (default: the first), checked."""
        k = self.min_offset if start is None else max(start, self.min_offset)
        while k < self.max_offset:
            phys, sizes, tags = self.slice(k, 1024)
            if not phys:
                return
            for i in range(len(phys)):
                yield IndexEntry(k + i, phys[i], sizes[i], tags[i])
            k += len(phys)

    def offset_for_commit_offset(self, commit_offset: int) -> int:
        """The queue offset of the first entry at or after a commitlog offset."""
        return self.files.first_not(self.min_offset, self.max_offset,
                                    lambda u: u[0] < commit_offset)

    def first_at_or_past(self, commit_offset: int) -> int:
        """Like :meth:`offset_for_commit_offset`, over every unit the files hold (pre-blank
        ones and those below the log start count as before any offset)."""
        f = self.files
        return f.first_not(f.first_start, f.max_offset,
                           lambda u: is_blank(u) or u[0] < commit_offset)
