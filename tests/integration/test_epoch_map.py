"""Epoch map (rmqha._core twins): entries, queries, mutations, the consistent-point search and the
RocketMQ epochFileCheckpoint file, on both twins."""
from __future__ import annotations

import binascii
import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqha._core import load_twin
from rmqha.store.epoch_map import OPEN_END, EpochMap, decode_checkpoint, encode_checkpoint
from rmqha.errors import CheckpointError, EpochError

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def make(twin: str, pairs=()) -> EpochMap:
    return EpochMap(pairs, implementation=twin)


# --- queries ---------------------------------------------------------------------------------


def test_entries_and_queries(twin: str) -> None:
    m = make(twin, [(1, 0), (2, 100), (5, 300)])
    assert m.implementation == twin
    assert m.entries() == [(1, 0, 100), (2, 100, 300), (5, 300, OPEN_END)]
    m.set_max_offset(450)
    assert m.entries()[-1] == (5, 300, 450)
    assert m.last_epoch() == 5
    assert m.entry_for_epoch(2) == (2, 100, 300)
    assert m.entry_for_epoch(3) is None
    assert m.entry_for_offset(0) == (1, 0, 100)
    assert m.entry_for_offset(99) == (1, 0, 100)
    assert m.entry_for_offset(100) == (2, 100, 300)
    assert m.entry_for_offset(449) == (5, 300, 450)
    assert m.entry_for_offset(450) is None
    assert m.next_entry(1) == (2, 100, 300)
    assert m.next_entry(2) == (5, 300, 450)
    assert m.next_entry(3) == (5, 300, 450)
    assert m.next_entry(5) is None
    assert m.first_entry() == (1, 0, 100)
    assert m.last_entry() == (5, 300, 450)
    assert len(m) == 3


def test_empty_map(twin: str) -> None:
    m = make(twin)
    assert m.last_epoch() == -1
    assert m.entries() == []
    assert m.entry_for_offset(0) is None
    assert m.last_entry() is None and m.first_entry() is None
    assert m.find_consistent_point([(1, 0, 10)]) == -1


# --- mutations -------------------------------------------------------------------------------


def test_append_rules(twin: str) -> None:
    m = make(twin, [(1, 0), (3, 100)])
    with pytest.raises(EpochError, match="not greater"):
        m.append(3, 200)
    with pytest.raises(EpochError, match="not greater"):
        m.append(2, 200)
    with pytest.raises(EpochError, match="below the start"):
        m.append(4, 50)
    with pytest.raises(EpochError):
        m.append(-1, 500)
    with pytest.raises(EpochError):
        m.append(4, -5)
    assert m.pairs() == [(1, 0), (3, 100)]  # every refusal left the map unchanged
    # An equal start replaces the last entry: epoch 3 never held data (RocketMQ does the same).
    m.append(4, 100)
    assert m.pairs() == [(1, 0), (4, 100)]
    m.append(7, 250)
    assert m.pairs() == [(1, 0), (4, 100), (7, 250)]


def test_truncate_suffix_leaves_last_entry_open(twin: str) -> None:
    m = make(twin, [(1, 0), (2, 100), (3, 200)])
    m.set_max_offset(260)
    assert m.truncate_suffix(150) == 1
    # The new last entry is open-ended again, not stuck at its old end (RocketMQ fixed it at its old end).
    assert m.entries() == [(1, 0, 100), (2, 100, OPEN_END)]
    assert m.truncate_suffix(100) == 1
    assert m.entries() == [(1, 0, OPEN_END)]
    assert m.truncate_suffix(0) == 1
    assert m.entries() == [] and m.last_epoch() == -1


def test_truncate_suffix_by_epoch(twin: str) -> None:
    m = make(twin, [(1, 0), (2, 100), (4, 200)])
    assert m.truncate_suffix_by_epoch(2) == 2
    assert m.entries() == [(1, 0, OPEN_END)]


