"""Batch limiting, confirm offset and SyncStateSet rules (rmqha._core.ha_offsets), both twins."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqha._core import load_twin
from rmqha.store.epoch_map import EpochMap
from rmqha.errors import EpochError

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
OTHER = {"cython": "python", "python": "cython"}


def epochs(kind: str) -> EpochMap:
    m = EpochMap([(1, 0), (2, 1000), (4, 5000)], implementation=kind)
    m.set_max_offset(9000)
    return m


def test_limit_batch_cuts(twin: str) -> None:
    ho = load_twin("ha_offsets", twin)
    for kind in (twin, OTHER[twin]):  # either twin's public map is accepted
        m = epochs(kind)
        # Inside an epoch: only want / max_batch / segment bound it.
        assert ho.limit_batch(m, 0, 500, 1 << 30) == (1, 0, 500)
        assert ho.limit_batch(m, 0, 10**6, 1 << 30) == (1, 0, 1000)  # epoch 1 ends at 1000
        assert ho.limit_batch(m, 900, 10**6, 1 << 30, 64) == (1, 0, 64)
        assert ho.limit_batch(m, 990, 10**6, 1 << 30) == (1, 0, 10)
        assert ho.limit_batch(m, 1000, 10**6, 1 << 30, 1 << 20) == (2, 1000, 4000)
        assert ho.limit_batch(m, 1000, 10**6, 1500) == (2, 1000, 500)  # segment end first
        assert ho.limit_batch(m, 4999, 10, 1 << 30) == (2, 1000, 1)
        # The newest epoch is open-ended: only want bounds it (default max_batch 32 KiB).
        assert ho.limit_batch(m, 5000, 10**6, 1 << 30) == (4, 5000, 32768)
        assert ho.limit_batch(m, 9000, 0, 1 << 30) == (4, 5000, 0)  # nothing to send: heartbeat
        assert ho.limit_batch(m, 20000, 100, 1 << 30) == (4, 5000, 100)
        assert ho.limit_batch(m._core, 0, 10**6, 1 << 30) == (1, 0, 1000)


def test_limit_batch_errors(twin: str) -> None:
    ho = load_twin("ha_offsets", twin)
    with pytest.raises(EpochError, match="empty"):
        ho.limit_batch(EpochMap(implementation=twin), 0, 10, 100)
    late = EpochMap([(3, 100)], implementation=twin)
    with pytest.raises(EpochError, match="starts at 100"):
        ho.limit_batch(late, 50, 10, 1000)
    for args in ((-1, 10, 100), (0, -1, 100), (50, 10, 40)):
        with pytest.raises(ValueError):
            ho.limit_batch(late, *args)
    with pytest.raises(ValueError):
        ho.limit_batch(late, 100, 10, 1000, 0)


@FAST
@given(
    steps=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5000)), min_size=1, max_size=10),
    max_offset=st.integers(0, 60000),
    frm=st.integers(0, 60000),
    want=st.integers(0, 100000),
    seg=st.integers(0, 70000),
    batch=st.integers(1, 70000),
)
def test_limit_batch_twins_agree(twin: str, steps, max_offset, frm, want, seg, batch) -> None:
    pairs, e, s = [], 0, 0
    for de, ds in steps:
        e += de
        pairs.append((e, s))
        s += ds
    results = []
    for mod_twin, map_twin in ((twin, twin), ("python", "python"), (twin, OTHER[twin])):
        m = EpochMap(pairs, implementation=map_twin)
        m.set_max_offset(max_offset)
        try:
            results.append(load_twin("ha_offsets", mod_twin).limit_batch(m, frm, want, max(seg, frm), batch))
        except EpochError as exc:
            results.append(type(exc))
    assert results[0] == results[1] == results[2]
    r = results[0]
    if isinstance(r, tuple):
        epoch, start, size = r
        entry = m.entry_for_epoch(epoch)
        assert start == entry[1] <= frm
        assert 0 <= size <= min(want, batch, max(seg, frm) - frm)
        nxt = m.next_entry(epoch)
        if nxt is not None:
            assert frm + size <= nxt[1]  # never crosses the epoch end


def test_confirm_offset(twin: str) -> None:
    ho = load_twin("ha_offsets", twin)
    assert ho.confirm_offset(1000, [], 7) == 1000  # a SyncStateSet of the master alone
    assert ho.confirm_offset(1000, [800], 7) == 800
    assert ho.confirm_offset(1000, [1200, 900, 950], 7) == 900
    assert ho.confirm_offset(1000, (1000, 1000), 7) == 1000
    # A member without a live connection freezes the confirm offset (#6662).
    assert ho.confirm_offset(1000, [900, None], 500) == 500
    assert ho.confirm_offset(1000, [900, -1], 500) == 500
    # 0 is a real ack of an empty slave, not "ignored" as RocketMQ's #6728 did.
    assert ho.confirm_offset(1000, [0, 900], 500) == 0
    assert ho.confirm_offset(1000, iter([950, 990]), 0) == 950


@FAST
@given(
    master=st.integers(0, 1 << 50),
    acks=st.lists(st.one_of(st.none(), st.integers(-5, 1 << 50)), max_size=8),
    previous=st.integers(-1, 1 << 50),
)
def test_confirm_offset_twins_agree(twin: str, master, acks, previous) -> None:
    got = load_twin("ha_offsets", twin).confirm_offset(master, acks, previous)
    assert got == load_twin("ha_offsets", "python").confirm_offset(master, acks, previous)
    if any(a is None or a < 0 for a in acks):
        assert got == previous
    else:
        assert got == min([master, *acks])


def test_should_expand_and_shrink(twin: str) -> None:
    ho = load_twin("ha_offsets", twin)
    assert ho.should_expand(1000, 1000, 500) is True
    assert ho.should_expand(999, 1000, 500) is False  # below the confirm offset
    assert ho.should_expand(1000, 900, 1001) is False  # not yet in the current epoch
    assert ho.should_expand(-1, -1, 0) is False
    assert ho.should_shrink(20000, 5000, 15000) is False  # exactly at the limit: still in sync
    assert ho.should_shrink(20001, 5000, 15000) is True
    assert ho.should_shrink(16000, 0) is True
    assert ho.should_shrink(15000, 0) is False
