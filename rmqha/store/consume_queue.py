"""Per topic/queue indexes: queue offset -> (commitlog offset, size, tag hash).

The index is built by scanning the commitlog's own records, and only up to the confirm
offset, so a consumer never sees a message a failover could take back.  It lives in
memory (three packed arrays per queue, 20 bytes per message) and is rebuilt by a scan on
start; :meth:`ConsumeQueueIndex.truncate` cuts it with the commitlog when a slave drops
its tail, :meth:`ConsumeQueueIndex.trim_below` when retention deletes segments.  Queue
offsets come from the records (the commitlog assigns them), so the index and the log can
never disagree on them.
"""
from __future__ import annotations

import bisect
import logging
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from rmqha import _core
from rmqha.protocol.message import tag_hash

log = logging.getLogger(__name__)

_queue_scan = _core.load("queue_scan")
_NO_TOPICS: frozenset[bytes] = frozenset()


def _tag_hash_bytes(raw: bytes) -> int:
    """The tag hash of a raw TAGS value that is not ASCII (ASCII ones hash in C)."""
    return tag_hash(raw.decode("utf-8", errors="replace"))



class LogReader(Protocol):
    """What the index needs from a commitlog."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def read(self, offset: int, size: int) -> memoryview: ...

    def segment_end(self, offset: int) -> int: ...


@dataclass(frozen=True)
class IndexEntry:
    queue_offset: int
    commit_offset: int
    size: int
    tag_hash: int


class QueueIndex:
    """The index of one topic/queue: consecutive queue offsets from ``base``."""

    __slots__ = ("topic", "queue_id", "base", "phys", "sizes", "tags")

    def __init__(self, topic: str, queue_id: int, base: int = 0) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.base = base
        self.phys = array("q")
        self.sizes = array("i")
        self.tags = array("q")

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """The next queue offset to be indexed (RocketMQ's "max offset")."""
        return self.base + len(self.phys)

    def __len__(self) -> int:
        return len(self.phys)

    def add(self, queue_offset: int, commit_offset: int, size: int, tag: int) -> bool:
        """Append one entry; False (and nothing changed) for a queue offset already held."""
        end = self.max_offset
        if queue_offset != end:
            if not self.phys:
                # First entry after retention or on an empty index: start where the log does.
                self.base = queue_offset
            elif queue_offset < end:
                log.warning("index %s/%d: queue offset %d already indexed (next %d); skipped",
                            self.topic, self.queue_id, queue_offset, end)
                return False
            else:
                # A hole means records were lost below us; keep serving from the new point
                # rather than inventing entries (consumers get PULL_OFFSET_MOVED for the hole).
                log.warning("index %s/%d: gap from %d to %d; restarting the index there",
                            self.topic, self.queue_id, end, queue_offset)
                self.clear(queue_offset)
        self.phys.append(commit_offset)
        self.sizes.append(size)
        self.tags.append(tag)
        return True

    def extend(self, first: int, phys: bytes, sizes: bytes, tags: bytes) -> int:
        """Append a run of entries with consecutive queue offsets from ``first`` (native
        int64 / int32 / int64 bytes, as ``rmqha._core.queue_scan`` makes them), by the
        rules of :meth:`add`; returns how many leading entries were already held."""
        end = self.max_offset
        skip = 0
        if first != end:
            if not self.phys:
                self.base = first
            elif first < end:
                skip = min(len(sizes) // 4, end - first)
                log.warning("index %s/%d: queue offsets %d..%d already indexed (next %d); "
                            "skipped", self.topic, self.queue_id, first, first + skip - 1, end)
            else:
                log.warning("index %s/%d: gap from %d to %d; restarting the index there",
                            self.topic, self.queue_id, end, first)
                self.clear(first)
        if skip:
            phys, sizes, tags = phys[8 * skip:], sizes[4 * skip:], tags[8 * skip:]
        self.phys.frombytes(phys)
        self.sizes.frombytes(sizes)
        self.tags.frombytes(tags)
        return skip

    def clear(self, base: int) -> None:
        self.base = base
        del self.phys[:]
        del self.sizes[:]
        del self.tags[:]

    def get(self, queue_offset: int) -> IndexEntry | None:
        i = queue_offset - self.base
        if 0 <= i < len(self.phys):
            return IndexEntry(queue_offset, self.phys[i], self.sizes[i], self.tags[i])
        return None

    def slice(self, queue_offset: int, count: int) -> tuple[array, array, array]:
        """Up to ``count`` entries from ``queue_offset`` (which must be within the index)."""
        i = queue_offset - self.base
        j = min(len(self.phys), i + count)
        return self.phys[i:j], self.sizes[i:j], self.tags[i:j]

    def truncate_phys(self, commit_offset: int) -> int:
        """Drop entries whose record starts at or after ``commit_offset``; returns how many."""
        i = bisect.bisect_left(self.phys, commit_offset)
        n = len(self.phys) - i
        if n:
            del self.phys[i:]
            del self.sizes[i:]
            del self.tags[i:]
        return n

    def trim_phys_below(self, commit_offset: int) -> int:
        """Drop entries whose record starts below ``commit_offset``; returns how many."""
        i = bisect.bisect_left(self.phys, commit_offset)
        if i:
            del self.phys[:i]
            del self.sizes[:i]
            del self.tags[:i]
            self.base += i
        return i

    def offset_for_commit_offset(self, commit_offset: int) -> int:
        """The queue offset of the first entry at or after a commitlog offset."""
        return self.base + bisect.bisect_left(self.phys, commit_offset)


@dataclass
class ScannedRecord:
    """A record the scan found in a watched topic (the state log)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    size: int


class ConsumeQueueIndex:
    """Every queue's index, advanced by scanning the commitlog up to a given offset."""

    def __init__(self, watched_topics: Iterable[str] = (),
                 watched_property: bytes | None = None) -> None:
        self.queues: dict[tuple[str, int], QueueIndex] = {}
        #: Records of any topic whose properties hold this key are handed to on_watched
        #: too (committed transactional messages carry TRAN_PREPARED_QUEUE_OFFSET).
        self.watched_property = None if watched_property is None else watched_property + b"\x01"
        #: Commitlog position up to which records were scanned (always a record boundary).
        self.indexed_offset = 0
        self.watched_topics = frozenset(watched_topics)
        self._watched_bytes = frozenset(t.encode() for t in self.watched_topics)
        # Topic bytes -> str, so a scan decodes each topic name once.
        self._topic_names: dict[bytes, str] = {}

    def queue(self, topic: str, queue_id: int) -> QueueIndex | None:
        return self.queues.get((topic, queue_id))

    def topics(self) -> set[str]:
        return {t for t, _ in self.queues}

    def advance(self, log_: LogReader, up_to: int,
                on_watched: Callable[[ScannedRecord], None] | None = None) -> set[tuple[str, int]]:
        """Index every whole record in [indexed_offset, up_to); returns the queues that grew."""
        grown: set[tuple[str, int]] = set()
        low = log_.min_offset
        if self.indexed_offset < low:
            self.indexed_offset = low
        # A slave's log may end inside a record; only whole records are indexed.
        up_to = min(up_to, getattr(log_, "whole_offset", log_.max_offset))
        pos = self.indexed_offset
        while pos < up_to:
            seg_end = log_.segment_end(pos)
            stop = min(up_to, seg_end)
            view = log_.read(pos, stop - pos)
            consumed = self._scan(view, pos, grown, on_watched)
            pos += consumed
            if pos < stop:
                if stop == seg_end:
                    # The rest of the segment is a blank (or not a record): the writer
                    # moved on to the next segment.
                    pos = seg_end
                    continue
                break
        self.indexed_offset = max(self.indexed_offset, pos)
        return grown

    def _scan(self, view: memoryview, base: int, grown: set[tuple[str, int]],
              on_watched: Callable[[ScannedRecord], None] | None) -> int:
        # The per-record walk is compiled (rmqha._core.queue_scan): one run per stretch of
        # consecutive records of a queue, added here with three array extends.
        watched_prop = self.watched_property if on_watched is not None else None
        watched = self._watched_bytes if on_watched is not None else _NO_TOPICS
        consumed, runs, bad = _queue_scan.index_runs(view, base, watched, watched_prop,
                                                     _tag_hash_bytes)
        queues = self.queues
        topic_names = self._topic_names
        for raw_topic, queue_id, first, phys, sizes, tags, hits in runs:
            topic = topic_names.get(raw_topic)
            if topic is None:
                topic = topic_names[raw_topic] = raw_topic.decode("utf-8", errors="replace")
            key = (topic, queue_id)
            q = queues.get(key)
            if q is None:
                q = queues[key] = QueueIndex(topic, queue_id, first)
            skipped = q.extend(first, phys, sizes, tags)
            if skipped < len(sizes) // 4:
                grown.add(key)
                if hits and on_watched is not None:
                    ph = array("q", phys)
                    sz = array("i", sizes)
                    for i in hits:
                        if i >= skipped:
                            on_watched(ScannedRecord(topic, queue_id, first + i, ph[i], sz[i]))
        if bad is not None:
            at, magic, total = bad
            log.error("index scan: no record at commitlog offset %d (magic %#x, size %d)",
                      base + at, magic, total)
        return consumed

    def truncate(self, commit_offset: int) -> None:
        """The commitlog was cut at ``commit_offset``: forget everything from there on."""
        for q in self.queues.values():
            q.truncate_phys(commit_offset)
        if self.indexed_offset > commit_offset:
            self.indexed_offset = commit_offset

    def trim_below(self, commit_offset: int) -> None:
        """Segments below ``commit_offset`` were deleted: drop their entries."""
        for q in self.queues.values():
            q.trim_phys_below(commit_offset)
        if self.indexed_offset < commit_offset:
            self.indexed_offset = commit_offset

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self.queues if k[0] == topic]:
            del self.queues[key]