def test_truncate_prefix(twin: str) -> None:
    m = make(twin, [(1, 0), (2, 100), (3, 200)])
    assert m.truncate_prefix(99) == 0
    assert m.truncate_prefix(100) == 1
    assert m.pairs() == [(2, 100), (3, 200)]
    # The newest entry stays even when the offset passes its start: new data goes there.
    assert m.truncate_prefix(10_000) == 1
    assert m.pairs() == [(3, 200)]


# --- consistent point --------------------------------------------------------------------------


def test_find_consistent_point_examples(twin: str) -> None:
    local = make(twin, [(1, 0), (2, 100), (4, 300)])
    local.set_max_offset(400)
    # Remote shares epochs 1 and 2 but went on with epoch 3 at 250: truncate at min(ends)=250.
    remote = [(1, 0, 100), (2, 100, 250), (3, 250, 500)]
    assert local.find_consistent_point(remote) == 250
    # Same epoch with a different start is not a match; fall back to an older one.
    assert local.find_consistent_point([(1, 0, 80), (2, 80, 500)]) == 80
    assert local.find_consistent_point([(9, 0, 10)]) == -1
    other_twin = "python" if twin == "cython" else "cython"
    for kind in (twin, other_twin):
        r = make(kind, [(1, 0), (2, 100), (4, 300)])
        r.set_max_offset(350)
        assert local.find_consistent_point(r) == 350
        assert local.find_consistent_point(r._core) == 350


class _Broker:
    """A replica in the election model: its log as one epoch per byte, and its EpochMap."""

    def __init__(self, twin: str) -> None:
        self.log: list[int] = []
        self.map = make(twin)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


_ops = st.lists(
    st.tuples(st.sampled_from(["elect", "write", "sync", "crash"]), st.integers(0, 3), st.integers(0, 12)),
    min_size=1,
    max_size=40,
)


@FAST
@given(ops=_ops)
def test_consistent_point_is_longest_agreeing_prefix(twin: str, ops) -> None:
    """Elections, writes, partial replication and crashes that cut tails, as RocketMQ does
    them; any two replicas' consistent point is the longest prefix whose bytes agree (a byte
    is identified by its offset and the epoch that wrote it)."""
    brokers = [_Broker(twin) for _ in range(4)]
    master: _Broker | None = None
    epoch = 0
    for kind, who, amount in ops:
        b = brokers[who]
        if kind == "elect":
            epoch += 1
            master = b
            b.map.append(epoch, len(b.log))
        elif kind == "write" and master is not None:
            master.log.extend([master.map.last_epoch()] * amount)
        elif kind == "sync" and master is not None and b is not master:
            # The slave truncates to the true fork point, then copies part of the master's tail,
            # adding an epoch entry whenever the block's epoch changes (as the HA slave does).
            tp = _lcp(b.log, master.log)
            del b.log[tp:]
            b.map.truncate_suffix(tp)
            upto = min(len(master.log), tp + amount * 3)
            for off in range(tp, upto):
                e = master.log[off]
                if e != b.map.last_epoch():
                    b.map.append(e, master.map.entry_for_epoch(e)[1])
                b.log.append(e)
        elif kind == "crash":
            cut = max(0, len(b.log) - amount)
            del b.log[cut:]
            b.map.truncate_suffix(cut)
            if b is master:
                master = None
    for a in brokers:
        a.map.set_max_offset(len(a.log))
    for a in brokers:
        for c in brokers:
            expect = _lcp(a.log, c.log)
            got = a.map.find_consistent_point(c.map)
            assert got == a.map.find_consistent_point(c.map.entries())
            if expect > 0:
                assert got == expect, (a.map, c.map, a.log, c.log)
            else:
                assert got in (-1, 0)


