"""The cap on connections per peer host, on every listening port (issue 37, point 4).

Real processes on 127.0.0.1 (:class:`cluster.Cluster`): a controller, a name server and a
broker, each with a small ``max_connections_per_peer``.  A "stranger" connects from
127.0.0.3 (Linux routes all of 127/8 to loopback) as many times as the cap allows to each
port: the name server's, the broker's client and HA ports, the controller's RPC and Raft
ports, and a name server serving TLS (where the count starts before the handshake).  The
next connection from that host is closed at accept, while a connection from
127.0.0.2 (another peer) still gets in and, on a remoting port, is answered; the refusal
is logged naming the peer and the cap.  Negative control: the stranger's connections up
to the cap are all still open, so the cap is what closed the extra one.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from cluster import Cluster
from peer_socket import peer_closed
from security_wire import RawClient
from tls_pki import CLIENT, NAMESRV, client_tls, config_keys, make_pki

from rmqha.net.client_security import client_context
from rmqha.net.peer_limit import PeerLimit
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand, encode
from rmqha.security.tls import ReloadingContext
from rmqha.testing.local_cluster import free_port
from rmqha.testing.tls_keys import process_tls

CAP = 4
STRANGER = "127.0.0.3"
OTHER = "127.0.0.2"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("peercap")) as c:
        cap = {"max_connections_per_peer": CAP}
        # Generous waits: a loaded two-core machine starts a process in tens of seconds.
        c.wait_controllers(c.start_controllers(1, wait=False, **cap), 90)
        ns = c.start_namesrv(wait=False, **cap)
        c.wait_for(lambda: ns.listens(ns.address), 90, what="the name server listening", process=ns)
        c.broker = c.start_broker("broker-a", wait=False, ha_listen_port=free_port(), **cap)
        c.wait_broker_up(c.broker, 90)
        c.wait_role(c.broker, "master", 90)
        yield c


def _from(host: str, address: str) -> socket.socket:
    peer, _, port = address.rpartition(":")
    return socket.create_connection((peer, int(port)), timeout=2, source_address=(host, 0))


def _ports(c: Cluster) -> dict[str, tuple[str, object]]:
    ctrl, ns, broker = c.controllers[0], c.namesrvs[0], c.broker
    return {
        "name server": (ns.address, ns),
        "broker client port": (broker.address, broker),
        "broker HA port": (f"127.0.0.1:{broker.config['ha_listen_port']}", broker),
        "controller RPC": (ctrl.address, ctrl),
        "controller Raft": (ctrl.raft_address, ctrl),
    }


@pytest.mark.parametrize("port", ["name server", "broker client port", "broker HA port",
                                  "controller RPC", "controller Raft"])
def test_one_connection_past_the_cap_is_closed_and_another_peer_gets_in(live: Cluster, port: str) -> None:
    address, proc = _ports(live)[port]
    held = [_from(STRANGER, address) for _ in range(CAP)]
    try:
        extra = _from(STRANGER, address)
        live.wait_for(lambda: peer_closed(extra), 5, what=f"the {CAP + 1}th connection closed", process=proc)
        # Negative control: the ones within the cap are open (the extra one is not closed
        # for being silent: they are just as silent and older).
        assert not any(map(peer_closed, held)), "a connection within the cap was closed"
        other = _from(OTHER, address)
        try:
            if "Raft" in port or "HA" in port:
                time.sleep(0.5)  # the extra one was closed at once; this one is kept
                assert not peer_closed(other), f"a connection from another host was refused on {port}"
            else:
                with RawClient(address, source=OTHER) as client:
                    answer = client.request(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
                assert answer.is_response, f"another host's request on {port} went unanswered"
        finally:
            other.close()
        live.wait_for(lambda: proc.log_contains(f"refused a connection from {STRANGER}")  # type: ignore[attr-defined]
                      and proc.log_contains(f"max_connections_per_peer = {CAP}"), 5,  # type: ignore[attr-defined]
                      what="the refusal logged", process=proc)
    finally:
        for s in held:
            s.close()


def test_over_tls_a_handshake_in_progress_holds_its_place(live: Cluster,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """On a TLS port the count starts at the accept: connections that never start their
    handshake fill the cap, the next is closed at once, and another host's TLS client is
    answered meanwhile."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    ns = live.start_namesrv(wait=False, max_connections_per_peer=CAP, **config_keys(process_tls(pki.good, NAMESRV)))
    live.wait_for(lambda: ns.listens(ns.address), 90, what="the TLS name server listening", process=ns)
    held = [_from(STRANGER, ns.address) for _ in range(CAP)]
    try:
        extra = _from(STRANGER, ns.address)
        live.wait_for(lambda: peer_closed(extra), 5, what=f"the {CAP + 1}th connection closed", process=ns)
        assert not any(map(peer_closed, held)), "a connection within the cap was closed"
        context = client_context(client_tls(pki.good, CLIENT))
        assert isinstance(context, ReloadingContext)
        with socket.create_connection(_split(ns.address), timeout=5, source_address=(OTHER, 0)) as raw, \
                context.get().wrap_socket(raw) as tls:
            tls.sendall(encode(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)))
            assert tls.recv(4), "another host's TLS request went unanswered"
    finally:
        for s in held:
            s.close()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def test_refusals_are_logged_at_most_once_per_peer_per_period(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limit = PeerLimit("test port", 1, clock=lambda: now[0])
    assert limit.admit("10.0.0.1") is not None
    for _ in range(5):
        assert limit.admit("10.0.0.1") is None
    assert limit.admit("10.0.0.2") is not None  # another peer: its own count
    now[0] = 11.0
    assert limit.admit("10.0.0.1") is None
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(lines) == 2 and "(4 more refused since the last line)" in lines[1], lines
