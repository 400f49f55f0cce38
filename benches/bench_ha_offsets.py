"""Batch limiting and confirm-offset benchmarks: compiled vs pure twin vs a plain-Python
baseline (``bisect`` over lists for limit_batch, builtin ``min`` for confirm_offset)."""
from __future__ import annotations

import bisect

import pytest

from benches.conftest import describe
from rmqha._core import load_twin
from rmqha.store.epoch_map import EpochMap

TWINS = ("cython", "python")


def _single(benchmark, fn, *args):
    # Same calibration for every implementation (many calls per round; see bench_frames).
    return benchmark.pedantic(fn, args=args, iterations=1000, rounds=100, warmup_rounds=3)
N = 1000


def _map(impl: str) -> EpochMap:
    m = EpochMap([(i + 1, i * 100_000) for i in range(N)], implementation=impl)
    m.set_max_offset(N * 100_000)
    return m


@pytest.mark.benchmark(group="ha-limit-batch")
@pytest.mark.parametrize("impl", TWINS + ("bisect",))
def test_limit_batch(benchmark, impl: str) -> None:
    describe(benchmark, impl, message_bytes=32768, batch=1, entries=N)
    if impl == "bisect":
        starts = [i * 100_000 for i in range(N)]
        epochs = [i + 1 for i in range(N)]

        def limit(frm: int, want: int, seg: int, mb: int = 32768) -> tuple[int, int, int]:
            i = bisect.bisect_right(starts, frm) - 1
            size = min(want, mb, seg - frm)
            if i + 1 < len(starts):
                size = min(size, starts[i + 1] - frm)
            return epochs[i], starts[i], size

        assert limit(12_345_000, 1 << 20, 1 << 30) == (124, 12_300_000, 32768)
        _single(benchmark, limit, 12_345_000, 1 << 20, 1 << 30)
        return
    lb = load_twin("ha_offsets", impl).limit_batch
    m = _map(impl)
    assert lb(m, 12_345_000, 1 << 20, 1 << 30) == (124, 12_300_000, 32768)
    _single(benchmark, lb, m, 12_345_000, 1 << 20, 1 << 30)


@pytest.mark.benchmark(group="ha-confirm-offset")
@pytest.mark.parametrize("replicas", (2, 8))
@pytest.mark.parametrize("impl", TWINS + ("builtin-min",))
def test_confirm_offset(benchmark, impl: str, replicas: int) -> None:
    describe(benchmark, impl, message_bytes=0, batch=1, replicas=replicas)
    acks = [1_000_000 - i * 10 for i in range(replicas - 1)]  # the other members' acks
    if impl == "builtin-min":
        def confirm(master: int, acks: list[int], previous: int) -> int:
            return min(master, *acks)
        _single(benchmark, confirm, 2_000_000, acks, 0)
        return
    co = load_twin("ha_offsets", impl).confirm_offset
    assert co(2_000_000, acks, 0) == min(acks)
    _single(benchmark, co, 2_000_000, acks, 0)
