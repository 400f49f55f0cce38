"""Per topic/queue indexes: queue offset -> (commitlog offset, size, tag hash), in files.

The consume queues are RocketMQ ConsumeQueue files (layout in
:mod:`rmqha.store.consume_queue_file`) under one root directory, memory mapped: the index
is the mappings, so memory stays flat as the log grows.  They are built by dispatching the
commitlog's own records (:meth:`ConsumeQueueIndex.advance`), and only up to the confirm
offset, so a consumer never sees a message a failover could take back.  Queue offsets come
from the records (the commitlog assigns them), so the index and the log can never
disagree on them.  A confirm's records usually go in one compiled call
(``queue_scan.dispatch``) straight into the queues' files through each queue's armed
sink (:meth:`QueueFiles.arm`); what it does not take goes the general way.

Durability: a flush (every ``flush_interval_s``, on a thread of its own) fdatasyncs the
files written since the last one, then records in the dispatch checkpoint
(:class:`~rmqha.store.checkpoint.DispatchCheckpoint`, file ``checkpoint`` in the root,
RocketMQ's StoreCheckpoint idea) the commitlog offset every unit below which is durable.

Recovery (:meth:`ConsumeQueueIndex.recover`) is bounded by what was dispatched since that
checkpoint, not by the log: with ``T`` = min(checkpoint, end of the log), each queue keeps
its units up to the first one that is not a unit or points at or past ``T`` (a binary
search: the units below ``T`` were durable and in order), zeroes what follows, checks its
first and last kept units against the records they point at, and the log is dispatched
again from ``T`` only.  A queue whose files are not RocketMQ's layout or whose units do
not match the log is rebuilt from the commitlog (the log line says why); so is every
queue when the checkpoint is missing or corrupt.  Reads check each unit against the
record it points at (magic, size, queue id, queue offset, topic) and rebuild the queue
rather than serve a wrong record.

:meth:`ConsumeQueueIndex.truncate` cuts the queues with the commitlog when a slave drops
its tail (lowering the checkpoint first), :meth:`ConsumeQueueIndex.trim_below` follows
retention (whole files below the new start are deleted, the last file of a queue is kept
for its max offset, as RocketMQ does).

One queue's units, read by queue offset, are :mod:`rmqha.store.queue_index`'s
(:class:`~rmqha.store.queue_index.QueueIndex`); this module keeps them all, durable and true
to the log.
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from array import array
from collections.abc import Callable, Container, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rmqha import _core
from rmqha._core._protocols import QueueSinkLike
from rmqha.errors import StoreError
from rmqha.protocol.message import tag_hash
from rmqha.store.checkpoint import (
    DISPATCH_CHECKPOINT_FILE,
    DispatchCheckpoint,
    DispatchState,
)
from rmqha.store.consume_queue_file import (
    DEFAULT_MAX_MAPPED,
    DEFAULT_UNITS_PER_FILE,
    MappingCache,
    QueueFileError,
    QueueFiles,
    topic_dir_name,
    topic_from_dir_name,
)
from rmqha.store.queue_index import UNIT, PartialWrite, QueueIndex, is_blank
from rmqha.store.segments import fsync_dir

log = logging.getLogger(__name__)

_queue_scan = _core.load("queue_scan")
_pull_answer = _core.load("pull_answer")
_NO_TOPICS: frozenset[bytes] = frozenset()
_PHYS_SIZE = struct.Struct(">qi")
#: A record's total size, magic, body CRC, queue id, flag, queue offset.
_RECORD_HEAD = struct.Struct(">iIiiiq")
_MESSAGE_MAGIC = 0xDAA320A7
_FIXED = 91
#: The log is dispatched this many bytes at a time (bounds the memory one scan takes).
SCAN_CHUNK = 8 << 20


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


def _log_end(log_: LogReader) -> int:
    # A slave's log may end inside a record; only whole records are indexed.
    return int(getattr(log_, "whole_offset", log_.max_offset))


@dataclass
class ScannedRecord:
    """A record the scan found in a watched topic (the state log)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    size: int