@FAST
@given(
    local=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 200)), max_size=12),
    remote=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 200), st.integers(0, 400)), max_size=12),
    max_offset=st.integers(0, 500),
)
def test_twins_agree_on_arbitrary_histories(twin: str, local, remote, max_offset) -> None:
    ref = load_twin("epoch_map", "python").EpochMapCore()
    mine = load_twin("epoch_map", twin).EpochMapCore()
    for e, s in local:
        outcomes = []
        for m in (ref, mine):
            try:
                m.append(e, s)
                outcomes.append("ok")
            except EpochError:
                outcomes.append("refused")
        assert outcomes[0] == outcomes[1]
    ref.set_max_offset(max_offset)
    mine.set_max_offset(max_offset)
    assert mine.entries() == ref.entries()
    assert mine.find_consistent_point(remote) == ref.find_consistent_point(remote)
    for o in (0, 50, 199, max_offset):
        assert mine.entry_for_offset(o) == ref.entry_for_offset(o)
    for e in (0, 5, 30):
        assert mine.entry_for_epoch(e) == ref.entry_for_epoch(e)
        assert mine.next_entry(e) == ref.next_entry(e)
    assert mine.truncate_prefix(100) == ref.truncate_prefix(100)
    assert mine.truncate_suffix(150) == ref.truncate_suffix(150)
    assert mine.entries() == ref.entries()


# --- checkpoint file ---------------------------------------------------------------------------


def test_checkpoint_bytes_match_rocketmq(twin: str, tmp_path: Path) -> None:
    path = tmp_path / "epochFileCheckpoint"
    m = EpochMap.open(path, implementation=twin)
    m.append(1, 0)
    m.append(2, 1024)
    body = b"1-0\n2-1024\n"
    crc = binascii.crc32(body) & 0x7FFFFFFF
    assert path.read_bytes() == b"2\n" + str(crc).encode() + b"\n" + body
    assert (tmp_path / "epochFileCheckpoint.bak").read_bytes().startswith(b"1\n")


_histories = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 10_000)), max_size=20).map(
    lambda steps: [(sum(s[0] for s in steps[: i + 1]), sum(s[1] for s in steps[:i]))
                   for i in range(len(steps))]
)


@FAST
@given(pairs=_histories)
def test_checkpoint_round_trip(twin: str, tmp_path: Path, pairs) -> None:
    data = encode_checkpoint(pairs)
    assert decode_checkpoint(data) == pairs
    path = tmp_path / f"rt-{len(pairs)}"
    m = make(twin, pairs)
    m.save(path)
    assert path.read_bytes() == data
    assert EpochMap.load(path, implementation=twin).pairs() == pairs


