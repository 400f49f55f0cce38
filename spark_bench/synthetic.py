"""Synthetic benchmark histories with known change points, for tests and the pipeline bench.

Each run is a pytest-benchmark document (the same shape as an autosave file) with noisy
timings: Gaussian noise of ``noise`` relative standard deviation plus rare upward spikes,
the kind a shared VM produces. ``steps`` multiplies chosen benchmarks' times from a chosen
run on, so the tests know exactly where a detector must find a change.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

#: Implementations cycled through a group: both rmqha twins and two peers.
IMPLEMENTATIONS = ("cython", "python", "struct", "lmdb")
_SPEED = {"cython": 1.0, "python": 2.0, "struct": 1.5, "lmdb": 3.0}


@dataclass(frozen=True)
class HistorySpec:
    runs: int
    benchmarks: int
    noise: float = 0.02
    spike_rate: float = 0.0
    spike_factor: float = 1.3
    #: benchmark index -> [(first run of the new level, time multiplier), ...]
    steps: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    implementations: tuple[str, ...] = IMPLEMENTATIONS
    machine: str = "synthetic-host"
    seed: int = 1
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    #: CI runners that get a new host name per job: node is ``<machine>-job<run>``.
    host_per_run: bool = False
    branch: str = "main"
    #: Runs made from a work tree with uncommitted changes.
    dirty_runs: frozenset[int] = frozenset()
    #: Runs measured out of commit order: run ``r`` is *measured* at slot ``run_order[r]``
    #: (its ``datetime``), while its commit time stays ``r`` hours after ``start``.
    run_order: tuple[int, ...] = ()
    #: benchmark index -> first run without it (renamed or removed from then on).
    removed_from: dict[int, int] = field(default_factory=dict)
    #: Prefix of the synthetic commit ids (histories of two branches need different ones).
    commit_salt: str = ""


def bench_spec(runs: int, benchmarks: int) -> HistorySpec:
    """The history the trend benches time: 3% noise, 1% spikes, a 20% slowdown of every
    tenth benchmark and a 15% speed-up of every twentieth (from the fifth). The slowdowns
    start at three quarters of the history, but no earlier than 1,000 runs before its end,
    so the detector (which looks at the last ``DetectorConfig.max_points`` = 3,000 runs)
    sees them at 20,000 runs as it does at 2,000."""
    slow_from = max(runs * 3 // 4, runs - 1000)
    steps = {i: [(slow_from, 1.2)] for i in range(0, benchmarks, 10)}
    steps.update({i: [(runs // 3, 0.85)] for i in range(5, benchmarks, 20)})
    return HistorySpec(runs=runs, benchmarks=benchmarks, noise=0.03, spike_rate=0.01, steps=steps)


def commit_of(run: int, salt: str = "") -> str:
    return hashlib.sha1(f"{salt}run-{run}".encode()).hexdigest()


def commit_time_of(spec: HistorySpec, run: int) -> datetime:
    return spec.start + timedelta(hours=run)


def run_time_of(spec: HistorySpec, run: int) -> datetime:
    """When run ``run`` was measured (commit order unless ``run_order`` says otherwise)."""
    slot = spec.run_order[run] if spec.run_order else run
    return spec.start + timedelta(hours=slot, minutes=30)


def benchmark_identity(spec: HistorySpec, index: int) -> dict[str, object]:
    """Name, group, params and extra_info of benchmark ``index``: consecutive indexes form
    one group measured by every implementation with the same size."""
    impl = spec.implementations[index % len(spec.implementations)]
    group = index // len(spec.implementations)
    size = 64 << (group % 4)
    name = f"test_op{group}[{impl}-{size}]"
    return {
        "group": f"op{group}", "name": name,
        "fullname": f"benches/bench_synthetic.py::{name}",
        "params": {"implementation": impl, "size": size},
        "param": f"{impl}-{size}",
        "extra_info": {"implementation": impl, "message_bytes": size},
        "implementation": impl,
    }


def timings(spec: HistorySpec) -> np.ndarray:
    """Median times, shape (runs, benchmarks), in seconds."""
    rng = np.random.default_rng(spec.seed)
    levels = np.array([
        1e-6 * (1 + (i // len(spec.implementations)) % 7)
        * _SPEED.get(spec.implementations[i % len(spec.implementations)], 1.0)
        for i in range(spec.benchmarks)])
    values = levels[None, :] * (1.0 + spec.noise * rng.standard_normal((spec.runs, spec.benchmarks)))
    if spec.spike_rate:
        spikes = rng.random((spec.runs, spec.benchmarks)) < spec.spike_rate
        values[spikes] *= spec.spike_factor
    for bench, changes in spec.steps.items():
        for first_run, factor in changes:
            values[first_run:, bench] *= factor
    return np.abs(values)


def _stats(median: float, noise: float) -> dict[str, float | int]:
    mean = median * 1.02
    return {
        "min": median * 0.9, "max": median * 1.8, "mean": mean, "stddev": median * max(noise, 1e-3),
        "rounds": 1000, "median": median, "iqr": median * 0.05, "q1": median * 0.97,
        "q3": median * 1.02, "iqr_outliers": 3, "stddev_outliers": 5, "outliers": "5;3",
        "ld15iqr": median * 0.9, "hd15iqr": median * 1.1, "ops": 1.0 / mean,
        "total": mean * 1000, "iterations": 1,
    }


def run_document(spec: HistorySpec, run: int, row: np.ndarray) -> dict[str, object]:
    benches = []
    for i, median in enumerate(row):
        if run >= spec.removed_from.get(i, spec.runs + 1):
            continue
        ident = benchmark_identity(spec, i)
        benches.append({
            "group": ident["group"], "name": ident["name"], "fullname": ident["fullname"],
            "params": ident["params"], "param": ident["param"], "extra_info": ident["extra_info"],
            "options": {"disable_gc": True, "timer": "perf_counter", "min_rounds": 5,
                        "max_time": 1.0, "min_time": 5e-06, "warmup": False},
            "stats": _stats(float(median), spec.noise),
        })
    return {
        "machine_info": {
            "node": f"{spec.machine}-job{run}" if spec.host_per_run else spec.machine,
            "processor": "", "machine": "x86_64",
            "python_implementation": "CPython", "python_version": "3.11.7",
            "release": "6.18", "system": "Linux",
            "cpu": {"brand_raw": "Synthetic CPU", "arch": "X86_64", "count": 2},
        },
        "commit_info": {"id": commit_of(run, spec.commit_salt),
                        "time": commit_time_of(spec, run).isoformat(),
                        "dirty": run in spec.dirty_runs, "project": "rmqha",
                        "branch": spec.branch},
        "benchmarks": benches,
        "datetime": run_time_of(spec, run).isoformat(),
        "version": "5.3.1",
    }


def write_history(spec: HistorySpec, directory: str, first: int = 0) -> list[str]:
    """One pretty-printed JSON file per run, named like pytest-benchmark autosaves; runs
    before ``first`` are not written. ``dataclasses.replace(spec, runs=spec.runs + 1)``
    written from ``first=spec.runs`` adds one run to a history on disk (its timings are
    drawn anew with the same levels and steps; the files already there stay as they are)."""
    os.makedirs(directory, exist_ok=True)
    values = timings(spec)
    paths = []
    for run in range(first, spec.runs):
        stamp = run_time_of(spec, run).strftime("%Y%m%d_%H%M%S")
        path = os.path.join(directory, f"{run + 1:04d}_{commit_of(run, spec.commit_salt)[:12]}_{stamp}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(run_document(spec, run, values[run]), fh, indent=4)
        paths.append(path)
    return paths


def history_frame(spec: HistorySpec) -> pd.DataFrame:
    """The same history directly in the ingested-table layout (schema.RUN_TABLE), for
    tests of the trend job that need no file parsing."""
    values = timings(spec)
    idents = [benchmark_identity(spec, i) for i in range(spec.benchmarks)]
    rows = []
    for run in range(spec.runs):
        when = run_time_of(spec, run).replace(tzinfo=None)
        node = f"{spec.machine}-job{run}" if spec.host_per_run else spec.machine
        run_id = hashlib.sha1(f"{node}-{spec.commit_salt}-{run}".encode()).hexdigest()[:20]
        for i, ident in enumerate(idents):
            if run >= spec.removed_from.get(i, spec.runs + 1):
                continue
            st = _stats(float(values[run, i]), spec.noise)
            rows.append({
                "run_id": run_id, "run_time": when, "commit": commit_of(run, spec.commit_salt),
                "commit_dirty": run in spec.dirty_runs, "branch": spec.branch, "machine": node,
                "python": "CPython 3.11.7", "cpu": "Synthetic CPU",
                "benchmark": ident["fullname"], "name": ident["name"], "group": ident["group"],
                "params": {k: str(v) for k, v in ident["params"].items()},
                "implementation": ident["implementation"],
                "min": st["min"], "median": st["median"], "mean": st["mean"], "max": st["max"],
                "stddev": st["stddev"], "iqr": st["iqr"], "ops": st["ops"],
                "rounds": st["rounds"], "iterations": st["iterations"],
                "extra_info": {k: str(v) for k, v in ident["extra_info"].items()},
                "source_file": None, "ingested_at": when,
                "commit_time": commit_time_of(spec, run).replace(tzinfo=None),
                "machine_info": {"node": node, "machine": "x86_64", "system": "Linux",
                                 "python_version": "3.11.7", "cpu_brand": "Synthetic CPU"},
            })
    return pd.DataFrame(rows)
