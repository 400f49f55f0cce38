"""Epoch map benchmarks: the consistent-point search on 1,000-entry maps and offset lookups,
compiled vs pure twin (the pure twin is the plain-Python peer), one run."""
from __future__ import annotations

import pytest

from benches.conftest import describe
from rmqha._core import load_twin

TWINS = ("cython", "python")


def _single(benchmark, fn, *args):
    # Same calibration for every implementation (many calls per round; see bench_frames).
    return benchmark.pedantic(fn, args=args, iterations=1000, rounds=100, warmup_rounds=3)
N = 1000


def _maps(impl: str):
    core = load_twin("epoch_map", impl).EpochMapCore
    # The histories agree on the first half and then diverge: the search walks 500 entries.
    local = core([(i * 2 + 1, i * 1000) for i in range(N)])
    remote = core([(i * 2 + 1, i * 1000) for i in range(N // 2)] + [(i * 2 + 2, i * 1000 + 7) for i in range(N // 2, N)])
    local.set_max_offset(N * 1000)
    remote.set_max_offset(N * 1000 + 50)
    return local, remote


def _info(benchmark, impl: str, batch: int) -> None:
    describe(benchmark, impl, message_bytes=0, batch=batch, entries=N)


@pytest.mark.benchmark(group="epoch-map-consistent-point-1000")
@pytest.mark.parametrize("impl", TWINS)
def test_find_consistent_point_map(benchmark, impl: str) -> None:
    _info(benchmark, impl, N)
    local, remote = _maps(impl)
    assert benchmark(local.find_consistent_point, remote) == 500 * 1000
    benchmark.extra_info["remote"] = "map"


@pytest.mark.benchmark(group="epoch-map-consistent-point-1000-triples")
@pytest.mark.parametrize("impl", TWINS)
def test_find_consistent_point_triples(benchmark, impl: str) -> None:
    _info(benchmark, impl, N)
    local, remote = _maps(impl)
    triples = remote.entries()  # as decoded from a RETURN_EPOCH frame
    assert benchmark(local.find_consistent_point, triples) == 500 * 1000
    benchmark.extra_info["remote"] = "triples"


@pytest.mark.benchmark(group="epoch-map-entry-for-offset")
@pytest.mark.parametrize("impl", TWINS)
def test_entry_for_offset(benchmark, impl: str) -> None:
    _info(benchmark, impl, 1)
    local, _ = _maps(impl)
    assert _single(benchmark, local.entry_for_offset, 123_456) == (247, 123_000, 124_000)
