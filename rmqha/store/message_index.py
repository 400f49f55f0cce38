"""The message index: topic + key (``KEYS``, space separated) or unique id (``UNIQ_KEY``)
-> commitlog offsets, on disk, for QUERY_MESSAGE and the unique-key lookups clients make.

Like the consume-queue index it is built by scanning the commitlog's own records, and only
up to what the consume queue has indexed (never past the confirm offset), so every replica
has one and a lookup never finds a message a failover could take back.

Layout.  A directory of index files, each named by the 20-digit commit offset where it
begins; the newest one takes new entries, the others are full.  A file is a fixed-size
hash table, memory mapped (RocketMQ's IndexFile has the same shape):

* a 128-byte header: magic, sizes, entry count, the commit offset range it covers
  (``end_phys``: records below it were scanned), the store-time range of its entries, a
  checkpoint (entry count and ``end_phys`` as of the last flush) with a clean flag, and
  the id of the boot during which it was opened for writing (16 bytes at 72; zeros in
  files of older versions);
* ``slot_count`` int32 slots: the 1-based number of the newest entry whose key hash falls
  in the slot (0 = none);
* ``capacity`` 24-byte entries in commit-offset order: commit offset, store timestamp,
  key hash (CRC32 of ``topic#key``), and the number of the previous entry of the slot.

Files are created sparse, header and slots allocated at once and entry blocks ahead of
the writes (a write into a mapping with no block behind it on a full filesystem would
kill the process): a full disk stops the index where it is until there is room.

The scan that turns records into entries is a hot path with two twins
(``rmqha._core.message_index``: compiled and pure, identical bytes).

A lookup walks one chain per file (newest first) and reads each candidate record to check
topic and key, so hash collisions cost a read, never a wrong answer.

Crash recovery.  :meth:`IndexFile.flush` msyncs the entries and slots, then records the
checkpoint; the periodic flush does the same on a thread of its own (fdatasync, then the
checkpoint of what was written before it started), off the broker's loop; a clean close
sets the clean flag.  A file opened without it keeps only the
checkpointed entries (they were on disk before the checkpoint said so) and the index
scans the log again from the checkpoint's ``end_phys``.  After a process crash (the file
was opened during this boot, so every byte written is in the page cache) the entries
written since the checkpoint are unlinked newest first, as a truncation does: the work
is bounded by what was written since the checkpoint.  After a reboot (or with no boot id)
pages may have reached the disk in any order, so every slot chain is rebuilt from the
checkpointed entries.  A slave's truncation unlinks the entries at or past the cut, newest first
(each was the head of its chain when added, so this restores the chains exactly).
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqha import _core
from rmqha.errors import StoreError
from rmqha.store.checkpoint import boot_id
from rmqha.store.segments import fsync_dir
from rmqha.store.consume_queue import LogReader
from rmqha.protocol.message import REC_FIXED

log = logging.getLogger(__name__)

_impl = _core.load("message_index")
#: The most entries one record adds (the twins' key limit).
_MAX_KEYS_PER_RECORD = 64

MAGIC = b"RMQHAIX1"
VERSION = 1
HEADER_SIZE = 128
#: magic, version, slot_count, capacity, count, clean, durable_count, begin_phys,
#: end_phys, durable_end_phys, min_ts, max_ts
_HEADER = struct.Struct(">8sIIIIIIqqqqq")
_END_PHYS_AT = 40
_BOOT_AT = _HEADER.size
_BOOT_SIZE = 16
_ENTRY = struct.Struct(">qqIi")  # commit offset, store timestamp, key hash, previous entry
ENTRY_SIZE = _ENTRY.size
_SLOT = struct.Struct(">i")
_Q = struct.Struct(">q")
_BODY_LEN = struct.Struct(">i")
_PROPS_LEN = struct.Struct(">H")

#: Defaults: 1 Mi slots (4 MiB) and 4 Mi entries (96 MiB) per file, created sparse.
DEFAULT_SLOTS = 1 << 20
DEFAULT_ENTRIES = 4 << 20
#: Entry blocks are allocated ahead of the writes this much at a time.
RESERVE_BYTES = 1 << 20
#: RocketMQ's key separator in the KEYS property.
KEY_SEPARATOR = " "
#: Keys longer than this are not indexed (RocketMQ bounds keys in the same spirit).
MAX_KEY_BYTES = 1024


def key_hash(topic: str, key: str) -> int:
    """The hash an index entry carries: CRC32 of ``topic#key`` (UTF-8)."""
    return zlib.crc32(f"{topic}#{key}".encode())


