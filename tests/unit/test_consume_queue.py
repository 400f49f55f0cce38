"""The consume queues as files (rmqha.store.consume_queue): RocketMQ's ConsumeQueue bytes,
a restart that re-dispatches only what follows the checkpoint, truncation and retention
keeping files and log consistent, damaged files found and rebuilt from the commitlog.

Every test that dispatches runs with both twins of the walk (``rmqha._core.queue_scan``)."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from rmqha._core import load_twin
from rmqha.protocol.message import tag_hash
from rmqha.store import CommitLog
from rmqha.store import consume_queue as cq
from rmqha.store.checkpoint import DISPATCH_CHECKPOINT_FILE, DispatchCheckpoint
from rmqha.store.consume_queue import ConsumeQueueIndex

SEG = 64 * 1024
UNIT = struct.Struct(">qiq")
BLANK = UNIT.pack(0, 0x7FFFFFFF, 0)  # RocketMQ's fillPreBlank unit


@pytest.fixture
def walk(twin: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Dispatch with the named twin of the commitlog walk."""
    monkeypatch.setattr(cq, "_queue_scan", load_twin("queue_scan", twin))
    return twin


@pytest.fixture
def clog(tmp_path: Path):
    log = CommitLog(tmp_path / "commitlog", segment_bytes=SEG, prefault=False)
    try:
        yield log
    finally:
        log.close()


Row = tuple[str, int, int, int, str]  # topic, queue id, commit offset, size, tag


def fill(log: CommitLog, n: int, *, queues: int = 2, start: int = 0, body: int = 8,
         topic: str = "T") -> list[Row]:
    rows = []
    for i in range(start, start + n):
        tag = f"tag{i % 5}"
        phys, size = log.append(topic, b"m%07d" % i + b"." * body, i % queues, {"TAGS": tag})
        rows.append((topic, i % queues, phys, size, tag))
    return rows


def by_hand(rows: list[Row], topic: str, qid: int) -> bytes:
    """The units of a queue, written with struct as RocketMQ lays them out."""
    return b"".join(UNIT.pack(p, s, tag_hash(t)) for tp, q, p, s, t in rows
                    if (tp, q) == (topic, qid))


def queue_file_bytes(root: Path, topic_dir: str, qid: int) -> bytes:
    d = root / topic_dir / str(qid)
    return b"".join((d / n).read_bytes() for n in sorted(os.listdir(d)))


def index(root: Path, **kw) -> ConsumeQueueIndex:
    kw.setdefault("flush_interval_s", 3600)  # flushes happen when a test says so
    return ConsumeQueueIndex(root, **kw)


def held(idx: ConsumeQueueIndex) -> dict[tuple[str, int], tuple[int, int, list]]:
    """Every queue's (min, max, units from min), read from the files."""
    return {k: (q.min_offset, q.max_offset,
                [q.files.unit(i) for i in range(q.min_offset, q.max_offset)])
            for k, q in sorted(idx.queues.items())}


def reference(log: CommitLog, tmp_path: Path, name: str = "reference", **kw) -> dict:
    """What a fresh index built from the whole log holds."""
    ref = index(tmp_path / name, **kw)
    ref.advance(log, log.max_offset)
    out = held(ref)
    ref.close()
    return out


# --- the bytes ------------------------------------------------------------------------------


def test_queue_files_are_rocketmq_consume_queue_files(walk: str, clog: CommitLog,
                                                      tmp_path: Path) -> None:
    rows = fill(clog, 30) + fill(clog, 3, topic="ü", queues=1)
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    root = tmp_path / "cq"
    # 15 units per queue in files of 8 units, named by their byte offset in the queue.
    assert sorted(os.listdir(root / "T" / "0")) == ["00000000000000000000",
                                                    "00000000000000000160"]
    assert all((root / "T" / "0" / n).stat().st_size == 8 * 20 for n in os.listdir(root / "T" / "0"))
    for qid in (0, 1):
        raw = queue_file_bytes(root, "T", qid)
        want = by_hand(rows, "T", qid)
        assert raw == want + bytes(16 * 20 - len(want))
    # A name RocketMQ would refuse gets a "~<hex>" directory; the units are the same.
    assert queue_file_bytes(root, "~" + "ü".encode().hex(), 0)[:60] == by_hand(rows, "ü", 0)
    assert UNIT.unpack(by_hand(rows, "T", 0)[:20])[2] == tag_hash("tag0")
    ck = (root / DISPATCH_CHECKPOINT_FILE).read_bytes()
    assert ck[:8] == b"RMQHACQ1" and struct.unpack_from(">q", ck, 8)[0] == clog.max_offset
    assert zlib.crc32(ck[:-4]) == struct.unpack(">I", ck[-4:])[0]
    idx.close()


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every queue file under ``root`` by its path below it (the checkpoint aside)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != DISPATCH_CHECKPOINT_FILE}


def differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    """The files two trees do not hold alike."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def test_confirm_by_confirm_dispatch_writes_the_general_walks_bytes(
        walk: str, clog: CommitLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Indexing one record per confirm (the compiled dispatch into armed sinks, across file
    ends, new queues and watched records) leaves the files the general walk over the
    whole log writes; a one-byte difference is reported."""
    idx = index(tmp_path / "cq", watched_topics=["W"], watched_property=b"MARK", units_per_file=7)
    seen: list[tuple[str, int, int]] = []
    general = []
    real = cq._queue_scan.index_runs
    monkeypatch.setattr(cq._queue_scan, "index_runs", lambda *a: general.append(1) or real(*a))
    for i in range(60):
        topic = "W" if i % 17 == 5 else ("T" if i % 3 else "ü")
        props = {"TAGS": f"t{i % 4}"} | ({"MARK": "1"} if i % 13 == 4 else {})
        clog.append(topic, b"m%04d" % i, i % 2, props)
        idx.advance(clog, clog.max_offset,
                    lambda r: seen.append((r.topic, r.queue_id, r.queue_offset)))
    # New queues, file ends and watched records go the general way; the rest do not.
    assert idx.dispatched == 60 and 10 < len(general) < 30
    assert [t for t, _, _ in seen] == [
        "W" if i % 17 == 5 else ("T" if i % 3 else "ü") for i in range(60)
        if i % 17 == 5 or i % 13 == 4]
    idx.flush()
    monkeypatch.setattr(ConsumeQueueIndex, "_dispatch_compiled",
                        lambda self, log, start, *a: start)
    ref = index(tmp_path / "ref", watched_topics=["W"], watched_property=b"MARK",
                units_per_file=7)
    ref.advance(clog, clog.max_offset)
    ref.flush()
    got, want = tree_bytes(tmp_path / "cq"), tree_bytes(tmp_path / "ref")
    assert len(want) > 6 and differing(got, want) == []
    name = sorted(got)[1]
    got[name] = bytes([got[name][0] ^ 1]) + got[name][1:]
    assert differing(got, want) == [name]
    idx.close()
    ref.close()


def test_confirm_by_confirm_after_a_cut_and_a_restart(walk: str, clog: CommitLog,
                                                      tmp_path: Path) -> None:
    """The queues' sinks follow a truncation and a restart: what one confirm at a time
    indexes afterwards is what a fresh index of the whole log holds."""
    idx = index(tmp_path / "cq", units_per_file=8)

    def confirm_each(n: int, start: int, into: ConsumeQueueIndex) -> list[Row]:
        rows = []
        for i in range(start, start + n):
            rows += fill(clog, 1, start=i, queues=3)
            into.advance(clog, clog.max_offset)
        return rows

    rows = confirm_each(40, 0, idx)
    clog.truncate(rows[25][2])
    idx.truncate(rows[25][2])
    confirm_each(15, 100, idx)
    assert held(idx) == reference(clog, tmp_path, "ref1", units_per_file=8)
    idx.close()
    again = index(tmp_path / "cq", units_per_file=8)
    again.recover(clog)
    confirm_each(20, 200, again)
    assert held(again) == reference(clog, tmp_path, "ref2", units_per_file=8)
    assert again.dispatched == 20
    again.close()


