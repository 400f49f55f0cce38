"""Fixtures of the proxy tests, which run in the proxy's own venv (``make test-proxy``).

The official RocketMQ 5 client and the generated gRPC modules come from the ``proxy``
extra, which the main venv does not have (its ``rocketmq`` is the 0.4.4 C++ binding): the
main suite's conftest leaves this directory out, and here a missing module is an error,
never a skip.  The client writes its log under
``~/logs/rocketmq_python``; HOME points into a temp dir, for the proxy processes too.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc  # noqa: F401
import pytest
from rocketmq.grpc_protocol import service_pb2  # noqa: F401

HOME = tempfile.mkdtemp(prefix="rmqha-proxy-home-")
os.environ["HOME"] = HOME

from proxy_harness import ProxyProc, start_cluster, start_proxy  # noqa: E402


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, ProxyProc]]:
    """A cluster (name server + controller, a master and a slave) and a proxy, shared by
    the tests of a module (each uses its own topics and groups)."""
    cluster = start_cluster(Path(tmp_path_factory.mktemp("proxied")))
    with cluster:
        yield cluster, start_proxy(cluster)


@pytest.fixture(autouse=True)
def main_thread_event_loop() -> Iterator[None]:
    """An event loop set for the main thread during each test.

    The official client creates its telemetry stream with ``asyncio.get_event_loop()`` in
    whichever thread runs its route callback, and that is the main thread when the gRPC
    future is already done as the callback is added.  After any ``asyncio.run`` in this
    process (test_proxy_config_compat's) the main thread has no loop, so that call raised
    "There is no current event loop in thread 'MainThread'" and the client lost its route:
    test_delay_message failed that way once in two CI runs."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()