@dataclass(frozen=True)
class Hit:
    """One index entry a lookup found (a candidate: the record still has to match)."""

    commit_offset: int
    store_timestamp: int


class IndexFile:
    """One memory-mapped hash-table file (see the module docstring for the layout)."""

    # Read from the header with struct (untyped): declared here for the checker.
    capacity: int
    reserved: int
    _entries_at: int

    def __init__(self, path: Path, mm: mmap.mmap, fd: int) -> None:
        self.path = path
        self._mm = mm
        self._fd = fd
        (magic, version, self.slot_count, self.capacity, self.count, _clean,
         _durable, self.begin_phys, self.end_phys, _dend, self.min_ts,
         self.max_ts) = _HEADER.unpack_from(mm, 0)
        self._entries_at = HEADER_SIZE + 4 * self.slot_count
        self._dirty = False
        self._sealed = False
        #: Entries whose blocks are allocated (written ones are, the rest by reserve()).
        self.reserved = self.count

    # --- create / open -------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, begin_phys: int, slot_count: int, capacity: int) -> IndexFile:
        if slot_count < 1 or capacity < 1:
            raise ValueError("an index file needs at least one slot and one entry")
        size = HEADER_SIZE + 4 * slot_count + ENTRY_SIZE * capacity
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            # Header and slots get their blocks now; entries as they are needed (see
            # reserve()): a write into the mapping where the filesystem has no block left
            # would kill the process (SIGBUS) instead of failing cleanly.
            os.posix_fallocate(fd, 0, HEADER_SIZE + 4 * slot_count)
            header = _HEADER.pack(MAGIC, VERSION, slot_count, capacity, 0, 1, 0, begin_phys,
                                  begin_phys, begin_phys, 0, 0)
            os.pwrite(fd, header, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(str(path.parent))  # the new file's name, or a power loss drops the file
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> IndexFile:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise StoreError(f"index file {path} is {size} bytes, shorter than its header")
            head = os.pread(fd, _HEADER.size, 0)
            magic, version, slots, capacity, count, clean, durable, begin, end, dend, _, _ = \
                _HEADER.unpack(head)
            if magic != MAGIC or version != VERSION:
                raise StoreError(f"{path} is not an rmqha message index file")
            want = HEADER_SIZE + 4 * slots + ENTRY_SIZE * capacity
            if slots < 1 or capacity < 1 or size != want:
                raise StoreError(f"index file {path} is {size} bytes; its header says {want}")
            if count > capacity or durable > capacity or not begin <= dend <= end:
                raise StoreError(f"index file {path} has an inconsistent header")
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        f = cls(path, mm, fd)
        if not clean:
            me = boot_id()
            if me != bytes(_BOOT_SIZE) and mm[_BOOT_AT:_BOOT_AT + _BOOT_SIZE] == me:
                f._unlink_since(durable, dend)
            else:
                f._recover(durable, dend)
        f.reserved = f.count  # written entries have their blocks; reserve() adds the rest
        mm[_BOOT_AT:_BOOT_AT + _BOOT_SIZE] = boot_id()
        f._set_clean(False)
        return f

    def _unlink_since(self, durable: int, durable_end: int) -> None:
        """After a process crash: unlink the entries written since the checkpoint, newest
        first (each was the head of its chain when added, or never linked if the crash hit
        between its write and its slot's), and keep the rest as it is."""
        mm = self._mm
        at = self._entries_at
        last = self._written_entries(max(durable, self.count))
        slots = self.slot_count
        for i in range(last - 1, durable - 1, -1):
            pos = at + i * ENTRY_SIZE
            _, _, h, prev = _ENTRY.unpack_from(mm, pos)
            s = HEADER_SIZE + 4 * (h % slots)
            if _SLOT.unpack_from(mm, s)[0] == i + 1:
                _SLOT.pack_into(mm, s, prev)
            mm[pos:pos + ENTRY_SIZE] = bytes(ENTRY_SIZE)
        log.warning("message index %s was not closed cleanly (process crash): keeping its %d "
                    "checkpointed entries (up to commit offset %d), unlinked %d later ones",
                    self.path.name, durable, durable_end, last - durable)
        self.count, self.end_phys = durable, durable_end
        self._write_header(clean=False)
        self._mm.flush()

    def _written_entries(self, start: int) -> int:
        """The number of entries written: the first all-zero one at or after ``start``
        (entries past the written ones were never written, or zeroed by a truncation)."""
        zero = bytes(ENTRY_SIZE)
        mm = self._mm
        i = min(start, self.capacity)
        pos = self._entries_at + i * ENTRY_SIZE
        while i < self.capacity:
            hit = mm.find(zero, pos)
            if hit < 0:
                return self.capacity
            i = -(-(hit - self._entries_at) // ENTRY_SIZE)
            pos = self._entries_at + i * ENTRY_SIZE
            if i < self.capacity and mm[pos:pos + ENTRY_SIZE] == zero:
                return i
        return self.capacity

    def _recover(self, durable: int, durable_end: int) -> None:
        """After an unclean close, maybe a reboot: keep the checkpointed entries, rebuild
        the chains."""
        written = self._written_entries(max(durable, self.count))
        log.warning("message index %s was not closed cleanly (after a reboot, or written "
                    "by an older version): keeping %d checkpointed entries (up to commit "
                    "offset %d), dropping %d later ones and rebuilding its slots",
                    self.path.name, durable, durable_end, written - durable)
        mm = self._mm
        mm[self._entries_at + durable * ENTRY_SIZE:self._entries_at + written * ENTRY_SIZE] = \
            bytes((written - durable) * ENTRY_SIZE)
        mm[HEADER_SIZE:self._entries_at] = bytes(4 * self.slot_count)
        slots = self.slot_count
        at = self._entries_at
        min_ts = max_ts = 0
        for i in range(durable):
            pos = at + i * ENTRY_SIZE
            phys, ts, h, _ = _ENTRY.unpack_from(mm, pos)
            s = HEADER_SIZE + 4 * (h % slots)
            (head,) = _SLOT.unpack_from(mm, s)
            _ENTRY.pack_into(mm, pos, phys, ts, h, head)
            _SLOT.pack_into(mm, s, i + 1)
            min_ts = ts if i == 0 else min(min_ts, ts)
            max_ts = max(max_ts, ts)
        self.count, self.end_phys, self.min_ts, self.max_ts = durable, durable_end, min_ts, max_ts
        self._write_header(clean=False)
        self._mm.flush()

    # --- header ----------------------------------------------------------------------------

    def _write_header(self, *, clean: bool, durable: tuple[int, int] | None = None) -> None:
        mm = self._mm
        if durable is None:
            (_, _, _, _, _, _, d_count, _, _, d_end, _, _) = _HEADER.unpack_from(mm, 0)
        else:
            d_count, d_end = durable
        _HEADER.pack_into(mm, 0, MAGIC, VERSION, self.slot_count, self.capacity, self.count,
                          1 if clean else 0, d_count, self.begin_phys, self.end_phys, d_end,
                          self.min_ts, self.max_ts)

    def _set_clean(self, clean: bool) -> None:
        self._write_header(clean=clean)
        self._mm.flush(0, mmap.PAGESIZE)

    # --- writes ----------------------------------------------------------------------------

    def reserve(self, more: int) -> int:
        """Make sure blocks are allocated for ``more`` entries past the written ones
        (growing by at least RESERVE_BYTES, never past the capacity); returns how many
        entries are reserved.  OSError (ENOSPC) when the filesystem is full."""
        need = min(self.capacity, self.count + more)
        if need > self.reserved:
            want = min(self.capacity, max(need, self.reserved + RESERVE_BYTES // ENTRY_SIZE))
            start = self._entries_at + self.reserved * ENTRY_SIZE
            try:
                os.posix_fallocate(self._fd, start, (want - self.reserved) * ENTRY_SIZE)
            except OSError:
                want = need  # a nearly full filesystem: just what is needed, or fail
                os.posix_fallocate(self._fd, start, (want - self.reserved) * ENTRY_SIZE)
            self.reserved = want
        return self.reserved

    @property
    def full(self) -> bool:
        return self.count >= self.capacity or self._sealed

    def seal(self) -> None:
        """Take no more entries (a newer file starts at ``end_phys``)."""
        self._sealed = True
        self.flush(force=True)

    @property
    def mm(self) -> mmap.mmap:
        return self._mm

    @property
    def entries_at(self) -> int:
        return self._entries_at

    def touched(self) -> None:
        """Entries were added through :attr:`mm` (the scan's hot path)."""
        self._dirty = True

    def set_end(self, end_phys: int) -> None:
        """Records below ``end_phys`` were scanned into this file."""
        if end_phys != self.end_phys:
            self.end_phys = end_phys
            _Q.pack_into(self._mm, _END_PHYS_AT, end_phys)
            self._dirty = True

    def truncate(self, commit_offset: int) -> int:
        """Unlink the entries at or past ``commit_offset`` (newest first); returns how many."""
        mm = self._mm
        at = self._entries_at
        removed = 0
        while self.count:
            pos = at + (self.count - 1) * ENTRY_SIZE
            phys, _, h, prev = _ENTRY.unpack_from(mm, pos)
            if phys < commit_offset:
                break
            _SLOT.pack_into(mm, HEADER_SIZE + 4 * (h % self.slot_count), prev)
            mm[pos:pos + ENTRY_SIZE] = bytes(ENTRY_SIZE)
            self.count -= 1
            removed += 1
        self.end_phys = max(self.begin_phys, min(self.end_phys, commit_offset))
        # The checkpoint must not claim entries that are gone: flush and checkpoint now.
        self.flush(force=True)
        return removed

    def flush(self, *, force: bool = False) -> None:
        """Make the entries durable, then checkpoint them (see the module docstring)."""
        if not (self._dirty or force):
            return
        self._write_header(clean=False)
        self._mm.flush()
        self._write_header(clean=False, durable=(self.count, self.end_phys))
        self._mm.flush(0, mmap.PAGESIZE)
        self._dirty = False

    def begin_checkpoint(self) -> tuple[int, int] | None:
        """The loop thread's half of a background flush: None when nothing changed, else
        the checkpoint (entry count, ``end_phys``) that :meth:`finish_checkpoint` may
        record once the entries up to it are on disk."""
        if not self._dirty:
            return None
        self._write_header(clean=False)
        self._dirty = False
        return self.count, self.end_phys

    def finish_checkpoint(self, durable: tuple[int, int]) -> None:
        """The flush thread's half: fdatasync (entries, slots and header as of
        :meth:`begin_checkpoint`, and maybe later ones), then record the checkpoint.  The
        loop keeps adding entries meanwhile; a header it rewrites keeps the checkpoint it
        reads, so the recorded one can only be older than the data, never newer."""
        if self._mm.closed:
            return
        os.fdatasync(self._fd)  # releases the GIL; msync of the mapping would hold it
        self._write_header(clean=False, durable=durable)
        self._mm.flush(0, mmap.PAGESIZE)

    def close(self) -> None:
        if self._mm.closed:
            return
        self.flush()
        self._write_header(clean=True, durable=(self.count, self.end_phys))
        self._mm.flush()
        self._mm.close()
        os.close(self._fd)

    # --- reads -----------------------------------------------------------------------------

    def chain(self, h: int) -> Iterator[Hit]:
        """Entries with key hash ``h``, newest first."""
        mm = self._mm
        at = self._entries_at
        (i,) = _SLOT.unpack_from(mm, HEADER_SIZE + 4 * (h % self.slot_count))
        steps = 0
        while 0 < i <= self.count and steps <= self.count:
            phys, ts, eh, prev = _ENTRY.unpack_from(mm, at + (i - 1) * ENTRY_SIZE)
            if eh == h:
                yield Hit(phys, ts)
            if prev >= i:
                break  # chains only point backwards; anything else is damage
            i = prev
            steps += 1


def record_matches(record: bytes | memoryview, topic: bytes, key: bytes, *, unique: bool) -> bool:
    """Whether a raw V1 record is of ``topic`` and carries ``key`` (as its UNIQ_KEY when
    ``unique``, else among its KEYS): the check a lookup makes on every candidate, read
    straight from the record's bytes (no full decode)."""
    n = len(record)
    if n < REC_FIXED:
        return False
    (body_len,) = _BODY_LEN.unpack_from(record, 84)
    t = 88 + body_len
    if t + 3 > n:
        return False
    topic_len = record[t]
    if bytes(record[t + 1 : t + 1 + topic_len]) != topic:
        return False
    (props_len,) = _PROPS_LEN.unpack_from(record, t + 1 + topic_len)
    p = t + 3 + topic_len
    props = bytes(record[p : p + props_len])
    if unique:
        return _impl.prop(props, b"UNIQ_KEY\x01") == key
    keys = _impl.prop(props, b"KEYS\x01")
    return keys is not None and key in keys.split(b" ")


@dataclass
class FoundMessage:
    """A record a lookup matched: its commit offset and raw bytes (RocketMQ's format)."""

    commit_offset: int
    raw: bytes


class MessageIndex:
    """Every index file of one store; advanced by scanning the commitlog."""

    def __init__(self, directory: str | Path, *, slots_per_file: int = DEFAULT_SLOTS,
                 entries_per_file: int = DEFAULT_ENTRIES,
                 skip_topics: Iterable[str] = (), flush_interval_s: float = 1.0) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.slots_per_file = slots_per_file
        self.entries_per_file = entries_per_file
        self.skip_topics = tuple(t.encode() for t in skip_topics)
        self.flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        #: The periodic flush runs on this thread (made at the first one), one at a time;
        #: the lock keeps files from closing under it.
        self._flusher: ThreadPoolExecutor | None = None
        self._flushing = False
        self._flush_lock = threading.Lock()
        #: Out of blocks: logged once until entries are added again; _blocked: this call.
        self._space_error = False
        self._blocked = False
        self.files: list[IndexFile] = []
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()
        for path in sorted(self.dir.glob("[0-9]" * 20)):
            try:
                self.files.append(IndexFile.open(path))
            except StoreError as exc:
                # Derived data: drop the damaged file and everything after it, rescan.
                log.error("%s; the message index is rebuilt from the log from there", exc)
                for later in sorted(self.dir.glob("[0-9]" * 20)):
                    if later.name >= path.name:
                        later.unlink()
                break
        #: Last store timestamp indexed and the commit offset scanned up to.
        self.last_update_ts = max((f.max_ts for f in self.files), default=0)

    @property
    def indexed_offset(self) -> int:
        """Records below this commit offset were scanned (0 before any file exists)."""
        return self.files[-1].end_phys if self.files else 0

    # --- building --------------------------------------------------------------------------

    def _active(self, begin_phys: int) -> IndexFile:
        if not self.files or self.files[-1].full:
            return self._rotate(begin_phys)
        return self.files[-1]

    def _rotate(self, begin_phys: int) -> IndexFile:
        """Seal the newest file (if any) and start one at ``begin_phys``."""
        if self.files:
            self.files[-1].seal()
        path = self.dir / f"{begin_phys:020d}"
        self.files.append(IndexFile.create(path, begin_phys, self.slots_per_file,
                                           self.entries_per_file))
        return self.files[-1]

    def advance(self, log_: LogReader, up_to: int) -> int:
        """Index every whole record in [indexed_offset, up_to); returns entries added."""
        low = log_.min_offset
        pos = max(self.indexed_offset, low)
        if self.files and self.files[-1].end_phys < low:
            self.files[-1].set_end(low)
        up_to = min(up_to, getattr(log_, "whole_offset", log_.max_offset))
        added = 0
        self._blocked = False
        if pos >= up_to:
            return 0
        try:
            active = self._active(pos)
        except OSError as exc:
            self._out_of_space(exc, pos)
            return 0
        while pos < up_to:
            seg_end = log_.segment_end(pos)
            stop = min(up_to, seg_end)
            view = log_.read(pos, stop - pos)
            consumed, n = self._scan(view, pos)
            added += n
            pos += consumed
            if pos < stop:
                if self._blocked:
                    break  # out of blocks: stay at the first record not indexed
                if stop == seg_end:
                    pos = seg_end  # a blank fills the rest of the segment
                    continue
                break
        self.files[-1].set_end(pos)
        del active
        self.trim_below(low)
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self._flush_in_background()
        return added

    def _scan(self, view: memoryview, base: int) -> tuple[int, int]:
        """Add the keys of the whole records in ``view`` (at commit offset ``base``);
        returns (bytes consumed, entries added).  The loop is the hot path
        (``rmqha._core.message_index``); this handles file rotation and block allocation
        around it (it writes only into entries reserved beforehand)."""
        pos, n, added = 0, len(view), 0
        while True:
            f = self.files[-1]
            try:
                room = f.reserve(1)
            except OSError as exc:
                self._out_of_space(exc, base + pos)
                return pos, added
            pos, f.count, f.min_ts, f.max_ts, got, status = _impl.add_records(
                view, pos, n, base, f.mm, f.slot_count, f.entries_at, room, f.count,
                f.min_ts, f.max_ts, self.skip_topics, MAX_KEY_BYTES)
            if got:
                f.touched()
                added += got
                if f.max_ts > self.last_update_ts:
                    self.last_update_ts = f.max_ts
                self._space_error = False
            if status == _impl.FULL:
                if room < f.capacity:
                    try:
                        f.reserve(_MAX_KEYS_PER_RECORD)
                    except OSError as exc:
                        self._out_of_space(exc, base + pos)
                        return pos, added
                    continue
                # A record's keys never span two files: this one ends before the record.
                f.set_end(base + pos)
                try:
                    self._rotate(base + pos)
                except OSError as exc:
                    self._out_of_space(exc, base + pos)
                    return pos, added
                continue
            if status == _impl.NOT_A_RECORD:
                log.error("message index scan: no record at commitlog offset %d", base + pos)
            return pos, added

    def _out_of_space(self, exc: OSError, offset: int) -> None:
        """No block for more entries: the index stays behind at ``offset`` and catches up
        on a later call (lookups meanwhile miss what lies beyond)."""
        self._blocked = True
        if not self._space_error:
            self._space_error = True
            log.error("message index stopped at commit offset %d: %s (it catches up once "
                      "there is room)", offset, exc)

    # --- reads -----------------------------------------------------------------------------

    def candidates(self, topic: str, key: str, *, begin_ts: int = 0,
                   end_ts: int = 2**63 - 1) -> Iterator[int]:
        """Commit offsets whose entry carries ``topic#key``'s hash, newest first."""
        h = key_hash(topic, key)
        for f in reversed(self.files):
            if f.count and (f.max_ts < begin_ts or f.min_ts > end_ts):
                continue
            for hit in f.chain(h):
                if begin_ts <= hit.store_timestamp <= end_ts:
                    yield hit.commit_offset

    # --- upkeep ----------------------------------------------------------------------------

    def truncate(self, commit_offset: int) -> None:
        """The commitlog was cut at ``commit_offset``: forget everything from there on."""
        with self._flush_lock:
            while self.files and self.files[-1].begin_phys > commit_offset:
                f = self.files.pop()
                f.close()
                f.path.unlink()
            if self.files:
                self.files[-1].truncate(commit_offset)

    def trim_below(self, commit_offset: int) -> None:
        """Delete full files whose every entry lies below ``commit_offset`` (retention)."""
        if len(self.files) <= 1 or self.files[0].end_phys > commit_offset:
            return
        with self._flush_lock:
            while len(self.files) > 1 and self.files[0].end_phys <= commit_offset:
                f = self.files.pop(0)
                f.close()
                f.path.unlink()

    def flush(self) -> None:
        """Flush and checkpoint the files taking entries now, in this thread."""
        with self._flush_lock:
            for f in self.files[-2:]:
                f.flush()
        self._last_flush = time.monotonic()

    def _flush_in_background(self) -> None:
        """The periodic flush, on the flush thread: an msync of a file's mapping takes
        milliseconds (10 ms here under load) with the GIL held, which stalled every send
        and ack of the broker's loop; the thread's fdatasync releases it."""
        self._last_flush = time.monotonic()
        if self._flushing:
            return  # the previous one is still writing: the next interval takes the rest
        jobs = [(f, cp) for f in self.files[-2:] if (cp := f.begin_checkpoint()) is not None]
        if not jobs:
            return
        if self._flusher is None:
            self._flusher = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="message-index-flush")
        self._flushing = True
        self._flusher.submit(self._finish_flush, jobs)

    def _finish_flush(self, jobs: list[tuple[IndexFile, tuple[int, int]]]) -> None:
        try:
            with self._flush_lock:
                for f, checkpoint in jobs:
                    f.finish_checkpoint(checkpoint)
        except (OSError, ValueError) as exc:
            # The checkpoint stays where it was: a crash rescans a little more of the log.
            log.error("message index flush failed: %s", exc)
        finally:
            self._flushing = False

    def close(self) -> None:
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)
            self._flusher = None
        with self._flush_lock:
            for f in self.files:
                f.close()
            self.files = []

    def stats(self) -> dict[str, Any]:
        return {"files": len(self.files), "entries": sum(f.count for f in self.files),
                "indexed_offset": self.indexed_offset}
