"""The TLS layer under pysyncobj's Raft connections (:mod:`rmqha.controller.raft_tls`),
over real loopback TCP sockets with tiny kernel buffers, in one thread.

- the owed-byte rule: a payload far bigger than the socket buffers arrives whole when the
  sender behaves as pysyncobj does (one buffer, handed over whole, WRITE interest only
  while it is not empty); the negative control, a variant that reports every byte taken,
  loses WRITE interest and the payload stalls;
- pysyncobj's own ``TcpConnection`` over it: messages pickled, framed and read back in
  order, one far bigger than the buffers, one sent during the handshake;
- who may be at the other end: a dialled peer must be the member its address belongs to,
  an accepted peer a controller of the group, and a refused one is logged once and never
  read from; the address an accepted peer claims must be its own;
- settings: TLS stands in for the password with remote peers; a controller serving TLS
  builds its Raft TLS (ConfigError naming ``tls.server.trustCertPath`` without a CA).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import TcpConnection

from rmqha.controller.config import ControllerConfig
from rmqha.controller.raft import RaftSettings
from rmqha.controller.raft_tls import RaftTls, TlsSocket
from rmqha.controller.server import ControllerServer
from rmqha.errors import ConfigError
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings
from rmqha.testing.tls_keys import config_keys, server_tls

N0, N1 = "127.0.0.1:7001", "127.0.0.1:7002"
IDS = {N0: "n0", N1: "n1"}
#: Asked of the kernel for both ends (it doubles it): far under every payload below.
TINY = 4096


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("raft-tls-pki")
    certs.dev_cluster(d, controllers=3, groups={"g1": 1}, namesrv=0)
    return d


def _raft_tls(pki: Path, identity: Identity) -> RaftTls:
    tls = RaftTls.from_settings(server_tls(pki, identity), IDS)
    assert tls is not None
    return tls


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(dialled, accepted): a loopback TCP connection, non-blocking, tiny buffers."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        dialled = socket.socket()
        dialled.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TINY)
        dialled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY)
        dialled.connect(listener.getsockname())
        accepted, _ = listener.accept()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TINY)
    for s in (dialled, accepted):
        s.setblocking(False)
    yield dialled, accepted
    dialled.close()
    accepted.close()


class _Writer:
    """pysyncobj's side of ``send``: one buffer, always handed over whole; a count of 0
    or EAGAIN stops the attempt; the poller is asked for WRITE only while it holds bytes."""

    def __init__(self, sock: TlsSocket) -> None:
        self.sock = sock
        self.buffer = b""
        self.most_backlog = 0

    def push(self, data: bytes) -> None:
        self.buffer += data
        self.flush()

    def flush(self) -> None:
        while self.buffer:
            try:
                n = self.sock.send(self.buffer)
            except BlockingIOError:
                return
            self.most_backlog = max(self.most_backlog, self.sock.backlog)
            if n == 0:
                return
            self.buffer = self.buffer[n:]


def _read_all(sock: TlsSocket) -> bytes:
    """What pysyncobj's read does on a READ event: recv until EAGAIN."""
    got = b""
    while True:
        try:
            chunk = sock.recv(8192)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk


Done = Callable[[dict[int, bytes]], bool]


def _pump(ends: list[tuple[TlsSocket, _Writer]], done: Done, timeout: float) -> dict[int, bytes]:
    """Poll the ends as pysyncobj's poller would until ``done(got)`` or ``timeout``; what
    each end read (``got``, by index)."""
    got = {i: b"" for i in range(len(ends))}
    deadline = time.monotonic() + timeout
    while not done(got) and time.monotonic() < deadline:
        readers = [s.fileno() for s, _ in ends]
        writers = [s.fileno() for s, w in ends if w.buffer]
        r, w, _ = select.select(readers, writers, [], 0.05)
        for i, (s, writer) in enumerate(ends):
            if s.fileno() in w:
                writer.flush()
            if s.fileno() in r:
                got[i] += _read_all(s)
    return got


def _connected(pki: Path, pair: tuple[socket.socket, socket.socket],
               dial_class: type[TlsSocket] = TlsSocket) -> tuple[TlsSocket, TlsSocket, dict[int, bytes]]:
    """n1 dials n0 over ``pair``; both handshake and n0 reads n1's first bytes."""
    n0, n1 = _raft_tls(pki, Identity.controller("n0")), _raft_tls(pki, Identity.controller("n1"))
    client = dial_class(pair[0], n1.client.get(), server_side=False, peer_address=N0,
                        check=lambda tls: n1.check_dialled(tls, N0))
    server = n0.accept(pair[1])
    ends = [(client, _Writer(client)), (server, _Writer(server))]
    ends[0][1].push(N1.encode())
    got = _pump(ends, lambda got: got[1] == N1.encode(), 5)
    assert got[1] == N1.encode()
    return client, server, got


