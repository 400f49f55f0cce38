"""Shared fixtures: both twins of every hot path, free loopback ports, process cleanup."""
from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

from rmqha import _core
from rmqha.testing.local_cluster import free_port

# CI runs the property tests derandomised: the same examples every run, so a red CI is a
# real regression and never a lucky draw; locally each run explores new inputs.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    # A run that silently tested only the pure twins would prove nothing about the compiled
    # ones; fail loudly unless the pure-only mode was asked for.
    if not _core.NO_EXTENSIONS:
        missing = []
        for feature in _core.FEATURES:
            try:
                _core.load_twin(feature, "cython")
            except ImportError as exc:
                missing.append(f"{feature}: {exc}")
        if missing:
            raise pytest.UsageError(
                "compiled twins did not load (build with `make build`, or set "
                "RMQHA_NO_EXTENSIONS=1 to test the pure twins only):\n  " + "\n  ".join(missing)
            )


def _twins() -> list[str]:
    return ["python"] if _core.NO_EXTENSIONS else list(_core.TWINS)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs the suite on two workers (pytest-xdist).  A module stays on one
    worker, so its module fixtures (clusters) start once and its tests keep their order;
    all of Spark goes to one worker, so one JVM serves it.  (xdist's own ``loadgroup`` no
    longer groups under pytest 9: it renames ``item._nodeid``, which pytest 9 ignores.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/spark" if path.startswith("tests/spark/") else path

    return ModuleScheduling(config, log)


@pytest.fixture(params=_twins())
def twin(request: pytest.FixtureRequest) -> str:
    """The name of a twin ("cython" or "python"); every test using it runs on both."""
    return request.param


@pytest.fixture
def port_factory():
    return free_port


os.environ.setdefault("PYTHONHASHSEED", "0")

# The proxy's tests need the RocketMQ 5 client, which clashes with this venv's rocketmq
# 0.4.4: `make test-proxy` runs them in their own venv (with --confcutdir=tests/proxy).
# tests/peers_smoke starts real RocketMQ 5 and Kafka JVMs: `make test-peers-smoke` only.
collect_ignore = ["proxy", "interop", "peers_smoke"]
