"""A controller group addressed by node index, over :mod:`rmqha.testing.local_cluster`.

``ControllerGroup(tmp_dir, size=3).start()`` creates a :class:`~rmqha.testing.local_cluster.Cluster`
in ``tmp_dir`` holding ``size`` controllers (free loopback ports for RPC and Raft, journals
under ``tmp_dir``, group name ``test-group``).  ``wait_leader()`` returns the index of the
controller that says it leads; ``kill(i)`` sends SIGKILL, ``pause(i)`` / ``resume(i)``
SIGSTOP/SIGCONT (a partition that keeps sockets open), ``restart(i)`` starts a stopped node
again on the same journal and ports.  ``stop()`` always ends everything it started; use it
in a ``finally`` or as a context manager.  Starting, logs and waiting are local_cluster's.
The group runs with a cluster secret (generated, or ``cluster_secret``): a client of it
signs with :attr:`ControllerGroup.secret`.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rmqha.errors import LocalClusterError
from rmqha.testing.local_cluster import QUICK_CONTROLLER, Cluster, ControllerProc, free_port

__all__ = ["ControllerGroup", "free_port"]

#: The controller timers this group's users (the controller tests and benchmark) are
#: written against: a dead master is looked for every 300 ms and a new Raft leader waits
#: 1 s for heartbeats before electing; the election-rule tests depend on that ordering.
GROUP_TIMERS: dict[str, Any] = {**QUICK_CONTROLLER, "scan_inactive_master_interval": 300,
                                "new_leader_heartbeat_wait": 1000}


class ControllerGroup:
    def __init__(self, directory: Path, size: int = 3, settings: dict[str, Any] | None = None,
                 python: str = sys.executable,
                 per_node: dict[int, dict[str, Any]] | None = None,
                 cluster_secret: str | None = None, insecure: bool = False) -> None:
        self.directory = Path(directory)
        self.size = size
        self.per_node = per_node or {}
        self.cluster = Cluster(self.directory, python=python, controller_defaults=GROUP_TIMERS,
                               cluster_secret=cluster_secret, insecure=insecure)
        self.nodes: list[ControllerProc] = self.cluster.add_controllers(
            size, per_node=self.per_node, controller_group="test-group", **(settings or {}))

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes]

    @property
    def address_list(self) -> str:
        return ";".join(self.addresses)

    @property
    def secret(self) -> str | None:
        """The cluster secret the group runs with (None when insecure): clients need it."""
        return self.cluster.cluster_secret

    def start(self, wait: bool = True, timeout: float = 30.0) -> ControllerGroup:
        """Start every node; with ``wait`` until there is a leader and every node serves
        (a node whose port another process took first moves with its group:
        :meth:`Cluster.wait_controllers`)."""
        for i in range(self.size):
            self.start_one(i)
        if wait:
            try:
                self.cluster.wait_controllers(self.nodes, timeout)
            except LocalClusterError as exc:
                raise TimeoutError(str(exc)) from None
        return self

    def start_one(self, i: int) -> None:
        self.nodes[i].start()

    def restart(self, i: int) -> None:
        """Start node ``i`` again (it must have been stopped or killed)."""
        self.nodes[i].start()

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def pause(self, i: int) -> None:
        self.nodes[i].pause()

    def resume(self, i: int) -> None:
        self.nodes[i].resume()

    def alive(self, i: int) -> bool:
        return self.nodes[i].alive

    def metadata(self, i: int, timeout: float = 1.0) -> dict[str, str] | None:
        """GET_METADATA_INFO of controller i, or None if it does not answer."""
        if not self.alive(i):
            return None
        return self.cluster.controller_metadata(self.addresses[i], timeout)

    def wait_leader(self, timeout: float = 30.0, exclude: set[int] | None = None) -> int:
        """Index of a controller that says it is leader (not one of ``exclude``)."""
        def leader() -> int | None:
            for i in range(self.size):
                if exclude and i in exclude:
                    continue
                meta = self.metadata(i, 0.5)
                if meta and meta.get("isLeader") == "true":
                    return i + 1  # truthy even for node 0
            return None

        try:
            return self.cluster.wait_for(leader, timeout, what="a controller leader") - 1
        except LocalClusterError as exc:
            raise TimeoutError(str(exc)) from None

    def log_tail(self, lines: int = 40) -> str:
        return self.cluster.describe(lines)

    def logs(self) -> str:
        return "\n".join(node.log_text() for node in self.nodes)

    def stop(self) -> None:
        self.cluster.stop_all(timeout=10.0)

    def __enter__(self) -> ControllerGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
