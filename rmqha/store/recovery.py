"""Opening a commitlog directory: its segment files checked for gaps and a missing start,
every record past the flushed offset validated, a torn or corrupt tail cut and zeroed,
segments past the end removed."""
from __future__ import annotations

import logging
import os
from types import ModuleType

from rmqha.errors import MissingSegmentError, StoreError
from rmqha.store.checkpoint import Checkpoint
from rmqha.store.queue_offsets import QueueOffsets
from rmqha.store.segments import SEGMENT_NAME, Segment, fsync_dir, segment_path

log = logging.getLogger(__name__)


def recover(directory: str, segment_bytes: int, codec: ModuleType,
            segments: dict[int, Segment], queues: QueueOffsets, checkpoint: Checkpoint) -> int:
    """Open the log in ``directory`` into ``segments`` and ``queues``; returns where it
    ends (0 for an empty directory).  The recovered bytes are fdatasync-ed before return."""
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
        return 0
    queues.load_base(bases[0])
    table = dict(queues.base)
    S = codec.ScanStop
    end = bases[0]
    last = len(bases) - 1
    for i, base in enumerate(bases):
        seg = Segment(path(base), base, sb, create=False)
        segments[base] = seg
        pos, stop, _count = codec.scan(seg.mm, 0, sb, base, flushed, table)
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
    return end