def test_every_mutation_persists(twin: str, tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    m = EpochMap.open(path, implementation=twin)
    assert path.read_bytes() == b"0\n0\n"
    m.append(1, 0)
    m.append(2, 10)
    m.append(3, 20)
    assert EpochMap.load(path).pairs() == [(1, 0), (2, 10), (3, 20)]
    m.truncate_prefix(10)
    assert EpochMap.load(path).pairs() == [(2, 10), (3, 20)]
    m.truncate_suffix(20)
    assert EpochMap.load(path).pairs() == [(2, 10)]
    with pytest.raises(EpochError):
        m.append(1, 30)
    assert EpochMap.load(path).pairs() == [(2, 10)]
    # Emptying the map is written too (RocketMQ kept the stale file).
    m.truncate_suffix(0)
    assert path.read_bytes() == b"0\n0\n"
    assert EpochMap.open(path, implementation=twin).entries() == []


def _good(path: Path, pairs) -> None:
    path.write_bytes(encode_checkpoint(pairs))


@pytest.mark.parametrize(
    "damage",
    ["truncated", "crc_flipped", "garbage", "empty", "missing", "count_wrong", "out_of_order"],
)
def test_corrupt_main_falls_back_to_bak(twin: str, tmp_path: Path, caplog, damage: str) -> None:
    path = tmp_path / "epochFileCheckpoint"
    pairs = [(1, 0), (2, 500), (3, 900)]
    _good(Path(f"{path}.bak"), pairs)
    good = encode_checkpoint(pairs + [(4, 1000)])
    if damage == "truncated":
        path.write_bytes(good[:-3])
    elif damage == "crc_flipped":
        lines = good.split(b"\n")
        lines[1] = str(int(lines[1]) ^ 1).encode()
        path.write_bytes(b"\n".join(lines))
    elif damage == "garbage":
        path.write_bytes(os.urandom(64))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "count_wrong":
        path.write_bytes(b"9" + good[1:])
    elif damage == "out_of_order":
        _good(path, [])
        path.write_bytes(encode_checkpoint([(2, 0), (1, 5)]))
    with caplog.at_level(logging.WARNING, logger="rmqha.store.epoch_map"):
        m = EpochMap.open(path, implementation=twin)
    assert m.pairs() == pairs
    assert any(".bak" in r.getMessage() for r in caplog.records)
    # open() repaired the main file from the backup and left the backup as it was.
    assert decode_checkpoint(path.read_bytes()) == pairs
    assert decode_checkpoint(Path(f"{path}.bak").read_bytes()) == pairs


def test_both_bad_is_an_error_naming_both(twin: str, tmp_path: Path) -> None:
    path = tmp_path / "epochFileCheckpoint"
    path.write_bytes(b"2\n123\n1-0\n")
    Path(f"{path}.bak").write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        EpochMap.open(path, implementation=twin)
    assert str(path) in str(info.value) and f"{path}.bak" in str(info.value)
    # Main bad and no backup at all: still an error, never a silent empty map.
    os.unlink(f"{path}.bak")
    with pytest.raises(CheckpointError, match="missing"):
        EpochMap.open(path, implementation=twin)
    with pytest.raises(CheckpointError):
        EpochMap.load(tmp_path / "absent", implementation=twin)


def test_bak_only(twin: str, tmp_path: Path) -> None:
    path = tmp_path / "epochFileCheckpoint"
    _good(Path(f"{path}.bak"), [(7, 70)])
    assert EpochMap.load(path, implementation=twin).pairs() == [(7, 70)]


def test_failed_write_rolls_back(twin: str, tmp_path: Path) -> None:
    d = tmp_path / "gone"
    d.mkdir()
    m = EpochMap.open(d / "epochs", implementation=twin)
    m.append(1, 0)
    for name in os.listdir(d):
        os.unlink(d / name)
    os.rmdir(d)
    with pytest.raises(CheckpointError):
        m.append(2, 10)
    assert m.pairs() == [(1, 0)]


def test_twins_write_identical_files(tmp_path: Path) -> None:
    pairs = [(1, 0), (3, 4096), (8, 1 << 40)]
    for kind in ("python", "cython"):
        make(kind, pairs).save(tmp_path / kind)
    assert (tmp_path / "python").read_bytes() == (tmp_path / "cython").read_bytes()


def test_concurrent_reads_see_consistent_maps(twin: str) -> None:
    """The commitlog writer thread mutates while the HA loop reads: no torn reads."""
    import threading

    from rmqha.ha.offsets import limit_batch

    m = make(twin, [(1, 0)])
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(2, 1500):
                m.append(i, i * 10)
                if i % 7 == 0:
                    m.truncate_suffix(i * 10 - 25)
                if i % 11 == 0:
                    m.truncate_prefix(i * 5)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            entries = m.entries()
            assert all(a[0] < b[0] and a[1] <= b[1] and a[2] == b[1] for a, b in zip(entries, entries[1:]))
            # The newest entry's start stays inside the map whatever the writer does next
            # (prefix truncation keeps the newest entry; suffix truncation leaves it open-ended).
            last = m.last_entry()
            epoch, start, size = limit_batch(m, last[1], 100, 1 << 40)
            assert start <= last[1] and 0 <= size <= 100
            reads += 1
    finally:
        t.join(timeout=30)
    assert not t.is_alive() and not errors
