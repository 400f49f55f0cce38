"""The commitlog on disk, both twins: round trips, rolls, recovery, flushing, threads, bad input."""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqha import _core
from rmqha.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidMessageError,
    MessageTooLargeError,
    OffsetMismatchError,
    StoreClosedError,
    StoreError,
)
from rmqha.protocol.message import encode_batch_entries
from rmqha.store import CommitLog, StoredMessage
from rmqha.store.segments import sidecar_path
from rmqha.testing.ha import wait_until

SEG = 16384
MAGIC = 0xDAA320A7
BLANK = 0xCBD43194


def fixed_clock() -> int:
    return 1_700_000_000_123


def parse_store(directory: str | Path, segment_bytes: int) -> list[dict]:
    """An independent reader of a store: RocketMQ v1 records with struct, segment by segment.

    Returns every record (blanks included, as {"blank": size}) with its global offset.
    """
    out = []
    names = sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit())
    for name in names:
        base = int(name)
        data = Path(directory, name).read_bytes()
        assert len(data) == segment_bytes
        pos = 0
        while pos + 8 <= len(data):
            total, magic = struct.unpack_from(">iI", data, pos)
            if total == 0 and magic == 0:
                break
            if magic == BLANK:
                assert pos + total == len(data), "a blank must fill the segment"
                out.append({"offset": base + pos, "blank": total})
                break
            assert magic == MAGIC
            (crc, qid, flag, qoff, phys, sysflag, born, bip, bport, store, sip, sport, rc, prep,
             blen) = struct.unpack_from(">iiiqqiq4siq4siiqi", data, pos + 8)
            body = data[pos + 88:pos + 88 + blen]
            tlen = data[pos + 88 + blen]
            topic = data[pos + 89 + blen:pos + 89 + blen + tlen]
            (plen,) = struct.unpack_from(">H", data, pos + 89 + blen + tlen)
            props = data[pos + 91 + blen + tlen:pos + 91 + blen + tlen + plen]
            assert 91 + blen + tlen + plen == total
            assert phys == base + pos
            assert crc == zlib.crc32(body) & 0x7FFFFFFF
            out.append({"offset": base + pos, "size": total, "topic": topic.decode(),
                        "body": body, "queue_id": qid, "queue_offset": qoff, "flag": flag,
                        "props": props, "born": born, "store": store, "sport": sport})
            pos += total
    return out


@pytest.fixture
def logs(tmp_path):
    """Open commitlogs through ``make(dir, twin, **kw)``; all are closed at the end."""
    opened: list[CommitLog] = []

    def make(directory, twin, **kw) -> CommitLog:
        kw.setdefault("segment_bytes", SEG)
        kw.setdefault("clock", fixed_clock)
        log = CommitLog(directory, implementation=twin, **kw)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def copy_log(src, dst) -> None:
    """A log directory and its sidecars (checkpoint, queue offsets) beside it, as they are."""
    shutil.copytree(src, dst)
    for name in ("checkpoint", "queue_offsets.json", "queue_offsets.snapshot"):
        if os.path.exists(sidecar_path(str(src), name)):
            shutil.copy2(sidecar_path(str(src), name), sidecar_path(str(dst), name))


def store_bytes(directory) -> dict[str, bytes]:
    return {n: Path(directory, n).read_bytes() for n in sorted(os.listdir(directory))
            if len(n) == 20 and n.isdigit()}


topics = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_categories=("Cs",)),
                 min_size=1, max_size=20)
prop_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                    max_size=6)
messages = st.lists(
    st.tuples(topics, st.binary(max_size=3000), st.integers(0, 3),
              st.dictionaries(prop_text.filter(bool), prop_text, max_size=3), st.booleans()),
    min_size=1, max_size=25)


@pytest.mark.skipif(_core.NO_EXTENSIONS,
                    reason="compares the two twins; RMQHA_NO_EXTENSIONS runs the pure one only")
@given(msgs=messages)
@settings(max_examples=25, deadline=None)
def test_round_trip_identical_bytes_both_twins(msgs) -> None:
    with tempfile.TemporaryDirectory() as root:
        results = {}
        for twin in ("cython", "python"):
            d = os.path.join(root, twin)
            log = CommitLog(d, segment_bytes=SEG, implementation=twin, clock=fixed_clock,
                            prefault=False)
            try:
                placed = []
                for topic, body, qid, props, as_batch in msgs:
                    if as_batch:
                        r = log.append_batch(topic, [body, body[::-1]], qid, props)
                        placed += [(r.offsets[0], topic, body, qid, props),
                                   (r.offsets[1], topic, body[::-1], qid, props)]
                    else:
                        off, size = log.append(topic, body, qid, props)
                        placed.append((off, topic, body, qid, props))
                for off, topic, body, qid, props in placed:
                    m = log.read_message(off)
                    # A pair with an empty value is left out (RocketMQ's readers drop it).
                    stored = {k: v for k, v in props.items() if v}
                    assert (m.topic, m.body, m.queue_id, m.properties) == (topic, body, qid, stored)
                assert [m.physical_offset for m in log.iter_messages()] == [p[0] for p in placed]
            finally:
                log.close()
            results[twin] = store_bytes(d)
            recs = [r for r in parse_store(d, SEG) if "blank" not in r]
            assert [(r["offset"], r["topic"], r["body"], r["queue_id"]) for r in recs] == [
                (p[0], p[1], p[2], p[3]) for p in placed]
            # Queue offsets are consecutive per (topic, queue).
            seen: dict = {}
            for r in recs:
                key = (r["topic"], r["queue_id"])
                assert r["queue_offset"] == seen.get(key, 0)
                seen[key] = r["queue_offset"] + 1
            log = CommitLog(d, segment_bytes=SEG, implementation=twin, prefault=False)
            try:
                assert log.queue_offsets() == seen
            finally:
                log.close()
        assert results["cython"] == results["python"]


def test_segment_roll_and_blank_records(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin)
    body = b"z" * 1000
    offsets = [log.append("roll", body)[0] for _ in range(50)]
    assert len(log.segment_files()) >= 4
    for off in offsets:
        assert log.segment_start(off) == log.segment_start(off + 1091 - 1), "no straddling"
    log.close()
    recs = parse_store(tmp_path, SEG)
    blanks = [r for r in recs if "blank" in r]
    assert len(blanks) == len(log.segment_files()) - 1 or len(blanks) >= 3
    for b in blanks:
        assert b["blank"] >= 8 and (b["offset"] + b["blank"]) % SEG == 0
    assert [r["offset"] for r in recs if "blank" not in r] == offsets


