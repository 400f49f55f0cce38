"""The commitlog's disk footprint, both twins: sparse segments, the reserved window ahead of
the writer (appends, batches and replicated blocks across its boundary and across segments
recover byte-identical; with ``flush = sync`` written to disk ahead of the writer), and a
full filesystem refused cleanly with nothing stored lost."""
from __future__ import annotations

import fcntl
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqha.errors import DiskFullError
from rmqha.store import CommitLog
from needs import unavailable
from tmpfs import grow, tmpfs

SEG = 64 << 10
WINDOW = 8 << 10  # two pages: every few records cross the window's edge


def fixed_clock() -> int:
    return 1_700_000_000_123


def store_bytes(directory: Path, end: int) -> dict[str, bytes]:
    """Segment files holding bytes below ``end`` (the warm-up may have created the next)."""
    return {n: (directory / n).read_bytes() for n in sorted(os.listdir(directory))
            if len(n) == 20 and n.isdigit() and int(n) < end}


def messages(log: CommitLog) -> list[tuple[int, str, bytes, int]]:
    return [(m.physical_offset, m.topic, m.body, m.queue_offset) for m in log.iter_messages()]


FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_UNWRITTEN = 0x800
_FIEMAP_HEAD = struct.Struct("=QQIIII")
_FIEMAP_EXTENT = struct.Struct("=QQQ16xI12x")


def unwritten_bytes(path: str, start: int, end: int) -> int | None:
    """Bytes of ``[start, end)`` of a file in unwritten (fallocated, never written) extents,
    by the FIEMAP ioctl; None where the filesystem does not answer it."""
    count = 512
    req = bytearray(_FIEMAP_HEAD.size + count * _FIEMAP_EXTENT.size)
    _FIEMAP_HEAD.pack_into(req, 0, start, end - start, 0, 0, count, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, req)
    except OSError:
        return None
    finally:
        os.close(fd)
    mapped = _FIEMAP_HEAD.unpack_from(req, 0)[3]
    total = 0
    for i in range(mapped):
        logical, _, length, flags = _FIEMAP_EXTENT.unpack_from(
            req, _FIEMAP_HEAD.size + i * _FIEMAP_EXTENT.size)
        if flags & FIEMAP_EXTENT_UNWRITTEN:
            total += max(0, min(end, logical + length) - max(start, logical))
    return total


def feed(log: CommitLog, seed: int) -> None:
    """Singles and batches of mixed sizes, rolling several segments."""
    rnd = random.Random(seed)
    for i in range(60):
        if i % 5 == 4:
            log.append_batch("batch", [bytes([i]) * rnd.randrange(0, 3000) for _ in range(12)],
                             queue_id=i % 3)
        else:
            log.append(f"t{i % 4}", bytes([i]) * rnd.randrange(0, 6000), queue_id=i % 2,
                       properties={"k": str(i)} if i % 3 else None)


def test_an_idle_log_holds_a_window_of_blocks_not_its_segments(twin, tmp_path) -> None:
    log = CommitLog(tmp_path / "log", implementation=twin)  # 1 GiB segments
    try:
        assert log.wait_prefaulted(60)
        usage = log.disk_usage()
        assert usage.logical_bytes >= 1 << 30                    # the segment's full size ...
        assert usage.allocated_bytes < 100 << 20                 # ... but only a window on disk
        assert usage.allocated_bytes >= log.prefault_window_bytes  # reserved ahead of the writer
        log.append("t", b"x" * 1000)
    finally:
        log.close()
    again = CommitLog(tmp_path / "log", implementation=twin)
    try:
        assert again.wait_prefaulted(60)
        assert again.disk_usage().allocated_bytes < 100 << 20
        assert [m.body for m in again.iter_messages()] == [b"x" * 1000]
    finally:
        again.close()