def test_a_queue_starting_past_its_file_start_is_pre_blank_filled(walk: str, clog: CommitLog,
                                                                   tmp_path: Path) -> None:
    rows = fill(clog, 60, queues=1, body=3000)  # about 3 segments
    clog.delete_segments_before(SEG)
    kept = [r for r in rows if r[2] >= clog.min_offset]
    first = len(rows) - len(kept)
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.advance(clog, clog.max_offset)
    q = idx.queue("T", 0)
    assert (q.min_offset, q.max_offset) == (first, 60) and first % 8
    start = first - first % 8
    names = sorted(os.listdir(tmp_path / "cq" / "T" / "0"))
    assert names[0] == f"{start * 20:020d}"
    raw = queue_file_bytes(tmp_path / "cq", "T", 0)
    assert raw[:(first - start) * 20] == BLANK * (first - start)
    assert raw[(first - start) * 20:(60 - start) * 20] == by_hand(kept, "T", 0)
    idx.close()


# --- restarts -------------------------------------------------------------------------------


def test_a_restart_re_dispatches_only_what_follows_the_checkpoint(walk: str, clog: CommitLog,
                                                                  tmp_path: Path, caplog) -> None:
    fill(clog, 200, queues=3)
    idx = index(tmp_path / "cq", units_per_file=16)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    checkpoint = clog.max_offset
    fill(clog, 37, queues=3, start=200)
    idx.advance(clog, clog.max_offset)  # written, not yet checkpointed: then a crash
    assert idx.dispatched == 237

    crashed = index(tmp_path / "cq", units_per_file=16)
    report = crashed.recover(clog)
    assert (report.checkpoint, report.start, report.clean) == (checkpoint, checkpoint, False)
    assert report.units_dropped == 37 and not report.rebuilt
    crashed.advance(clog, clog.max_offset)
    assert crashed.dispatched == 37
    assert held(crashed) == reference(clog, tmp_path, units_per_file=16)
    crashed.close()

    clean = index(tmp_path / "cq", units_per_file=16)
    report = clean.recover(clog)
    assert report.clean and report.start == clog.max_offset
    clean.advance(clog, clog.max_offset)
    assert clean.dispatched == 0 and held(clean) == reference(clog, tmp_path, "r2",
                                                                units_per_file=16)
    clean.close()

    # The negative control: without the checkpoint nothing in the files is trusted.
    os.unlink(tmp_path / "cq" / DISPATCH_CHECKPOINT_FILE)
    blind = index(tmp_path / "cq", units_per_file=16)
    assert blind.recover(clog).full_rebuild == "its checkpoint is missing or corrupt"
    assert "rebuilding every queue from the commitlog" in caplog.text
    blind.advance(clog, clog.max_offset)
    assert blind.dispatched == 237
    blind.close()


def test_the_periodic_flush_checkpoints_on_its_thread(walk: str, clog: CommitLog,
                                                      tmp_path: Path) -> None:
    import time

    fill(clog, 50)
    idx = index(tmp_path / "cq", flush_interval_s=0)
    idx.advance(clog, clog.max_offset)  # due at once: handed to the flush thread
    deadline = time.monotonic() + 30
    while idx.durable_offset != clog.max_offset and time.monotonic() < deadline:
        time.sleep(0.005)
    state = DispatchCheckpoint(tmp_path / "cq" / DISPATCH_CHECKPOINT_FILE).read()
    assert state is not None and state.offset == clog.max_offset and not state.clean
    assert state.same_boot
    idx.close()
    assert DispatchCheckpoint(tmp_path / "cq" / DISPATCH_CHECKPOINT_FILE).read().clean


def test_after_a_reboot_units_behind_a_hole_are_zeroed_too(walk: str, clog: CommitLog,
                                                           tmp_path: Path) -> None:
    """A power loss may leave units written after the checkpoint behind a unit that never
    reached the disk: recovery after a reboot zeroes the whole rest of the file."""
    fill(clog, 20, queues=1)
    idx = index(tmp_path / "cq", units_per_file=64)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    path = tmp_path / "cq" / "T" / "0" / f"{0:020d}"
    stale = UNIT.pack(clog.max_offset + 500, 120, 7)
    with open(path, "r+b") as fh:  # a hole at unit 20, a stale unit at 23
        fh.seek(23 * 20)
        fh.write(stale)
    # The negative control: after a process crash nothing follows a zero unit.
    same_boot = index(tmp_path / "cq", units_per_file=64)
    assert same_boot.recover(clog).units_dropped == 0
    same_boot.close()
    assert path.read_bytes()[23 * 20:24 * 20] == stale
    ck = tmp_path / "cq" / DISPATCH_CHECKPOINT_FILE
    head = ck.read_bytes()[:20] + b"\xee" * 16  # written during another boot
    ck.write_bytes(head + struct.pack(">I", zlib.crc32(head)))
    rebooted = index(tmp_path / "cq", units_per_file=64)
    report = rebooted.recover(clog)
    assert report.units_dropped == 1 and path.read_bytes()[20 * 20:] == bytes(44 * 20)
    assert held(rebooted) == reference(clog, tmp_path, units_per_file=64)
    rebooted.close()


