"""Fixtures of the proxy tests, which run in the proxy's own venv (``make test-proxy``).

The official RocketMQ 5 client and the generated gRPC modules come from the ``proxy``
extra, which the main venv does not have (its ``rocketmq`` is the 0.4.4 C++ binding): the
main suite's conftest leaves this directory out, and here a missing module is an error,
never a skip.  The client writes its log under
``~/logs/rocketmq_python``; HOME points into a temp dir, for the proxy processes too.
"""
from __future__ import annotations

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