def test_batch_rolls_segments_and_matches_singles(twin, logs, tmp_path) -> None:
    bodies = [bytes([i % 256]) * (i * 53 % 1500) for i in range(120)]
    # No warm-up thread: it may or may not have made the next segment file by the close.
    a = logs(tmp_path / "a", twin, prefault=False)
    r = a.append_batch("T", bodies, 2, {"k": "v"})
    b = logs(tmp_path / "b", twin, prefault=False)
    singles = [b.append("T", x, 2, {"k": "v"})[0] for x in bodies]
    assert list(r.offsets) == singles and r.count == 120 and r.first_queue_offset == 0
    assert r.end_offset == a.max_offset == b.max_offset
    a.close()
    b.close()
    assert store_bytes(tmp_path / "a") == store_bytes(tmp_path / "b")
    assert a.queue_offset("T", 2) == 120


def test_batch_entries_roll_segments_and_match_singles(twin, logs, tmp_path) -> None:
    """A batch body stored as it came (each entry's own flag and properties) is the store
    that appending its messages one by one makes, across segment rolls."""
    rows = [(bytes([i % 256]) * (i * 53 % 1500), {} if i % 7 == 0 else {"k": f"v{i}"}, i % 4)
            for i in range(120)]
    batch = b""
    for body, props, flag in rows:
        pb = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
        batch += struct.pack(">iiiii", 22 + len(body) + len(pb), 0, 0, flag, len(body)) + body
        batch += struct.pack(">h", len(pb)) + pb
    # No warm-up thread: it may or may not have made the next segment file by the close.
    a = logs(tmp_path / "a", twin, prefault=False)
    r = a.append_batch_entries("T", batch, len(rows), 2, sys_flag=0, born_timestamp=7)
    b = logs(tmp_path / "b", twin, prefault=False)
    singles = [b.append("T", body, 2, props, flag=flag, born_timestamp=7)
               for body, props, flag in rows]
    assert list(zip(r.offsets, r.sizes)) == singles
    assert (r.count, r.first_queue_offset, r.end_offset) == (120, 0, a.max_offset)
    assert a.max_offset == b.max_offset and len(a.segment_files()) > 3
    a.close()
    b.close()
    assert store_bytes(tmp_path / "a") == store_bytes(tmp_path / "b")


def test_encoded_properties_are_stored_as_they_are_or_refused(twin, logs, tmp_path) -> None:
    # No warm-up thread: it may or may not have made the next segment file by the close.
    a = logs(tmp_path / "a", twin, prefault=False)
    b = logs(tmp_path / "b", twin, prefault=False)
    assert a.append("T", b"x", 0, b"k\x01v\x02KEYS\x01a\x02") == b.append(
        "T", b"x", 0, {"k": "v", "KEYS": "a"})
    for bad in (b"k\x01v", b"k\x01v\x02k\x01w\x02", b"\x01v\x02", b"k\x01\xff\x02"):
        with pytest.raises(InvalidMessageError, match="encoded properties"):
            a.append("T", b"y", 0, bad)
    assert a.max_offset == b.max_offset
    a.close()
    b.close()
    assert store_bytes(tmp_path / "a") == store_bytes(tmp_path / "b")


def _fill(log: CommitLog, n: int, rnd: random.Random) -> list[tuple[int, int, bytes]]:
    out = []
    for i in range(n):
        body = rnd.randbytes(rnd.randrange(0, 900))
        off, size = log.append(f"t{i % 3}", body, i % 2)
        out.append((off, size, body))
    return out


def _reopen_and_check(twin, d, records, cut_at: int, original: dict[str, bytes]) -> CommitLog:
    """Reopen; every record ending at or before cut_at must be there, nothing after it.

    (A record whose damaged bytes were zeros anyway is intact and may stay too.)
    """
    log = CommitLog(d, segment_bytes=SEG, implementation=twin, prefault=False)
    try:
        survivors = [r for r in records if r[0] + r[1] <= cut_at]
        nxt = records[len(survivors)] if len(survivors) < len(records) else None
        if nxt is not None and nxt[0] < cut_at:
            seg = original[f"{nxt[0] - nxt[0] % SEG:020d}"]
            if not any(seg[cut_at % SEG:(nxt[0] + nxt[1]) % SEG or SEG]):
                survivors.append(nxt)
        expect_end = survivors[-1][0] + survivors[-1][1] if survivors else 0
        # The end may sit at a segment boundary after a blank.
        assert log.max_offset in (expect_end, log.segment_end(expect_end))
        got = list(log.iter_messages())
        assert [(m.physical_offset, m.body) for m in got] == [(o, b) for o, _, b in survivors]
        # The table agrees with what survived, and appends continue cleanly.
        off, _ = log.append("t0", b"after recovery")
        assert log.read_message(off).queue_offset == sum(
            1 for i, r in enumerate(survivors) if i % 3 == 0 and i % 2 == 0)
    except BaseException:
        log.close()
        raise
    return log


def _closed_source(logs, twin, src, count: int, rnd: random.Random):
    """A log at ``src`` with ``count`` random appends, closed cleanly: returns the records,
    the store's bytes and its segment file names in order."""
    log = logs(src, twin)
    records = _fill(log, count, rnd)
    log.close()
    return records, store_bytes(src), sorted(n for n in os.listdir(src) if n.isdigit())


def _drop_segments_after(d, files: list[str], base: int) -> None:
    """Delete the segment files that start after ``base`` (a crash before they existed)."""
    for later in files:
        if int(later) > base:
            os.unlink(d / later)


def test_recovery_after_truncating_a_segment_file(twin, logs, tmp_path) -> None:
    rnd = random.Random(7)
    src = tmp_path / "src"
    records, original, files = _closed_source(logs, twin, src, 60, rnd)
    for trial in range(12):
        d = tmp_path / f"t{trial}"
        copy_log(src, d)
        name = rnd.choice(files[-2:])
        base = int(name)
        cut = rnd.randrange(0, SEG)
        os.truncate(d / name, cut)
        _drop_segments_after(d, files, base)
        _reopen_and_check(twin, d, records, base + cut, original).close()


