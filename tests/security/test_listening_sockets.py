"""Every socket a process listens on, and what its Raft port keeps (issue 37, point 4).

Real processes on 127.0.0.1 (:class:`cluster.Cluster`):

- a controller (RPC, Raft and metrics ports), a name server (client, status page and
  metrics ports) and a broker (client, HA and metrics ports), none told to listen on a
  wildcard: every socket each one listens on (/proc, :func:`listening_sockets`) is on
  127.0.0.1, and the list holds every port the config names (the lister sees them);
- negative controls: a controller told ``listen_host = "0.0.0.0"`` shows both its RPC and
  its Raft port on the wildcard, and pysyncobj left alone (the old behaviour: no
  ``bindAddress``) shows its port on 0.0.0.0 in this very process;
- the Raft port keeps no stranger: of six silent connections at once from one host, two
  are closed at accept (four may wait to identify), and the four, one of them sending a
  byte every half second, are closed within the 10 s handshake deadline, each drop
  logged; the negative control, pysyncobj alone, still holds a silent connection then.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster, Process, free_port
from peer_socket import peer_closed
from pysyncobj import SyncObj, SyncObjConf

from rmqha.controller.raft_port import HANDSHAKE_DEADLINE_S, MAX_UNIDENTIFIED_PER_HOST
from rmqha.testing.local_cluster import ListenSocket, listening_sockets


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _sockets_on(cluster: Cluster, proc: Process, ports: set[int]) -> list[ListenSocket]:
    """What ``proc`` listens on, once it listens on every port of ``ports``."""
    assert proc.pid is not None
    pid = proc.pid
    return cluster.wait_for(
        lambda: (found := listening_sockets(pid)) and ports <= {s.port for s in found} and found,
        what=f"{proc.name} listening on {sorted(ports)}", process=proc)


def _wildcards(sockets: list[ListenSocket]) -> list[str]:
    return [str(s) for s in sockets if s.wildcard]


def test_no_process_listens_on_a_wildcard_it_was_not_given(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        [ctrl] = c.start_controllers(1, metrics_port=free_port())
        ns = c.start_namesrv(status_port=free_port(), metrics_port=free_port())
        [broker] = c.start_group("g1", 1, metrics_port=free_port())
        expected = {
            ctrl: {_port(ctrl.address), _port(ctrl.raft_address), ctrl.config["metrics_port"]},
            ns: {ns.config["listen_port"], ns.config["status_port"], ns.config["metrics_port"]},
            broker: {_port(broker.address), _port(broker.ha_address), broker.config["metrics_port"]},
        }
        for proc, ports in expected.items():
            sockets = _sockets_on(c, proc, ports)
            assert not _wildcards(sockets), f"{proc.name} listens on wildcards: {_wildcards(sockets)}"
            assert {s.host for s in sockets} == {"127.0.0.1"}, f"{proc.name}: {sockets}"


def test_negative_control_a_controller_told_the_wildcard_shows_it(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        [ctrl] = c.start_controllers(1, listen_host="0.0.0.0")
        ports = {_port(ctrl.address), _port(ctrl.raft_address)}
        sockets = _sockets_on(c, ctrl, ports)
        assert {s.port for s in sockets if s.wildcard} == ports, sockets


@contextlib.contextmanager
def _bare_pysyncobj(tmp_path: Path) -> Iterator[int]:
    """pysyncobj as it binds without rmqha (no bindAddress): its port."""
    port = free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    node = SyncObj(f"127.0.0.1:{port}", [], SyncObjConf(journalFile=str(tmp_path / "bare.journal"),
                                                         fullDumpFile=str(tmp_path / "bare.dump")))
    try:
        yield port
    finally:
        node.destroy_synchronous()


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_negative_control_pysyncobj_alone_binds_every_interface(tmp_path: Path) -> None:
    with _bare_pysyncobj(tmp_path) as port:
        _wait(lambda: any(s.port == port for s in listening_sockets(os.getpid())), 10, "pysyncobj bound")
        mine = [s for s in listening_sockets(os.getpid()) if s.port == port]
        assert [s.host for s in mine] == ["0.0.0.0"], mine




def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=2)


@pytest.mark.timeout(120)
def test_raft_port_drops_silent_and_stalled_links_and_caps_them(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c, _bare_pysyncobj(tmp_path / "bare") as bare_port:
        [ctrl] = c.start_controllers(1)
        raft = _port(ctrl.raft_address)
        c.wait_for(lambda: ctrl.listens(ctrl.raft_address), what="Raft port listening", process=ctrl)
        _wait(lambda: any(s.port == bare_port for s in listening_sockets(os.getpid())), 10,
              "pysyncobj bound")
        bare = _connect(bare_port)
        started = time.monotonic()
        links = [_connect(raft) for _ in range(MAX_UNIDENTIFIED_PER_HOST + 2)]
        try:
            # The two over the cap are closed at accept, long before any deadline.
            c.wait_for(lambda: sum(map(peer_closed, links)) >= 2, 5, what="links over the cap closed", process=ctrl)
            kept = [s for s in links if not peer_closed(s)]
            assert len(kept) == MAX_UNIDENTIFIED_PER_HOST
            trickler = kept[0]

            def all_closed() -> bool:
                with contextlib.suppress(OSError):
                    trickler.send(b"\x00")  # a byte at a time: never a whole frame
                return all(peer_closed(s) for s in kept)

            c.wait_for(all_closed, HANDSHAKE_DEADLINE_S + 8, what="silent and stalled links dropped",
                       interval=0.5, process=ctrl)
            took = time.monotonic() - started
            assert took >= HANDSHAKE_DEADLINE_S - 0.5, f"dropped after {took:.1f} s, before the deadline"
            c.wait_for(lambda: ctrl.log_contains("did not identify as a member within 10 s")
                       and ctrl.log_contains("already waiting to identify"), 5, what="drops logged")
            # Negative control: pysyncobj alone still holds its silent connection.
            assert not peer_closed(bare), "pysyncobj alone dropped a silent link: the control shows nothing"
        finally:
            for s in [*links, bare]:
                s.close()


def _scrape(port: int) -> bytes:
    with _connect(port) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.timeout(120)
def test_remoting_and_metrics_ports_drop_silent_peers(tmp_path: Path) -> None:
    """A silent connection to a name server's client port and to its metrics port is
    closed within the 10 s deadline; a scrape is answered meanwhile.  Negative control:
    prometheus_client's own server, in this process, still holds its silent peer then."""
    from prometheus_client import CollectorRegistry, start_http_server

    bare_server, _ = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    with Cluster(tmp_path) as c:
        ns = c.start_namesrv(metrics_port=free_port())
        metrics = int(ns.config["metrics_port"])
        c.wait_for(lambda: ns.listens(f"127.0.0.1:{metrics}"), what="metrics port", process=ns)
        bare = _connect(bare_server.server_port)
        started = time.monotonic()
        silent = [_connect(int(ns.config["listen_port"])), _connect(metrics)]
        try:
            assert b"rmqha_" in _scrape(metrics), "no scrape while a silent peer is connected"
            c.wait_for(lambda: all(map(peer_closed, silent)), HANDSHAKE_DEADLINE_S + 8,
                       what="silent peers dropped", interval=0.5, process=ns)
            took = time.monotonic() - started
            assert took >= HANDSHAKE_DEADLINE_S - 0.5, f"dropped after {took:.1f} s, before the deadline"
            assert not peer_closed(bare), "prometheus_client alone dropped a silent peer: the control shows nothing"
        finally:
            for s in [*silent, bare]:
                s.close()
            bare_server.shutdown()
            bare_server.server_close()
