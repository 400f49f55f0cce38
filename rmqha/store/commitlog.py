"""The commitlog: RocketMQ-format records in sparse, mmap-ed segment files.

This module owns the store's files and their lifecycle: segment files named by the 20-digit
offset of their first byte, the flushed-offset checkpoint, the queue-offset table per
(topic, queue id), group-committed flushing, recovery of a torn or corrupt tail, and the
background warm-up of a window ahead of the writer.

Segments are sparse: a new one is only ``ftruncate``-d to its size, and disk blocks are
reserved (``posix_fallocate``) a window ahead of the writer, never the whole file, so an
idle log costs a few MiB of disk, not two segments.  Every byte the writer puts in through
the mapping lies in reserved blocks: a write through a mapping into a hole of a full
filesystem is a SIGBUS, while a failed ``fallocate`` is a clean ENOSPC, refused as
:class:`~rmqha.errors.DiskFullError` before anything is written.  The warm-up thread
reserves and faults in the window (first touch of a page costs 8-16 us on this class of
VM) and moves it on as the writer crosses its middle; a writer that overtakes it reserves
blocks itself.  Record bytes are written by the selected twin of :mod:`rmqha._core.records`.

Replicated bytes (a slave) arrive either as ``append_data`` (validated in the caller's
buffer, then one ``pwrite``) or straight into the mapping through ``receive_view`` /
``commit_received`` (one kernel copy from the socket); both validate every record before
``max_offset`` moves and zero a bad block.  ``reset`` starts an empty log at a later
segment (a slave joining after retention on its master).

Threads: one writer at a time (appends, ``append_data``, truncate, delete, close serialise
on one lock); any number of readers (``read``, ``read_message``, ``iter_messages``) without
locks; a flusher thread; a warm-up thread.
"""
from __future__ import annotations

import errno
import fcntl
import heapq
import itertools
import json
import logging
import mmap
import os
import re
import socket
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from queue import SimpleQueue
from types import ModuleType

from rmqha import _core
from rmqha.failpoints import Failpoint, hit
from rmqha.store.disk_usage import DiskUsage, directory_usage
from rmqha.store.scrub import BadRecord, bad_records
from rmqha.errors import (
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    InvalidMessageError,
    MessageTooLargeError,
    MissingSegmentError,
    OffsetMismatchError,
    StoreClosedError,
    StoreError,
)

log = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"^[0-9]{20}$")
CHECKPOINT_FILE = "commitlog.checkpoint"
QUEUE_BASE_FILE = "queue_offsets.json"
# magic, flushed offset, min offset, flags, CRC32 of the preceding 32 bytes
_CHECKPOINT = struct.Struct(">8sqqqI")
_CLEAN = 1   # flags bit: written by close(); the log ended exactly at the flushed offset
_CHECKPOINT_MAGIC = b"RMQHACP1"
_SIZE_MAGIC = struct.Struct(">iI")
_INT32 = struct.Struct(">i")
_HOST = struct.Struct(">4si")
_ZEROS = bytes(1 << 20)
# sys flag bits for IPv6 born/store hosts: v1 records carry IPv4 only.
_SYSFLAG_V6_HOSTS = 0x10 | 0x20
_INT32_MAX = 0x7FFFFFFF
_FIXED = 91          # record bytes besides body, topic and properties
_MIN_BLANK = 8       # a segment always keeps room for the blank record's header
_NEVER = 1 << 62
_PAGE = mmap.PAGESIZE
#: Default bytes reserved and faulted in ahead of the writer.
DEFAULT_PREFAULT_WINDOW = 32 << 20


class FlushMode(str, Enum):
    ASYNC = "async"   # a background flush every flush_interval_ms
    SYNC = "sync"     # an append returns once an fsync covers it (group commit)


@dataclass(slots=True)
class StoredMessage:
    """One decoded commitlog record (every field of the RocketMQ v1 format).

    Not frozen: a frozen dataclass's ``__init__`` costs several microseconds per record,
    which would dominate reading a log back.
    """

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    body_crc: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    properties: dict[str, str]
    magic: int


@dataclass(frozen=True, slots=True)
class BatchAppendResult:
    """Where ``append_batch`` put its records.

    ``offsets[i]`` is record i's physical offset; its size is ``overhead + len(body i)``;
    its queue offset ``first_queue_offset + i``.
    """

    offsets: array
    first_queue_offset: int
    count: int
    overhead: int
    end_offset: int


def encode_host(host: str, port: int) -> bytes:
    """8-byte v1 host: IPv4 address + int32 port."""
    try:
        packed = socket.inet_aton(host)
    except OSError as exc:
        raise InvalidMessageError(f"host {host!r} is not an IPv4 address") from exc
    if not 0 <= port <= 0xFFFF:
        raise InvalidMessageError(f"port {port} out of range")
    return _HOST.pack(packed, port)


def decode_host(raw: bytes) -> tuple[str, int]:
    ip, port = _HOST.unpack(raw)
    return socket.inet_ntoa(ip), port


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    if not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidMessageError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")