@dataclass
class RecoveryReport:
    """What :meth:`ConsumeQueueIndex.recover` found and did."""

    #: The checkpoint read (None: missing or corrupt).
    checkpoint: int | None
    #: Where dispatching starts again.
    start: int
    clean: bool = False
    queues: int = 0
    #: Units written after the checkpoint, zeroed (they are dispatched again).
    units_dropped: int = 0
    #: Queue -> why it was rebuilt from the commitlog.
    rebuilt: dict[tuple[str, int], str] = field(default_factory=dict)
    full_rebuild: str | None = None


class ConsumeQueueIndex:
    """Every queue's index, advanced by dispatching the commitlog up to a given offset.

    ``directory`` is the ``consumequeue`` root.  Call :meth:`recover` with the log before
    anything else (:meth:`advance` does it on first use)."""

    def __init__(self, directory: str | os.PathLike[str], watched_topics: Iterable[str] = (),
                 watched_property: bytes | None = None, *,
                 units_per_file: int = DEFAULT_UNITS_PER_FILE, flush_interval_s: float = 1.0,
                 max_mapped_files: int = DEFAULT_MAX_MAPPED) -> None:
        if units_per_file < 1:
            raise StoreError(f"units_per_file must be >= 1, got {units_per_file}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.units_per_file = units_per_file
        self.flush_interval_s = flush_interval_s
        self.queues: dict[tuple[str, int], QueueIndex] = {}
        #: Records of any topic whose properties hold this key are handed to on_watched
        #: too (committed transactional messages carry TRAN_PREPARED_QUEUE_OFFSET).
        self.watched_property = None if watched_property is None else watched_property + b"\x01"
        #: Commitlog position up to which records were dispatched (a record boundary).
        self.indexed_offset = 0
        #: The offset the checkpoint file holds (every unit below it is durable).
        self.durable_offset = 0
        #: Records written into the queues by this object (a restart's re-dispatch counts).
        self.dispatched = 0
        self.last_recovery: RecoveryReport | None = None
        self.watched_topics = frozenset(watched_topics)
        self._watched_bytes = frozenset(t.encode() for t in self.watched_topics)
        # Topic bytes -> str, so a scan decodes each topic name once.
        self._topic_names: dict[bytes, str] = {}
        #: (topic bytes, queue id) -> the queue's sink, for the compiled dispatch.
        self._sinks: dict[tuple[bytes, int], QueueSinkLike] = {}
        self._dispatch_calls = 0
        self._cache = MappingCache(max_mapped_files)
        self._dirty: set[str] = set()
        self._checkpoint = DispatchCheckpoint(self.dir / DISPATCH_CHECKPOINT_FILE)
        self._log: LogReader | None = None
        self._blocked = False
        self._space_error = False
        self._last_flush = time.monotonic()
        self._flusher: ThreadPoolExecutor | None = None
        self._flushing = False
        #: Serialises checkpoint writes; a truncation bumps the generation so a flush
        #: started before it cannot record an offset past the cut.
        self._cp_lock = threading.Lock()
        self._generation = 0
        self._closed = False

    # --- queues -------------------------------------------------------------------------

    def queue(self, topic: str, queue_id: int) -> QueueIndex | None:
        return self.queues.get((topic, queue_id))

    def topics(self) -> set[str]:
        return {t for t, _ in self.queues}

    def _topic_name(self, raw: bytes) -> str:
        topic = self._topic_names.get(raw)
        if topic is None:
            topic = self._topic_names[raw] = raw.decode("utf-8", errors="replace")
        return topic

    def _make_queue(self, raw_topic: bytes, queue_id: int) -> QueueIndex:
        topic = self._topic_name(raw_topic)
        files = QueueFiles(self.dir / topic_dir_name(raw_topic) / str(queue_id),
                           self.units_per_file, self._cache, self._dirty)
        q = self.queues[(topic, queue_id)] = QueueIndex(self, topic, raw_topic, queue_id, files)
        self._sinks[(raw_topic, queue_id)] = files.sink
        return q

    # --- recovery -----------------------------------------------------------------------

    def recover(self, log_: LogReader) -> RecoveryReport:
        """Open the queue files against ``log_`` (see the module docstring); dispatching
        then resumes at ``indexed_offset``."""
        self._log = log_
        low, end = log_.min_offset, _log_end(log_)
        state = self._checkpoint.read()
        listing = self._listing()
        if state is None:
            report = self._start_over(listing, low, end)
        else:
            report = self._reopen(log_, listing, state, low, end)
        self.indexed_offset = self.durable_offset = report.start
        report.queues = len(self.queues)
        self.last_recovery = report
        return report

    def _start_over(self, listing: list[tuple[bytes, int]], low: int, end: int) -> RecoveryReport:
        """No usable checkpoint: nothing in the files is trusted, the log is dispatched
        from its start."""
        report = RecoveryReport(None, low)
        if listing:
            report.full_rebuild = "its checkpoint is missing or corrupt"
            log.error("consume queues in %s: %s; rebuilding every queue from the commitlog "
                      "(%d bytes)", self.dir, report.full_rebuild, end - low)
        elif end > low:
            log.info("consume queues in %s: none yet; building them from the commitlog "
                     "(%d bytes)", self.dir, end - low)
        self._wipe()
        return report

    def _reopen(self, log_: LogReader, listing: list[tuple[bytes, int]], state: DispatchState,
                low: int, end: int) -> RecoveryReport:
        """Keep what the checkpoint covers of every queue, rebuild the damaged ones."""
        threshold = min(state.offset, end)
        if state.offset > end:
            log.warning("consume queues in %s: checkpoint %d is past the log end %d (the log "
                        "was cut): cutting the queues there", self.dir, state.offset, end)
        report = RecoveryReport(state.offset, max(threshold, low), clean=state.clean)
        bad: dict[tuple[bytes, int], str] = {}
        for raw_topic, queue_id in listing:
            why = self._open_queue(raw_topic, queue_id, threshold, low, report,
                                   thorough=not state.same_boot)
            if why is not None:
                bad[(raw_topic, queue_id)] = why
        if bad:
            self._rebuild(log_, bad, report.start, report)
        if not state.clean:
            log.info("consume queues in %s were not closed cleanly (%s): kept what the "
                     "checkpoint at %d covers, %d later unit(s) dropped; re-dispatching the "
                     "log from %d (%d bytes)", self.dir,
                     "same boot" if state.same_boot else "after a reboot", state.offset,
                     report.units_dropped, report.start, end - report.start)
        return report

    def _listing(self) -> list[tuple[bytes, int]]:
        out = []
        for topic_entry in os.scandir(self.dir):
            if not topic_entry.is_dir():
                continue
            raw = topic_from_dir_name(topic_entry.name)
            if raw is None:
                log.warning("consume queues: %s is not a topic directory; ignored",
                            topic_entry.path)
                continue
            for q_entry in os.scandir(topic_entry.path):
                if q_entry.is_dir() and q_entry.name.isdigit():
                    out.append((raw, int(q_entry.name)))
        return sorted(out)

    def _wipe(self) -> None:
        for entry in os.scandir(self.dir):
            if entry.is_dir() and topic_from_dir_name(entry.name) is not None:
                shutil.rmtree(entry.path, ignore_errors=True)
        fsync_dir(str(self.dir))
        for q in self.queues.values():
            q.files.sink.limit = 0
        self.queues.clear()
        self._sinks.clear()

    def _open_queue(self, raw_topic: bytes, queue_id: int, threshold: int, low: int,
                    report: RecoveryReport, *, thorough: bool) -> str | None:
        """Load one queue; the reason it must be rebuilt, or None."""
        q = self._make_queue(raw_topic, queue_id)
        f = q.files
        try:
            f.load()
        except QueueFileError as exc:
            return str(exc)
        if not f.starts:
            self._forget(q)
            return None
        first = f.first_start
        durable = f.first_not(
            first, f.starts[-1] + f.upf,
            lambda u: u[1] > 0 and u[0] >= 0 and (u[0] < threshold or is_blank(u)))
        report.units_dropped += f.settle_end(durable, thorough)
        if durable == first:
            self._forget(q)  # nothing durable: dispatching again rebuilds it
            return None
        f.min_offset = f.first_not(first, durable, lambda u: is_blank(u) or u[0] < low)
        f.drop_files_below(f.min_offset)
        if len(q):
            for k in {q.min_offset, q.max_offset - 1}:
                why = self._mismatch(q, k, f.unit(k))
                if why is not None:
                    return why
        return None

    def _forget(self, q: QueueIndex) -> None:
        q.files.destroy()
        self.queues.pop((q.topic, q.queue_id), None)

    def _rebuild(self, log_: LogReader, bad: dict[tuple[bytes, int], str], up_to: int,
                 report: RecoveryReport) -> None:
        """Rebuild ``bad`` queues from the commitlog up to ``up_to`` (one pass for all)."""
        keys = set()
        for (raw_topic, queue_id), why in bad.items():
            topic = self._topic_name(raw_topic)
            log.error("consume queue %s/%d: %s; rebuilding it from the commitlog", topic,
                      queue_id, why)
            report.rebuilt[(topic, queue_id)] = why
            q = self.queues.get((topic, queue_id)) or self._make_queue(raw_topic, queue_id)
            q.files.destroy()
            keys.add((topic, queue_id))
        self._dispatch(log_, log_.min_offset, up_to, None, keys)
        for key in keys:
            rebuilt = self.queues.get(key)
            if rebuilt is not None and not rebuilt.files.starts:
                del self.queues[key]  # no record of it is left in the log

    # --- checking units against the log -------------------------------------------------

    def _mismatch(self, q: QueueIndex, k: int, unit: tuple[int, int, int]) -> str | None:
        """Why unit ``k`` of ``q`` does not describe the record it points at, or None."""
        log_ = self._log
        if log_ is None:
            return None
        phys, size, _ = unit
        if size < _FIXED or phys < log_.min_offset or phys + size > _log_end(log_):
            return (f"unit {k} points at {size} bytes at commitlog offset {phys}, outside "
                    f"the log ({log_.min_offset}..{_log_end(log_)})")
        try:
            rec = log_.read(phys, size)
        except StoreError as exc:
            return f"unit {k} points at commitlog offset {phys}, which cannot be read: {exc}"
        total, magic, _, qid, _, qoff = _RECORD_HEAD.unpack_from(rec, 0)
        blen = struct.unpack_from(">i", rec, 84)[0]
        topic = b""
        if magic == _MESSAGE_MAGIC and 0 <= blen <= size - _FIXED:
            tlen = rec[88 + blen]
            topic = bytes(rec[89 + blen:89 + blen + tlen])
        if (magic, total, qid, qoff, topic) != (_MESSAGE_MAGIC, size, q.queue_id, k,
                                                q.raw_topic):
            return (f"unit {k} (commitlog offset {phys}, {size} bytes) does not match the "
                    f"record there (magic {magic:#x}, {total} bytes, queue {qid}, queue "
                    f"offset {qoff}, topic {topic!r})")
        return None

    def checked_unit(self, q: QueueIndex, k: int) -> tuple[int, int, int]:
        phys, sizes, tags = self.checked_slice(q, k, 1)
        if not phys:
            raise StoreError(f"consume queue {q.topic}/{q.queue_id} no longer holds {k}")
        return phys[0], sizes[0], tags[0]

    def checked_slice(self, q: QueueIndex, k: int, count: int,
                      ) -> tuple[array[int], array[int], array[int]]:
        for _attempt in range(2):
            raw = q.files.units(k, count)
            why = self._first_bad(q, k, raw)
            if why is None:
                if not raw:
                    break
                phys, sizes, tags = zip(*UNIT.iter_unpack(raw))
                return array("q", phys), array("i", sizes), array("q", tags)
            self._repair(q, why)
            if not q.min_offset <= k < q.max_offset:
                break
        return array("q"), array("i"), array("q")

    def read_answer(self, q: QueueIndex, k: int, count: int, hashes: Container[int] | None,
                    max_bytes: int) -> tuple[bytes, int] | None:
        """``(records, units covered)`` of a pull answer from queue offset ``k``: up to
        ``count`` units, records back to back within ``max_bytes`` (the first always), those
        whose tag hash is in ``hashes`` (when given).  One compiled pass per segment checks
        every unit against its record as :meth:`checked_slice` does and every record taken
        as the commitlog's ``verify`` does (lengths, offset, body CRC), and copies them.
        None when there is nothing to read or any check fails: the caller takes the
        checked path then (:meth:`checked_slice` repairs the queue, ``verify`` names the
        bad record), so a damaged store answers exactly as it did before this pass."""
        log_ = self._log
        raw = q.files.units(k, count)
        n = len(raw) // UNIT.size
        if log_ is None or not n:
            return None
        low, end = log_.min_offset, _log_end(log_)
        parts: list[bytes] = []
        i = total = taken = 0
        while True:
            phys, size = _PHYS_SIZE.unpack_from(raw, UNIT.size * i)
            if size < _FIXED or phys < low or phys + size > end:
                return None
            view = log_.read(phys, min(log_.segment_end(phys), end) - phys)
            j, how, taken, total, part = _pull_answer.assemble(
                view, phys, raw, i, n, k, q.queue_id, q.raw_topic, hashes, max_bytes, total,
                taken)
            parts.append(part)
            if how == _pull_answer.DONE:
                return (parts[0] if len(parts) == 1 else b"".join(parts)), taken
            if how != _pull_answer.OUTSIDE or j == i:
                return None
            i = j

    def _first_bad(self, q: QueueIndex, k: int, raw: bytes) -> str | None:
        """Why the first of the units ``raw`` (from queue offset ``k``) that does not match
        its record fails, or None when all match (checked in C a segment at a time)."""
        log_ = self._log
        if log_ is None:
            return None
        n = len(raw) // UNIT.size
        low, end = log_.min_offset, _log_end(log_)
        i = 0
        while i < n:
            unit = UNIT.unpack_from(raw, UNIT.size * i)
            phys, size = unit[0], unit[1]
            if size < _FIXED or phys < low or phys + size > end:
                return self._mismatch(q, k + i, unit)
            stop = min(log_.segment_end(phys), end)
            j, bad = _queue_scan.check_units(log_.read(phys, stop - phys), phys, raw, i, n, k,
                                             q.queue_id, q.raw_topic)
            if bad or j == i:
                unit = UNIT.unpack_from(raw, UNIT.size * j)
                return self._mismatch(q, k + j, unit) or (
                    f"unit {k + j} (commitlog offset {unit[0]}) is out of order")
            i = j
        return None

    def _repair(self, q: QueueIndex, why: str) -> None:
        """A read found a damaged unit: rebuild the queue before serving from it."""
        log_ = self._log
        assert log_ is not None
        report = self.last_recovery or RecoveryReport(None, self.indexed_offset)
        self._rebuild(log_, {(q.raw_topic, q.queue_id): why}, self.indexed_offset, report)
        if (q.topic, q.queue_id) not in self.queues:
            q.files.min_offset = q.files.max_offset = 0

    # --- dispatching --------------------------------------------------------------------

    def advance(self, log_: LogReader, up_to: int,
                on_watched: Callable[[ScannedRecord], None] | None = None) -> set[tuple[str, int]]:
        """Index every whole record in [indexed_offset, up_to); returns the queues that grew."""
        if self._log is not log_:
            self.recover(log_)
        low = log_.min_offset
        if self.indexed_offset < low:
            self.trim_below(low)
        grown: set[tuple[str, int]] = set()
        end = min(up_to, _log_end(log_))
        pos = self.indexed_offset  # not below the log start (trimmed above)
        if pos < end and self._sinks:
            pos = self._dispatch_compiled(log_, pos, end, on_watched, grown)
        if pos < end:
            pos = self._dispatch(log_, pos, end, on_watched, None, grown)
        self.indexed_offset = pos
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self._flush_in_background()
        return grown

    def _dispatch_compiled(self, log_: LogReader, start: int, up_to: int,
                           on_watched: Callable[[ScannedRecord], None] | None,
                           grown: set[tuple[str, int]]) -> int:
        """The usual confirm: one compiled call writes the units of the records in
        [start, up_to) (``start`` not below the log start; up to its segment's end, at
        most SCAN_CHUNK) into their queues' files through the queues' armed sinks;
        returns where it stopped, for :meth:`_dispatch` to take the rest the general way
        (a new queue, a watched record, a file or block boundary, a segment end)."""
        pos = start
        stop = min(up_to, pos + SCAN_CHUNK, log_.segment_end(pos))
        self._dispatch_calls += 1
        watching = on_watched is not None
        consumed, records, keys = _queue_scan.dispatch(
            log_.read(pos, stop - pos), pos, self._sinks,
            self._watched_bytes if watching else _NO_TOPICS,
            self.watched_property if watching else None, _tag_hash_bytes,
            self._dispatch_calls)
        if records:
            queues = self.queues
            for key in keys:
                queues[key].files.took()
                grown.add(key)
            self.dispatched += records
            self._space_error = False
        return pos + consumed

    def replay_watched(self, log_: LogReader, start: int, stop: int,
                       on_watched: Callable[[ScannedRecord], None]) -> int:
        """Hand ``on_watched`` the records in [start, stop) carrying the watched property,
        without indexing anything; returns how many."""
        found = 0

        def scan(view: memoryview, base: int) -> tuple[int, tuple[int, int, int] | None]:
            nonlocal found
            consumed, runs, bad = _queue_scan.index_runs(view, base, _NO_TOPICS,
                                                         self.watched_property, _tag_hash_bytes)
            for raw_topic, queue_id, first, units, hits in runs:
                for i in hits:
                    phys, size = _PHYS_SIZE.unpack_from(units, UNIT.size * i)
                    on_watched(ScannedRecord(self._topic_name(raw_topic), queue_id, first + i,
                                             phys, size))
                    found += 1
            return consumed, bad

        self._walk(log_, start, stop, scan)
        return found

    def _dispatch(self, log_: LogReader, start: int, up_to: int,
                  on_watched: Callable[[ScannedRecord], None] | None,
                  only: set[tuple[str, int]] | None,
                  grown: set[tuple[str, int]] | None = None) -> int:
        """Dispatch the whole records in [start, up_to); returns where it stopped."""
        return self._walk(log_, start, up_to,
                          lambda view, base: self._scan(view, base, grown, on_watched, only))

    def _walk(self, log_: LogReader, start: int, up_to: int,
              scan: Callable[[memoryview, int], tuple[int, tuple[int, int, int] | None]]) -> int:
        """Run ``scan(view, base)`` over the whole records in [start, up_to), a chunk at a
        time; returns where the walk stopped (a record boundary)."""
        pos = max(start, log_.min_offset)
        up_to = min(up_to, _log_end(log_))
        self._blocked = False
        while pos < up_to:
            seg_end = log_.segment_end(pos)
            stop = min(up_to, seg_end)
            end = min(stop, pos + SCAN_CHUNK)
            consumed, bad = scan(log_.read(pos, end - pos), pos)
            if consumed == 0 and bad is None and end < stop and not self._blocked:
                # A record (or the blank ending the segment) longer than a chunk.
                end = stop
                consumed, bad = scan(log_.read(pos, end - pos), pos)
            if self._blocked:
                return pos + consumed  # out of blocks: stay at the first record not indexed
            nxt = pos + consumed
            if nxt < end and (bad is not None or end == stop):
                if stop != seg_end:
                    return nxt  # a partial record at the end of what is readable
                # The rest of the segment is a blank (or not a record): the writer moved
                # on to the next segment.
                nxt = seg_end
            pos = nxt
        return max(pos, start)

    def _scan(self, view: memoryview, base: int, grown: set[tuple[str, int]] | None,
              on_watched: Callable[[ScannedRecord], None] | None,
              only: set[tuple[str, int]] | None) -> tuple[int, tuple[int, int, int] | None]:
        # The per-record walk is compiled (rmqha._core.queue_scan): one run per stretch of
        # consecutive records of a queue, written here into its file in one copy.
        watched_prop = self.watched_property if on_watched is not None else None
        watched = self._watched_bytes if on_watched is not None else _NO_TOPICS
        consumed, runs, bad = _queue_scan.index_runs(view, base, watched, watched_prop,
                                                     _tag_hash_bytes)
        queues = self.queues
        for raw_topic, queue_id, first, units, hits in runs:
            key = (self._topic_name(raw_topic), queue_id)
            if only is not None and key not in only:
                continue
            q = queues.get(key)
            if q is None:
                q = self._make_queue(raw_topic, queue_id)
            n = len(units) // UNIT.size
            try:
                skipped = q.extend(first, units)
            except PartialWrite as exc:
                self._out_of_space(exc, q)
                done = exc.next_offset - first
                self.dispatched += max(done, 0)
                if grown is not None and done > 0:
                    grown.add(key)
                return (_PHYS_SIZE.unpack_from(units, UNIT.size * max(done, 0))[0] - base,
                        None)
            self._space_error = False
            q.files.arm()
            if skipped < n:
                self.dispatched += n - skipped
                if grown is not None:
                    grown.add(key)
                if hits and on_watched is not None:
                    for i in hits:
                        if i >= skipped:
                            phys, size = _PHYS_SIZE.unpack_from(units, UNIT.size * i)
                            on_watched(ScannedRecord(key[0], queue_id, first + i, phys, size))
        if bad is not None:
            at, magic, total = bad
            log.error("index scan: no record at commitlog offset %d (magic %#x, size %d)",
                      base + at, magic, total)
        return consumed, bad

    def _out_of_space(self, exc: PartialWrite, q: QueueIndex) -> None:
        self._blocked = True
        if not self._space_error:
            self._space_error = True
            log.error("consume queue %s/%d stopped at queue offset %d: %s (indexing resumes "
                      "once there is room)", q.topic, q.queue_id, exc.next_offset, exc)

    # --- the log moved ------------------------------------------------------------------

    def truncate(self, commit_offset: int) -> None:
        """The commitlog was cut at ``commit_offset``: forget everything from there on
        (the checkpoint is lowered first, so a crash half-way re-dispatches from the cut)."""
        with self._cp_lock:
            self._generation += 1
            if self.durable_offset > commit_offset:
                self._checkpoint.write(commit_offset)
                self.durable_offset = commit_offset
        for q in list(self.queues.values()):
            q.files.cut(q.first_at_or_past(commit_offset))
        if self.indexed_offset > commit_offset:
            self.indexed_offset = commit_offset

    def trim_below(self, commit_offset: int) -> None:
        """Segments below ``commit_offset`` were deleted: drop their entries (whole files)."""
        for q in self.queues.values():
            f = q.files
            new_min = f.first_not(f.min_offset, f.max_offset,
                                  lambda u: is_blank(u) or u[0] < commit_offset)
            if new_min > f.min_offset:
                f.min_offset = new_min
                f.drop_files_below(new_min)
        if self.indexed_offset < commit_offset:
            self.indexed_offset = commit_offset

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self.queues if k[0] == topic]:
            q = self.queues.pop(key)
            q.files.destroy()
            topic_dir = q.files.dir.parent
            if topic_dir.exists() and not any(topic_dir.iterdir()):
                topic_dir.rmdir()
                fsync_dir(str(self.dir))

    # --- durability ---------------------------------------------------------------------

    def _flush_in_background(self) -> None:
        """fdatasync the files written since the last flush, then checkpoint, on the flush
        thread (an fsync must not hold the broker's loop)."""
        self._last_flush = time.monotonic()
        if self._flushing or self._closed:
            return  # the previous one is still writing: the next interval takes the rest
        if self.indexed_offset == self.durable_offset and not self._dirty:
            return
        paths = list(self._dirty)
        self._dirty.clear()
        if self._flusher is None:
            self._flusher = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="consume-queue-flush")
        self._flushing = True
        self._flusher.submit(self._finish_flush, paths, self.indexed_offset, self._generation)

    def _finish_flush(self, paths: list[str], offset: int, generation: int) -> None:
        try:
            self._sync(paths)
            with self._cp_lock:
                if generation == self._generation:
                    self._checkpoint.write(offset)
                    self.durable_offset = offset
        except OSError as exc:
            # The checkpoint stays where it was: a crash re-dispatches a little more.
            log.error("consume queue flush failed: %s", exc)
            self._dirty.update(paths)
        finally:
            self._flushing = False

    @staticmethod
    def _sync(paths: Iterable[str]) -> None:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since (truncated, trimmed, dropped)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def flush(self) -> None:
        """fdatasync every file written and checkpoint ``indexed_offset``, in this thread."""
        self._wait_for_flusher()
        paths = list(self._dirty)
        self._dirty.clear()
        offset = self.indexed_offset
        self._sync(paths)
        with self._cp_lock:
            self._checkpoint.write(offset)
            self.durable_offset = offset
        self._last_flush = time.monotonic()

    def _wait_for_flusher(self) -> None:
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)
            self._flusher = None

    def close(self) -> None:
        """Flush, record a clean checkpoint and unmap everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wait_for_flusher()
        if self._log is not None:
            paths = list(self._dirty)
            self._dirty.clear()
            self._sync(paths)
            with self._cp_lock:
                self._checkpoint.write(self.indexed_offset, clean=True)
                self.durable_offset = self.indexed_offset
        self._cache.close()

    def stats(self) -> dict[str, int]:
        return {"queues": len(self.queues), "indexed_offset": self.indexed_offset,
                "durable_offset": self.durable_offset, "dispatched": self.dispatched,
                "mapped_files": len(self._cache._maps)}
