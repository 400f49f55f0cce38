"""The commitlog: an append-only log of RocketMQ v1 records in sparse, mmap-ed segments.

:class:`CommitLog` is the public face and owns the writer's side: appends (single and
batch), rolling segments, reserving blocks ahead of the mapping writes, reads, truncation,
retention, ``reset`` and close.  Its collaborators, one module each:

- :mod:`rmqha.store.segments`: segment files, their mappings and the pre-fault window the
  warm-up thread keeps ahead of the writer (segments are sparse; see there why a full disk
  is a clean :class:`~rmqha.errors.DiskFullError`, never a SIGBUS);
- :mod:`rmqha.store.flusher`: group-commit flushing and the flushed offset's waiters;
- :mod:`rmqha.store.checkpoint`: the checkpoint file (and the directory's lock);
- :mod:`rmqha.store.recovery`: opening a directory, cutting a torn or corrupt tail;
- :mod:`rmqha.store.receive`: the slave's receive path (``append_data``, ``receive_view``);
- :mod:`rmqha.store.queue_offsets`: the (topic, queue id) -> next queue offset table;
- :mod:`rmqha.store.message`: :class:`StoredMessage` and the record fields' checks.

Record bytes are written by the selected twin of :mod:`rmqha._core.records`.

Threads: one writer at a time (appends, ``append_data``, truncate, delete, close serialise
on one lock); any number of readers (``read``, ``read_message``, ``iter_messages``) without
locks; a flusher thread; a warm-up thread.
"""
from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future

from rmqha import _core
from rmqha._core._protocols import RecordsTwin, SendFrame
from rmqha.errors import (
    ConfigError,
    DiskFullError,
    InvalidMessageError,
    MessageTooLargeError,
    StoreError,
)
from rmqha.store.checkpoint import CHECKPOINT_FILE, Checkpoint
from rmqha.store.disk_usage import DiskUsage, directory_usage
from rmqha.store.flusher import Flusher, FlushMode
from rmqha.store.message import (
    INT32_MAX,
    BatchAppendResult,
    EntriesAppendResult,
    StoredMessage,
    check_fields,
    decode_host,
    encode_host,
    to_message,
    topic_bytes,
)
from rmqha.store.queue_offsets import QUEUE_BASE_FILE, QueueOffsets
from rmqha.store.receive import ReceivePath
from rmqha.store.recovery import recover
from rmqha.store.scrub import BadRecord, bad_records, queues_before
from rmqha.store.segments import (
    DEFAULT_PREFAULT_WINDOW,
    PAGE,
    PrefaultWindow,
    Segment,
    adopt_legacy_sidecars,
    fsync_dir,
    page_up,
    segment_path,
)

__all__ = ["CHECKPOINT_FILE", "DEFAULT_PREFAULT_WINDOW", "QUEUE_BASE_FILE", "BatchAppendResult", "CommitLog",
           "FlushMode", "StoredMessage", "decode_host", "encode_host"]

log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">iI")
_ENTRY_SIZE = struct.Struct(">i")  # a batch entry's total size
_ZEROS = bytes(1 << 20)
_FIXED = 91          # record bytes besides body, topic and properties
_MIN_BLANK = 8       # a segment always keeps room for the blank record's header
_INT64_MAX = (1 << 63) - 1