def test_recovery_with_flipped_tail_bytes(twin, logs, tmp_path) -> None:
    rnd = random.Random(11)
    src = tmp_path / "src"
    log = logs(src, twin, flush_interval_ms=3_600_000)
    records = _fill(log, 30, rnd)
    flushed = log.flush()
    records += _fill(log, 30, rnd)
    # A crash now: the files as they are (the page cache holds the unflushed tail).
    snap = tmp_path / "snap"
    copy_log(src, snap)
    original = store_bytes(snap)
    assert flushed < log.max_offset
    for trial in range(15):
        d = tmp_path / f"f{trial}"
        copy_log(snap, d)
        victim = rnd.randrange(31, 60)
        off, size, body = records[victim]
        # Flip a byte in a validated part: size, magic, CRC, physical offset, or the body.
        where = rnd.choice([0, 3, 5, 9, 30] + ([88 + rnd.randrange(len(body))] if body else []))
        name = f"{off - off % SEG:020d}"
        with open(d / name, "r+b") as fh:
            fh.seek(off % SEG + where)
            byte = fh.read(1)
            fh.seek(off % SEG + where)
            fh.write(bytes([byte[0] ^ (1 << rnd.randrange(8))]))
        _reopen_and_check(twin, d, records, off, original).close()


def test_recovery_with_zeroed_tail(twin, logs, tmp_path) -> None:
    rnd = random.Random(5)
    src = tmp_path / "src"
    records, original, files = _closed_source(logs, twin, src, 50, rnd)
    for trial in range(8):
        d = tmp_path / f"z{trial}"
        copy_log(src, d)
        name = files[-1] if trial % 2 else files[-2]
        start = rnd.randrange(0, SEG)
        with open(d / name, "r+b") as fh:
            fh.seek(start)
            fh.write(bytes(SEG - start))
        _drop_segments_after(d, files, int(name))
        _reopen_and_check(twin, d, records, int(name) + start, original).close()


def test_checkpoint_tracks_flushes_and_survives_reopen(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin, flush_interval_ms=3_600_000)
    log.append("a", b"1")
    fut = log.flush_future(log.max_offset)
    assert not fut.done() and log.flushed_offset < log.max_offset
    assert log.flush() == log.max_offset == log.flushed_offset
    assert fut.result(timeout=5) >= log.max_offset
    assert log.flush_future(1).done()
    log.close()
    raw = Path(sidecar_path(str(tmp_path), "checkpoint")).read_bytes()
    assert struct.unpack_from(">q", raw, 8)[0] == log.max_offset
    # A corrupt checkpoint only means "validate everything".
    Path(sidecar_path(str(tmp_path), "checkpoint")).write_bytes(b"garbage")
    again = logs(tmp_path, twin)
    assert again.max_offset == log.max_offset


def test_sync_flush_group_commit(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin, flush="sync")
    threads, per = 4, 40
    errors: list[BaseException] = []
    done: list[tuple[int, int]] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        try:
            for i in range(per):
                off, size = log.append(f"w{k}", b"x" * 200)
                # Sync mode: the record is flushed when append returns.
                assert log.flushed_offset >= off + size
                with lock:
                    done.append((off, size))
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors, errors
    assert len(done) == threads * per
    assert log.flushed_offset == log.max_offset
    # Waiters shared fsyncs: fewer flush rounds than appends.
    assert 0 < log.flush_count < threads * per
    fut = log.flush_future(log.max_offset)
    assert fut.done()


def test_sync_flush_without_waiting_shares_one_fsync(twin, logs, tmp_path) -> None:
    # A broker appends a whole batch without waiting, then waits once for its end: the
    # batch costs one fsync round, not one per message.
    log = logs(tmp_path, twin, flush="sync")
    before = log.flush_count
    ends = [sum(log.append("batch", b"y" * 300, wait_flush=False)) for _ in range(32)]
    result = log.append_batch("batch", [b"z" * 300] * 32, wait_flush=False)
    assert log.flushed_offset < result.end_offset  # nothing waited for the disk yet
    assert log.flush_future(result.end_offset).result(timeout=10) >= result.end_offset
    assert ends[-1] < result.end_offset <= log.flushed_offset
    assert 1 <= log.flush_count - before <= 2


def test_received_blocks_after_a_pause_are_gathered_not_fsynced_one_by_one(
        twin, logs, tmp_path) -> None:
    """Sync mode, nobody waiting (a slave acking from its page cache): blocks that arrive
    after the flusher went idle wait the gathering period and share one fsync.  Before,
    a block that came after a pause was fsynced at once, alone, so a slave one message
    at a time fsynced every message and kept the disk the master waits on busy."""
    from rmqha.store.flusher import LAZY_FLUSH_S

    source = logs(tmp_path / "m", twin)
    placed = [source.append("t", b"r" * 200) for _ in range(7)]
    chunks = [bytes(source.read(off, size)) for off, size in placed]
    log = logs(tmp_path / "s", twin, flush="sync")
    log.append_data(0, chunks[0], wait_flush=False)
    deadline = time.monotonic() + 30
    while log.flushed_offset < len(chunks[0]):  # the first one flushes: now idle
        assert time.monotonic() < deadline, "the first block was never flushed"
        time.sleep(0.001)
    before = log.flush_count
    started = time.monotonic()
    for off, size in placed[1:]:
        log.append_data(off, chunks[placed.index((off, size))], wait_flush=False)
    end = placed[-1][0] + placed[-1][1]
    while log.flushed_offset < end:
        assert time.monotonic() < deadline, "the blocks after the pause were never flushed"
        time.sleep(0.001)
    assert time.monotonic() - started >= LAZY_FLUSH_S * 0.9  # gathered, not at once
    assert log.flush_count - before <= 2  # six blocks, at most two fsyncs