def _page_up(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


def _data_end(seg: _Segment, start: int, stop: int) -> int:
    """Where the bytes of ``seg[start:stop]`` that may be non-zero end: at the first hole.
    Past a blank record's header a segment is a hole (it reads as zeros), and zeroing it
    through the mapping would take blocks, or fault on a full disk.  Filesystems without
    SEEK_HOLE report none: then everything up to ``stop`` is zeroed."""
    try:
        hole = os.lseek(seg.fd, start, os.SEEK_HOLE)
    except OSError:
        return stop
    return min(stop, max(start, hole))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Segment:
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
                _fsync_dir(os.path.dirname(path) or ".")
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
        upto = min(self.size, _page_up(upto))
        if upto <= have:
            return
        os.posix_fallocate(self.fd, have, upto - have)
        if upto > self.allocated:
            self.allocated = upto

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


class CommitLog:
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
        if not isinstance(prefault_window_bytes, int) or prefault_window_bytes < 2 * _PAGE:
            raise ConfigError(f"prefault_window_bytes must be an int >= {2 * _PAGE}, "
                              f"got {prefault_window_bytes!r}")
        self._codec: ModuleType = (_core.load("records") if implementation is None
                                   else _core.load_twin("records", implementation))
        self.implementation = "python" if self._codec.__name__.endswith("_py") else "cython"
        self._dir = os.fspath(directory)
        os.makedirs(self._dir, exist_ok=True)
        self._sb = segment_bytes
        limit = segment_bytes - self._codec.MIN_BLANK
        self._max_record = limit if max_message_bytes is None else min(limit, max_message_bytes)
        self._store_host = encode_host(*store_host)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._prefault = prefault
        self._window = _page_up(prefault_window_bytes)
        self._flush_interval = flush_interval_ms / 1000.0
        self._checkpoint_interval = checkpoint_interval_ms / 1000.0

        self._lock = threading.RLock()          # the writer side
        self._io_lock = threading.Lock()        # fd lifetime vs fdatasync
        self._flush_lock = threading.Lock()
        self._flushed_cond = threading.Condition(self._flush_lock)  # waiters on flushes
        self._flusher_cond = threading.Condition(self._flush_lock)  # wakes the flusher
        self._flush_wanted = 0
        self._futures: list[tuple[int, int, Future]] = []
        self._future_seq = itertools.count()
        self.flush_count = 0                    # fdatasync rounds done (group-commit evidence)
        self._last_checkpoint = 0.0
        self._listeners: list[Callable[[int], None]] = []
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None    # segment holding max_offset (writer cache)
        # A record of ``size`` bytes at the max offset fits the active segment without
        # reserving blocks iff ``max_offset + size + _MIN_BLANK <= _limit`` (0: ask).
        self._limit = 0
        self._topics: dict[str | bytes, bytes] = {}
        self._decoded: dict[bytes, object] = {}  # topic and host bytes -> decoded value
        self._warm_ready: dict[int, _Segment] = {}
        self._warm_lock = threading.RLock()
        self._warm_queue: SimpleQueue = SimpleQueue()
        self._warm_idle = threading.Event()
        self._warm_idle.set()
        self._warm_pending = 0
        # The warm-up keeps [max offset, max offset + window) reserved and faulted in: when
        # the writer crosses the window's middle the next half is requested.  A whole
        # segment ahead (the former design) cost two segments of disk per idle broker;
        # a writer faster than the warm-up reserves its blocks itself and takes the page
        # faults (the slave's receive path then uses pwrite: see tail_is_warm).
        self._warm_upto = 0          # global offset up to which warm-up was requested
        self._warm_next_at = _NEVER  # max offset at which the window moves on
        self._queue_offsets: dict[tuple[bytes, int], int] = {}
        self._base_table: dict[tuple[bytes, int], int] = {}
        self._closed = False
        self._closing = False

        self._max_offset = 0
        self._whole_offset = 0      # end of the last whole record (< max only on a slave)
        self._flushed_offset = 0
        self._ckpt_fd = os.open(os.path.join(self._dir, CHECKPOINT_FILE),
                                os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # One writer per directory, across processes too (released on close or exit).
            fcntl.flock(self._ckpt_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._ckpt_fd)
            raise StoreError(f"commitlog {self._dir} is already open (locked by another "
                             "CommitLog or process)") from None
        #: Records found bad below the flushed offset (see :meth:`verify_tail`): never served.
        self.corrupt: list[BadRecord] = []
        try:
            self._recover()
            self.verify_tail(verify_segments_on_open)
        except BaseException:
            self._close_files()
            raise
        self._flusher = threading.Thread(target=self._flush_loop, name="commitlog-flush",
                                         daemon=True)
        self._flusher.start()
        self._warmer = threading.Thread(target=self._warm_loop, name="commitlog-warm",
                                        daemon=True)
        self._warmer.start()
        active = self._segments.get(self.segment_start(self._max_offset))
        if active is None:
            # Create the first segment now rather than on the first append.
            with self._lock:
                self._active_segment()
        with self._lock:
            self._warm_all_ahead()

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
        return self._flushed_offset

    @property
    def flush_mode(self) -> str:
        return self._mode.value

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

    def _path(self, base: int) -> str:
        return os.path.join(self._dir, f"{base:020d}")

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise StoreClosedError(f"commitlog {self._dir} is closed")

    # --- validation ----------------------------------------------------------------------

    def _topic_bytes(self, topic: str | bytes) -> bytes:
        if isinstance(topic, str):
            try:
                tb = topic.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidMessageError(f"topic is not encodable as UTF-8: {exc}") from None
        elif isinstance(topic, bytes):
            tb = topic
        else:
            raise InvalidMessageError(f"topic must be str, got {type(topic).__name__}")
        if not tb:
            raise InvalidMessageError("topic must not be empty")
        if len(tb) > self._codec.MAX_TOPIC_BYTES:
            raise InvalidMessageError(
                f"topic is {len(tb)} bytes; the limit is {self._codec.MAX_TOPIC_BYTES}")
        return tb

    def _check_common(self, queue_id: int, flag: int, sys_flag: int, reconsume_times: int,
                      prepared_transaction_offset: int, born_timestamp: int | None) -> None:
        _check_int("queue_id", queue_id, 0, _INT32_MAX)
        _check_int("flag", flag, -_INT32_MAX - 1, _INT32_MAX)
        _check_int("sys_flag", sys_flag, 0, _INT32_MAX)
        if sys_flag & _SYSFLAG_V6_HOSTS:
            raise InvalidMessageError("sys_flag marks IPv6 hosts; v1 records hold IPv4 only")
        _check_int("reconsume_times", reconsume_times, 0, _INT32_MAX)
        _check_int("prepared_transaction_offset", prepared_transaction_offset, 0, (1 << 63) - 1)
        if born_timestamp is not None:
            _check_int("born_timestamp", born_timestamp, 0, (1 << 63) - 1)

    # --- appends -------------------------------------------------------------------------

    def append(self, topic: str | bytes, body: bytes | bytearray | memoryview,
               queue_id: int = 0, properties: Mapping[str, str] | None = None, *,
               flag: int = 0, sys_flag: int = 0, born_timestamp: int | None = None,
               born_host: tuple[str, int] | None = None, reconsume_times: int = 0,
               prepared_transaction_offset: int = 0, wait_flush: bool = True) -> tuple[int, int]:
        """Append one message; returns ``(physical offset, size)``.

        In sync flush mode this returns once an fsync covers the record, unless
        ``wait_flush=False``: then the caller waits with :meth:`flush_future` (one fsync can
        then cover a whole batch of appends).
        """
        # The common case (a known topic, default fields) stays on a short path: at a few
        # hundred ns per record in the codec, Python-level checks would dominate.
        tb = self._topics.get(topic)
        if tb is None:
            tb = self._topic_bytes(topic)
            if len(self._topics) < 4096:
                self._topics[topic] = tb
        if type(body) is not bytes and not isinstance(body, (bytearray, memoryview)):
            raise InvalidMessageError(f"body must be bytes-like, got {type(body).__name__}")
        pb = self._codec.encode_properties(properties) if properties else b""
        if (type(queue_id) is not int or not 0 <= queue_id <= _INT32_MAX or flag or sys_flag
                or reconsume_times or prepared_transaction_offset
                or born_timestamp is not None):
            self._check_common(queue_id, flag, sys_flag, reconsume_times,
                               prepared_transaction_offset, born_timestamp)
        bh = self._store_host if born_host is None else encode_host(*born_host)
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
            end = offset + size
            self._max_offset = self._whole_offset = end
            if end >= self._warm_next_at:
                self._warm_next()
        if self._listeners or self._mode is FlushMode.SYNC:
            self._appended(end, wait_flush)
        return offset, size

    def append_batch(self, topic: str | bytes, bodies: Sequence[bytes] | Iterable[bytes],
                     queue_id: int = 0, properties: Mapping[str, str] | None = None, *,
                     flag: int = 0, sys_flag: int = 0, born_timestamp: int | None = None,
                     born_host: tuple[str, int] | None = None, reconsume_times: int = 0,
                     prepared_transaction_offset: int = 0,
                     wait_flush: bool = True) -> BatchAppendResult:
        """Append many messages to one (topic, queue) with shared properties, in C loops.

        ``wait_flush`` as for :meth:`append` (sync flush mode: one fsync covers the batch).

        Every body is checked before anything is written; rolling segments as needed.
        """
        tb = self._topic_bytes(topic)
        pb = self._codec.encode_properties(properties)
        self._check_common(queue_id, flag, sys_flag, reconsume_times,
                           prepared_transaction_offset, born_timestamp)
        bh = self._store_host if born_host is None else encode_host(*born_host)
        items = bodies if isinstance(bodies, list) else list(bodies)
        n = len(items)
        offsets = array("q", bytes(8 * n))
        overhead = self._codec.FIXED_SIZE + len(tb) + len(pb)
        codec = self._codec
        limit = self._sb - codec.MIN_BLANK
        with self._lock:
            self._check_open()
            key = (tb, queue_id)
            q0 = self._queue_offsets.get(key, 0)
            now = self._clock()
            born = now if born_timestamp is None else born_timestamp
            done = 0
            try:
                while done < n:
                    seg = self._active_segment()
                    pos = self._max_offset - seg.base
                    # Records go only where blocks are reserved (the first call also
                    # checks every body, before anything is written).
                    count, end = codec.write_batch(
                        seg.mm, pos, max(pos, min(limit, seg.allocated)), tb, items, done, pb,
                        queue_id, flag, q0 + done, seg.base, sys_flag, born, bh, now,
                        self._store_host, reconsume_times, prepared_transaction_offset,
                        offsets, self._max_record)
                    done += count
                    self._max_offset = self._whole_offset = seg.base + end
                    if done < n:
                        need = end + overhead + len(items[done])
                        if need <= limit:
                            self._allocate(seg, need)  # the window ran out: reserve more
                            continue
                        # The next record does not fit: pad this segment and roll.
                        self._allocate(seg, end + codec.MIN_BLANK)
                        codec.write_blank(seg.mm, end, self._sb - end)
                        self._max_offset = self._whole_offset = seg.base + self._sb
            finally:
                if done:
                    self._queue_offsets[key] = q0 + done
            end_offset = self._max_offset
            if end_offset >= self._warm_next_at:
                self._warm_next()
        if n:
            self._appended(end_offset, wait_flush)
        return BatchAppendResult(offsets, q0, n, overhead, end_offset)

    def append_data(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Slave side: write raw log bytes at exactly ``max_offset``; returns the new max.

        The block may end inside a record (the next block continues it) but never crosses a
        segment end.  Whole records in it are validated (magic, sizes, offsets, CRC) and fed
        to the queue-offset table; an invalid one undoes the write and raises.

        The bytes go to the segment file with ``pwrite`` (a kernel copy through its direct
        map: on this class of VM far cheaper than a user-space copy into a mapping that is
        not warm yet); the records are validated in ``data`` itself, only a record begun
        by an earlier block is checked in the file.  Nothing is visible to readers before
        max_offset moves, and that happens only after validation.  A receiver that can
        put the bytes straight into the log uses :meth:`receive_view` instead.
        """
        n = len(data)
        with self._lock:
            seg, pos = self._tail_block(offset, n)
            if n == 0:
                return offset
            try:
                self._pwrite(seg, data, pos)
            except OSError:
                self._zero(seg, pos, pos + n)  # no partial block may linger past the end
                raise
            end_offset = self._commit_block(seg, pos, n, data)
        self._appended(end_offset)
        return end_offset

    def receive_view(self, offset: int, size: int) -> memoryview:
        """Slave side: a writable view of the ``size`` log bytes at ``offset`` (exactly
        ``max_offset``, inside one segment), to receive replicated bytes straight into the
        segment's mapping (``socket.recv_into``) with no copy in between.

        What is written there stays invisible (beyond ``max_offset``) until
        :meth:`commit_received` validates it; :meth:`discard_received` zeroes an abandoned
        one.  One writer: no other write, truncate or reset may come in between.
        """
        with self._lock:
            seg, pos = self._tail_block(offset, size)
            return seg.view[pos:pos + size]

    def tail_is_warm(self, offset: int, size: int) -> bool:
        """Whether the ``size`` bytes at ``offset`` (max offset, one segment) are in memory
        already, so that receiving into :meth:`receive_view` costs no page allocation;
        when not (warm-up is behind), :meth:`append_data` from a buffer is cheaper."""
        seg = self._segments.get(self.segment_start(offset))
        if seg is None or size <= 0:
            return False
        pos = offset - seg.base
        if pos + size > self._sb:
            return False
        try:
            return bool(self._codec.resident(seg.mm, pos, pos + size))
        except ValueError:  # unmapped under us (truncate / close)
            return False

    def commit_received(self, offset: int, size: int) -> int:
        """Make ``size`` bytes received through :meth:`receive_view` at ``offset`` part of
        the log, exactly as :meth:`append_data` would (same validation; an invalid record
        zeroes them and raises CorruptRecordError); returns the new max offset."""
        with self._lock:
            seg, pos = self._tail_block(offset, size)
            if size == 0:
                return offset
            end_offset = self._commit_block(seg, pos, size, None)
        self._appended(end_offset)
        return end_offset

    def discard_received(self, offset: int, size: int) -> None:
        """Zero ``size`` bytes received at ``offset`` (the max offset) and never committed
        (a link that broke mid-block), so no stray bytes follow the log's end."""
        with self._lock:
            if self._closed or offset != self._max_offset or size <= 0:
                return
            seg, pos = self._tail_block(offset, size)
            self._zero(seg, pos, pos + size)

    def _tail_block(self, offset: int, n: int) -> tuple[_Segment, int]:
        """(segment, position) of an ``n``-byte block at the max offset; with the lock held."""
        self._check_open()
        if offset != self._max_offset:
            raise OffsetMismatchError(
                f"replicated data at {offset}, but the log ends at {self._max_offset}")
        if n < 0:
            raise StoreError(f"negative block size {n}")
        seg_end = self.segment_end(offset)
        if offset + n > seg_end:
            raise StoreError(
                f"a block of {n} bytes at {offset} crosses the segment end {seg_end}")
        seg = self._active_segment()
        pos = offset - seg.base
        # Reserved before a byte arrives: a receive_view write into a hole of a full disk
        # would be a SIGBUS, and pwrite's ENOSPC would leave a block to undo.
        self._allocate(seg, pos + n)
        return seg, pos

    def _commit_block(self, seg: _Segment, pos: int, n: int,
                      data: bytes | bytearray | memoryview | None) -> int:
        """Validate a block written at ``seg[pos:pos+n]`` (``data``: its source, checked
        there; None: check the segment) and advance the log, or zero it and raise."""
        end = pos + n
        table: dict[tuple[bytes, int], int] = {}
        if data is None:
            stop_pos, stop, _ = self._codec.scan(seg.mm, self._whole_offset - seg.base, end,
                                                 seg.base, 0, table)
        else:
            stop_pos, stop = self._validate_block(seg, data, pos, end, table)
        S = self._codec.ScanStop
        incomplete = stop == S.TORN or (stop == S.ZEROS and end - stop_pos < 8)
        bad = stop not in (S.END, S.BLANK) and not incomplete
        if not bad and end == self._sb and stop_pos != self._sb:
            bad = True
        if bad:
            self._zero(seg, pos, end)
            raise CorruptRecordError(
                f"replicated block at {seg.base + pos}: invalid record at {seg.base + stop_pos} "
                f"({S(stop).name}); nothing written")
        self._queue_offsets.update(table)
        self._max_offset = seg.base + end
        self._whole_offset = seg.base + stop_pos
        if self._max_offset >= self._warm_next_at:
            self._warm_next()
        return self._max_offset

    @staticmethod
    def _pwrite(seg: _Segment, data: bytes | bytearray | memoryview, pos: int) -> None:
        done = os.pwrite(seg.fd, data, pos)
        n = len(data)
        if done < n:  # short write (a signal, a nearly full disk): finish it
            view = memoryview(data).cast("B")
            while done < n:
                done += os.pwrite(seg.fd, view[done:], pos + done)

    def _validate_block(self, seg: _Segment, data: bytes | bytearray | memoryview, pos: int,
                        end: int, table: dict[tuple[bytes, int], int]) -> tuple[int, int]:
        """Scan the records of a block written at ``seg[pos:end]``: (stop position, ScanStop)."""
        codec = self._codec
        wpos = self._whole_offset - seg.base
        rec_end = pos
        if wpos < pos:
            # A record begun by an earlier block: its head is only in the file, so check it
            # there (one record); the rest of the block is checked in ``data``.
            rec_end = end
            if end - wpos >= 8:
                (total,) = _INT32.unpack_from(seg.mm, wpos)
                if pos < wpos + total < end:
                    rec_end = wpos + total
            stop_pos, stop, _ = codec.scan(seg.mm, wpos, rec_end, seg.base, 0, table)
            if rec_end == end or stop != codec.ScanStop.END:
                return stop_pos, stop
        stop_pos, stop, _ = codec.scan(data, rec_end - pos, end - pos, seg.base + pos, 0, table,
                                       False, self._sb - pos)
        return pos + stop_pos, stop

    def _appended(self, end: int, wait_flush: bool = True) -> None:
        for cb in self._listeners:
            cb(end)
        if wait_flush and self._mode is FlushMode.SYNC:
            self._wait_flushed(end)

    # --- segments ------------------------------------------------------------------------

    def _room_for(self, size: int) -> _Segment:
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

    def _allocate(self, seg: _Segment, upto: int) -> None:
        """Reserve ``seg``'s blocks up to position ``upto`` before the writer touches them
        (with the writer's lock).  Normally the warm-up did; a writer that overtook it
        reserves a window at once, or on a nearly full disk just what it needs.
        DiskFullError when even that is refused: nothing has been written."""
        if upto <= seg.allocated:
            return
        try:
            seg.allocate(upto + self._window)
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

    def _active_segment(self) -> _Segment:
        base = self.segment_start(self._max_offset)
        seg = self._segments.get(base)
        if seg is not None:
            if seg is not self._active:
                self._active = seg
                self._limit = 0
            return seg
        with self._warm_lock:
            seg = self._warm_ready.pop(base, None)
            if seg is None:
                seg = _Segment(self._path(base), base, self._sb, create=True)
            self._segments[base] = seg
        if self._warm_upto <= self._max_offset:
            self._warm_next()  # the writer got here before its warm-up
        # The next file now (sparse: costs no blocks), so the window can run into it.
        self._request_warm(("create", base + self._sb))
        self._active = seg
        self._limit = 0
        return seg

    def _forget_active(self) -> None:
        self._active = None
        self._limit = 0

    def _warm_all_ahead(self) -> None:
        """Warm a fresh window from the max offset (after open, truncate and reset: the
        writer may go fast from here, and zeroed pages were left write-protected)."""
        self._warm_upto = self._max_offset
        self._warm_next()

    def _warm_next(self) -> None:
        """The writer crossed the window's middle: request the window from here on (within
        the active segment and the next one)."""
        mx = self._max_offset
        upto = min(mx + self._window, self.segment_start(mx) + 2 * self._sb)
        start = max(self._warm_upto, mx)
        if start < upto:
            self._request_warm(("range", start, upto))
            self._warm_upto = upto
        # Half a window on (less when the next segment's end caps the window).
        self._warm_next_at = max(upto - self._window // 2, (mx + upto) // 2 + 1)

    def _request_warm(self, job: tuple) -> None:
        if not self._prefault:
            return
        with self._warm_lock:
            self._warm_idle.clear()
            self._warm_pending += 1
        self._warm_queue.put(job)

    def _warm_loop(self) -> None:
        while True:
            job = self._warm_queue.get()
            try:
                if job[0] == "stop":
                    return
                if job[0] == "create":
                    self._warm_segment(job[1])
                elif job[0] == "range":
                    start, end = job[1], job[2]
                    while start < end and not self._closing:
                        base = start - start % self._sb
                        seg = self._warm_segment(base)
                        if seg is None:
                            break
                        stop = min(end, base + self._sb)
                        with self._io_lock:  # segments close (fd -1) under this lock
                            if seg.fd < 0:
                                break
                            seg.allocate(stop - base)
                        # Only reserved blocks are touched (no SIGBUS on a full disk).
                        self._codec.prefault(seg.mm, start - base, stop - base)
                        start = stop
            except (OSError, ValueError) as exc:
                # Warming is an optimisation; a failure shows up again, loudly, on the writer.
                log.warning("commitlog warm-up %s failed: %s", job[0], exc)
            finally:
                with self._warm_lock:
                    self._warm_pending -= 1
                    if self._warm_pending <= 0:
                        self._warm_idle.set()

    def _warm_segment(self, base: int) -> _Segment | None:
        """The segment at ``base`` for warm-up, creating the writer's next one if needed."""
        with self._warm_lock:
            seg = self._segments.get(base) or self._warm_ready.get(base)
            if seg is not None or self._closing:
                return seg
            # Only ever the segment right after the writer's: a job queued before a
            # truncate or reset must not leave a file beyond a gap.
            if base != self.segment_start(self._max_offset) + self._sb:
                return None
            seg = _Segment(self._path(base), base, self._sb, create=True)
            self._warm_ready[base] = seg
            return seg

    def wait_prefaulted(self, timeout: float | None = None) -> bool:
        """Top the window ahead of the writer up to its full size and block until it is
        reserved and faulted in (False when ``timeout`` ran out first)."""
        with self._lock:
            if not self._closing and not self._closed:
                self._warm_next()
        return self._warm_idle.wait(timeout)

    @property
    def prefault_window_bytes(self) -> int:
        return self._window

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
        return self._message(fields)

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
            yield self._message(fields)
            off += fields[0]

    def _message(self, f: tuple) -> StoredMessage:
        # Topics and hosts repeat from record to record: decode each distinct value once.
        names = self._decoded
        topic = names.get(f[15])
        if topic is None:
            topic = f[15].decode("utf-8", "replace")
            if len(names) < 4096:
                names[f[15]] = topic
        born = names.get(f[9])
        if born is None:
            born = names[f[9]] = decode_host(f[9])
        store = names.get(f[11])
        if store is None:
            store = names[f[11]] = decode_host(f[11])
        return StoredMessage(
            topic=topic, body=f[14], queue_id=f[3],
            queue_offset=f[5], physical_offset=f[6], size=f[0], body_crc=f[2], flag=f[4],
            sys_flag=f[7], born_timestamp=f[8], born_host=born,
            store_timestamp=f[10], store_host=store, reconsume_times=f[12],
            prepared_transaction_offset=f[13],
            properties=self._codec.decode_properties(f[16]) if f[16] else {}, magic=f[1])

    # --- flushing ------------------------------------------------------------------------

    def _wait_flushed(self, offset: int) -> None:
        with self._flush_lock:
            if self._flushed_offset >= offset:
                return
            if self._flush_wanted < offset:
                self._flush_wanted = offset
                self._flusher_cond.notify()
            while self._flushed_offset < offset:
                if self._closed:
                    raise StoreClosedError("commitlog closed before the record was flushed")
                self._flushed_cond.wait()

    def flush_future(self, offset: int) -> Future:
        """A future done when ``flushed_offset >= offset`` (result: the flushed offset).

        In sync mode it asks for a flush at once; in async mode the next timed flush does it.
        """
        fut: Future = Future()
        with self._flush_lock:
            if self._flushed_offset >= offset:
                fut.set_result(self._flushed_offset)
                return fut
            if self._closed:
                fut.set_exception(StoreClosedError("commitlog is closed"))
                return fut
            heapq.heappush(self._futures, (offset, next(self._future_seq), fut))
            if self._mode is FlushMode.SYNC and self._flush_wanted < offset:
                self._flush_wanted = offset
                self._flusher_cond.notify()
        return fut

    def flush(self) -> int:
        """fsync everything appended so far and record the checkpoint; returns the offset."""
        self._flush_now(force_checkpoint=True)
        return self._flushed_offset

    def _flush_loop(self) -> None:
        while True:
            with self._flush_lock:
                if self._mode is FlushMode.SYNC:
                    while not self._closing and self._flush_wanted <= self._flushed_offset:
                        self._flusher_cond.wait(self._checkpoint_interval)
                        if self._flushed_offset > self._checkpointed:
                            break
                elif not self._closing:
                    self._flusher_cond.wait(self._flush_interval)
                if self._closing:
                    return
            try:
                self._flush_now()
            except OSError as exc:
                log.error("commitlog flush failed: %s", exc)
                time.sleep(self._flush_interval)

    def _flush_now(self, force_checkpoint: bool = False) -> None:
        with self._io_lock:
            target = self._max_offset
            start = self._flushed_offset
            if target > start:
                for seg in list(self._segments.values()):
                    if seg.base < target and seg.base + self._sb > start:
                        os.fdatasync(seg.fd)
                hit(Failpoint.AFTER_FLUSH)  # only flushes that wrote something count
            with self._flush_lock:
                if target > self._flushed_offset:
                    self._flushed_offset = target
                    self.flush_count += 1
                self._resolve_futures()
                self._flushed_cond.notify_all()
            now = time.monotonic()
            if force_checkpoint or (self._flushed_offset != self._checkpointed and
                                    now - self._last_checkpoint >= self._checkpoint_interval):
                self._write_checkpoint()

    def _resolve_futures(self) -> None:
        while self._futures and self._futures[0][0] <= self._flushed_offset:
            _, _, fut = heapq.heappop(self._futures)
            if not fut.done():
                fut.set_result(self._flushed_offset)

    # --- checkpoint and queue base -------------------------------------------------------

    _checkpointed = -1

    def _write_checkpoint(self, clean: bool = False) -> None:
        head = _CHECKPOINT_MAGIC + struct.pack(">qqq", self._flushed_offset, self.min_offset,
                                               _CLEAN if clean else 0)
        os.pwrite(self._ckpt_fd, head + struct.pack(">I", zlib.crc32(head)), 0)
        os.fdatasync(self._ckpt_fd)
        self._checkpointed = self._flushed_offset
        self._last_checkpoint = time.monotonic()

    def _read_checkpoint(self) -> tuple[int, bool]:
        """(flushed offset, clean shutdown); (0, False) when missing or corrupt."""
        raw = os.pread(self._ckpt_fd, _CHECKPOINT.size, 0)
        if not raw:
            return 0, False
        if len(raw) == _CHECKPOINT.size:
            magic, flushed, _min, flags, crc = _CHECKPOINT.unpack(raw)
            if magic == _CHECKPOINT_MAGIC and zlib.crc32(raw[:-4]) == crc and flushed >= 0:
                return flushed, bool(flags & _CLEAN)
        log.warning("commitlog checkpoint %s is corrupt: validating every record",
                    os.path.join(self._dir, CHECKPOINT_FILE))
        return 0, False

    def _save_queue_base(self, valid_at: int) -> None:
        path = os.path.join(self._dir, QUEUE_BASE_FILE)
        doc = {"valid_at": valid_at,
               "queues": [[t.decode("latin-1"), q, n] for (t, q), n in self._base_table.items()]}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(self._dir)

    def _check_first_segment(self, first_base: int) -> None:
        """A log may start past 0 only where retention or ``reset`` moved its start, and
        both record that start in ``queue_offsets.json`` first; anything else is a first
        segment gone missing (a slave would then claim bytes it does not hold)."""
        if first_base == 0:
            return
        path = os.path.join(self._dir, QUEUE_BASE_FILE)
        try:
            with open(path, encoding="utf-8") as fh:
                recorded = int(json.load(fh)["valid_at"])
        except FileNotFoundError:
            recorded = 0
        except (ValueError, KeyError, TypeError):
            return  # unreadable: _load_queue_base says so; the segments are the evidence left
        if recorded < first_base:
            raise MissingSegmentError(
                f"commitlog segment {self._path(recorded)} is missing: the log starts at "
                f"{self._path(first_base)} but the store records its start at {recorded} "
                f"({QUEUE_BASE_FILE}); restore the file, or let the broker rebuild this store "
                f"from its master (rebuild_store_from_master)")

    def _load_queue_base(self, first_base: int) -> dict[tuple[bytes, int], int]:
        path = os.path.join(self._dir, QUEUE_BASE_FILE)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            if doc["valid_at"] < first_base:
                # Segments went missing without being recorded (deleted by hand?): the table
                # is still the best lower bound for queues that lived only in them.
                log.warning("%s describes the log before %s, but the log starts at %d",
                            path, doc["valid_at"], first_base)
            # Records still present (valid_at > first_base after a crash mid-delete) are
            # scanned again on top and only raise the values.
            return {(t.encode("latin-1"), int(q)): int(n) for t, q, n in doc["queues"]}
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s is unreadable (%s): queue offsets restart from the log", path, exc)
            return {}

    # --- recovery ------------------------------------------------------------------------

    def _recover(self) -> None:
        bases = sorted(int(n) for n in os.listdir(self._dir) if _SEGMENT_NAME.match(n))
        for b in bases:
            if b % self._sb:
                raise StoreError(f"segment {self._path(b)} does not start at a multiple of "
                                 f"segment_bytes={self._sb}")
        for prev, nxt in zip(bases, bases[1:]):
            if nxt != prev + self._sb:
                raise MissingSegmentError(
                    f"commitlog segment {self._path(prev + self._sb)} is missing (the log has "
                    f"{self._path(prev)} and then {self._path(nxt)}); restore it, or let the "
                    f"broker rebuild this store from its master (rebuild_store_from_master)")
        if bases:
            self._check_first_segment(bases[0])
        checkpoint, clean = self._read_checkpoint()
        if not bases:
            self._flushed_offset = 0
            self._write_checkpoint()
            return
        self._base_table = self._load_queue_base(bases[0])
        table = dict(self._base_table)
        S = self._codec.ScanStop
        end = bases[0]
        last = len(bases) - 1
        for i, base in enumerate(bases):
            seg = _Segment(self._path(base), base, self._sb, create=False)
            self._segments[base] = seg
            pos, stop, _count = self._codec.scan(seg.mm, 0, self._sb, base, checkpoint, table)
            if stop == S.BLANK or (stop == S.END and pos == self._sb):
                end = base + self._sb
                continue
            end = base + pos
            if stop != S.ZEROS:
                log.warning("commitlog recovery: cut the log at offset %d: %s (%s)", end,
                            S(stop).name, self._path(base))
            # After a crash, anything after the end may be garbage from a torn write (pages
            # reach the disk in any order), so stale records could sit right after the new
            # end; zero it cheaply (shrink and re-extend the file) so they can never be read
            # back.  After close() (clean flag, nothing written since) the rest is zeros.
            if stop != S.ZEROS or not clean or end != checkpoint:
                self._segments.pop(base)
                seg.close()
                fd = os.open(seg.path, os.O_RDWR)
                try:
                    os.ftruncate(fd, pos)
                    os.ftruncate(fd, self._sb)  # a hole again: zeros, no blocks
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                self._segments[base] = _Segment(seg.path, base, self._sb, create=False)
            for later in bases[i + 1:]:
                path = self._path(later)
                with open(path, "rb") as fh:
                    unused = not any(fh.read(8))
                # A never-written segment is the warmed-up next one: expected, not news.
                log.log(logging.DEBUG if unused else logging.WARNING,
                        "commitlog recovery: removing segment %s after the log end %d",
                        path, end)
                os.unlink(path)
            if i < last:
                _fsync_dir(self._dir)
            break
        if checkpoint > end:
            log.error("commitlog recovery: the checkpoint says %d was flushed but the log "
                      "ends at %d: flushed data was lost", checkpoint, end)
        self._queue_offsets = table
        self._max_offset = self._whole_offset = end
        # Recovered bytes may still be only in the page cache (a process crash): make them
        # durable before calling them flushed.
        for seg in self._segments.values():
            os.fdatasync(seg.fd)
        self._flushed_offset = end
        self._write_checkpoint()

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

    def _zero(self, seg: _Segment, start: int, stop: int) -> None:
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
                raise StoreError(f"truncate to {offset} outside the log "
                                 f"{self.min_offset}..{self._max_offset}")
            S = self._codec.ScanStop
            base = self.segment_start(offset)
            seg = self._segments[base] if base in self._segments else None
            # Forget the dropped records' queue offsets (the lowest dropped one per queue).
            dropped: dict[tuple[bytes, int], int] = {}
            cur = offset
            while cur < self._whole_offset:
                b = self.segment_start(cur)
                s = self._segments[b]
                data_end = min(self._sb, self._whole_offset - b)
                pos, stop, _ = self._codec.scan(s.mm, cur - b, data_end, b, 1 << 62,
                                                dropped, True)
                if cur == offset and pos == cur - b and stop not in (S.END, S.BLANK):
                    raise StoreError(f"truncate to {offset}: not a record boundary "
                                     f"({S(stop).name})")
                if stop != S.BLANK:
                    break
                cur = b + self._sb
            with self._io_lock:
                for key, q in dropped.items():
                    if q < self._queue_offsets.get(key, 0):
                        if q:
                            self._queue_offsets[key] = q
                        else:
                            self._queue_offsets.pop(key, None)
                if seg is not None:
                    start = offset - base
                    self._zero(seg, start, _data_end(seg, start, min(self._sb, self._max_offset - base)))
                    os.fdatasync(seg.fd)
                removed = False
                self._forget_active()
                for b in sorted(self._segments):
                    if b > base:
                        self._segments.pop(b).close()
                        os.unlink(self._path(b))
                        removed = True
                with self._warm_lock:
                    for b in list(self._warm_ready):
                        self._warm_ready.pop(b).close()
                        os.unlink(self._path(b))
                        removed = True
                if removed:
                    _fsync_dir(self._dir)
                self._max_offset = offset
                self._whole_offset = min(self._whole_offset, offset)
                with self._flush_lock:
                    if self._flushed_offset > offset:
                        self._flushed_offset = offset
                    self._flush_wanted = min(self._flush_wanted, offset)
                self._write_checkpoint()
            # Zeroing and fdatasync left the pages clean and write-protected: fault them
            # writable again off the hot path (and the next segment).
            self._warm_all_ahead()
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
                self._base_table = {}
                self._queue_offsets = {}
                self._save_queue_base(offset)
                self._forget_active()
                victims = [self._segments.pop(b) for b in sorted(self._segments)]
                # Under the warm-up lock: no job may create a segment of the old or the new
                # geometry while the files change (a stray file would leave a gap).
                with self._warm_lock:
                    victims.extend(self._warm_ready.pop(b) for b in sorted(self._warm_ready))
                    self._max_offset = self._whole_offset = offset
                    for seg in victims:
                        seg.close()
                        os.unlink(seg.path)
                    _fsync_dir(self._dir)
                    seg = _Segment(self._path(offset), offset, self._sb, create=True)
                os.fdatasync(seg.fd)
                self._segments[offset] = seg
                self._active = seg
                self._limit = 0
                _fsync_dir(self._dir)
                with self._flush_lock:
                    self._flushed_offset = offset
                    self._flush_wanted = min(self._flush_wanted, offset)
                    self._resolve_futures()
                    self._flushed_cond.notify_all()
                self._write_checkpoint()
            self._warm_all_ahead()
            log.info("commitlog reset: empty log at %d (%d old segment file(s) removed)",
                     offset, len(victims))

    def cut_to_last_whole_record(self) -> int:
        """Drop a partial record at the end (slave side); returns the new max offset."""
        with self._lock:
            if self._whole_offset < self._max_offset:
                whole = self._whole_offset
                seg = self._active_segment()
                with self._io_lock:
                    self._zero(seg, whole - seg.base, self._max_offset - seg.base)
                    self._max_offset = whole
                    with self._flush_lock:
                        if self._flushed_offset > whole:
                            self._flushed_offset = whole
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
                    self._codec.scan(seg.mm, 0, self._sb, b, 1 << 62, self._base_table)
                self._save_queue_base(victims[-1] + self._sb)
                for b in victims:
                    self._segments.pop(b).close()
                    os.unlink(self._path(b))
                _fsync_dir(self._dir)
                self._write_checkpoint()
            log.info("commitlog deleted %d segment(s) before %d", len(victims), offset)
            return len(victims)

    # --- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, stop the threads and unmap everything; idempotent."""
        with self._lock:
            if self._closed:
                return
            with self._flush_lock:
                self._closing = True
                self._flusher_cond.notify_all()
            self._flusher.join()
            self._warm_queue.put(("stop",))
            self._warmer.join()
            try:
                self._flush_now(force_checkpoint=True)
                with self._io_lock:
                    if self._flushed_offset == self._max_offset == self._whole_offset:
                        self._write_checkpoint(clean=True)
            finally:
                with self._flush_lock:
                    self._closed = True
                    for _, _, fut in self._futures:
                        if not fut.done():
                            fut.set_exception(StoreClosedError("commitlog closed"))
                    self._futures.clear()
                    self._flushed_cond.notify_all()
                with self._io_lock:
                    self._close_files()

    def _close_files(self) -> None:
        self._forget_active()
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
        for seg in self._warm_ready.values():
            seg.close()
        self._warm_ready.clear()
        if self._ckpt_fd >= 0:
            os.close(self._ckpt_fd)
            self._ckpt_fd = -1

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommitLog({self._dir!r}, {self.implementation}, min={self.min_offset}, "
                f"max={self._max_offset}, flushed={self._flushed_offset})")