def test_writes_across_the_window_and_segments_recover_byte_identical(twin, tmp_path) -> None:
    """A tiny window warmed ahead, the same window with no warm-up (the writer reserves every
    block itself), a wide window, and a slave fed raw blocks of random sizes: one set of
    bytes, before and after a reopen, and the blocks past the data stay unreserved."""
    kinds = {"warm": dict(prefault_window_bytes=WINDOW),
             "cold": dict(prefault_window_bytes=WINDOW, prefault=False),
             "sync": dict(prefault_window_bytes=WINDOW, flush="sync"),  # synced ahead too
             "wide": dict(prefault_window_bytes=1 << 20)}
    logs = {k: CommitLog(tmp_path / k, segment_bytes=SEG, implementation=twin, clock=fixed_clock,
                         **kw) for k, kw in kinds.items()}
    slave = CommitLog(tmp_path / "slave", segment_bytes=SEG, implementation=twin,
                      clock=fixed_clock, prefault_window_bytes=WINDOW)
    try:
        for log in logs.values():
            feed(log, seed=7)
        src = logs["warm"]
        assert src.max_offset > 4 * SEG
        rnd = random.Random(3)
        off = 0
        while off < src.max_offset:
            n = min(rnd.randrange(1, 3 * WINDOW), src.segment_end(off) - off, src.max_offset - off)
            data = bytes(src.read(off, n))
            if rnd.random() < 0.5:
                slave.append_data(off, data)
            else:
                slave.receive_view(off, n)[:] = data
                slave.commit_received(off, n)
            off += n
        expected = messages(src)
        assert len(expected) > 100
        for log in [*logs.values(), slave]:
            assert messages(log) == expected
            log.wait_prefaulted(30)
        # Blocks follow the data: at most the window past the end (plus the partial page).
        # st_blocks also counts the filesystem's own blocks: ext4 gives a file whose
        # extents no longer fit in its inode (the window's small reservations interleaved
        # with other writers' fragment it) an extent-tree block, so one block per file.
        usage = src.disk_usage()
        assert usage.allocated_bytes <= src.max_offset + 4 * WINDOW + 8192 + 4096 * usage.files, (
            usage, src.max_offset)
        end = src.max_offset
    finally:
        for log in [*logs.values(), slave]:
            log.close()
    first = store_bytes(tmp_path / "warm", end)
    for name in [*kinds, "slave"]:
        assert store_bytes(tmp_path / name, end) == first, name
        again = CommitLog(tmp_path / name, segment_bytes=SEG, implementation=twin,
                          clock=fixed_clock, prefault_window_bytes=WINDOW)
        try:
            assert messages(again) == expected
            again.append("after", b"reopened")  # the writer picks up a sparse tail
            assert messages(again)[-1][2] == b"reopened"
        finally:
            again.close()


def _answers_fiemap_with_unwritten_extents(directory: Path) -> bool:
    """Whether a file fallocated in ``directory`` shows unwritten extents by FIEMAP (tmpfs
    answers no FIEMAP; some filesystems' fallocate writes zeros)."""
    probe = directory / "fiemap-probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, 64 << 10)
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        return bool(unwritten_bytes(str(probe), 0, 64 << 10))
    finally:
        probe.unlink()


@pytest.fixture
def extent_dir(tmp_path) -> Iterator[Path]:
    """A directory on a filesystem with unwritten extents: pytest's own, else /var/tmp,
    else the repository's (where /tmp is a tmpfs, the other two are usually a real disk);
    none of them is a skip locally and a failure under CI (see :mod:`needs`)."""
    repo = Path(__file__).resolve().parents[2]
    for parent in (tmp_path, Path("/var/tmp"), repo):
        try:
            directory = Path(tempfile.mkdtemp(prefix="rmqha-extents-", dir=parent))
        except OSError:
            continue
        try:
            if _answers_fiemap_with_unwritten_extents(directory):
                yield directory
                return
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    unavailable(f"no filesystem with unwritten extents (FIEMAP) under {tmp_path}, /var/tmp or {repo}")


