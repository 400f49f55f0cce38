"""The slave's receive path of the commitlog: replicated bytes written at the log's end,
validated record by record before ``max_offset`` moves, zeroed when bad.

Replicated bytes arrive either as :meth:`ReceivePath.append_data` (validated in the
caller's buffer, then one ``pwrite``), as :meth:`ReceivePath.append_run` (contiguous
blocks scattered in one buffer: one ``pwritev``, or copies into the mapping where the
warm-up faulted it in, validated where they lie, the log moved once), or straight into
the mapping through :meth:`ReceivePath.receive_view` / :meth:`ReceivePath.commit_received`
(one kernel copy from the socket).  A block may end inside a record (the next block
continues it) but never crosses a segment end.  The HA slave's compiled lane
(``rmqha._core.slave_lane``) borrows the tail instead: :meth:`ReceivePath.lane_grant`
lends it the active segment, :meth:`ReceivePath.lane_adopt` makes what it appended and
validated part of the log (the queue-offset table caught up from the records' headers),
:meth:`ReceivePath.lane_release` ends the loan; meanwhile every other writer is refused.

:class:`ReceivePath` is a part of :class:`~rmqha.store.CommitLog` kept in its own module:
it works on the log's writer state (the writer lock, max and whole offsets, the active
segment, the queue-offset table), which the annotations below name.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rmqha._core._protocols import RecordsTwin
from rmqha._core.records_py import ScanStop
from rmqha.errors import CorruptRecordError, DiskFullError, OffsetMismatchError, StoreClosedError, StoreError
from rmqha.store.flusher import Flusher, FlushMode
from rmqha.store.segments import PrefaultWindow, Segment

_INT32 = struct.Struct(">i")
#: The scan stops of a block whose records all checked (both twins share the enum).
_CLEAN_STOPS = (int(ScanStop.END), int(ScanStop.BLANK))
#: Buffers per ``pwritev`` (Linux's IOV_MAX).
_IOV_MAX = 1024
#: A verify_from beyond any offset: catching the queue-offset table up after the compiled
#: lane re-reads headers only (the lane checked every record's CRC already).
_NO_VERIFY = 1 << 62
#: What lane_grant reserves at least, past the max offset (the warm-up reserves more ahead).
_MIN_GRANT = 4 << 20


@dataclass(frozen=True)
class LaneGrant:
    """The log's tail lent to the HA slave's compiled lane (:meth:`ReceivePath.lane_grant`):
    the active segment's mapping and file, its base, how far the lane may write into it
    (``limit``, a position: the blocks reserved so far), the global offset below which the
    warm-up faulted it in, and the log's max and whole offsets."""

    mapping: mmap.mmap
    fd: int
    base: int
    limit: int
    warm: int
    max_offset: int
    whole_offset: int