def test_concurrent_readers(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin, segment_bytes=65536)
    placed: list[tuple[int, bytes]] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        rnd = random.Random()
        try:
            while not stop.is_set() or reads[0] < 50:
                if not placed:
                    continue
                off, body = placed[rnd.randrange(len(placed))]
                assert log.read_message(off).body == body
                view = log.read(off, 91)
                assert struct.unpack_from(">q", view, 28)[0] == off
                view.release()
                reads[0] += 1
                for m in log.iter_messages(off):
                    if m.physical_offset > off + 20000:
                        break
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    rs = [threading.Thread(target=reader) for _ in range(2)]
    for t in rs:
        t.start()
    try:
        for i in range(1500):
            body = i.to_bytes(4, "big") * (i % 50)
            off, _ = log.append("r", body)
            placed.append((off, body))
            if i % 100 == 0:
                log.append_batch("r", [b"batch"] * 20)
    finally:
        stop.set()
        for t in rs:
            t.join(timeout=60)
    assert not errors, errors
    assert reads[0] >= 50


def test_bad_input_leaves_log_unchanged(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin)
    log.append("ok", b"first")
    log.flush()
    # The warm-up thread creates the next segment file in the background: let it finish,
    # or a file it adds between two looks reads as a change the bad calls made.
    assert log.wait_prefaulted(30)
    before = (log.max_offset, store_bytes(tmp_path), log.queue_offsets())
    bad_calls = [
        (MessageTooLargeError, lambda: log.append("big", b"x" * SEG)),
        (MessageTooLargeError, lambda: log.append_batch("big", [b"ok", b"x" * SEG])),
        (InvalidMessageError, lambda: log.append("", b"x")),
        (InvalidMessageError, lambda: log.append("t" * 256, b"x")),
        (InvalidMessageError, lambda: log.append("ok", b"x", properties={"a\x01": "b"})),
        (InvalidMessageError, lambda: log.append("ok", b"x", properties={"a": "b\x02"})),
        (InvalidMessageError, lambda: log.append_batch("ok", [b"x"], properties={"\x02": ""})),
        (InvalidMessageError, lambda: log.append_batch("ok", [b"x", 5])),
        (InvalidMessageError, lambda: log.append("ok", "text body")),
        (InvalidMessageError, lambda: log.append("ok", b"x", queue_id=-1)),
        (InvalidMessageError, lambda: log.append("ok", b"x", born_host=("::1", 1))),
        (OffsetMismatchError, lambda: log.append_data(log.max_offset + 1, b"xx")),
        (OffsetMismatchError, lambda: log.append_data(0, b"xx")),
        (StoreError, lambda: log.append_data(log.max_offset, b"\0" * SEG)),
        (CorruptRecordError, lambda: log.append_data(log.max_offset, b"\x07" * 200)),
        (StoreError, lambda: log.truncate(log.max_offset + 10)),
        (StoreError, lambda: log.truncate(3)),
        (StoreError, lambda: log.read(log.max_offset - 5, 10)),
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
        assert (log.max_offset, store_bytes(tmp_path), log.queue_offsets()) == before
    with pytest.raises(ConfigError):
        CommitLog(tmp_path / "x", flush="sometimes")
    with pytest.raises(StoreError):
        CommitLog(tmp_path, segment_bytes=SEG)  # one open log per directory
    log.close()
    with pytest.raises(StoreClosedError):
        log.append("ok", b"late")


def test_append_data_replicates_byte_for_byte(twin, logs, tmp_path) -> None:
    # No warm-up threads: either may or may not have made its next segment file by the
    # close, and the two stores are compared file by file.
    master = logs(tmp_path / "m", twin, prefault=False)
    rnd = random.Random(3)
    _fill(master, 40, rnd)
    master.append_batch("b", [b"q" * 300] * 30, 1)
    slave = logs(tmp_path / "s", twin, prefault=False)
    seen: list[int] = []
    slave.add_append_listener(seen.append)
    off = 0
    while off < master.max_offset:
        n = min(rnd.randrange(1, 5000), master.max_offset - off, master.segment_end(off) - off)
        view = master.read(off, n)
        slave.append_data(off, view)
        view.release()
        off += n
        assert slave.max_offset == off == seen[-1]
        assert slave.whole_offset <= off
    assert slave.whole_offset == slave.max_offset == master.max_offset
    assert slave.queue_offsets() == master.queue_offsets()
    # A block ending inside a record: readers stop at the last whole record, and the cut
    # drops the partial one.
    m2 = master.append("tail", b"partial record body")[0]
    slave.append_data(m2, master.read(m2, 40))
    assert slave.whole_offset == m2 and slave.max_offset == m2 + 40
    assert [m.physical_offset for m in slave.iter_messages()][-1] < m2
    assert slave.cut_to_last_whole_record() == m2
    master.close()
    slave.close()
    mb, sb = store_bytes(tmp_path / "m"), store_bytes(tmp_path / "s")
    assert sorted(sb) == sorted(mb)
    for name in mb:
        if int(name) + SEG <= m2:
            assert mb[name] == sb[name]


def test_truncate_and_queue_offsets(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin)
    offs = [log.append("a" if i % 2 else "b", b"x" * 700)[0] for i in range(60)]
    assert log.queue_offset("a") == 30
    cut = offs[21]
    with pytest.raises(StoreError):
        log.truncate(cut + 1)
    log.truncate(cut)
    assert log.max_offset == cut and log.flushed_offset <= cut
    assert log.queue_offset("a") == 10 and log.queue_offset("b") == 11
    for name, data in store_bytes(tmp_path).items():
        if int(name) > log.segment_start(cut):
            assert not any(data), "only the warmed-up next segment (all zeros) may follow"
    new_off, _ = log.append("a", b"new")
    assert log.read_message(new_off).queue_offset == 10
    log.close()
    again = logs(tmp_path, twin)
    assert again.max_offset == log.max_offset
    assert again.queue_offset("a") == 11 and again.queue_offset("b") == 11


@pytest.mark.parametrize("field_at", [84, 4], ids=["body length", "magic"])
def test_truncate_cuts_at_a_record_damaged_past_reading(twin, logs, tmp_path, field_at) -> None:
    """A record whose length or magic rotted cannot be read, yet its start is a boundary
    (the records before it tile up to it): cutting there is the slave's repair, so it is
    allowed; a cut inside it is still refused."""
    log = logs(tmp_path, twin)
    offs = [log.append("a", b"x" * 700)[0] for i in range(12)]
    bad = offs[7]
    base = log.segment_start(bad)
    seg = log._segments[base]
    seg.mm[bad - base + field_at:bad - base + field_at + 4] = b"\x7f\x00\x00\x00"
    with pytest.raises(StoreError, match="not a record boundary"):
        log.truncate(bad + 8)
    log.truncate(bad)
    assert log.max_offset == bad
    assert log.read_message(offs[6]).body == b"x" * 700
    assert log.read_message(log.append("a", b"again")[0]).queue_offset == 7


def test_delete_segments_before_keeps_queue_offsets(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin)
    for i in range(80):
        log.append("only-old" if i < 10 else "main", b"y" * 900)
    assert log.delete_segments_before(SEG * 3) == 3
    assert log.min_offset == SEG * 3
    with pytest.raises(StoreError):
        log.read_message(0)
    assert next(log.iter_messages()).physical_offset >= SEG * 3
    log.close()
    again = logs(tmp_path, twin)
    assert again.min_offset == SEG * 3
    assert again.queue_offset("only-old") == 10 and again.queue_offset("main") == 70


def test_reopen_walks_only_from_the_queue_offset_snapshot(twin, logs, tmp_path) -> None:
    """Opening a log rebuilds its queue-offset table from the snapshot on: a clean close
    walks nothing, a crash walks what followed the last flush; without the snapshot (the
    negative control) the walk starts at the first segment, with the same result."""
    log = logs(tmp_path / "a", twin, flush_interval_ms=3_600_000)
    for i in range(80):
        log.append("a" if i % 3 else "b", b"y" * 900, i % 2)
    flushed_at = log.flush()
    for i in range(7):
        log.append("a", b"late", 1)
    crash = tmp_path / "crash"
    copy_log(tmp_path / "a", crash)  # the files as a crash now leaves them
    end, table = log.max_offset, log.queue_offsets()
    log.close()
    again = logs(tmp_path / "a", twin)
    assert (again.recovery_start, again.max_offset, again.queue_offsets()) == (end, end, table)
    crashed = logs(crash, twin)
    assert crashed.recovery_start == flushed_at > 2 * SEG
    assert (crashed.max_offset, crashed.queue_offsets()) == (end, table)
    os.unlink(Path(sidecar_path(str(tmp_path / "a"), "queue_offsets.snapshot")))
    again.close()
    walked = logs(tmp_path / "a", twin)
    assert (walked.recovery_start, walked.max_offset, walked.queue_offsets()) == (0, end, table)
    # The snapshot written by that open: the next one checks no more than the last segment.
    snap = json.loads(Path(sidecar_path(str(tmp_path / "a"), "queue_offsets.snapshot")).read_text())
    assert (snap["valid_at"], snap["since"]) == (end, walked.segment_start(end - 1))


def test_the_log_directory_holds_segments_only_and_older_stores_are_adopted(twin, logs, tmp_path) -> None:
    """RocketMQ takes every file in a commitlog directory for a segment (and refuses to start
    on any other), so the checkpoint and the queue-offset files live beside the directory; a
    store an older rmqha wrote, with them inside, opens with its checkpoint and table kept."""
    d = tmp_path / "commitlog"
    log = logs(d, twin, flush_interval_ms=3_600_000)
    for i in range(40):
        log.append("t", b"s" * 900)
    log.flush()
    end, table = log.max_offset, log.queue_offsets()
    log.delete_segments_before(SEG)  # writes the base table (queue_offsets.json)
    base = log.min_offset
    log.close()
    names = sorted(os.listdir(d))
    assert names and all(len(n) == 20 and n.isdigit() for n in names), names
    sidecars = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert sidecars == ["commitlog.checkpoint", "commitlog.queue_offsets.json",
                        "commitlog.queue_offsets.snapshot"], sidecars
    # Put them back where rmqha before the move kept them.
    for name, old in (("checkpoint", "commitlog.checkpoint"), ("queue_offsets.json", "queue_offsets.json"),
                      ("queue_offsets.snapshot", "queue_offsets.snapshot")):
        os.replace(sidecar_path(str(d), name), d / old)
    again = logs(d, twin)
    assert (again.min_offset, again.max_offset, again.queue_offsets()) == (base, end, table)
    assert again.recovery_start > 0  # the adopted checkpoint and snapshot were used, not a full walk
    assert all(len(n) == 20 and n.isdigit() for n in os.listdir(d))


def test_a_tail_lost_below_the_snapshot_is_found(twin, logs, tmp_path) -> None:
    """The records from the snapshot before the last one up to the last one are walked at
    open: a tail the disk zeroed there makes the open walk the whole log and cut it."""
    log = logs(tmp_path / "a", twin, flush_interval_ms=3_600_000)
    offs = [log.append("a", b"q" * 700)[0] for _ in range(30)]
    log.flush()
    offs += [log.append("a", b"r" * 700)[0] for _ in range(10)]
    log.close()
    snap = json.loads(Path(sidecar_path(str(tmp_path / "a"), "queue_offsets.snapshot")).read_text())
    assert (snap["since"], snap["valid_at"]) == (offs[30], log.max_offset)
    damaged = tmp_path / "damaged"
    copy_log(tmp_path / "a", damaged)
    seg = offs[35] - offs[35] % SEG
    with open(damaged / f"{seg:020d}", "r+b") as fh:  # zeros from record 35 on
        fh.seek(offs[35] - seg)
        fh.write(bytes(SEG - (offs[35] - seg)))
    reopened = logs(damaged, twin)
    assert (reopened.recovery_start, reopened.max_offset) == (0, offs[35])
    assert reopened.queue_offset("a") == 35
    intact = logs(tmp_path / "a", twin)
    assert intact.recovery_start == intact.max_offset > offs[35]


def test_truncate_and_retention_move_the_snapshot(twin, logs, tmp_path) -> None:
    log = logs(tmp_path / "log", twin, flush_interval_ms=3_600_000)
    offs = [log.append("a", b"z" * 900)[0] for _ in range(60)]
    log.flush()
    log.truncate(offs[40])
    crashed = tmp_path / "after-truncate"
    copy_log(tmp_path / "log", crashed)
    assert logs(crashed, twin).recovery_start == offs[40]
    log.delete_segments_before(SEG * 2)
    crashed = tmp_path / "after-delete"
    copy_log(tmp_path / "log", crashed)
    reopened = logs(crashed, twin)
    assert reopened.recovery_start == offs[40] and reopened.min_offset == SEG * 2
    assert reopened.queue_offset("a") == 40


def test_read_views_and_close_with_live_view(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin)
    off, size = log.append("v", b"zero-copy")
    view = log.read(off, size)
    assert isinstance(view, memoryview) and bytes(view[88:97]) == b"zero-copy"
    msg = log.read_message(off)
    assert isinstance(msg, StoredMessage) and msg.store_timestamp == fixed_clock()
    assert msg.store_host == ("127.0.0.1", 10911) and msg.size == size
    with pytest.raises(StoreError):
        log.read(log.segment_end(0) - 4, 8)
    log.close()  # a reader's view outlives the log without an error
    assert len(view) == size


def test_async_flush_listeners_and_futures(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin, flush_interval_ms=20)
    seen: list[int] = []
    log.add_append_listener(seen.append)
    off, size = log.append("l", b"one")
    r = log.append_batch("l", [b"two", b"three"])
    assert seen == [off + size, r.end_offset] == [off + size, log.max_offset]
    # The background flush resolves the future without an explicit flush().
    fut = log.flush_future(log.max_offset)
    assert fut.result(timeout=10) >= log.max_offset
    assert log.flushed_offset >= log.max_offset
    log.remove_append_listener(seen.append)
    log.append("l", b"four")
    assert len(seen) == 2
    assert log.queue_offset("l") == 4 and log.implementation == twin


def test_sync_mode_covers_batches_and_replicated_data(twin, logs, tmp_path) -> None:
    master = logs(tmp_path / "m", twin)
    master.append_batch("s", [b"a" * 100] * 50)
    slave = logs(tmp_path / "s", twin, flush="sync")
    r = slave.append_batch("local", [b"b"] * 3)
    assert slave.flushed_offset >= r.end_offset
    slave.truncate(0)
    end = slave.append_data(0, master.read(0, master.max_offset))
    assert slave.flushed_offset >= end == master.max_offset


def test_append_data_rejects_a_bad_record_split_across_blocks(twin, logs, tmp_path) -> None:
    """A record cut at a block edge is validated once its tail arrives: a bad tail (CRC)
    rejects that whole block, leaves the log where it was, and the good bytes still fit."""
    master = logs(tmp_path / "m", twin)
    offs = [master.append("split", bytes([i]) * 700)[0] for i in range(8)]
    slave = logs(tmp_path / "s", twin)
    cut = offs[3] + 300  # record 3 straddles the blocks
    slave.append_data(0, master.read(0, cut))
    assert (slave.max_offset, slave.whole_offset) == (cut, offs[3])
    tail = bytearray(master.read(cut, master.max_offset - cut))
    tail[100] ^= 0x55  # inside record 3's body
    with pytest.raises(CorruptRecordError, match="BAD_CRC"):
        slave.append_data(cut, tail)
    assert (slave.max_offset, slave.whole_offset) == (cut, offs[3])
    assert slave.queue_offset("split") == 3
    tail[100] ^= 0x55
    tail[offs[5] - cut + 4] ^= 0x01  # record 5's magic, wholly inside the block
    with pytest.raises(CorruptRecordError, match="BAD_MAGIC"):
        slave.append_data(cut, tail)
    assert slave.max_offset == cut
    slave.append_data(cut, master.read(cut, master.max_offset - cut))
    assert slave.queue_offset("split") == 8
    slave.close()
    again = logs(tmp_path / "s", twin)
    assert again.max_offset == master.max_offset and again.queue_offset("split") == 8
    assert [m.body for m in again.iter_messages()] == [bytes([i]) * 700 for i in range(8)]


def test_a_slave_stopped_with_a_bad_half_record_reopens_before_it(twin, logs, tmp_path) -> None:
    """A slave flushes what it received, a record's head included (the checkpoint then
    says mid-record was flushed).  Stopped before the tail arrives with that head's body
    corrupt, it must reopen at the last whole record: the record crossing the flushed
    offset is checked like those past it, not taken whole because it starts below it."""
    master = logs(tmp_path / "m", twin)
    offs = [master.append("split", bytes([i]) * 700)[0] for i in range(4)]
    head = bytearray(master.read(0, master.max_offset - 4))  # record 3 lacks 4 bytes
    head[offs[3] + 100] ^= 0x55  # in its body
    slave = logs(tmp_path / "s", twin)
    slave.append_data(0, bytes(head))
    assert (slave.max_offset, slave.whole_offset) == (len(head), offs[3])
    slave.flush()
    slave.close()
    again = logs(tmp_path / "s", twin)
    assert (again.max_offset, again.whole_offset) == (offs[3], offs[3])
    assert again.corrupt == []
    assert [m.body for m in again.iter_messages()] == [bytes([i]) * 700 for i in range(3)]
    again.append_data(offs[3], master.read(offs[3], master.max_offset - offs[3]))
    assert again.queue_offset("split") == 4


@pytest.mark.parametrize("props, missing", [({"KEYS": "order-17", "TAGS": "paid"}, 5), (None, 4)],
                         ids=["cut-in-properties", "cut-in-topic"])
def test_a_slave_stopped_with_a_half_record_of_zeros_reopens_before_it(
        twin, logs, tmp_path, caplog, props, missing) -> None:
    """A slave killed between two blocks of a catch-up, its file's zeros standing in for
    the rest of a record: the cut falls in the properties (or in the topic of a record
    without them), so the sizes add up and the body CRC passes.  It must reopen at the
    last whole record (the zero last byte tells the half one) and take it whole from its
    master."""
    master = logs(tmp_path / "m", twin)
    offs = [master.append("split", bytes([i]) * 700, 0, props)[0] for i in range(4)]
    slave = logs(tmp_path / "s", twin)
    slave.append_data(0, master.read(0, master.max_offset - missing))
    assert slave.whole_offset == offs[3]
    slave.flush()
    slave.close()
    # RocketMQ's check (sizes, magic, body CRC) reads the half record as a whole one.
    seen = parse_store(tmp_path / "s", SEG)
    assert [r["offset"] for r in seen] == offs
    assert seen[3]["props"] != seen[2]["props"] or seen[3]["topic"] != "split"
    with caplog.at_level("WARNING", logger="rmqha.store.recovery"):
        again = logs(tmp_path / "s", twin)
    assert (again.max_offset, again.whole_offset) == (offs[3], offs[3])
    assert f"cut the log at offset {offs[3]}: ZERO_TAIL" in caplog.text
    assert again.corrupt == []
    assert [m.body for m in again.iter_messages()] == [bytes([i]) * 700 for i in range(3)]
    again.append_data(offs[3], master.read(offs[3], master.max_offset - offs[3]))
    assert (again.queue_offset("split"), again.max_offset) == (4, master.max_offset)
    last = again.read_message(offs[3])
    assert (last.topic, last.body, last.properties) == ("split", bytes([3]) * 700, props or {})


def test_a_cut_partial_record_is_durable_before_records_go_over_it(twin, logs, tmp_path) -> None:
    """A slave that flushed a record's head, becoming master, cuts it: the zeroed bytes
    and the lower flushed offset reach the disk at once, so after a crash before the next
    checkpoint recovery checks the records written over them (here one whose tail the
    crash lost) instead of trusting them below the stale flushed offset."""
    master = logs(tmp_path / "m", twin)
    offs = [master.append("split", bytes([i]) * 700, 0, {"KEYS": "k"})[0] for i in range(2)]
    live = tmp_path / "s"
    slave = logs(live, twin, flush_interval_ms=3_600_000)
    slave.append_data(0, master.read(0, offs[1] + 600))
    slave.flush()  # the checkpoint says offs[1] + 600, mid-record, was flushed
    assert slave.cut_to_last_whole_record() == offs[1]
    assert not any(Path(live, f"{0:020d}").read_bytes()[offs[1]:offs[1] + 600])
    off, size = slave.append("new", b"n" * 100, 0, {"TAGS": "t"})
    assert off == offs[1] and off + size < offs[1] + 600
    crashed = tmp_path / "crashed"
    copy_log(live, crashed)
    with open(crashed / f"{0:020d}", "r+b") as fh:  # the crash lost its last 3 bytes
        fh.seek(off + size - 3)
        fh.write(bytes(3))
    reopened = logs(crashed, twin)
    assert reopened.max_offset == off
    # Negative control: the same crash without the lost bytes keeps the record.
    intact = tmp_path / "intact"
    copy_log(live, intact)
    assert logs(intact, twin).max_offset == off + size


def test_appends_refuse_a_record_that_would_end_in_zero(twin, logs, tmp_path) -> None:
    """Every append path keeps a record's last byte non-zero, refusing by name and storing
    nothing; a property value ending in NUL is no such record (its pair's separator
    closes the properties)."""
    log = logs(tmp_path, twin)
    log.append("T", b"x")
    end = log.max_offset
    batch = encode_batch_entries([(b"y", b"k\x01v\x02", 0), (b"z", b"k\x01v\x00", 0)])
    why = "ends in a NUL byte: recovery tells a torn record by its zero last byte"
    for refused in (lambda: log.append("T\x00", b"y"),
                    lambda: log.append_plain("T\x00", b"y", 0, b"", 0, 0, 1, ("127.0.0.1", 1), 0),
                    lambda: log.append_batch("T\x00", [b"y"]),
                    lambda: log.append_batch_entries("T\x00", batch[:27], 1),
                    lambda: log.append_batch_entries("T", batch, 2)):
        with pytest.raises(InvalidMessageError, match=why):
            refused()
    assert log.max_offset == end and log.queue_offset("T") == 1
    off, size = log.append("T", b"z", 0, {"k": "v\x00"})
    assert bytes(log.read(off, size))[-2:] == b"\x00\x02"
    assert log.read_message(off).properties == {"k": "v\x00"}


def test_receive_view_commit_and_discard(twin, logs, tmp_path) -> None:
    """Bytes received straight into the mapping count only once committed and valid."""
    master = logs(tmp_path / "m", twin)
    offs = [master.append("rv", bytes([i]) * 900)[0] for i in range(10)]
    slave = logs(tmp_path / "s", twin)
    seen: list[int] = []
    slave.add_append_listener(seen.append)
    cut = offs[4] + 500  # record 4 straddles the two blocks
    for start, end in ((0, cut), (cut, master.max_offset)):
        view = slave.receive_view(start, end - start)
        view[:] = master.read(start, end - start)
        view.release()
        assert slave.max_offset == start  # invisible until committed
        assert slave.commit_received(start, end - start) == end == seen[-1]
    assert slave.queue_offset("rv") == 10 and slave.whole_offset == master.max_offset
    assert [m.body for m in slave.iter_messages()] == [bytes([i]) * 900 for i in range(10)]
    # A bad record: the commit refuses, zeroes the bytes and leaves the log as it was.
    tail_at = master.max_offset
    more = master.append("rv", b"z" * 300)[1]
    view = slave.receive_view(tail_at, more)
    view[:] = master.read(tail_at, more)
    view[120] ^= 0xFF
    view.release()
    with pytest.raises(CorruptRecordError, match="BAD_CRC"):
        slave.commit_received(tail_at, more)
    assert slave.max_offset == tail_at and not any(slave.receive_view(tail_at, more))
    # An abandoned block (the link broke): discard zeroes what came.
    view = slave.receive_view(tail_at, more)
    view[:100] = master.read(tail_at, 100)
    view.release()
    slave.discard_received(tail_at, 100)
    assert not any(slave.receive_view(tail_at, more)) and slave.max_offset == tail_at
    with pytest.raises(OffsetMismatchError):
        slave.receive_view(tail_at + 1, 10)
    with pytest.raises(StoreError, match="segment end"):
        slave.receive_view(tail_at, SEG)
    slave.close()
    again = logs(tmp_path / "s", twin)
    assert (again.max_offset, again.queue_offset("rv")) == (tail_at, 10)


def test_reset_refuses_data_and_unaligned_offsets(twin, logs, tmp_path) -> None:
    log = logs(tmp_path, twin)
    log.append("r", b"x" * 100)
    first = f"{0:020d}"
    before = (log.max_offset, log.min_offset, store_bytes(tmp_path)[first])
    for bad in (SEG // 2, -SEG, 3):
        with pytest.raises(StoreError, match="multiple of segment_bytes"):
            log.reset(bad)
    with pytest.raises(StoreError, match="not empty"):
        log.reset(SEG)
    assert (log.max_offset, log.min_offset, store_bytes(tmp_path)[first]) == before
    log.close()
    with pytest.raises(StoreClosedError):
        log.reset(0)


def test_reset_starts_an_empty_log_durably(twin, logs, tmp_path) -> None:
    master = logs(tmp_path / "m", twin)
    while master.max_offset < 3 * SEG + 2000:
        master.append_batch("q", [b"m" * 500] * 4, 1)
    base_q = {}
    for m in master.iter_messages(3 * SEG):
        base_q[(m.topic, m.queue_id)] = m.queue_offset + 1
    # A slave that had a log (with retention history) drops it and restarts at 3 * SEG.
    d = tmp_path / "s"
    slave = logs(d, twin)
    for i in range(60):
        slave.append("old-topic", b"o" * 600)
    slave.delete_segments_before(2 * SEG)  # leaves queue_offsets.json behind
    slave.truncate(slave.min_offset)
    assert slave.max_offset == slave.min_offset == 2 * SEG
    slave.reset(3 * SEG)
    assert (slave.min_offset, slave.max_offset, slave.flushed_offset) == (3 * SEG,) * 3
    assert slave.queue_offsets() == {}
    files = store_bytes(d)
    assert min(files) == f"{3 * SEG:020d}"
    assert all(not any(data) for data in files.values()), "nothing but empty (warmed) segments"
    slave.close()
    slave = logs(d, twin)
    assert (slave.min_offset, slave.max_offset, slave.queue_offsets()) == (3 * SEG, 3 * SEG, {})
    # Replicated bytes land at the new start and keep the master's queue offsets.
    end = slave.append_data(3 * SEG, master.read(3 * SEG, master.max_offset - 3 * SEG))
    assert end == master.max_offset
    assert slave.queue_offsets() == base_q == {("q", 1): master.queue_offset("q", 1)}
    assert [m.physical_offset for m in slave.iter_messages()] == \
        [m.physical_offset for m in master.iter_messages(3 * SEG)]
    slave.close()
    slave = logs(d, twin)
    assert (slave.min_offset, slave.max_offset) == (3 * SEG, master.max_offset)
    assert slave.queue_offsets() == base_q
    assert store_bytes(d)[f"{3 * SEG:020d}"] == store_bytes(tmp_path / "m")[f"{3 * SEG:020d}"]
    # An empty log can move back to 0 too, and appends continue from there.
    slave.truncate(3 * SEG)
    slave.reset(0)
    assert slave.append("new", b"n")[0] == 0 and slave.queue_offsets() == {("new", 0): 1}
    slave.close()
    slave = logs(d, twin)
    assert (slave.min_offset, slave.queue_offset("new")) == (0, 1)


def test_store_module_exports() -> None:
    import rmqha.store as store
    from rmqha.store.epoch_map import EpochMap

    assert store.EpochMap is EpochMap
    assert store.CommitLog is CommitLog and store.StoredMessage is StoredMessage
    with pytest.raises(AttributeError):
        store.NoSuchThing  # noqa: B018 - the attribute access is the test


_WRITER = r"""
import sys
from rmqha.store import CommitLog
log = CommitLog(sys.argv[1], segment_bytes=16384, flush="sync", implementation=sys.argv[2])
i = 0
while True:
    off, size = log.append("k%d" % (i % 3), (b"%08d" % i) * (i % 40))
    print(off, size, i, flush=True)
    i += 1
"""


def test_kill_during_sync_appends_keeps_every_acknowledged_record(twin, tmp_path) -> None:
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "log"), twin],
                            stdout=subprocess.PIPE, text=True)
    acked: list[tuple[int, int, int]] = []
    try:
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while len(acked) < 300 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked.append(tuple(int(x) for x in line.split()))  # type: ignore[misc]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert len(acked) >= 300, "the writer did not get going"
    with CommitLog(tmp_path / "log", segment_bytes=16384, implementation=twin,
                   prefault=False) as log:
        for off, size, i in acked:
            m = log.read_message(off)
            assert (m.size, m.body, m.topic) == (size, (b"%08d" % i) * (i % 40), f"k{i % 3}")
        assert log.max_offset >= acked[-1][0] + acked[-1][1]