class _ReportsAllTaken(TlsSocket):
    """The negative control: counts the whole chunk it encrypted as sent even when the
    socket left part of it in the backlog (no owed byte)."""

    def _send_sealed(self, view: memoryview) -> int:
        taken = super()._send_sealed(view)
        if self._owed:
            self._owed = False
            taken += 1
        return taken


def _send_big(pki: Path, pair: tuple[socket.socket, socket.socket],
              dial_class: type[TlsSocket]) -> tuple[bytes, bytes, int]:
    client, server, _ = _connected(pki, pair, dial_class)
    payload = os.urandom(1 << 20)
    writer = _Writer(client)
    ends = [(client, writer), (server, _Writer(server))]
    received = bytearray()

    def done(_: dict[int, bytes]) -> bool:
        received.extend(_read_all(server))
        return len(received) >= len(payload)

    writer.push(payload)
    _pump(ends[:1], done, 1.0)  # the whole MiB takes some milliseconds when it flows
    return payload, bytes(received), writer.most_backlog


def test_a_payload_far_over_the_socket_buffers_arrives_whole(pki, tcp_pair):
    payload, received, backlog = _send_big(pki, tcp_pair, TlsSocket)
    assert backlog > 0, "the socket took everything at once: the backlog was never used"
    assert received == payload


def test_negative_control_reporting_every_byte_taken_stalls(pki, tcp_pair):
    payload, received, backlog = _send_big(pki, tcp_pair, _ReportsAllTaken)
    assert backlog > 0
    assert len(received) < len(payload)  # pysyncobj's buffer emptied: no WRITE interest left


def test_pysyncobj_connections_carry_messages_over_it(pki, tcp_pair):
    poller = createPoller("auto")
    n0, n1 = _raft_tls(pki, Identity.controller("n0")), _raft_tls(pki, Identity.controller("n1"))
    got: dict[str, list[object]] = {"n0": [], "n1": []}
    conns = {}
    for name, raw in (("n1", tcp_pair[0]), ("n0", tcp_pair[1])):
        conn = TcpConnection(poller, socket=raw, timeout=10, sendBufferSize=TINY, recvBufferSize=TINY)
        conn.setOnMessageReceivedCallback(got[name].append)
        conns[name] = conn
    conns["n1"]._TcpConnection__socket = n1.dial(tcp_pair[0], N0)
    conns["n0"]._TcpConnection__socket = n0.accept(tcp_pair[1])
    big = {"type": "append_entries", "entries": [os.urandom(300 << 10)]}
    conns["n1"].send(N1)  # during the handshake, as pysyncobj's dialler does
    conns["n1"].send(big)
    sent = [N1, big]
    deadline = time.monotonic() + 10
    beat = 0.0
    # pysyncobj asks for WRITE only after a WRITE event found its buffer full; bytes a
    # direct send left behind go with the next send, as a leader's heartbeats do.
    while len(got["n0"]) < 3 and time.monotonic() < deadline:
        if time.monotonic() >= beat:
            sent.append({"type": "heartbeat", "n": len(sent)})
            conns["n1"].send(sent[-1])
            beat = time.monotonic() + 0.01
        poller.poll(0.005)
    assert len(got["n0"]) >= 3 and got["n0"] == sent[: len(got["n0"])]
    conns["n0"].send({"type": "next_node_idx", "success": True})
    deadline = time.monotonic() + 5
    while not got["n1"] and time.monotonic() < deadline:
        poller.poll(0.01)
    assert got["n1"] == [{"type": "next_node_idx", "success": True}]
    for conn in conns.values():
        conn.disconnect()


@pytest.mark.parametrize(("dialler", "why"), [
    (Identity.broker("DefaultCluster", "g1", "g1-0"), "only controller may connect"),
    (Identity.controller("n2"), "not a controller of this group"),
])
def test_an_accepted_peer_that_is_no_member_is_refused_unread(pki, tcp_pair, caplog, dialler, why):
    n0 = _raft_tls(pki, Identity.controller("n0"))
    other = RaftTls.from_settings(server_tls(pki, dialler), IDS)
    assert other is not None
    # The dialler checks nothing, so it sends its bytes right behind its handshake.
    client = TlsSocket(tcp_pair[0], other.client.get(), server_side=False, peer_address=N0,
                       check=lambda tls: Identity.controller("n0"))
    server = n0.accept(tcp_pair[1])
    ends = [(client, _Writer(client)), (server, _Writer(server))]
    ends[0][1].push(b"pickle the server must never read")
    refused: list[OSError] = []

    def server_read(_: dict[int, bytes]) -> bool:
        try:
            assert _read_all(server) == b""
        except ConnectionResetError as exc:
            refused.append(exc)
        return bool(refused)

    with caplog.at_level(logging.WARNING, "rmqha.controller.raft_tls"):
        _pump(ends[:1], server_read, 5)
        with pytest.raises(ConnectionResetError):
            server.recv(8192)  # still refused, and not logged again
    assert refused, "the server never refused the link"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and why in lines[0] and str(dialler) in lines[0], lines
    assert lines[0].startswith("Raft link from 127.0.0.1:")