class ReceivePath:
    """``append_data``, ``receive_view``, ``commit_received``, ``discard_received`` and
    ``tail_is_warm`` of :class:`~rmqha.store.CommitLog`."""

    # The log's writer state (set by CommitLog.__init__).
    _lock: threading.RLock
    _codec: RecordsTwin
    _sb: int
    _max_offset: int
    _whole_offset: int
    _closed: bool
    _closing: bool
    _segments: dict[int, Segment]
    _active: Segment | None
    _queue_offsets: dict[tuple[bytes, int], int]
    _warm: PrefaultWindow
    _mode: FlushMode
    _flusher: Flusher
    _check_open: Callable[[], None]
    _active_segment: Callable[[], Segment]
    _allocate: Callable[[Segment, int], None]
    _zero: Callable[[Segment, int, int], None]
    _appended: Callable[..., None]
    segment_start: Callable[[int], int]
    segment_end: Callable[[int], int]
    _dir: str
    #: Whether the HA slave's compiled lane holds the tail (every other writer is refused).
    _lane_held = False
    #: While a lane runs: its ``progress()`` (whole end, appended end), read by
    #: :meth:`received_end` before :meth:`lane_adopt` catches the log up.
    _lane_progress: Callable[[], tuple[int, int]] | None = None

    def _not_writable(self) -> StoreError:
        if self._closed or self._closing:
            return StoreClosedError(f"commitlog {self._dir} is closed")
        return StoreError(f"commitlog {self._dir}: the HA slave's compiled lane holds the log's tail")

    # --- the compiled lane (rmqha.ha.slave_lane) --------------------------------------------

    def lane_grant(self) -> LaneGrant:
        """Lend the log's tail to the HA slave's compiled lane, which appends validated
        blocks into the active segment's mapping below ``limit`` without the lock (one
        writer) until :meth:`lane_release`; meanwhile every other write, truncation or
        reset is refused (StoreError), and :meth:`lane_adopt` makes what it appended part
        of the log.  DiskFullError when not even a block can be reserved (then nothing is
        lent)."""
        with self._lock:
            self._check_open()
            seg = self._active_segment()
            pos = self._max_offset - seg.base
            self._allocate(seg, min(pos + _MIN_GRANT, self._sb))
            self._lane_held = True
            return LaneGrant(seg.mm, seg.fd, seg.base, min(seg.allocated, self._sb), self._warm.faulted,
                             self._max_offset, self._whole_offset)

    def lane_adopt(self, max_offset: int, whole_offset: int) -> tuple[int, int]:
        """The lane appended and validated up to ``max_offset`` (its last whole record ends
        at ``whole_offset``), in the segment it was lent: move the log there, catch the
        queue-offset table up, tell the listeners and the flusher.  Returns the room the
        lane may use now: (limit, warm), as in :class:`LaneGrant`."""
        with self._lock:
            seg = self._active
            if seg is None or not self._lane_held:
                raise StoreError("lane_adopt without a lane holding the log's tail")
            moved = max_offset > self._max_offset
            if moved:
                if not (seg.base <= self._whole_offset <= whole_offset <= max_offset <= seg.base + self._sb):
                    raise StoreError(f"lane_adopt: offsets {whole_offset}/{max_offset} outside the segment at "
                                     f"{seg.base} (log at {self._whole_offset}/{self._max_offset})")
                table: dict[tuple[bytes, int], int] = {}
                self._codec.scan(seg.mm, self._whole_offset - seg.base, whole_offset - seg.base, seg.base,
                                 _NO_VERIFY, table)
                self._queue_offsets.update(table)
                self._advance(seg, max_offset - seg.base, whole_offset - seg.base)
            room = min(seg.allocated, self._sb), self._warm.faulted
        if moved:
            self._received(max_offset, False)
        return room

    def lane_watch(self, progress: Callable[[], tuple[int, int]]) -> None:
        """The armed lane's progress, for :meth:`received_end` (until :meth:`lane_release`)."""
        self._lane_progress = progress

    def received_end(self) -> int:
        """Where the log ends as this slave's acks say: with a lane running, what it appended
        and acknowledged, which the log's own ``max_offset`` adopts one loop wake-up later.
        A status that reports a slave's offset reads this, or it shows the slave behind
        records its master already counted as copied."""
        progress = self._lane_progress
        end = self._max_offset
        return end if progress is None else max(end, progress()[1])

    def lane_release(self) -> None:
        """The lane stopped: the tail is the log's writers' again."""
        with self._lock:
            self._lane_held = False
            self._lane_progress = None

    def append_data(self, offset: int, data: bytes | bytearray | memoryview, *,
                    wait_flush: bool = True) -> int:
        """Slave side: write raw log bytes at exactly ``max_offset``; returns the new max.

        In sync flush mode this returns once an fsync covers the block, unless
        ``wait_flush=False`` (as for :meth:`append`): then the flush is only asked for (it
        runs within ``LAZY_FLUSH_S``, grouped with the blocks that follow).  An
        HA slave passes False and leaves the choice to ``ha_slave_flush_before_ack``
        (RocketMQ's slave acks from its page cache).

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
        self._received(end_offset, wait_flush)
        return end_offset

    def append_run(self, offset: int, buf: memoryview, spans: Sequence[int], *,
                   wait_flush: bool = True) -> int:
        """:meth:`append_data` of contiguous blocks (the first at ``offset``) that lie apart
        in ``buf``: ``spans`` holds per block its position in ``buf``, its size and one
        value this ignores (a flat sequence of triples).  Returns the new max offset.

        What is stored, checked and refused is what one :meth:`append_data` per block
        would give, the blocks before a refused one stored; the cost is not: the blocks
        of one segment go to the file with one ``pwritev`` (or into the mapping, where
        it is warm), are validated in ``buf`` in order, and move the log, tell the
        listeners and ask for a flush once.  At a segment end the run goes on in the
        next segment the same way; where the disk cannot take a segment's part at once,
        it is appended block by block (what fits is stored, then DiskFullError)."""
        if len(spans) == 3:
            end = self._append_lone(offset, buf, spans, wait_flush)
            if end >= 0:
                return end
        i, n = 0, len(spans)
        while i < n:
            j, total = self._one_segment(offset, spans, i)
            with self._lock:
                try:
                    seg, pos = self._tail_block(offset, total)
                except DiskFullError:
                    done = None
                else:
                    done = self._write_run(seg, pos, total, buf, spans, i, j)
            if done is None:
                for k in range(i, j, 3):
                    p = spans[k]
                    offset = self.append_data(offset, buf[p : p + spans[k + 1]], wait_flush=wait_flush)
            else:
                end, error = done
                if end != offset:
                    self._received(end, wait_flush)
                if error is not None:
                    raise error
                offset = end
            i = j
        return offset

    def _append_lone(self, offset: int, buf: memoryview, spans: Sequence[int], wait_flush: bool) -> int:
        """:meth:`append_run` of one block (live traffic: a block a read) where nothing but
        the append is to do: the log open, the block at its max offset, inside the active
        segment and its reserved blocks.  The new max offset, or -1 with nothing done
        (the general path then checks, reserves and refuses as it must)."""
        size = spans[1]
        with self._lock:
            seg = self._active
            if seg is None or self._closed or self._closing or offset != self._max_offset:
                return -1
            pos = offset - seg.base
            if not (0 <= pos and 0 < size and pos + size <= min(self._sb, seg.allocated)
                    and self._segments.get(seg.base) is seg):
                return -1
            end, error = self._write_run(seg, pos, size, buf, spans, 0, 3)
        if end != offset:
            self._received(end, wait_flush)
        if error is not None:
            raise error
        return end

    def _one_segment(self, offset: int, spans: Sequence[int], i: int) -> tuple[int, int]:
        """The blocks of ``spans`` from index ``i`` on that end in the segment ``offset`` is
        in: (index after them, their bytes); at least the first block (a block crossing
        the segment end is refused by :meth:`_tail_block`)."""
        seg_end = offset - offset % self._sb + self._sb
        sizes = spans[i + 1 :: 3]
        total = sum(sizes)
        if offset + total <= seg_end:
            return len(spans), total
        total = sizes[0]
        j = i + 3
        for size in sizes[1:]:
            if offset + total + size > seg_end:
                break
            total += size
            j += 3
        return j, total

    def _write_run(self, seg: Segment, pos: int, total: int, buf: memoryview, spans: Sequence[int], i: int,
                   j: int) -> tuple[int, CorruptRecordError | None]:
        """Write the blocks ``spans[i:j]`` (``total`` bytes) at ``seg[pos:]`` and validate
        them in order; the log moves past the valid ones, what follows an invalid one is
        zeroed.  (New max offset, the error of the invalid block or None); with the lock
        held.

        Where the warm-up has faulted the pages in already, the blocks are copied into
        the mapping (no system call); otherwise one ``pwritev`` (a copy into pages not
        faulted in costs a fault per page, far more on this class of VM)."""
        base = seg.base
        if base + pos + total <= self._warm.faulted:
            mm = seg.mm
            at = pos
            for k in range(i, j, 3):
                p = spans[k]
                end = at + spans[k + 1]
                mm[at:end] = buf[p : p + end - at]
                at = end
        else:
            self._write_file(seg, pos, total, buf, spans, i, j)
        scan = self._codec.scan
        sb = self._sb
        done_stops = _CLEAN_STOPS
        wpos = self._whole_offset - base
        at = pos
        table: dict[tuple[bytes, int], int] = {}
        error = None
        for k in range(i, j, 3):
            p = spans[k]
            end = at + spans[k + 1]
            if wpos < at:  # a record begun by an earlier block
                stop_pos, stop = self._validate_block(seg, wpos, buf, p, at, end, table)
            else:  # _validate_block's usual case, inline
                shift = p - at
                stop_pos, stop, _ = scan(buf, p, p + end - at, base - shift, 0, table, False, sb + shift)
                stop_pos -= shift
            if not (stop in done_stops and (end != sb or stop_pos == sb)) and self._is_bad(stop, stop_pos, end):
                self._zero(seg, at, pos + total)
                error = self._corrupt(seg, at, stop_pos, stop)
                break
            # The table of a block refused is dropped whole, as append_data drops it.
            self._queue_offsets.update(table)
            table.clear()
            wpos = stop_pos
            at = end
        if at != pos:
            self._advance(seg, at, wpos)
        return base + at, error

    def _write_file(self, seg: Segment, pos: int, total: int, buf: memoryview, spans: Sequence[int], i: int,
                    j: int) -> None:
        """Write the blocks ``spans[i:j]`` (``total`` bytes) at ``seg[pos:]`` with one
        ``pwritev``; on an error what was written is zeroed."""
        pieces = [buf[spans[k] : spans[k] + spans[k + 1]] for k in range(i, j, 3)]
        try:
            self._pwritev(seg, pieces, pos)
        except OSError:
            self._zero(seg, pos, pos + total)  # nothing may linger past the end
            raise
        finally:
            for piece in pieces:
                piece.release()

    def _received(self, end_offset: int, wait_flush: bool) -> None:
        self._appended(end_offset, wait_flush)
        if not wait_flush and self._mode is FlushMode.SYNC:
            # Nobody waits, but sync mode still means "on disk soon" (lazily, grouped).
            self._flusher.request(end_offset)

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

    def commit_received(self, offset: int, size: int, *, wait_flush: bool = True) -> int:
        """Make ``size`` bytes received through :meth:`receive_view` at ``offset`` part of
        the log, exactly as :meth:`append_data` would (same validation; an invalid record
        zeroes them and raises CorruptRecordError; ``wait_flush`` the same); returns the
        new max offset."""
        with self._lock:
            seg, pos = self._tail_block(offset, size)
            if size == 0:
                return offset
            end_offset = self._commit_block(seg, pos, size, None)
        self._received(end_offset, wait_flush)
        return end_offset

    def discard_received(self, offset: int, size: int) -> None:
        """Zero ``size`` bytes received at ``offset`` (the max offset) and never committed
        (a link that broke mid-block), so no stray bytes follow the log's end."""
        with self._lock:
            if self._closed or offset != self._max_offset or size <= 0:
                return
            seg, pos = self._tail_block(offset, size)
            self._zero(seg, pos, pos + size)

    def _tail_block(self, offset: int, n: int) -> tuple[Segment, int]:
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

    def _commit_block(self, seg: Segment, pos: int, n: int,
                      data: bytes | bytearray | memoryview | None) -> int:
        """Validate a block written at ``seg[pos:pos+n]`` (``data``: its source, checked
        there; None: check the segment) and advance the log, or zero it and raise."""
        end = pos + n
        table: dict[tuple[bytes, int], int] = {}
        if data is None:
            stop_pos, stop, _ = self._codec.scan(seg.mm, self._whole_offset - seg.base, end,
                                                 seg.base, 0, table)
        else:
            stop_pos, stop = self._validate_block(seg, self._whole_offset - seg.base, data, 0,
                                                  pos, end, table)
        if self._is_bad(stop, stop_pos, end):
            self._zero(seg, pos, end)
            raise self._corrupt(seg, pos, stop_pos, stop)
        self._queue_offsets.update(table)
        self._advance(seg, end, stop_pos)
        return self._max_offset

    def _is_bad(self, stop: int, stop_pos: int, end: int) -> bool:
        """Whether a block ending at segment position ``end``, whose scan stopped at
        ``stop_pos`` for ``stop``, holds an invalid record (a record it only begins is
        not one, unless the block ends the segment)."""
        S = self._codec.ScanStop
        if stop != S.END and stop != S.BLANK and not (stop == S.TORN or (stop == S.ZEROS and end - stop_pos < 8)):
            return True
        return end == self._sb and stop_pos != self._sb

    def _corrupt(self, seg: Segment, pos: int, stop_pos: int, stop: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"replicated block at {seg.base + pos}: invalid record at {seg.base + stop_pos} "
            f"({self._codec.ScanStop(stop).name}); nothing written")

    def _advance(self, seg: Segment, end: int, whole: int) -> None:
        """Move the log's end to ``seg[end]``, its last whole record's end to ``seg[whole]``."""
        self._max_offset = seg.base + end
        self._whole_offset = seg.base + whole
        if self._max_offset >= self._warm.next_at:
            self._warm.advance()

    @staticmethod
    def _pwrite(seg: Segment, data: bytes | bytearray | memoryview, pos: int) -> None:
        done = os.pwrite(seg.fd, data, pos)
        n = len(data)
        if done < n:  # short write (a signal, a nearly full disk): finish it
            view = memoryview(data).cast("B")
            while done < n:
                done += os.pwrite(seg.fd, view[done:], pos + done)

    @staticmethod
    def _pwritev(seg: Segment, pieces: list[memoryview], pos: int) -> int:
        """Write ``pieces`` back to back at ``pos`` of the segment file; their total size."""
        total = sum(map(len, pieces))
        done = 0
        for first in range(0, len(pieces), _IOV_MAX):
            done += os.pwritev(seg.fd, pieces[first : first + _IOV_MAX], pos + done)
        if done < total:  # short write (a signal, a nearly full disk): finish it
            rest = b"".join(pieces)
            view = memoryview(rest)
            while done < total:
                done += os.pwrite(seg.fd, view[done:], pos + done)
        return total

    def _validate_block(self, seg: Segment, wpos: int, data: bytes | bytearray | memoryview, at: int,
                        pos: int, end: int, table: dict[tuple[bytes, int], int]) -> tuple[int, int]:
        """Scan the records of a block written at ``seg[pos:end]``, its bytes at
        ``data[at:]``, after a last whole record ending at ``seg[wpos]``: (stop position
        in the segment, ScanStop)."""
        codec = self._codec
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
        shift = at - pos  # a position in data = a position in the segment + shift
        stop_pos, stop, _ = codec.scan(data, rec_end + shift, end + shift, seg.base - shift, 0, table,
                                       False, self._sb + shift)
        return stop_pos - shift, stop