class CommitLog(ReceivePath):
    """An append-only log of RocketMQ v1 records over mmap-ed segment files.

    ``implementation`` picks the records twin ("cython" / "python"; default: the one
    :func:`rmqha._core.load` selects).  ``clock`` returns the store timestamp in ms and
    ``store_host`` is written into every record, so two logs fed the same input (and the
    same clock) hold identical bytes.
    """

    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int = 1 << 30,
                 flush: str = "async", flush_interval_ms: int = 500,
                 implementation: str | None = None,
                 store_host: tuple[str, int] = ("127.0.0.1", 10911),
                 clock: Callable[[], int] | None = None, prefault: bool = True,
                 max_message_bytes: int | None = None,
                 checkpoint_interval_ms: int = 1000,
                 verify_segments_on_open: int = 2,
                 prefault_window_bytes: int = DEFAULT_PREFAULT_WINDOW) -> None:
        if not isinstance(segment_bytes, int) or segment_bytes < 4096:
            raise ConfigError(f"segment_bytes must be an int >= 4096, got {segment_bytes!r}")
        try:
            self._mode = FlushMode(flush)
        except ValueError:
            raise ConfigError(f"flush must be 'async' or 'sync', got {flush!r}") from None
        if flush_interval_ms <= 0:
            raise ConfigError(f"flush_interval_ms must be > 0, got {flush_interval_ms}")
        if not isinstance(prefault_window_bytes, int) or prefault_window_bytes < 2 * PAGE:
            raise ConfigError(f"prefault_window_bytes must be an int >= {2 * PAGE}, "
                              f"got {prefault_window_bytes!r}")
        self._codec: RecordsTwin = (_core.load("records") if implementation is None
                                    else _core.load_twin("records", implementation))
        self.implementation = "python" if self._codec.__name__.endswith("_py") else "cython"
        self._dir = os.fspath(directory)
        os.makedirs(self._dir, exist_ok=True)
        self._sb = segment_bytes
        limit = segment_bytes - self._codec.MIN_BLANK
        self._max_record = limit if max_message_bytes is None else min(limit, max_message_bytes)
        self._store_host = encode_host(*store_host)
        self._hosts: dict[tuple[str, int], bytes] = {}
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)

        self._lock = threading.RLock()          # the writer side
        self._io_lock = threading.Lock()        # fd lifetime vs fdatasync
        self._listeners: list[Callable[[int], None]] = []
        self._segments: dict[int, Segment] = {}
        self._active: Segment | None = None     # segment holding max_offset (writer cache)
        # A record of ``size`` bytes at the max offset fits the active segment without
        # reserving blocks iff ``max_offset + size + _MIN_BLANK <= _limit`` (0: ask).
        self._limit = 0
        self._topics: dict[str | bytes, bytes] = {}
        self._decoded: dict[bytes, object] = {}  # topic and host bytes -> decoded value
        adopt_legacy_sidecars(self._dir)
        self._queues = QueueOffsets(self._dir)
        self._queue_offsets = self._queues.next  # the hot path's reference (changed in place)
        self._closed = False
        self._closing = False

        self._max_offset = 0
        self._whole_offset = 0      # end of the last whole record (< max only on a slave)
        #: The queue offset :meth:`append` gave its last record (read under the caller's
        #: own serialisation of appends, so a send's answer need not read it back).
        self.last_queue_offset = -1
        self._warm = PrefaultWindow(
            self._dir, segment_bytes, self._codec, self._segments, self._io_lock,
            lambda: self._max_offset, lambda: self._closing,
            window=page_up(prefault_window_bytes), enabled=prefault,
            sync_ahead=self._mode is FlushMode.SYNC)
        self._checkpoint = Checkpoint(self._dir)
        #: Bumped when the table moves other than forward (truncate, reset, retention): a
        #: snapshot taken before that is not written.
        self._table_gen = 0
        self._snapshot_lock = threading.Lock()
        self._snapshotted: tuple[int, int] = (-1, -1)
        #: The record boundaries of the last snapshot written and of the one before it.
        self._snapshot_at = self._snapshot_since = 0
        self._flusher = Flusher(
            self._mode, flush_interval_s=flush_interval_ms / 1000.0,
            checkpoint_interval_s=checkpoint_interval_ms / 1000.0, segments=self._segments,
            segment_bytes=segment_bytes, io_lock=self._io_lock, checkpoint=self._checkpoint,
            max_offset=lambda: self._max_offset, min_offset=lambda: self.min_offset,
            snapshots=self)
        #: Records found bad below the flushed offset (see :meth:`verify_tail`): never served.
        self.corrupt: list[BadRecord] = []
        #: Where opening the log started walking records (its queue-offset snapshot, or
        #: the first segment without one).
        self.recovery_start = 0
        try:
            end, self.recovery_start, checked = recover(
                self._dir, self._sb, self._codec, self._segments, self._queues,
                self._checkpoint)
            self._snapshot_at = self._snapshot_since = checked
            self._max_offset = self._whole_offset = end
            self._flusher.flushed_offset = end
            self._flusher.write_checkpoint()
            # Recovery made the log durable up to its end: the next open walks from here.
            snap = self.take_snapshot()
            if snap is not None:
                self.save_snapshot(snap)
            self.verify_tail(verify_segments_on_open)
        except BaseException:
            self._close_files()
            raise
        self._flusher.start()
        self._warm.start()
        active = self._segments.get(self.segment_start(self._max_offset))
        if active is None:
            # Create the first segment now rather than on the first append.
            with self._lock:
                self._active_segment()
        with self._lock:
            self._warm.restart()

    # --- geometry and state ------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def segment_bytes(self) -> int:
        return self._sb

    @property
    def max_offset(self) -> int:
        return self._max_offset

    @property
    def whole_offset(self) -> int:
        """End of the last whole record (differs from max_offset on a slave mid-record)."""
        return self._whole_offset

    @property
    def min_offset(self) -> int:
        segs = self._segments
        return min(segs) if segs else self._max_offset

    @property
    def flushed_offset(self) -> int:
        return self._flusher.flushed_offset

    @property
    def flush_mode(self) -> str:
        return self._mode.value

    @property
    def flush_count(self) -> int:
        """fdatasync rounds done (group-commit evidence)."""
        return self._flusher.count

    @property
    def max_message_bytes(self) -> int:
        """The largest record (header, topic, properties and body) an append accepts."""
        return self._max_record

    def segment_start(self, offset: int) -> int:
        return offset - offset % self._sb

    def segment_end(self, offset: int) -> int:
        return offset - offset % self._sb + self._sb

    def segment_files(self) -> list[str]:
        return [self._segments[b].path for b in sorted(self._segments)]

    def queue_offset(self, topic: str | bytes, queue_id: int = 0) -> int:
        """The queue offset the next message to (topic, queue_id) gets."""
        key = (topic.encode("utf-8") if isinstance(topic, str) else bytes(topic), queue_id)
        return self._queue_offsets.get(key, 0)

    def queue_offsets(self) -> dict[tuple[str, int], int]:
        return {(t.decode("utf-8", "replace"), q): n for (t, q), n in self._queue_offsets.items()}

    def add_append_listener(self, cb: Callable[[int], None]) -> None:
        """``cb(new_max_offset)`` after every append / append_data, on the writer's thread."""
        self._listeners.append(cb)

    def remove_append_listener(self, cb: Callable[[int], None]) -> None:
        self._listeners.remove(cb)

    def _host_bytes(self, host: tuple[str, int]) -> bytes:
        """``encode_host`` of a born host, remembered: a producer's address repeats on
        every message it sends."""
        hb = self._hosts.get(host)
        if hb is None:
            hb = encode_host(*host)
            if len(self._hosts) >= 4096:
                self._hosts.clear()
            self._hosts[host] = hb
        return hb

    def _check_open(self) -> None:
        if self._closed or self._closing or self._lane_held:
            raise self._not_writable()

    # --- appends -------------------------------------------------------------------------

    def append(self, topic: str | bytes, body: bytes | bytearray | memoryview,
               queue_id: int = 0, properties: Mapping[str, str] | bytes | None = None, *,
               flag: int = 0, sys_flag: int = 0, born_timestamp: int | None = None,
               born_host: tuple[str, int] | None = None, reconsume_times: int = 0,
               prepared_transaction_offset: int = 0, wait_flush: bool = True) -> tuple[int, int]:
        """Append one message; returns ``(physical offset, size)``.

        ``properties`` is a map, or its encoding (canonical ``key\\x01value\\x02`` pairs,
        InvalidMessageError otherwise).

        In sync flush mode this returns once an fsync covers the record, unless
        ``wait_flush=False``: then the caller waits with :meth:`flush_future` (one fsync can
        then cover a whole batch of appends).
        """
        # The common case (a known topic, default fields) stays on a short path: at a few
        # hundred ns per record in the codec, Python-level checks would dominate.
        tb = self._topic_for(topic, body)
        if isinstance(properties, bytes):
            # Already encoded (a send's header carries them so): stored as they are when
            # canonical, so the record is what encoding their map would have made.
            pb = properties
            if not self._codec.properties_plain(pb):
                raise InvalidMessageError(
                    "encoded properties must be key\\x01value\\x02 pairs with unique, "
                    "non-empty keys in UTF-8")
        else:
            pb = self._codec.encode_properties(properties) if properties else b""
        if (type(queue_id) is not int or not 0 <= queue_id <= INT32_MAX or flag or sys_flag
                or reconsume_times or prepared_transaction_offset
                or (born_timestamp is not None and (type(born_timestamp) is not int
                                                or not 0 <= born_timestamp <= _INT64_MAX))):
            check_fields(queue_id, flag, sys_flag, reconsume_times,
                         prepared_transaction_offset, born_timestamp)
        bh = self._store_host if born_host is None else self._host_bytes(born_host)
        offset, size, _ = self._write_one(tb, body, queue_id, pb, flag, sys_flag,
                                          born_timestamp, bh, reconsume_times,
                                          prepared_transaction_offset, wait_flush)
        return offset, size

    def _topic_for(self, topic: str | bytes, body: object) -> bytes:
        """The topic's encoded bytes (cached for the first 4,096 topics), after checking
        that the body is bytes-like."""
        tb = self._topics.get(topic)
        if tb is None:
            tb = topic_bytes(self._codec, topic)
            if len(self._topics) < 4096:
                self._topics[topic] = tb
        if type(body) is not bytes and not isinstance(body, (bytearray, memoryview)):
            raise InvalidMessageError(f"body must be bytes-like, got {type(body).__name__}")
        return tb

    def append_plain(self, topic: str, body: bytes | bytearray | memoryview, queue_id: int,
                     properties: bytes, flag: int, sys_flag: int, born_timestamp: int,
                     born_host: tuple[str, int],
                     reconsume_times: int) -> tuple[int, int, int]:
        """:meth:`append` of a send as its frame carried it (encoded properties, every
        field given, no wait for a flush), with fewer steps: ``(physical offset, size,
        queue offset)``.  A broker's read brings many of these; each costs only this."""
        tb = self._topic_for(topic, body)
        if not self._codec.properties_plain(properties):
            raise InvalidMessageError(
                "encoded properties must be key\\x01value\\x02 pairs with unique, "
                "non-empty keys in UTF-8")
        if (type(queue_id) is not int or not 0 <= queue_id <= INT32_MAX or flag or sys_flag
                or reconsume_times or type(born_timestamp) is not int
                or not 0 <= born_timestamp <= _INT64_MAX):
            check_fields(queue_id, flag, sys_flag, reconsume_times, 0, born_timestamp)
        bh = self._hosts.get(born_host) or self._host_bytes(born_host)
        return self._write_one(tb, body, queue_id, properties, flag, sys_flag, born_timestamp,
                               bh, reconsume_times, 0, False)

    def append_plain_run(self, sends: list[SendFrame], start: int, stop: int,
                         queue_ids: array[int], born_default: int, born_host: tuple[str, int],
                         offsets: array[int], sizes: array[int],
                         queue_offsets: array[int]) -> int:
        """:meth:`append_plain` of plain sends ``sends[start:stop]`` (``send_frames``'
        tuples; send i to queue ``queue_ids[i]``, born at ``born_default`` when its frame
        says 0) in one codec call per segment they land in: the same records, one store
        timestamp.  ``offsets[i]`` / ``sizes[i]`` / ``queue_offsets[i]`` receive what
        append_plain returns.  Returns how many, from ``start``, it stored; it stops before
        a send append_plain must take alone (a check refuses it, a topic not seen yet, a
        full disk), which the caller appends with it.  The append listeners hear once."""
        codec = self._codec
        bh = self._hosts.get(born_host) or self._host_bytes(born_host)
        limit = self._sb - codec.MIN_BLANK
        i = start
        with self._lock:
            if self._closing:
                self._check_open()
            now = self._clock()
            try:
                while i < stop:
                    seg = self._active_segment()
                    pos = self._max_offset - seg.base
                    written, end, why = codec.write_plain_run(
                        seg.mm, pos, max(pos, min(limit, seg.allocated)), seg.base, sends, i,
                        stop, queue_ids, self._topics, self._queue_offsets, born_default, bh,
                        now, self._store_host, offsets, sizes, queue_offsets, self._max_record)
                    i += written
                    self._max_offset = self._whole_offset = seg.base + end
                    if why != codec.RUN_STOP_FULL:
                        break
                    send = sends[i]  # it passed the checks: its topic's bytes are known
                    self._room_for(_FIXED + len(self._topics[send[3]]) + len(send[8])
                                   + len(send[10]))
            except DiskFullError:
                pass  # the send it stopped at meets it again alone, and is refused by it
            end_offset = self._max_offset
            if i > start:
                self.last_queue_offset = queue_offsets[i - 1]
                if end_offset >= self._warm.next_at:
                    self._warm.advance()
        if i > start and (self._listeners or self._mode is FlushMode.SYNC):
            self._appended(end_offset, False)
        return i - start

    def _write_one(self, tb: bytes, body: bytes | bytearray | memoryview, queue_id: int,
                   pb: bytes, flag: int, sys_flag: int, born_timestamp: int | None, bh: bytes,
                   reconsume_times: int, prepared_transaction_offset: int,
                   wait_flush: bool) -> tuple[int, int, int]:
        """One checked record into the active segment: (offset, size, queue offset)."""
        size = _FIXED + len(tb) + len(pb) + len(body)
        if size > self._max_record:
            raise MessageTooLargeError(
                f"a record of {size} bytes exceeds the limit of {self._max_record} "
                f"(segment_bytes={self._sb})")
        with self._lock:
            if self._closing:
                self._check_open()
            seg = self._active
            if seg is None or self._max_offset + size + _MIN_BLANK > self._limit:
                seg = self._room_for(size)
            offset = self._max_offset
            key = (tb, queue_id)
            qoff = self._queue_offsets.get(key, 0)
            now = self._clock()
            self._codec.write_message(
                seg.mm, offset - seg.base, tb, body, pb, queue_id, flag, qoff, offset,
                sys_flag, now if born_timestamp is None else born_timestamp, bh, now,
                self._store_host, reconsume_times, prepared_transaction_offset)
            self._queue_offsets[key] = qoff + 1
            self.last_queue_offset = qoff
            end = offset + size
            self._max_offset = self._whole_offset = end
            if end >= self._warm.next_at:
                self._warm.advance()
        if self._listeners or self._mode is FlushMode.SYNC:
            self._appended(end, wait_flush)
        return offset, size, qoff

    def append_batch(self, topic: str | bytes, bodies: Sequence[bytes] | Iterable[bytes],
                     queue_id: int = 0, properties: Mapping[str, str] | None = None, *,
                     flag: int = 0, sys_flag: int = 0, born_timestamp: int | None = None,
                     born_host: tuple[str, int] | None = None, reconsume_times: int = 0,
                     prepared_transaction_offset: int = 0,
                     wait_flush: bool = True) -> BatchAppendResult:
        """Append many messages to one (topic, queue) with shared properties, in C loops.

        ``wait_flush`` as for :meth:`append` (sync flush mode: one fsync covers the batch).

        Every body is checked before anything is written; rolling segments as needed.  A
        full disk part-way raises DiskFullError after the records that fit are stored (and
        announced to the append listeners, like any other append).
        """
        tb = topic_bytes(self._codec, topic)
        pb = self._codec.encode_properties(properties)
        check_fields(queue_id, flag, sys_flag, reconsume_times,
                     prepared_transaction_offset, born_timestamp)
        bh = self._store_host if born_host is None else self._host_bytes(born_host)
        items = bodies if isinstance(bodies, list) else list(bodies)
        n = len(items)
        offsets = array("q", bytes(8 * n))
        overhead = self._codec.FIXED_SIZE + len(tb) + len(pb)
        codec = self._codec

        def write(seg: Segment, pos: int, limit: int, qoff: int, done: int,
                  now: int) -> tuple[int, int]:
            # The first call also checks every body, before anything is written.
            return codec.write_batch(
                seg.mm, pos, limit, tb, items, done, pb, queue_id, flag, qoff, seg.base,
                sys_flag, now if born_timestamp is None else born_timestamp, bh, now,
                self._store_host, reconsume_times, prepared_transaction_offset, offsets,
                self._max_record)

        q0, _, end_offset = self._append_records(
            (tb, queue_id), n, write, lambda done: overhead + len(items[done]), wait_flush)
        return BatchAppendResult(offsets, q0, n, overhead, end_offset)

    def append_batch_entries(self, topic: str | bytes, batch: bytes | memoryview, count: int,
                             queue_id: int = 0, *, sys_flag: int = 0,
                             born_timestamp: int | None = None,
                             born_host: tuple[str, int] | None = None,
                             wait_flush: bool = True) -> EntriesAppendResult:
        """Append the ``count`` entries of a SEND_BATCH body to one (topic, queue) as they
        came, each with its own flag and properties, in C loops (the records codec's
        ``write_batch_entries``; the caller checked the body with ``batch_plain``).

        Segments roll, a full disk part-way and ``wait_flush`` behave as for
        :meth:`append_batch`.
        """
        tb = topic_bytes(self._codec, topic)
        check_fields(queue_id, 0, sys_flag, 0, 0, born_timestamp)
        bh = self._store_host if born_host is None else self._host_bytes(born_host)
        offsets = array("q", bytes(8 * count))
        sizes = array("i", bytes(4 * count))
        codec = self._codec
        src = 0

        def write(seg: Segment, pos: int, limit: int, qoff: int, done: int,
                  now: int) -> tuple[int, int]:
            nonlocal src
            written, end, src = codec.write_batch_entries(
                seg.mm, pos, limit, tb, batch, src, queue_id, qoff, seg.base, sys_flag,
                now if born_timestamp is None else born_timestamp, bh, now, self._store_host,
                offsets, sizes, done, self._max_record)
            return written, end

        def next_size(done: int) -> int:
            # A record is its entry plus what a record adds to an entry.
            entry: int = _ENTRY_SIZE.unpack_from(batch, src)[0]
            return entry - 22 + codec.FIXED_SIZE + len(tb)

        q0, done, end_offset = self._append_records((tb, queue_id), count, write, next_size,
                                                    wait_flush)
        return EntriesAppendResult(offsets, sizes, q0, done, end_offset)

    def _append_records(self, key: tuple[bytes, int], n: int,
                        write: Callable[[Segment, int, int, int, int, int], tuple[int, int]],
                        next_size: Callable[[int], int],
                        wait_flush: bool) -> tuple[int, int, int]:
        """The segment loop of the batch appends: ``write(segment, position, limit, queue
        offset, records done, now)`` stores records from number ``done`` while they end
        at or before ``limit`` and returns (how many, end position); ``next_size(done)``
        is the size of record ``done``.  Records go only where blocks are reserved, and a
        record that does not fit pads the segment and rolls.  Returns (first queue offset,
        records stored, end offset).  A full disk part-way raises DiskFullError after the
        records that fit are stored and announced to the append listeners."""
        codec = self._codec
        limit = self._sb - codec.MIN_BLANK
        with self._lock:
            self._check_open()
            q0 = self._queue_offsets.get(key, 0)
            now = self._clock()
            done = 0
            full: DiskFullError | None = None
            try:
                while done < n:
                    seg = self._active_segment()
                    pos = self._max_offset - seg.base
                    written, end = write(seg, pos, max(pos, min(limit, seg.allocated)),
                                         q0 + done, done, now)
                    done += written
                    self._max_offset = self._whole_offset = seg.base + end
                    if done < n:
                        need = end + next_size(done)
                        if need <= limit:
                            self._allocate(seg, need)  # the window ran out: reserve more
                            continue
                        # The next record does not fit: pad this segment and roll.
                        self._allocate(seg, end + codec.MIN_BLANK)
                        codec.write_blank(seg.mm, end, self._sb - end)
                        self._max_offset = self._whole_offset = seg.base + self._sb
            except DiskFullError as exc:
                if not done:
                    raise
                full = exc  # the records before it are stored: announce them first
            finally:
                if done:
                    self._queue_offsets[key] = q0 + done
            end_offset = self._max_offset
            if end_offset >= self._warm.next_at:
                self._warm.advance()
        if full is not None:
            self._appended(end_offset, False)
            raise full
        if n:
            self._appended(end_offset, wait_flush)
        return q0, done, end_offset

    def _appended(self, end: int, wait_flush: bool = True) -> None:
        for cb in self._listeners:
            cb(end)
        if wait_flush and self._mode is FlushMode.SYNC:
            self._flusher.wait_flushed(end)

    # --- segments ------------------------------------------------------------------------

    def _room_for(self, size: int) -> Segment:
        """The segment the next ``size``-byte record goes to (padding and rolling), with
        blocks reserved for it; refreshes the append fast path's ``_limit``."""
        seg = self._active_segment()
        pos = self._max_offset - seg.base
        if pos + size + self._codec.MIN_BLANK > self._sb:
            self._allocate(seg, pos + self._codec.MIN_BLANK)
            self._codec.write_blank(seg.mm, pos, self._sb - pos)
            self._max_offset = self._whole_offset = seg.base + self._sb
            seg = self._active_segment()
            pos = 0
        self._allocate(seg, pos + size)
        self._limit = seg.base + min(self._sb, seg.allocated + _MIN_BLANK)
        return seg

    def _allocate(self, seg: Segment, upto: int) -> None:
        """Reserve ``seg``'s blocks up to position ``upto`` before the writer touches them
        (with the writer's lock).  Normally the warm-up did; a writer that overtook it
        reserves a window at once, or on a nearly full disk just what it needs.
        DiskFullError when even that is refused: nothing has been written."""
        if upto <= seg.allocated:
            return
        try:
            seg.allocate(upto + self._warm.window)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            try:
                seg.allocate(upto)
            except OSError as exc2:
                if exc2.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise DiskFullError(
                    f"commitlog {self._dir}: no disk space for offsets "
                    f"{seg.base + seg.allocated}..{seg.base + upto} ({exc2.strerror}); the "
                    f"write is refused and the log ends at {self._max_offset}") from None

    def _active_segment(self) -> Segment:
        base = self.segment_start(self._max_offset)
        seg = self._segments.get(base)
        if seg is not None:
            if seg is not self._active:
                self._active = seg
                self._limit = 0
            return seg
        seg = self._warm.take(base)
        self._warm.writer_entered(base)
        self._active = seg
        self._limit = 0
        return seg

    def _forget_active(self) -> None:
        self._active = None
        self._limit = 0

    def wait_prefaulted(self, timeout: float | None = None) -> bool:
        """Top the window ahead of the writer up to its full size and block until it is
        reserved and faulted in (False when ``timeout`` ran out first)."""
        with self._lock:
            if not self._closing and not self._closed:
                self._warm.advance()
        return self._warm.wait(timeout)

    @property
    def prefault_window_bytes(self) -> int:
        return self._warm.window

    def disk_usage(self) -> DiskUsage:
        """Blocks allocated and logical size of the log's files (segments are sparse)."""
        return directory_usage(self._dir)

    # --- reads ---------------------------------------------------------------------------

    def read(self, offset: int, size: int) -> memoryview:
        """A zero-copy view of ``size`` bytes at ``offset`` (valid until truncate/close).

        The range must lie in one segment and below ``max_offset``.
        """
        if size < 0 or offset < 0 or offset + size > self._max_offset:
            raise StoreError(
                f"read of {size} bytes at {offset} outside the log (max {self._max_offset})")
        base = self.segment_start(offset)
        if offset + size > base + self._sb:
            raise StoreError(f"read of {size} bytes at {offset} crosses the segment end "
                             f"{base + self._sb}")
        seg = self._segments.get(base)
        if seg is None:
            raise StoreError(f"offset {offset} is below the log start {self.min_offset}")
        pos = offset - base
        return seg.view[pos:pos + size]

    def segment_fd(self, offset: int) -> int:
        """A new file descriptor of the segment holding ``offset``; the caller closes it.

        For ``os.sendfile`` (the HA master): the kernel hands page-cache pages to the
        socket without a copy.  Being a duplicate, it keeps the file readable even if the
        segment is deleted meanwhile (a retention pass while a slow slave catches up).
        """
        with self._lock:  # every close of a segment's fd holds it
            seg = self._segments.get(self.segment_start(offset))
            if seg is None or not self.min_offset <= offset < self._max_offset:
                raise StoreError(f"offset {offset} is outside the log "
                                 f"{self.min_offset}..{self._max_offset}")
            return os.dup(seg.fd)

    def read_message(self, offset: int, *, verify_crc: bool = True) -> StoredMessage:
        """Decode the message at ``offset`` (CorruptRecordError for blanks and bad bytes)."""
        base = self.segment_start(offset)
        seg = self._segments.get(base)
        whole = self._whole_offset
        if seg is None or offset >= whole:
            raise StoreError(f"no message at {offset}: the log holds "
                             f"{self.min_offset}..{whole}")
        limit = min(self._sb, whole - base)
        try:
            fields = self._codec.decode(seg.mm, offset - base, limit, verify_crc)
        except ValueError as exc:  # the segment was unmapped under us (truncate / close)
            raise StoreError(f"segment of offset {offset} went away: {exc}") from None
        return to_message(self._codec, self._decoded, fields)

    def iter_messages(self, start: int | None = None, end: int | None = None
                      ) -> Iterator[StoredMessage]:
        """Messages from ``start`` (default: the log start) to the current end, skipping blanks."""
        off = self.min_offset if start is None else start
        stop = self._whole_offset if end is None else min(end, self._whole_offset)
        codec = self._codec
        blank = codec.BLANK_MAGIC
        while off < stop:
            base = self.segment_start(off)
            seg = self._segments.get(base)
            if seg is None:
                raise StoreError(f"offset {off} is not in the log")
            pos = off - base
            try:
                size, magic = _SIZE_MAGIC.unpack_from(seg.mm, pos)
                if magic == blank:
                    off = base + self._sb
                    continue
                fields = codec.decode(seg.mm, pos, min(self._sb, stop - base), True)
            except ValueError as exc:  # the segment was unmapped under us (truncate / close)
                raise StoreError(f"segment of offset {off} went away: {exc}") from None
            yield to_message(self._codec, self._decoded, fields)
            off += fields[0]

    # --- the queue-offset snapshot (see Flusher.flush_now) --------------------------------

    def take_snapshot(self) -> tuple[int, int, dict[tuple[bytes, int], int]] | None:
        """(generation, whole offset, a copy of the queue-offset table), consistent; None
        when the writer holds the lock for long (close() does, while it stops the flusher)."""
        if not self._lock.acquire(timeout=0.05):
            return None
        try:
            return self._table_gen, self._whole_offset, dict(self._queue_offsets)
        finally:
            self._lock.release()

    def save_snapshot(self, snap: tuple[int, int, dict[tuple[bytes, int], int]]) -> bool:
        """Write a snapshot taken by :meth:`take_snapshot` (once flushed up to it), unless
        the table moved back since or it is the one already written."""
        gen, valid_at, table = snap
        with self._snapshot_lock:
            if gen != self._table_gen or (gen, valid_at) == self._snapshotted:
                return False
            # Opening the log checks that records tile from the previous snapshot on: a
            # known record boundary, and little to walk.
            since = self._snapshot_at if self._snapshot_at < valid_at else min(
                self._snapshot_since, valid_at)
            try:
                self._queues.save_snapshot(valid_at, table, since)
            except OSError as exc:
                # The previous snapshot stays: the next open walks a little more.
                log.error("commitlog %s: queue-offset snapshot not written: %s", self._dir,
                          exc)
                return False
            self._snapshotted = (gen, valid_at)
            self._snapshot_at, self._snapshot_since = valid_at, since
            return True

    def _table_moved_back(self) -> None:
        """Truncate, reset and retention (writer lock held): older snapshots are void."""
        with self._snapshot_lock:
            self._table_gen += 1

    # --- flushing ------------------------------------------------------------------------

    def flush_future(self, offset: int) -> Future[int]:
        """A future done when ``flushed_offset >= offset`` (result: the flushed offset).

        In sync mode it asks for a flush at once; in async mode the next timed flush does it.
        """
        return self._flusher.future(offset)

    def sync_now(self) -> int:
        """fsync everything appended so far on the calling thread (one group commit, no hop
        to the flusher thread); returns the flushed offset.  The checkpoint follows at its
        usual interval."""
        self._flusher.flush_now()
        return self._flusher.flushed_offset

    def flush(self) -> int:
        """fsync everything appended so far and record the checkpoint; returns the offset."""
        self._flusher.flush_now(force_checkpoint=True)
        return self._flusher.flushed_offset

    # --- bytes changed at rest ------------------------------------------------------------

    def verify_tail(self, segments: int) -> list[BadRecord]:
        """Check every body CRC in the last ``segments`` segments, below the flushed offset
        too (recovery checks only past it, where a crash can tear writes).  Bad records are
        kept in :attr:`corrupt` and logged; nothing is cut here: on a slave the broker cuts
        from the first bad record and replication fetches the rest again
        (:meth:`first_corrupt_offset`), and nowhere is a bad record served."""
        holding = [b for b in sorted(self._segments) if b < self._whole_offset]
        bases = holding[-segments:] if segments > 0 else []
        found: list[BadRecord] = []
        for base in bases:
            end = min(self._whole_offset, base + self._sb) - base
            if end <= 0:
                continue
            bad, _ = bad_records(self._codec, self._segments[base].mm, 0, end, base)
            found.extend(bad)
        for b in found:
            log.error("commitlog %s: record at offset %d failed its check (%s): it will not be "
                      "served; a slave re-fetches it from its master", self._dir, b.offset, b.reason)
        self.corrupt = sorted(set(self.corrupt) | set(found), key=lambda b: b.offset)
        return found

    def first_corrupt_offset(self) -> int | None:
        live = [b.offset for b in self.corrupt if self.min_offset <= b.offset < self._max_offset]
        return min(live) if live else None

    def verify(self, offset: int, size: int) -> BadRecord | None:
        """The first bad record in ``[offset, offset + size)`` (whole records in one
        segment), or None: the check every range served to consumers goes through."""
        base = self.segment_start(offset)
        if size <= 0 or offset + size > base + self._sb or offset + size > self._whole_offset:
            raise StoreError(f"verify of {size} bytes at {offset}: not whole records in one segment")
        seg = self._segments.get(base)
        if seg is None:
            raise StoreError(f"verify at {offset}: no segment holds it")
        bad, _ = bad_records(self._codec, seg.mm, offset - base, offset - base + size, base)
        if bad:
            b = bad[0]
            if b not in self.corrupt:
                self.corrupt.append(b)
                log.error("commitlog %s: record at offset %d failed its check (%s) on read",
                          self._dir, b.offset, b.reason)
            return b
        return None

    # --- truncation and retention --------------------------------------------------------

    def _zero(self, seg: Segment, start: int, stop: int) -> None:
        mm = seg.mm
        while start < stop:
            n = min(stop - start, len(_ZEROS))
            mm[start:start + n] = _ZEROS[:n] if n < len(_ZEROS) else _ZEROS
            start += n

    def truncate(self, offset: int) -> None:
        """Drop everything from ``offset`` (a record boundary) on; later segments are deleted.

        The dropped bytes are zeroed and made durable, so a crash cannot bring them back.
        """
        with self._lock:
            self._check_open()
            if offset == self._max_offset:
                return
            if offset > self._max_offset or offset < self.min_offset:
                raise StoreError(f"truncate to {offset} outside the log {self.min_offset}..{self._max_offset}")
            S, base = self._codec.ScanStop, self.segment_start(offset)
            seg = self._segments.get(base)
            # Forget the dropped records' queue offsets (the lowest dropped one per queue).
            dropped: dict[tuple[bytes, int], int] = {}
            cur = offset
            while cur < self._whole_offset:
                b = self.segment_start(cur)
                s = self._segments[b]
                data_end = min(self._sb, self._whole_offset - b)
                pos, stop, _ = self._codec.scan(s.mm, cur - b, data_end, b, 1 << 62, dropped, True)
                if cur == offset and pos == cur - b and stop not in (S.END, S.BLANK):
                    # Unreadable at the cut (damaged at rest): proved from the records before.
                    kept = queues_before(self._codec, s.mm, b, offset)
                    if kept is None:
                        raise StoreError(f"truncate to {offset}: not a record boundary ({S(stop).name})")
                    dropped.update({key: min(nxt, dropped.get(key, nxt)) for key, nxt in kept.items()})
                elif stop != S.BLANK:
                    break
                cur = b + self._sb
            with self._io_lock:
                self._queues.forget(dropped)
                if seg is not None:
                    start = offset - base
                    self._zero(seg, start, seg.data_end(start, min(self._sb, self._max_offset - base)))
                    os.fdatasync(seg.fd)
                removed = False
                self._forget_active()
                for b in sorted(self._segments):
                    if b > base:
                        self._segments.pop(b).close()
                        os.unlink(segment_path(self._dir, b))
                        removed = True
                if self._warm.discard_ready():
                    removed = True
                if removed:
                    fsync_dir(self._dir)
                self._max_offset = offset
                self._whole_offset = min(self._whole_offset, offset)
                self._flusher.lower_to(offset)
                self._flusher.write_checkpoint()
            # Zeroing and fdatasync left the pages clean and write-protected: fault them
            # writable again off the hot path (and the next segment).
            self._warm.restart()
            self._table_moved_back()
            self._flusher.flush_now(force_checkpoint=True)  # and a snapshot at the cut
            log.info("commitlog truncated to %d", offset)

    def reset(self, offset: int) -> None:
        """Make this EMPTY log start at ``offset`` (a multiple of ``segment_bytes``), durably.

        A slave that joins late starts where its master's log starts (the master's min
        offset after retention, or its last segment with ``sync_from_last_file``) without
        holding the bytes before it.  Every segment file goes and one empty segment is
        created at ``offset``; min, max and flushed offsets become ``offset``; the queue
        offset table starts empty (the records that arrive next carry their own queue
        offsets) and so does ``queue_offsets.json``; the checkpoint is rewritten.  All of
        it is fsync-ed before returning, so a reopen finds the same empty log.  A crash
        half-way leaves an empty log (at 0 at worst), never a partial one.

        StoreError when the log holds any byte (``max_offset > min_offset``: truncate it
        first) or ``offset`` is negative or not segment-aligned.
        """
        if not isinstance(offset, int) or offset < 0 or offset % self._sb:
            raise StoreError(f"reset to {offset!r}: the offset must be a non-negative multiple "
                             f"of segment_bytes={self._sb}")
        with self._lock:
            self._check_open()
            if self._max_offset > self.min_offset or self._whole_offset != self._max_offset:
                raise StoreError(
                    f"reset to {offset}: the log is not empty (it holds {self.min_offset}.."
                    f"{self._max_offset}); truncate it to its min offset first")
            with self._io_lock:
                # Queue offsets first: a crash after this leaves an empty log, either way
                # with no stale per-queue numbers that the next records would contradict.
                self._queues.clear()
                self._queues.save_base(offset)
                self._forget_active()
                victims = [self._segments.pop(b) for b in sorted(self._segments)]
                # Under the warm-up lock: no job may create a segment of the old or the new
                # geometry while the files change (a stray file would leave a gap).
                with self._warm.lock:
                    victims.extend(self._warm.pop_ready())
                    self._max_offset = self._whole_offset = offset
                    for seg in victims:
                        seg.close()
                        os.unlink(seg.path)
                    fsync_dir(self._dir)
                    seg = Segment(segment_path(self._dir, offset), offset, self._sb, create=True)
                os.fdatasync(seg.fd)
                self._segments[offset] = seg
                self._active = seg
                self._limit = 0
                fsync_dir(self._dir)
                self._flusher.restart_at(offset)
                self._flusher.write_checkpoint()
            self._warm.restart()
            self._table_moved_back()
            self._flusher.flush_now(force_checkpoint=True)
            log.info("commitlog reset: empty log at %d (%d old segment file(s) removed)",
                     offset, len(victims))

    def cut_to_last_whole_record(self) -> int:
        """Drop a partial record at the end (slave side); returns the new max offset.

        As :meth:`truncate`, the zeroed bytes and the lowered checkpoint are made durable
        before anything is appended over them: a slave may have flushed the record's head
        (its checkpoint then says so), and recovery must check the records written there
        next, over zeros, not trust them below a stale flushed offset with the head's
        bytes under any tail of theirs a crash lost."""
        with self._lock:
            if self._whole_offset < self._max_offset:
                whole = self._whole_offset
                seg = self._active_segment()
                with self._io_lock:
                    self._zero(seg, whole - seg.base, self._max_offset - seg.base)
                    os.fdatasync(seg.fd)
                    self._max_offset = whole
                    self._flusher.cut_to(whole)
                    self._flusher.write_checkpoint()
            return self._max_offset

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole segments that end at or before ``offset`` (and before the log end).

        Their queue offsets are kept (in ``queue_offsets.json``) so queues continue after a
        restart.  Returns how many segments were deleted.
        """
        with self._lock:
            self._check_open()
            victims = [b for b in sorted(self._segments)
                       if b + self._sb <= offset and b + self._sb <= self._max_offset]
            if not victims:
                return 0
            with self._io_lock:
                self._forget_active()
                for b in victims:
                    seg = self._segments[b]
                    self._codec.scan(seg.mm, 0, self._sb, b, 1 << 62, self._queues.base)
                self._queues.save_base(victims[-1] + self._sb)
                for b in victims:
                    self._segments.pop(b).close()
                    os.unlink(segment_path(self._dir, b))
                fsync_dir(self._dir)
                self._flusher.write_checkpoint()
            # A snapshot from before the deletion would point below the new start.
            self._table_moved_back()
            self._flusher.flush_now(force_checkpoint=True)
            log.info("commitlog deleted %d segment(s) before %d", len(victims), offset)
            return len(victims)

    # --- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, stop the threads and unmap everything; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closing = True
            self._flusher.stop()
            self._warm.stop()
            try:
                self._flusher.flush_now(force_checkpoint=True)
                with self._io_lock:
                    if self._flusher.flushed_offset == self._max_offset == self._whole_offset:
                        self._flusher.write_checkpoint(clean=True)
            finally:
                self._closed = True
                self._flusher.fail_pending()
                with self._io_lock:
                    self._close_files()

    def _close_files(self) -> None:
        self._forget_active()
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
        self._warm.close_ready()
        self._checkpoint.close()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommitLog({self._dir!r}, {self.implementation}, min={self.min_offset}, "
                f"max={self._max_offset}, flushed={self._flusher.flushed_offset})")
