"""The test suite's view of :mod:`rmqha.testing.local_cluster`: real processes on loopback.

Everything is implemented in :mod:`rmqha.testing.local_cluster` (see its docstring for the API:
``Cluster``, ``start_controllers``, ``start_namesrv``, ``start_group``, ``wait_for``,
``holds``, ``kill``/``pause``/``restart``, ``replica_info``, ``route``, ``broker_status``,
...).  This module adds only what belongs to tests: the :data:`FAST_BROKER`,
:data:`FAST_NAMESRV` and :data:`FAST_CONTROLLER` settings (the quick timers plus 1 MiB
segments, so tests cross segment ends, and DEBUG logs for failure messages) and a
:class:`Cluster` that uses them under the cluster name ``rmqha-test``.

Typical use::

    from cluster import Cluster

    @pytest.fixture
    def cluster(tmp_path):
        with Cluster(tmp_path) as c:
            yield c
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rmqha.testing import local_cluster
from rmqha.testing.local_cluster import (
    DEFAULT_TIMEOUT,
    QUICK_BROKER,
    QUICK_CONTROLLER,
    QUICK_NAMESRV,
    BrokerProc,
    ControllerProc,
    NamesrvProc,
    Process,
    ReplicaInfo,
    controller_config,
    free_port,
    free_port_pair,
    port_open,
    write_toml,
)

__all__ = [
    "DEFAULT_TIMEOUT", "FAST_BROKER", "FAST_CONTROLLER", "FAST_NAMESRV", "BrokerProc", "Cluster",
    "ControllerProc", "NamesrvProc", "Process", "ReplicaInfo", "controller_config", "free_port",
    "free_port_pair", "port_open", "write_toml",
]

FAST_BROKER: dict[str, Any] = {**QUICK_BROKER, "segment_bytes": 1 << 20, "log_level": "DEBUG"}
FAST_NAMESRV: dict[str, Any] = {**QUICK_NAMESRV, "log_level": "DEBUG"}
FAST_CONTROLLER: dict[str, Any] = dict(QUICK_CONTROLLER)


class Cluster(local_cluster.Cluster):
    """:class:`rmqha.testing.local_cluster.Cluster` with the test settings."""

    def __init__(self, base_dir: Path, *, cluster_name: str = "rmqha-test", **options: Any) -> None:
        options.setdefault("broker_defaults", FAST_BROKER)
        options.setdefault("namesrv_defaults", FAST_NAMESRV)
        options.setdefault("controller_defaults", FAST_CONTROLLER)
        super().__init__(base_dir, cluster_name=cluster_name, **options)
