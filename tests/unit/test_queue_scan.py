"""The consume-queue walk, both twins: runs, tag hashes, watched records, where it stops."""
from __future__ import annotations

import mmap
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqha import _core
from rmqha._core import load_twin
from rmqha.protocol.message import tag_hash

HOST = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
records = load_twin("records", "python")


def _hash(raw: bytes) -> int:
    return tag_hash(raw.decode("utf-8", errors="replace"))


def write_log(rows: list[tuple[bytes, int, int, bytes]], base: int = 0) -> bytes:
    """Records for (topic, queue id, queue offset, properties) rows, written by the pure
    records twin (an independent writer for this module)."""
    buf = bytearray(sum(91 + len(t) + len(p) + 3 for t, _, _, p in rows))
    pos = 0
    for topic, qid, qoff, props in rows:
        pos += records.write_message(buf, pos, topic, b"abc", props, qid, 0, qoff, base + pos, 0,
                                     1, HOST, 2, HOST, 0, 0)
    return bytes(buf[:pos])


def entries(runs) -> list[tuple]:
    """Every (topic, queue, queue offset, phys, size, tag) the runs hold, in order."""
    out = []
    for topic, qid, first, units, _hits in runs:
        assert len(units) % 20 == 0
        for i, (p, s, t) in enumerate(struct.iter_unpack(">qiq", units)):
            out.append((topic, qid, first + i, p, s, t))
    return out