def test_with_sync_flush_the_window_ahead_of_the_writer_is_written_not_just_reserved(
        twin, extent_dir) -> None:
    """The writer's fdatasync must not pay for converting unwritten extents (a journal
    commit): with ``flush = sync`` the warm-up writes the window's blocks first."""
    window = 2 << 20
    found: dict[str, list[int]] = {}
    for mode in ("async", "sync"):
        log = CommitLog(extent_dir / mode, segment_bytes=8 << 20, implementation=twin,
                        flush=mode, prefault_window_bytes=window)
        try:
            found[mode] = []
            for _ in range(3):  # the window moves on as the writer crosses its middle
                assert log.wait_prefaulted(60)
                end = log.max_offset
                seg = log.segment_files()[-1]
                base = int(os.path.basename(seg))
                gap = unwritten_bytes(seg, end - base, min(end - base + window, 8 << 20))
                assert gap is not None, "FIEMAP answered the probe but not on a segment"
                found[mode].append(gap)
                log.append_batch("t", [b"m" * 1000] * (window // 2 // 1000 + 1))
        finally:
            log.close()
    # The reserved window stays unwritten without the sync warm-up: the comparison's control.
    assert any(found["async"]), found
    assert found["sync"] == [0, 0, 0], found
    assert log.flush_mode == "sync" and log._warm.synced_chunks >= 3


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    """A 320 KiB tmpfs: fills after a few segments' worth of records."""
    with tmpfs(tmp_path / "fs", "320k") as path:
        yield path


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_full_disk_refuses_appends_cleanly_and_loses_nothing(twin, small_fs, flush) -> None:
    # async: no warm-up, the writer reserves every block; sync: the warm-up reserves and
    # writes the window ahead, and meets the full disk first.
    log = CommitLog(small_fs / "log", segment_bytes=SEG, implementation=twin, clock=fixed_clock,
                    prefault_window_bytes=16 << 10, prefault=flush == "sync", flush=flush)
    stored: list[tuple[int, bytes]] = []
    announced: list[int] = []
    log.add_append_listener(announced.append)
    try:
        # A batch larger than the disk: what fits is stored and announced, then the error.
        batch = [bytes([i % 251]) * 1500 for i in range(400)]  # ~600 KiB
        with pytest.raises(DiskFullError, match="No space left on device"):
            log.append_batch("t", batch)
        stored = [(m.physical_offset, m.body) for m in log.iter_messages()]
        assert 0 < len(stored) < len(batch)
        assert [body for _, body in stored] == batch[:len(stored)]
        assert announced[-1] == log.max_offset and log.queue_offset("t") == len(stored)
        # Singles are refused too (at once, or after the few that still fit).
        with pytest.raises(DiskFullError, match="No space left on device"):
            for i in range(10_000):
                body = bytes([i % 251]) * 1500
                offset, _ = log.append("t", body)
                stored.append((offset, body))
        assert len(stored) > 20
        end = log.max_offset
        assert announced[-1] == end
        # Nothing half-written: the end stands, a batch and the slave's paths are refused too.
        with pytest.raises(DiskFullError):
            log.append_batch("t", [b"y" * 1500] * 40)
        rest = log.segment_end(end) - end  # the append found no blocks for less than this
        with pytest.raises(DiskFullError):
            log.append_data(end, b"\0" * rest)
        with pytest.raises(DiskFullError):
            log.receive_view(end, rest)
        assert log.max_offset == end and log.whole_offset == end
        assert [(m.physical_offset, m.body) for m in log.iter_messages()] == stored
        log.flush()
    finally:
        log.close()
    again = CommitLog(small_fs / "log", segment_bytes=SEG, implementation=twin,
                      clock=fixed_clock, prefault_window_bytes=16 << 10)
    try:
        assert again.max_offset == end
        assert [(m.physical_offset, m.body) for m in again.iter_messages()] == stored
        # Room again (the filesystem grown): the log goes on where it stopped.
        grow(small_fs, "4m")
        offset, _ = again.append("t", b"after the disk grew")
        assert offset == end
        assert again.read_message(offset).body == b"after the disk grew"
    finally:
        again.close()


def test_truncate_into_a_rolled_segment_leaves_its_blank_tail_a_hole(twin, tmp_path) -> None:
    """Truncating into a segment padded by a blank record zeroes the dropped records but
    not the hole past the blank's header: no blocks are taken there (nor, on a full disk,
    faulted for), and the log written again matches one that never held the dropped tail."""
    def open_log(name: str) -> CommitLog:
        return CommitLog(tmp_path / name, segment_bytes=SEG, implementation=twin,
                         clock=fixed_clock, prefault_window_bytes=WINDOW)

    log, fresh = open_log("cut"), open_log("fresh")
    try:
        keep = [log.append("t", bytes([i]) * 5000)[0] for i in range(6)]  # ~30 KiB
        fresh_keep = [fresh.append("t", bytes([i]) * 5000)[0] for i in range(6)]
        assert keep == fresh_keep
        log.append("t", b"x" * 40000)   # does not fit: the first segment gets a blank
        assert log.max_offset > SEG
        for i in range(20):
            log.append("later", bytes([i]) * 3000)
        log.wait_prefaulted(30)
        first = log.segment_files()[0]
        fd = os.open(first, os.O_RDONLY)
        try:
            assert os.lseek(fd, keep[-1], os.SEEK_HOLE) < SEG  # the blank's tail: a hole
            blocks_before = os.fstat(fd).st_blocks
            cut_at = keep[3]
            log.truncate(cut_at)
            assert os.fstat(fd).st_blocks <= blocks_before    # zeroing took no new blocks
            assert os.lseek(fd, keep[-1], os.SEEK_HOLE) < SEG  # and left the hole alone
            assert not any(os.pread(fd, SEG - cut_at, cut_at))  # the dropped records are gone
        finally:
            os.close(fd)
        for name, target in (("cut", log), ("fresh", fresh)):
            if name == "fresh":
                fresh.truncate(cut_at)
            for i in range(10):
                target.append("again", bytes([i + 100]) * 4000)
    finally:
        log.close()
        fresh.close()
    end = open_log("cut")
    try:
        got = messages(end)
        end_offset = end.max_offset
    finally:
        end.close()
    assert store_bytes(tmp_path / "cut", end_offset) == store_bytes(tmp_path / "fresh", end_offset)
    assert [m[2][:1] for m in got][-10:] == [bytes([i + 100]) for i in range(10)]