# --- truncation and retention ---------------------------------------------------------------


def test_truncation_cuts_the_files_and_lowers_the_checkpoint(walk: str, clog: CommitLog,
                                                             tmp_path: Path) -> None:
    rows = fill(clog, 60)
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    cut = rows[41][2]
    clog.truncate(cut)
    idx.truncate(cut)
    assert (idx.queue("T", 0).max_offset, idx.queue("T", 1).max_offset) == (21, 20)
    state = DispatchCheckpoint(tmp_path / "cq" / DISPATCH_CHECKPOINT_FILE).read()
    assert state is not None and state.offset == cut
    assert sorted(os.listdir(tmp_path / "cq" / "T" / "0")) == [f"{i * 160:020d}" for i in range(3)]
    raw = queue_file_bytes(tmp_path / "cq", "T", 0)
    assert raw == by_hand(rows[:41], "T", 0) + bytes(3 * 160 - 21 * 20)
    # The log grows again from the cut; the queues follow it.
    rows = rows[:41] + fill(clog, 9, start=1000)
    idx.advance(clog, clog.max_offset)
    assert queue_file_bytes(tmp_path / "cq", "T", 1)[:25 * 20] == by_hand(rows, "T", 1)
    idx.close()
    reopened = index(tmp_path / "cq", units_per_file=8)
    reopened.recover(clog)
    assert held(reopened) == reference(clog, tmp_path, units_per_file=8)
    reopened.close()


def test_a_crash_between_cutting_the_log_and_the_queues(walk: str, clog: CommitLog,
                                                        tmp_path: Path, caplog) -> None:
    rows = fill(clog, 60)
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    clog.truncate(rows[30][2])  # then the process died before the index heard of it
    again = index(tmp_path / "cq", units_per_file=8)
    report = again.recover(clog)
    assert report.start == rows[30][2] and "is past the log end" in caplog.text
    assert report.units_dropped == 30  # the units of the records cut
    fill(clog, 11, start=500, body=40)  # what the new master sends next
    again.advance(clog, clog.max_offset)
    assert held(again) == reference(clog, tmp_path, units_per_file=8)
    again.close()


def test_a_reset_log_restarts_its_queues(walk: str, clog: CommitLog, tmp_path: Path) -> None:
    """A slave that shares nothing with its new master empties its log and starts it over
    at the master's start: the queues restart with the records that arrive."""
    fill(clog, 40)
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    clog.truncate(clog.min_offset)
    clog.reset(4 * SEG)
    idx.truncate(4 * SEG)
    idx.trim_below(clog.min_offset)
    assert all(len(q) == 0 for q in idx.queues.values())
    fill(clog, 6)  # queue offsets from 0 again
    idx.advance(clog, clog.max_offset)
    assert held(idx) == reference(clog, tmp_path, units_per_file=8)
    phys = idx.queue("T", 0).slice(0, 10)[0]
    assert [clog.read_message(o).queue_offset for o in phys] == [0, 1, 2]
    assert min(phys) >= 4 * SEG
    idx.close()