def test_runs_group_consecutive_records_of_a_queue(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    rows = [(b"A", 0, 0, b""), (b"A", 0, 1, b"TAGS\x01red\x02"), (b"A", 0, 2, b""),
            (b"B", 0, 0, b""), (b"A", 1, 0, b""), (b"A", 0, 3, b""), (b"A", 0, 9, b"")]
    log = write_log(rows, base=1000)
    consumed, runs, bad = mod.index_runs(log, 1000, frozenset(), None, _hash)
    assert (consumed, bad) == (len(log), None)
    assert [(r[0], r[1], r[2], len(r[3]) // 20) for r in runs] == [
        (b"A", 0, 0, 3), (b"B", 0, 0, 1), (b"A", 1, 0, 1), (b"A", 0, 3, 1), (b"A", 0, 9, 1)]
    got = entries(runs)
    assert got[1][5] == tag_hash("red") and got[0][5] == 0
    assert got[0][3] == 1000 and got[1][3] == 1000 + got[0][4]


def test_units_are_rocketmq_consume_queue_units(twin: str) -> None:
    """A run's units are RocketMQ's 20-byte CQ_STORE_UNIT: offset int64, size int32, tag
    hash int64, big-endian; a negative tag hash is sign-extended as Java's long."""
    mod = load_twin("queue_scan", twin)
    rows = [(b"A", 0, 5, b"TAGS\x01payment\x02"), (b"A", 0, 6, b"")]
    log = write_log(rows, base=1 << 33)
    _, runs, _ = mod.index_runs(log, 1 << 33, frozenset(), None, _hash)
    first = len(write_log(rows[:1]))
    assert tag_hash("payment") == -786681338
    want = (struct.pack(">q", 1 << 33) + struct.pack(">i", first)
            + bytes.fromhex("ffffffffd11c3206")
            + struct.pack(">q", (1 << 33) + first) + struct.pack(">i", len(log) - first)
            + bytes(8))
    assert runs == [(b"A", 0, 5, want, [])]


def test_tag_hashes_match_java_for_ascii_and_not(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    tags = ["a", "TagA", "x" * 40, "étiquette", "标签", "\U0001F600", ""]
    rows = [(b"T", 0, i, f"KEYS\x01k\x02TAGS\x01{t}\x02".encode()) for i, t in enumerate(tags)]
    rows.append((b"T", 0, len(tags), b"XTAGS\x01no\x02"))  # not a pair's start
    rows.append((b"T", 0, len(tags) + 1, b"TAGS\x01last"))  # no closing separator
    _, runs, _ = mod.index_runs(write_log(rows), 0, frozenset(), None, _hash)
    assert [e[5] for e in entries(runs)] == [tag_hash(t) for t in tags] + [0, tag_hash("last")]


def test_watched_records_are_marked(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    rows = [(b"S", 0, 0, b""), (b"A", 0, 0, b"MARK\x011\x02"), (b"A", 0, 1, b""),
            (b"A", 0, 2, b"k\x01MARK\x01\x02")]
    _, runs, _ = mod.index_runs(write_log(rows), 0, frozenset({b"S"}), b"MARK\x01", _hash)
    assert [(r[0], r[4]) for r in runs] == [(b"S", [0]), (b"A", [0, 2])]
    _, runs, _ = mod.index_runs(write_log(rows), 0, frozenset(), None, _hash)
    assert all(r[4] == [] for r in runs)


def test_stops_at_torn_records_blanks_and_garbage(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    log = write_log([(b"A", 0, 0, b""), (b"A", 0, 1, b"")])
    one = len(log) // 2
    assert mod.index_runs(log[:-1], 0, frozenset(), None, _hash)[:1] == (one,)
    blank = struct.pack(">iI", 40, 0xCBD43194) + bytes(32)
    consumed, runs, bad = mod.index_runs(log[:one] + blank + log[one:], 0, frozenset(), None,
                                         _hash)
    assert consumed == len(log) + 40 and bad is None and len(entries(runs)) == 2
    garbage = log[:one] + b"\x00\x00\x00\x60\x12\x34\x56\x78" + bytes(100)
    consumed, runs, bad = mod.index_runs(garbage, 0, frozenset(), None, _hash)
    assert (consumed, bad, len(entries(runs))) == (one, (one, 0x12345678, 0x60), 1)
    # A record whose lengths do not add up is refused, not read past.
    broken = bytearray(log)
    struct.pack_into(">i", broken, one + 84, 10_000)
    consumed, _, bad = mod.index_runs(bytes(broken), 0, frozenset(), None, _hash)
    assert consumed == one and bad is not None and bad[0] == one


names = st.sampled_from([b"A", b"B", "ü".encode()])
props = st.sampled_from([b"", b"TAGS\x01a\x02", "TAGS\x01é\x02".encode(), b"W\x01\x02",
                         b"k\x01v\x02TAGS\x01zz\x02", b"TAGS\x01\x02"])


@pytest.mark.skipif(_core.NO_EXTENSIONS,
                    reason="compares the two twins; RMQHA_NO_EXTENSIONS runs the pure one only")
@given(rows=st.lists(st.tuples(names, st.integers(0, 2), st.integers(0, 5), props),
                     max_size=40),
       cut=st.integers(0, 200))
@settings(max_examples=150, deadline=None)
def test_twins_agree(rows, cut) -> None:
    log = write_log(rows, base=4096)
    log = log[:max(0, len(log) - cut)]
    outs = [load_twin("queue_scan", t).index_runs(log, 4096, frozenset({b"B"}), b"W\x01", _hash)
            for t in ("cython", "python")]
    assert outs[0] == outs[1]


def _units_of(log: bytes, base: int) -> bytes:
    _, runs, _ = load_twin("queue_scan", "python").index_runs(log, base, frozenset(), None, _hash)
    return b"".join(r[3] for r in runs)


def test_check_units_finds_the_first_unit_that_does_not_match(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    rows = [(b"A", 3, 10 + i, b"TAGS\x01t\x02") for i in range(6)]
    log = write_log(rows, base=500)
    units = _units_of(log, 500)
    assert mod.check_units(log, 500, units, 0, 6, 10, 3, b"A") == (6, False)
    assert mod.check_units(log, 500, units, 2, 5, 10, 3, b"A") == (5, False)
    # The negative controls: each field the check reads, wrong in turn.
    assert mod.check_units(log, 500, units, 0, 6, 11, 3, b"A") == (0, True)   # queue offset
    assert mod.check_units(log, 500, units, 0, 6, 10, 4, b"A") == (0, True)   # queue id
    assert mod.check_units(log, 500, units, 0, 6, 10, 3, b"B") == (0, True)   # topic
    assert mod.check_units(log, 500, units, 0, 6, 10, 3, b"AA") == (0, True)  # topic length
    swapped = units[:40] + units[60:80] + units[40:60] + units[80:]          # 2 and 3 swapped
    assert mod.check_units(log, 500, swapped, 0, 6, 10, 3, b"A") == (2, True)
    resized = bytearray(units)
    struct.pack_into(">i", resized, 4 * 20 + 8, 200)
    assert mod.check_units(log, 500, bytes(resized), 0, 6, 10, 3, b"A") == (4, True)
    moved = bytearray(units)
    struct.pack_into(">q", moved, 1 * 20, 500 + 7)  # mid-record: no magic there
    assert mod.check_units(log, 500, bytes(moved), 0, 6, 10, 3, b"A") == (1, True)
    # A record past the view is not checked, not failed: the caller reads further.
    second = len(write_log(rows[:2]))
    assert mod.check_units(log[:second], 500, units, 0, 6, 10, 3, b"A") == (2, False)
    # Units point up the log: one below the view's start is out of order.
    assert mod.check_units(log[second:], 500 + second, units, 1, 6, 11, 3, b"A") == (1, True)
    with pytest.raises(ValueError, match="unit range"):
        mod.check_units(log, 500, units, 0, 7, 10, 3, b"A")


@pytest.mark.skipif(_core.NO_EXTENSIONS,
                    reason="compares the two twins; RMQHA_NO_EXTENSIONS runs the pure one only")
@given(rows=st.lists(st.tuples(st.sampled_from([b"A", b"B"]), st.integers(0, 1),
                               st.integers(0, 3), props), min_size=1, max_size=20),
       flips=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=4),
       qid=st.integers(0, 1), first=st.integers(0, 3))
@settings(max_examples=150, deadline=None)
def test_check_units_twins_agree(rows, flips, qid, first) -> None:
    log = write_log(rows, base=64)
    units = bytearray(_units_of(log, 64))
    for at, value in flips:  # damage the units and the records alike
        if at < len(units):
            units[at] = value
    damaged = bytearray(log)
    for at, value in flips:
        if at < len(damaged):
            damaged[at] = value
    n = len(units) // 20
    outs = [load_twin("queue_scan", t).check_units(bytes(damaged), 64, bytes(units), 0, n,
                                                   first, qid, b"A")
            for t in ("cython", "python")]
    assert outs[0] == outs[1]


# --- dispatch: units written straight into the queues' files --------------------------------


def _sinks(mod, queues: dict[tuple[bytes, int], tuple[int, int, int]]) -> dict:
    """A sink per (topic, queue id) -> (file start, next queue offset, limit), each over a
    bytearray file of 16 units."""
    out = {}
    for (topic, qid), (start, nxt, limit) in queues.items():
        s = mod.QueueSink((topic.decode(), qid), topic, qid)
        s.mm, s.start, s.next, s.limit = bytearray(16 * 20), start, nxt, limit
        out[(topic, qid)] = s
    return out


def _expected_file(log: bytes, base: int, topic: bytes, qid: int, start: int, upto: int) -> bytes:
    """The 16-unit file the general walk (index_runs) gives queue (topic, qid) with the
    units of queue offsets [start, upto)."""
    file = bytearray(16 * 20)
    for r_topic, r_qid, first, units, _ in load_twin("queue_scan", "python").index_runs(
            log, base, frozenset(), None, _hash)[1]:
        for i in range(len(units) // 20):
            k = first + i
            if (r_topic, r_qid) == (topic, qid) and start <= k < upto:
                file[(k - start) * 20:(k - start + 1) * 20] = units[i * 20:(i + 1) * 20]
    return bytes(file)


def test_dispatch_writes_index_runs_units_into_the_files(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    rows = [(b"A", 0, 0, b"TAGS\x01red\x02"), (b"B", 1, 4, "TAGS\x01é\x02".encode()),
            (b"A", 0, 1, b""), (b"A", 0, 2, b"KEYS\x01k\x02TAGS\x01x\x02")]
    log = write_log(rows, base=500)
    sinks = _sinks(mod, {(b"A", 0): (0, 0, 16), (b"B", 1): (2, 4, 16)})
    consumed, count, keys = mod.dispatch(log, 500, sinks, frozenset(), None, _hash, 7)
    assert (consumed, count, keys) == (len(log), 4, [("A", 0), ("B", 1)])
    assert bytes(sinks[(b"A", 0)].mm) == _expected_file(log, 500, b"A", 0, 0, 3)
    assert bytes(sinks[(b"B", 1)].mm) == _expected_file(log, 500, b"B", 1, 2, 5)
    assert (sinks[(b"A", 0)].next, sinks[(b"B", 1)].next, sinks[(b"A", 0)].gen) == (3, 5, 7)
    # The checker this test leans on fires on a file that differs by one byte.
    wrong = bytearray(sinks[(b"A", 0)].mm)
    wrong[41] ^= 1
    assert bytes(wrong) != _expected_file(log, 500, b"A", 0, 0, 3)


def test_dispatch_stops_before_what_it_does_not_take(twin: str) -> None:
    mod = load_twin("queue_scan", twin)
    one = len(write_log([(b"A", 0, 0, b"")]))

    def stop(rows, queues, watched=frozenset(), prop=None, tail=b""):
        log = write_log(rows) + tail
        sinks = _sinks(mod, queues)
        consumed, count, _ = mod.dispatch(log, 0, sinks, watched, prop, _hash, 1)
        assert consumed == count * one  # every record taken was written, none after it
        return count

    a = {(b"A", 0): (0, 0, 16)}
    assert stop([(b"A", 0, 0, b""), (b"B", 0, 0, b"")], a) == 1  # a queue without a sink
    assert stop([(b"A", 0, 0, b""), (b"A", 0, 2, b"")], a) == 1  # a gap in queue offsets
    assert stop([(b"A", 0, 0, b""), (b"A", 0, 1, b"")], {(b"A", 0): (0, 0, 1)}) == 1  # limit
    assert stop([(b"A", 0, 0, b""), (b"A", 0, 1, b"")], {(b"A", 0): (0, 0, 0)}) == 0  # disarmed
    assert stop([(b"A", 0, 0, b""), (b"A", 0, 1, b"W\x01\x02")], a, prop=b"W\x01") == 1
    assert stop([(b"A", 0, 0, b"")], a | {(b"S", 0): (0, 0, 16)}, frozenset({b"S"})) == 1
    assert stop([(b"S", 0, 0, b"")], a | {(b"S", 0): (0, 0, 16)}, frozenset({b"S"})) == 0
    blank = struct.pack(">iI", 40, 0xCBD43194) + bytes(32)
    assert stop([(b"A", 0, 0, b"")], a, tail=blank) == 1
    assert stop([(b"A", 0, 0, b""), (b"A", 0, 1, b"")], a, tail=b"\x00\x00\x01") == 2
    log = write_log([(b"A", 0, 0, b""), (b"A", 0, 1, b"")])
    assert mod.dispatch(log[:-1], 0, _sinks(mod, a), frozenset(), None, _hash, 1)[:2] == (one, 1)
    # A mapping closed since the sink was armed: the record is left to the general way.
    sinks = _sinks(mod, a)
    sinks[(b"A", 0)].mm = b"read-only" * 40
    assert mod.dispatch(log, 0, sinks, frozenset(), None, _hash, 1) == (0, 0, [])
    closed = mmap.mmap(-1, 16 * 20)
    closed.close()
    sinks[(b"A", 0)].mm = closed
    assert mod.dispatch(log, 0, sinks, frozenset(), None, _hash, 1) == (0, 0, [])


@pytest.mark.skipif(_core.NO_EXTENSIONS,
                    reason="compares the two twins; RMQHA_NO_EXTENSIONS runs the pure one only")
@given(rows=st.lists(st.tuples(names, st.integers(0, 2), st.integers(0, 5), props),
                     max_size=40),
       cut=st.integers(0, 200), limit=st.integers(0, 8))
@settings(max_examples=150, deadline=None)
def test_dispatch_twins_agree(rows, cut, limit) -> None:
    log = write_log(rows, base=4096)
    log = log[:max(0, len(log) - cut)]
    outs = []
    for t in ("cython", "python"):
        mod = load_twin("queue_scan", t)
        sinks = _sinks(mod, {(n, q): (0, 0, limit) for n in (b"A", b"B", "ü".encode())
                             for q in (0, 1)})
        got = mod.dispatch(log, 4096, sinks, frozenset({b"B"}), b"W\x01", _hash, 3)
        outs.append((got, {k: (bytes(s.mm), s.next, s.gen) for k, s in sinks.items()}))
    assert outs[0] == outs[1]
