"""tests/interop: RocketMQ's Java clients and tools against real rmqha clusters.

Run by `make test-interop` (after `make interop-build`), not by `make test`: the root
conftest ignores this folder unless it is named on the command line.

``interop_cluster`` (module-scoped, parametrised ``plaintext`` / ``tls-acl``) gives each test
module one cluster per mode (:mod:`interop_cluster`), so every test in it runs twice; a
module lists the topics and groups its application account holds by overriding
``interop_grants``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from interop_cluster import Grants, InteropCluster, Mode, start_interop_cluster


@pytest.fixture(scope="module")
def interop_grants() -> Grants:
    """The application account's topics and groups in tls-acl mode (override per module)."""
    return Grants()


@pytest.fixture(scope="module", params=[m.value for m in Mode])
def interop_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    interop_grants: Grants) -> Iterator[InteropCluster]:
    """A cluster of the parametrised mode for the whole module; everything it started is
    stopped at the end (and checked gone)."""
    mode = Mode(request.param)
    base = tmp_path_factory.mktemp(f"interop-{mode.value}")
    started = time.monotonic()
    cluster, security, brokers = start_interop_cluster(base, mode, interop_grants)
    print(f"interop cluster {mode.value} up in {time.monotonic() - started:.1f} s at {base}")
    try:
        yield InteropCluster(mode, cluster, base, security, brokers)
    finally:
        cluster.stop_all()
    left = cluster.leftovers()
    assert not left, f"the interop cluster left {left}"