def test_a_dialled_peer_must_be_the_member_of_that_address(pki, tcp_pair, caplog):
    """n1 dials N1's address (its own, say a misconfigured peer list) and finds n0."""
    n0, n1 = _raft_tls(pki, Identity.controller("n0")), _raft_tls(pki, Identity.controller("n1"))
    client = n1.dial(tcp_pair[0], N1)
    server = n0.accept(tcp_pair[1])
    ends = [(client, _Writer(client)), (server, _Writer(server))]
    ends[0][1].push(b"hello")
    refused: list[OSError] = []

    def client_read(_: dict[int, bytes]) -> bool:
        try:
            _read_all(client)
        except ConnectionResetError as exc:
            refused.append(exc)
        return bool(refused)

    with caplog.at_level(logging.WARNING, "rmqha.controller.raft_tls"):
        _pump(ends, client_read, 5)
    assert refused
    assert any(f"Raft link to {N1} refused" in r.getMessage()
               and "expected rmqha:controller/n1" in r.getMessage() for r in caplog.records)


def test_negative_control_the_right_member_is_let_through(pki, tcp_pair):
    client, server, got = _connected(pki, tcp_pair)
    assert client.peer == Identity.controller("n0") and server.peer == Identity.controller("n1")


def test_an_accepted_controller_may_claim_only_its_own_address(pki):
    tls = _raft_tls(pki, Identity.controller("n0"))
    n1 = Identity.controller("n1")
    assert tls.claim_refusal(n1, N1) is None  # the control
    assert "claims Raft address 127.0.0.1:7001" in (tls.claim_refusal(n1, N0) or "")
    assert "not the Raft address of a member" in (tls.claim_refusal(n1, "readonly") or "")
    assert "not the Raft address of a member" in (tls.claim_refusal(n1, ["status"]) or "")
    assert tls.claim_refusal(None, N1) == "no verified certificate"


def test_a_peer_closing_during_the_handshake_is_dropped_without_a_warning(pki, tcp_pair, caplog):
    server = _raft_tls(pki, Identity.controller("n0")).accept(tcp_pair[1])
    port = tcp_pair[1].getpeername()[1]
    tcp_pair[0].send(b"\x16\x03\x01")  # the start of a ClientHello, then gone
    tcp_pair[0].close()
    with caplog.at_level(logging.INFO, "rmqha.controller.raft_tls"):
        with pytest.raises(ConnectionResetError):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                select.select([server.fileno()], [], [], 0.05)
                _read_all(server)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"Raft link from 127.0.0.1:{port} refused: the peer closed the link "
                       "during the TLS handshake")]


# --- settings ----------------------------------------------------------------------------------


def test_tls_stands_in_for_the_password_with_remote_peers(pki, tmp_path):
    remote = RaftSettings(self_address="127.0.0.1:5000", peers=["127.0.0.1:5000", "10.1.2.3:5000"],
                          journal_file=tmp_path / "j")
    with pytest.raises(ConfigError, match="cluster secret or TLS"):
        remote.check()  # the control: neither
    dataclasses.replace(remote, tls=_raft_tls(pki, Identity.controller("n0"))).check()


def test_raft_tls_only_when_serving_tls_and_never_without_the_ca(pki):
    assert RaftTls.from_settings(TlsSettings(), IDS) is None
    permissive = server_tls(pki, Identity.controller("n0"), mode=TlsMode.PERMISSIVE,
                            client_auth=ClientAuth.NONE)
    assert RaftTls.from_settings(permissive, IDS) is not None
    with pytest.raises(ConfigError, match="tls.server.trustCertPath is not set"):
        RaftTls.from_settings(dataclasses.replace(permissive, server_trust_cert_path=""), IDS)


def test_a_controller_serving_tls_builds_raft_tls_with_its_peers(pki, tmp_path):
    keys = config_keys(server_tls(pki, Identity.controller("n0"), client_auth=ClientAuth.NONE))
    config = ControllerConfig(controller_peers="n0-127.0.0.1:9878;n1-127.0.0.1:9879",
                              controller_self_id="n0", controller_store_path=tmp_path / "s",
                              allow_insecure=True, **keys)
    tls = ControllerServer(config).raft.settings.tls
    assert tls is not None and tls.ids == {"127.0.0.1:10878": "n0", "127.0.0.1:10879": "n1"}
    with pytest.raises(ConfigError, match="tls.server.trustCertPath"):
        ControllerServer(dataclasses.replace(config, tls_server_trust_cert_path=""))
    assert ControllerServer(dataclasses.replace(config, tls_server_mode="disabled")).raft.settings.tls is None
