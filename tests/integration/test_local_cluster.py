"""rmqha.testing.local_cluster's own promises: what it starts it stops, and nothing stays listening.

- ``stop_all`` ends every process (paused ones too) and ``leftovers()`` then finds no
  process and no open port; a process stopped this way exits by itself (SIGTERM);
- ``close`` also kills a child started for the cluster that no Process holds (what a
  Ctrl-C inside ``Popen`` leaves behind), even one scanned while its exec is unfinished
  and its command line still empty;
- a wait that cannot succeed fails with LocalClusterError carrying the processes' logs;
- a controller, name server or broker whose chosen port another process took before it
  bound it starts again on fresh ports (PORT_CLASH_RETRIES starts in all); a port the
  caller gave is waited for while taken and never moves.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rmqha.errors import LocalClusterError
from rmqha.testing import local_cluster, ports, processes
from rmqha.testing.local_cluster import (
    PORT_TAKEN,
    BrokerProc,
    Cluster,
    ControllerProc,
    NamesrvProc,
    _children_naming,
    free_port,
    port_open,
)


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


#: How each kind of process is started; a broker needs a controller first.
STARTS: dict[str, Callable[[Cluster], ControllerProc | NamesrvProc | BrokerProc]] = {
    "controller": lambda c: c.start_controllers(1)[0],
    "controller group": lambda c: c.start_controllers(3)[0],  # the others move with it
    "namesrv": lambda c: c.start_namesrv(),
    "broker": lambda c: c.start_broker(),
}
NEEDS: dict[str, Callable[[Cluster], object]] = {"broker": lambda c: c.start_controllers(1)}
real_bindable = processes._bindable


@contextmanager
def holding(port: int = 0) -> Iterator[tuple[int, Callable[[], None]]]:
    """Another process's socket listening on ``port`` (0: a free one): (its port, a
    release), held until released or the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock.getsockname()[1], sock.close


def hand_out_first(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """The harness's next port choice is ``port`` (as if another worker bound it after
    the choice); the ones after are free as usual."""
    real, handed = free_port, iter([port])
    choose = lambda count=1: next(handed, None) or real(count)  # noqa: E731
    for module in (local_cluster, processes, ports):  # every place that chooses ports
        monkeypatch.setattr(module, "free_port", choose)


@pytest.mark.parametrize("kind", list(STARTS))
def test_a_process_whose_port_was_taken_is_started_again_on_fresh_ports(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process binds a port between its choice and the bind of the process it was
    chosen for (workers share 127.0.0.1): the process (a controller: its whole group) is
    started again on fresh ports instead of failing the test.  Without the retry (the
    negative control) the same start fails, naming the clash."""
    with holding() as (port, _):
        with Cluster(tmp_path / "retry") as c:
            NEEDS.get(kind, lambda c: None)(c)
            hand_out_first(monkeypatch, port)
            proc = STARTS[kind](c)
            assert proc.listens(proc.address) and port not in proc.ports()
            assert proc.starts == 2 and proc.log_contains(f"127.0.0.1:{port} {PORT_TAKEN}")
            assert all(node.listens(node.address) and node.starts == 2 for node in c.controllers[1:])
        monkeypatch.setattr(processes, "PORT_CLASH_RETRIES", 1)
        with Cluster(tmp_path / "once") as c:
            NEEDS.get(kind, lambda c: None)(c)
            hand_out_first(monkeypatch, port)
            with pytest.raises(LocalClusterError, match=f"found a port taken \\(the last: {port}\\)"):
                STARTS[kind](c)


def test_a_port_given_is_waited_for_and_never_moves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start on ports the caller gave (here a restart on the same port) waits while
    another process holds one, then starts there; held for good, the start fails naming
    the port, and the process stays where it was put (the negative control)."""
    with Cluster(tmp_path) as c:
        ns = c.start_namesrv()
        address, port = ns.address, ns.ports()[0]
        ns.kill()
        with holding(port) as (_, release):
            seen_taken = release_when_seen_taken(monkeypatch, port, release)
            ns.start()
        assert seen_taken == [port]
        c.wait_for(lambda: port_open(address), what="the name server back on its port", process=ns)
        assert ns.address == address and ns.starts == 2
        ns.kill()
        monkeypatch.setattr(processes, "_bindable", real_bindable)
        monkeypatch.setattr(processes, "PORT_FREE_TIMEOUT", 0.3)
        with holding(port), pytest.raises(LocalClusterError, match=rf"port\(s\) \[{port}\] .* still taken"):
            ns.start()
        assert ns.address == address and ns.starts == 2 and not ns.alive


def release_when_seen_taken(monkeypatch: pytest.MonkeyPatch, port: int,
                            release: Callable[[], None]) -> list[int]:
    """The holder of ``port`` lets go once the harness has found it taken; the ports it
    found taken, in order."""
    seen: list[int] = []

    def bindable(p: int, host: str = "127.0.0.1", *, reuse: bool = False) -> bool:
        free = real_bindable(p, host, reuse=reuse)
        if not free:
            seen.append(p)
            release()
        return free

    monkeypatch.setattr(processes, "_bindable", bindable)
    return seen
