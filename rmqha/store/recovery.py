"""Opening a commitlog directory: its segment files checked for gaps and a missing start,
every record past the flushed offset validated, a torn or corrupt tail cut and zeroed,
segments past the end removed.

The queue-offset table is rebuilt from the records after its last snapshot (see
:mod:`rmqha.store.queue_offsets`), so opening a log walks what was written since the
snapshot, not every segment.  The records between the snapshot before it and the
snapshot are walked too (headers only, no table): a tail the disk lost or zeroed below
the snapshot is found there as it was before, and makes the walk start over from the
first segment, as it does without a usable snapshot."""
from __future__ import annotations

import logging
import os

from rmqha._core._protocols import RecordsTwin
from rmqha.errors import MissingSegmentError, StoreError
from rmqha.store.checkpoint import Checkpoint
from rmqha.store.queue_offsets import QueueOffsets
from rmqha.store.segments import SEGMENT_NAME, Segment, fsync_dir, segment_path

log = logging.getLogger(__name__)


def recover(directory: str, segment_bytes: int, codec: RecordsTwin,
            segments: dict[int, Segment], queues: QueueOffsets, checkpoint: Checkpoint,
            *, use_snapshot: bool = True) -> tuple[int, int, int]:
    """Open the log in ``directory`` into ``segments`` and ``queues``; returns where it
    ends (0 for an empty directory), where the walk that rebuilt the queue-offset table
    started, and a record boundary below which this open checked the log (the next
    snapshot's "since").  The recovered bytes are fdatasync-ed before return."""
    sb = segment_bytes

    def path(base: int) -> str:
        return segment_path(directory, base)

    bases = sorted(int(n) for n in os.listdir(directory) if SEGMENT_NAME.match(n))
    for b in bases:
        if b % sb:
            raise StoreError(f"segment {path(b)} does not start at a multiple of "
                             f"segment_bytes={sb}")
    for prev, nxt in zip(bases, bases[1:]):
        if nxt != prev + sb:
            raise MissingSegmentError(
                f"commitlog segment {path(prev + sb)} is missing (the log has "
                f"{path(prev)} and then {path(nxt)}); restore it, or let the "
                f"broker rebuild this store from its master (rebuild_store_from_master)")
    if bases:
        queues.check_first_segment(bases[0])
    flushed, clean = checkpoint.read()
    if not bases:
        return 0, 0, 0
    queues.load_base(bases[0])
    start, since, table = _starting_point(directory, queues, bases, sb) if use_snapshot else (
        bases[0], bases[0], dict(queues.base))
    since = max(since, bases[0])
    S = codec.ScanStop
    end = bases[0]
    last = len(bases) - 1
    for i, base in enumerate(bases):
        seg = Segment(path(base), base, sb, create=False)
        segments[base] = seg
        if base < start:
            at = min(start - base, sb)
            lo = max(since - base, 0)
            if lo < at and not _tiles(codec, seg, lo, at, base, flushed):
                log.warning("commitlog recovery: records below the queue-offset snapshot at "
                            "%d do not tile segment %s: walking the whole log instead",
                            start, path(base))
                for opened in segments.values():
                    opened.close()
                segments.clear()
                return recover(directory, sb, codec, segments, queues, checkpoint,
                               use_snapshot=False)
            if at == sb:
                end = base + sb  # wholly before the snapshot: the table counts its records
                continue
        else:
            at = 0
        pos, stop, _count = codec.scan(seg.mm, at, sb, base, flushed, table)
        if stop == S.BLANK or (stop == S.END and pos == sb):
            end = base + sb
            continue
        end = base + pos
        if stop != S.ZEROS:
            log.warning("commitlog recovery: cut the log at offset %d: %s (%s)", end,
                        S(stop).name, path(base))
        # After a crash, anything after the end may be garbage from a torn write (pages
        # reach the disk in any order), so stale records could sit right after the new
        # end; zero it cheaply (shrink and re-extend the file) so they can never be read
        # back.  After close() (clean flag, nothing written since) the rest is zeros.
        if stop != S.ZEROS or not clean or end != flushed:
            segments.pop(base)
            seg.close()
            fd = os.open(seg.path, os.O_RDWR)
            try:
                os.ftruncate(fd, pos)
                os.ftruncate(fd, sb)  # a hole again: zeros, no blocks
                os.fdatasync(fd)
            finally:
                os.close(fd)
            segments[base] = Segment(seg.path, base, sb, create=False)
        for later in bases[i + 1:]:
            later_path = path(later)
            with open(later_path, "rb") as fh:
                unused = not any(fh.read(8))
            # A never-written segment is the warmed-up next one: expected, not news.
            log.log(logging.DEBUG if unused else logging.WARNING,
                    "commitlog recovery: removing segment %s after the log end %d",
                    later_path, end)
            os.unlink(later_path)
        if i < last:
            fsync_dir(directory)
        break
    if flushed > end:
        log.error("commitlog recovery: the checkpoint says %d was flushed but the log "
                  "ends at %d: flushed data was lost", flushed, end)
    queues.replace(table)
    # Recovered bytes may still be only in the page cache (a process crash): make them
    # durable before calling them flushed.
    for seg in segments.values():
        os.fdatasync(seg.fd)
    # The next snapshot's "since": a record boundary below which this open checked the log,
    # and never before the last segment's start (a segment starts with a record).
    if end > start and use_snapshot and start > bases[0]:
        since = start
    elif end > bases[0]:
        since = max(since, end - (end - 1) % sb - 1)
    return end, start, since


def _tiles(codec: RecordsTwin, seg: Segment, lo: int, hi: int, base: int, flushed: int) -> bool:
    """Whether whole records (and a blank ending the segment) fill ``[lo, hi)``."""
    S = codec.ScanStop
    pos, stop, _ = codec.scan(seg.mm, lo, hi, base, flushed, None)
    return (stop == S.END and pos == hi) or (stop == S.BLANK and hi == seg.size)


def _starting_point(directory: str, queues: QueueOffsets, bases: list[int],
                    sb: int) -> tuple[int, int, dict[tuple[bytes, int], int]]:
    """Where the walk starts, from where records must tile up to it, and the table there:
    the snapshot when it lies within the segments, else the first segment with the base
    table."""
    snap = queues.load_snapshot()
    if snap is not None:
        valid_at, since, table = snap
        short = [b for b in bases
                 if b < valid_at and os.stat(segment_path(directory, b)).st_size < sb]
        if short:
            # Bytes the snapshot counts may be gone: only a walk finds where the log ends.
            log.warning("commitlog recovery: segment %s is shorter than %d bytes: walking "
                        "the whole log", segment_path(directory, short[0]), sb)
        elif bases[0] <= valid_at <= bases[-1] + sb:
            return valid_at, since, table
        else:
            log.warning("commitlog recovery: the queue-offset snapshot of %s is at offset "
                        "%d, outside the segments (%d..%d): walking the whole log",
                        directory, valid_at, bases[0], bases[-1] + sb)
    return bases[0], bases[0], dict(queues.base)
