"""The slave's receive path of the commitlog: replicated bytes written at the log's end,
validated record by record before ``max_offset`` moves, zeroed when bad.

Replicated bytes arrive either as :meth:`ReceivePath.append_data` (validated in the
caller's buffer, then one ``pwrite``) or straight into the mapping through
:meth:`ReceivePath.receive_view` / :meth:`ReceivePath.commit_received` (one kernel copy
from the socket).  A block may end inside a record (the next block continues it) but never
crosses a segment end.

:class:`ReceivePath` is a part of :class:`~rmqha.store.CommitLog` kept in its own module:
it works on the log's writer state (the writer lock, max and whole offsets, the active
segment, the queue-offset table), which the annotations below name.
"""
from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable

from rmqha._core._protocols import RecordsTwin
from rmqha.errors import CorruptRecordError, OffsetMismatchError, StoreError
from rmqha.store.flusher import Flusher, FlushMode
from rmqha.store.segments import PrefaultWindow, Segment

_INT32 = struct.Struct(">i")


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
    _segments: dict[int, Segment]
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
        if self._max_offset >= self._warm.next_at:
            self._warm.advance()
        return self._max_offset

    @staticmethod
    def _pwrite(seg: Segment, data: bytes | bytearray | memoryview, pos: int) -> None:
        done = os.pwrite(seg.fd, data, pos)
        n = len(data)
        if done < n:  # short write (a signal, a nearly full disk): finish it
            view = memoryview(data).cast("B")
            while done < n:
                done += os.pwrite(seg.fd, view[done:], pos + done)

    def _validate_block(self, seg: Segment, data: bytes | bytearray | memoryview, pos: int,
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
