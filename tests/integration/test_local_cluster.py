"""rmqha.testing.local_cluster's own promises: what it starts it stops, and nothing stays listening.

- ``stop_all`` ends every process (paused ones too) and ``leftovers()`` then finds no
  process and no open port; a process stopped this way exits by itself (SIGTERM);
- ``close`` also kills a child started for the cluster that no Process holds (what a
  Ctrl-C inside ``Popen`` leaves behind), even one scanned while its exec is unfinished
  and its command line still empty;
- a wait that cannot succeed fails with LocalClusterError carrying the processes' logs.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rmqha.errors import LocalClusterError
from rmqha.testing import local_cluster
from rmqha.testing.local_cluster import Cluster, _children_naming, port_open


def test_stop_all_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        controllers = c.start_controllers(1)
        ns = c.start_namesrv()
        ports = [p for proc in c.processes for p in proc.ports()]
        assert len(ports) == 3 and all(port_open(f"127.0.0.1:{p}") for p in (ports[0], ports[2]))
        assert c.leftovers().processes == [proc.name for proc in c.processes]
        controllers[0].pause()  # a frozen process must be stopped too
        c.stop_all(timeout=10)
        left = c.leftovers()
        assert not left and left.processes == [] and left.ports == []
        assert ns.returncode == 0  # SIGTERM: it shut down by itself
        assert controllers[0].returncode is not None


def test_close_kills_children_no_process_holds(tmp_path: Path) -> None:
    config = tmp_path / "stray" / "broker.toml"
    config.parent.mkdir()
    for _ in range(10):
        # Looks like one of the cluster's processes (python -m rmqha KIND --config DIR/...).
        stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m",
                                  "rmqha", "broker", "--config", str(config)])
        try:
            # Popen returns once the exec closed the child's close-on-exec pipe; the kernel
            # sets the new command line a little later. A scan in between must not lose
            # the child: it is found by its command line or reported as still starting.
            found, starting = _children_naming(tmp_path)
            assert stray.pid in found + starting
            Cluster(tmp_path).close()
            assert stray.wait(10) is not None
        finally:
            stray.kill()
            stray.wait()


def test_failed_wait_names_what_and_shows_logs(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        ns = c.start_namesrv()
        with pytest.raises(LocalClusterError) as info:
            c.wait_for(lambda: False, 0.3, what="the impossible")
        text = str(info.value)
        assert "the impossible" in text and ns.name in text and str(ns.log_path) in text


def test_a_controller_whose_port_was_taken_is_started_again_on_fresh_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process binds a port between its choice and the controller's bind (workers
    share 127.0.0.1): the group starts again on fresh ports instead of waiting out its
    deadline for a leader that cannot come.  Without the retry (the negative control) the
    same start fails."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = local_cluster.free_port
    handed = iter([port])

    def first_one_taken(count: int = 1) -> int:
        return next(handed, None) or real(count)

    try:
        monkeypatch.setattr(local_cluster, "free_port", first_one_taken)
        with Cluster(tmp_path / "retry") as c:
            (ctl,) = c.start_controllers(1)
            assert ctl.alive and port_open(ctl.address) and not ctl.address.endswith(f":{port}")
        handed = iter([port])
        monkeypatch.setattr(local_cluster, "PORT_CLASH_RETRIES", 1)
        with Cluster(tmp_path / "once") as c, pytest.raises(LocalClusterError, match="port taken"):
            c.start_controllers(1)
    finally:
        taken.close()
