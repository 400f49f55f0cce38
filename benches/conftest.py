"""Shared benchmark settings: quick mode for CI-sized runs, and the run context that the
Spark trend jobs (spark_bench) need in every saved benchmark.

Every benchmark's ``extra_info`` gets the commit, dirty flag, branch, machine id, Python
and quick-mode flag of the run, so a single row of the history is self-describing even
outside its file. ``RMQHA_BENCH_MACHINE`` names the machine for trend series (CI runners
get a fresh hostname per job; set it to something stable such as "ci-2vcpu").
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import uuid
from typing import Any

import pytest

# bench_proxy.py drives RocketMQ 5's official client, which only the proxy's venv has
# (`make bench-proxy`); in .venv the dev extra's rocketmq 0.4.4 stands in its place.
try:
    importlib.metadata.version("rocketmq-python-client")
    collect_ignore: list[str] = []
except importlib.metadata.PackageNotFoundError:
    collect_ignore = ["bench_proxy.py"]

#: RMQHA_BENCH_QUICK=1 shrinks long benchmarks (cluster paths) to CI size.
QUICK: bool = os.environ.get("RMQHA_BENCH_QUICK", "") not in ("", "0")

#: The machine name used by spark_bench to separate series (defaults to the hostname).
MACHINE: str = os.environ.get("RMQHA_BENCH_MACHINE", "") or platform.node() or "unknown"

#: One id per pytest session. pytest-benchmark stamps ``--benchmark-json`` and autosave
#: files of the same session with different ``datetime`` values; this id lets the ingest
#: job recognise them as one run and store it once.
RUN_ID: str = uuid.uuid4().hex

#: extra_info keys that the trend jobs use to compare like with like.
CASE_KEYS = ("implementation", "message_bytes", "batch", "replicas")


def describe(benchmark: Any, implementation: str, **info: Any) -> None:
    """Fill ``benchmark.extra_info`` with the implementation and the case fields, e.g.
    ``describe(benchmark, "cython", message_bytes=1024, batch=64)``. Values are kept as
    given; the trend jobs read them as strings."""
    benchmark.extra_info["implementation"] = implementation
    for key, value in info.items():
        benchmark.extra_info[key] = value


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    machine_info["rmqha_machine"] = MACHINE


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list[Any],
                                 output_json: dict[str, Any]) -> None:
    output_json["rmqha_run"] = RUN_ID
    commit = output_json.get("commit_info") or {}
    machine = output_json.get("machine_info") or {}
    context = {
        "commit": commit.get("id"),
        "commit_dirty": commit.get("dirty"),
        "branch": commit.get("branch"),
        "machine": machine.get("rmqha_machine", MACHINE),
        "python": f"{machine.get('python_implementation', platform.python_implementation())} "
                  f"{machine.get('python_version', platform.python_version())}",
        "quick": QUICK,
    }
    for bench in output_json.get("benchmarks", []):
        extra = bench.setdefault("extra_info", {})
        for key, value in context.items():
            # A benchmark's own value wins: it knows better what it measured.
            extra.setdefault(key, value)