def test_missing_segments_are_refused_naming_the_file(twin, logs, tmp_path) -> None:
    """A store missing its first segment, or one in the middle, does not open: a slave
    would otherwise claim bytes it does not hold.  Retention's own start is accepted."""
    from rmqha.errors import MissingSegmentError

    log = logs(tmp_path, twin)
    for _ in range(60):
        log.append("gap", b"g" * 1000)
    files = log.segment_files()
    assert len(files) >= 4
    log.close()
    names = [os.path.basename(f) for f in files]
    aside = tmp_path / "aside"
    aside.mkdir()
    os.replace(tmp_path / names[1], aside / names[1])
    with pytest.raises(MissingSegmentError, match=names[1]):
        logs(tmp_path, twin)
    os.replace(aside / names[1], tmp_path / names[1])
    os.replace(tmp_path / names[0], aside / names[0])
    with pytest.raises(MissingSegmentError, match=names[0]):
        logs(tmp_path, twin)
    os.replace(aside / names[0], tmp_path / names[0])
    # Nothing was changed by the refusals: the log opens whole.
    again = logs(tmp_path, twin)
    assert again.min_offset == 0 and len(list(again.iter_messages())) == 60
    # Retention moving the start is recorded, so a store that starts later opens.
    deleted = again.delete_segments_before(int(names[2]))
    assert deleted and again.min_offset == int(names[2])
    again.close()
    logs(tmp_path, twin).close()


def test_sync_flush_receive_without_waiting_still_reaches_the_disk(twin, logs, tmp_path) -> None:
    # An HA slave that acks from its page cache appends replicated blocks without waiting
    # for an fsync; in sync mode they are still flushed soon, with nobody asking again.
    src = logs(tmp_path / "src", twin)
    for i in range(20):
        src.append("t", bytes([i]) * 500)
    log = logs(tmp_path / "dst", twin, flush="sync")
    half = src.max_offset // 2  # inside a record: the next block continues it
    log.append_data(0, bytes(src.read(0, half)), wait_flush=False)
    view = log.receive_view(half, src.max_offset - half)
    view[:] = src.read(half, src.max_offset - half)
    view.release()
    end = log.commit_received(half, src.max_offset - half, wait_flush=False)
    fut = log.flush_future(0)  # already done: the call asks for nothing
    assert fut.done()
    wait_until(lambda: log.flushed_offset >= end, 30, "received bytes flushed")
    assert log.flush_count >= 1