def test_retention_deletes_whole_files_below_the_log_start(walk: str, clog: CommitLog,
                                                           tmp_path: Path) -> None:
    old = fill(clog, 5, queues=1, body=3000, topic="old")
    rows = fill(clog, 80, queues=1, body=3000)
    idx = index(tmp_path / "cq", units_per_file=4)
    idx.advance(clog, clog.max_offset)
    idx.flush()
    assert clog.delete_segments_before(3 * SEG) == 3
    idx.trim_below(clog.min_offset)
    q = idx.queue("T", 0)
    first = next(i for i, r in enumerate(rows) if r[2] >= clog.min_offset)
    assert (q.min_offset, q.max_offset) == (first, 80)
    assert q.get(first).commit_offset == rows[first][2]
    starts = sorted(int(n) // 20 for n in os.listdir(tmp_path / "cq" / "T" / "0"))
    assert starts[0] == first - first % 4 and starts[-1] == 76
    gone = idx.queue("old", 0)  # every record deleted: its last file keeps its max offset
    assert (gone.min_offset, gone.max_offset, len(old)) == (5, 5, 5)
    assert os.listdir(tmp_path / "cq" / "old" / "0") == [f"{4 * 20:020d}"]
    idx.close()
    reopened = index(tmp_path / "cq", units_per_file=4)
    reopened.recover(clog)
    want = reference(clog, tmp_path, units_per_file=4)  # the log holds no "old" record
    assert held(reopened) == {**want, ("old", 0): (5, 5, [])}
    reopened.close()


# --- damage ---------------------------------------------------------------------------------


def _built(clog: CommitLog, tmp_path: Path, n: int = 60) -> list[Row]:
    rows = fill(clog, n)
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.advance(clog, clog.max_offset)
    idx.close()
    return rows


def test_a_unit_that_does_not_match_its_record_is_never_served(walk: str, clog: CommitLog,
                                                               tmp_path: Path, caplog) -> None:
    rows = _built(clog, tmp_path)
    path = tmp_path / "cq" / "T" / "0" / f"{8 * 20:020d}"
    raw = bytearray(path.read_bytes())
    raw[20:40] = raw[40:60]  # unit 9 now points at the record of unit 10
    path.write_bytes(bytes(raw))
    idx = index(tmp_path / "cq", units_per_file=8)
    idx.recover(clog)  # its first and last units are fine: the damage is in the middle
    phys, sizes, tags = idx.queue("T", 0).slice(8, 4)
    want = [r for r in rows if r[1] == 0][8:12]
    assert list(phys) == [r[2] for r in want] and list(sizes) == [r[3] for r in want]
    assert "unit 9" in caplog.text and "rebuilding it from the commitlog" in caplog.text
    assert held(idx) == reference(clog, tmp_path, units_per_file=8)
    idx.close()


@pytest.mark.parametrize("damage", ["missing file", "short file", "stray name", "last unit",
                                    "first unit"])
def test_damaged_queue_files_are_rebuilt_from_the_commitlog(walk: str, clog: CommitLog,
                                                            tmp_path: Path, caplog,
                                                            damage: str) -> None:
    _built(clog, tmp_path)
    qdir = tmp_path / "cq" / "T" / "1"
    if damage == "missing file":
        os.unlink(qdir / f"{8 * 20:020d}")
        why = "is missing"
    elif damage == "short file":
        os.truncate(qdir / f"{8 * 20:020d}", 100)
        why = "is 100 bytes, not 160"
    elif damage == "stray name":
        (qdir / "notes.txt").write_text("x")
        why = "is not a consume queue file name"
    else:
        unit = 29 if damage == "last unit" else 0
        path = qdir / f"{(unit - unit % 8) * 20:020d}"
        raw = bytearray(path.read_bytes())
        struct.pack_into(">i", raw, (unit % 8) * 20 + 8, 97)  # a wrong size
        path.write_bytes(bytes(raw))
        why = "97 bytes) does not match the record there"
    idx = index(tmp_path / "cq", units_per_file=8)
    report = idx.recover(clog)
    assert list(report.rebuilt) == [("T", 1)] and why in report.rebuilt[("T", 1)]
    assert why in caplog.text and "rebuilding it from the commitlog" in caplog.text
    assert held(idx) == reference(clog, tmp_path, units_per_file=8)
    assert idx.dispatched == 30  # that queue's records only
    idx.close()


def test_a_garbled_checkpoint_rebuilds_every_queue(walk: str, clog: CommitLog,
                                                   tmp_path: Path, caplog) -> None:
    _built(clog, tmp_path)
    ck = tmp_path / "cq" / DISPATCH_CHECKPOINT_FILE
    raw = bytearray(ck.read_bytes())
    raw[10] ^= 0xFF
    ck.write_bytes(bytes(raw))
    idx = index(tmp_path / "cq", units_per_file=8)
    assert idx.recover(clog).full_rebuild is not None
    assert "checkpoint" in caplog.text and "is corrupt" in caplog.text
    idx.advance(clog, clog.max_offset)
    assert idx.dispatched == 60 and held(idx) == reference(clog, tmp_path, units_per_file=8)
    idx.close()


# --- watched records ----------------------------------------------------------------------------


def test_replay_watched_finds_marked_records_without_indexing(walk: str, clog: CommitLog,
                                                              tmp_path: Path) -> None:
    marked = [clog.append("T", b"x", 0, {"MARK": "1"} if i % 4 == 0 else {})[0]
              for i in range(40)]
    idx = index(tmp_path / "cq", watched_property=b"MARK")
    idx.advance(clog, clog.max_offset)
    before = held(idx)
    seen: list[int] = []
    found = idx.replay_watched(clog, marked[10], clog.max_offset,
                               lambda r: seen.append(r.commit_offset))
    assert seen == marked[12::4] and found == len(seen) and held(idx) == before
    idx.close()


# --- the broker's service -------------------------------------------------------------------


def test_a_service_restart_folds_the_queue_files_and_dispatches_only_the_rest(
        tmp_path: Path) -> None:
    """MessageService on a store: topics (state records) come back from the state queue's
    file, and only the records after the checkpoint are dispatched again."""
    from rmqha.messaging.context import MessagingConfig
    from rmqha.messaging.service import MessageService

    def start() -> tuple[CommitLog, MessageService]:
        log = CommitLog(tmp_path / "commitlog", segment_bytes=SEG, prefault=False)
        svc = MessageService(log, store_dir=tmp_path, config=MessagingConfig(
            consume_queue_flush_interval_s=3600), broker_name="b", broker_id=0,
            replication=None)
        svc.set_role("master")
        return log, svc

    log, svc = start()
    assert svc._topic_admin.ensure_topic("orders") is not None
    fill(log, 100, topic="orders", queues=4)
    svc.on_confirm_offset(log.max_offset)
    svc.index.flush()
    checkpoint = log.max_offset
    fill(log, 23, topic="orders", queues=4, start=100)
    svc.on_confirm_offset(log.max_offset)
    log.close()  # a crash of the process: the service never closes its queues
    svc.ctx.closed = True
    svc._lookup.close()

    log, again = start()
    try:
        assert again.index.last_recovery.start == checkpoint
        assert again.index.dispatched == 23
        assert "orders" in again.topics
        q = again.index.queue("orders", 0)
        assert (q.min_offset, q.max_offset) == (0, 31)
        phys, _, _ = q.slice(29, 5)
        assert [log.read_message(p).queue_offset for p in phys] == [29, 30]
    finally:
        again.close()
        log.close()
    log, clean = start()
    try:
        assert clean.index.last_recovery.clean and clean.index.dispatched == 0
    finally:
        clean.close()
        log.close()


# --- the compiled dispatch's sinks ------------------------------------------------------------


@pytest.mark.parametrize("change", ["append", "cut", "zero", "destroy", "settle_end", "load",
                                    "begin_at"])
def test_every_change_of_a_queues_files_disarms_its_sink(twin: str, tmp_path: Path,
                                                          change: str) -> None:
    """A sink is armed only by ``arm`` (after the general way wrote): anything else that
    moves the queue's end or its files leaves it disarmed, so the compiled dispatch never
    writes through a stale mapping or position."""
    from rmqha.store.consume_queue_file import MappingCache, QueueFiles

    files = QueueFiles(tmp_path / "T" / "0", 8, MappingCache(), set())
    files.sink = load_twin("queue_scan", twin).QueueSink(("T", 0), b"T", 0)
    files.begin_at(0)
    files.append(UNIT.pack(100, 95, 0) * 3)
    files.arm()
    assert (files.sink.next, files.sink.limit, files.sink.start) == (3, 8, 0)
    assert files.took() is False  # nothing written through it yet
    {"append": lambda: files.append(UNIT.pack(195, 95, 0)), "cut": lambda: files.cut(1),
     "zero": lambda: files.zero(1, 2), "destroy": files.destroy,
     "settle_end": lambda: files.settle_end(2, False), "load": files.load,
     "begin_at": lambda: files.begin_at(5)}[change]()
    assert files.sink.limit == 0
    files.sink.next = files.max_offset + 2  # what a dispatch through a stale sink would claim
    files.arm()
    assert files.sink.next == files.max_offset or files.sink.limit == 0
