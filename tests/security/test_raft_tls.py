"""Raft between controllers over mutual TLS (:mod:`rmqha.controller.raft_tls`), with real
controller processes on 127.0.0.1 whose certificates ``rmqha certs dev-cluster`` made.

- three controllers serving TLS (with the cluster secret on top, as deployed) elect a
  leader and commit; the leader is killed, a new one is elected and commits three
  1 MiB events; the old leader, restarted, catches up over TLS (far more than the links'
  socket buffers hold);
- a relay between two controllers that serve TLS without a secret (TLS is all that
  protects them) forwards no plaintext: a broker name committed through it is nowhere
  in what it forwarded, frames decompressed; the negative control, the same relay
  without TLS, shows it;
- raw clients at a TLS leader's Raft port without a certificate, with a broker's, one
  from another CA, an expired one, a controller's of another id, and a member's claiming
  another member's address, get no application byte; each refusal is logged and the
  group's leader and terms do not change.  The pickle probe, sent in plaintext, runs
  nothing.  The negative control: a member's certificate claiming its own address gets
  the leader's appends.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import os
import re
import socket
import ssl
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, ControllerProc, free_port
from raft_probe import raft_frame, send_probe
from tcp_proxy import TcpProxy
from tls_pki import client_tls, config_keys

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import TLS_HANDSHAKE_BYTE, TlsMode
from rmqha.security.tls import client_context as ssl_client_context
from rmqha.testing.tls_keys import process_tls

BROKER = Identity.broker("DefaultCluster", "g1", "g1-0")
#: A role change in a controller's log: "raft <address>: role A -> B (term N)".
ROLE_LINE = re.compile(r"raft \S+: role \w+ -> \w+ \(term \d+\)")


def _controller(i: int) -> Identity:
    return Identity.controller(f"n{i}")


class Keys:
    """``good``: the cluster CA and every identity (controllers n0..n3, n3 in no group);
    ``foreign``: the same from another CA; ``expired``: n1's, from the cluster CA, expired."""

    def __init__(self, base: Path) -> None:
        self.good, self.foreign, self.expired = base / "good", base / "foreign", base / "expired"
        for d in (self.good, self.foreign):
            certs.dev_cluster(d, controllers=4, groups={"g1": 1}, namesrv=0)
        self.expired.mkdir()
        for name in (certs.CA_CERT, certs.CA_KEY):
            (self.expired / name).write_bytes((self.good / name).read_bytes())
        certs.issue(self.expired, _controller(1), days=1,
                    now=dt.datetime.now(dt.UTC) - dt.timedelta(days=30))

    @property
    def ca(self) -> Path:
        return self.good / certs.CA_CERT

    def controllers(self, n: int) -> dict[int, dict[str, Any]]:
        """Per node: its own pair on its port and links; the RPC port ``permissive``, so
        the harness's plaintext requests may apply ids for any group name (the Raft links
        are mutual TLS whatever the RPC port's mode)."""
        return {i: config_keys(dataclasses.replace(process_tls(self.good, _controller(i)),
                                                   server_mode=TlsMode.PERMISSIVE))
                for i in range(n)}

    def raw(self, identity: Identity | None, where: Path | None = None) -> ssl.SSLContext:
        """A raw client's context: ``identity``'s pair from ``where`` (None: no
        certificate), trusting the cluster CA."""
        return ssl_client_context(client_tls(where or self.good, identity, self.ca))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("raft-tls-keys"))


def _apply_id(c: Cluster, name: str, code: str = "127.0.0.1:1;1") -> None:
    resp = c.controller_request(RequestCode.CONTROLLER_APPLY_BROKER_ID,
                                {"clusterName": "c", "brokerName": name, "appliedBrokerId": 1,
                                 "registerCheckCode": code})
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def _journal(proc: ControllerProc) -> bytes:
    """The controller's Raft journal as it is on disk (committed JSON text inside)."""
    path = Path(proc.config["controller_store_path"]) / "raft" / "journal"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _leader(c: Cluster) -> ControllerProc:
    address = c.wait_for(c.controller_leader, what="a controller leader")
    return next(p for p in c.controllers if p.address == address)


def _role_changes(c: Cluster) -> int:
    return sum(len(ROLE_LINE.findall(p.log_text())) for p in c.controllers)


def _refusals(proc: ControllerProc, side: str = "from") -> int:
    """Warnings the controller logged for Raft links refused (``side``: "from" accepted,
    "to" dialled)."""
    return sum(1 for line in proc.log_text().splitlines()
               if '"WARNING"' in line and f"Raft link {side} " in line)


# --- election, failover and catch-up ---------------------------------------------------------


def test_controllers_elect_fail_over_and_catch_up_over_tls(tmp_path: Path, keys: Keys) -> None:
    with Cluster(tmp_path / "c") as c:
        c.start_controllers(3, per_node=keys.controllers(3))
        _apply_id(c, "before-failover")
        old = _leader(c)
        assert c.wait_for(lambda: all(b"before-failover" in _journal(p) for p in c.controllers),
                          what="the first commit on every controller")
        old.kill()
        new = c.wait_for(lambda: (p := _leader(c)) is not old and p, what="a new leader")
        # Three 1 MiB events (random text compresses little): far over the 64 KiB socket
        # buffers pysyncobj asks for, so sends meet a full socket and go through the
        # backlog (seen with a log line there: live appends and the catch-up both do).
        big = [f"big-{i}-" + base64.b64encode(os.urandom(768 << 10)).decode() for i in range(3)]
        for i, text in enumerate(big):
            _apply_id(c, f"big-{i}", f"127.0.0.1:1;{text}")
        old.start()
        c.wait_for(lambda: big[-1].encode() in _journal(old), 30, what="the restarted controller caught up")
        journal = _journal(old)
        assert all(text.encode() in journal for text in big)
        _apply_id(c, "after-catch-up")
        c.wait_for(lambda: all(b"after-catch-up" in _journal(p) for p in c.controllers),
                   what="a commit after the catch-up on every controller")
        assert new.alive
        assert not any(_refusals(p, side) for p in c.controllers for side in ("from", "to"))


# --- what a relay between two controllers sees ------------------------------------------------


def _pysyncobj_text(stream: bytes) -> bytes:
    """``stream`` with every pysyncobj frame it opens with decompressed behind it (what
    an eavesdropper who knows pysyncobj's framing reads)."""
    out, pos = [stream], 0
    while pos + 4 <= len(stream):
        (size,) = struct.unpack("i", stream[pos:pos + 4])
        if size <= 0 or pos + 4 + size > len(stream):
            break
        try:
            out.append(zlib.decompress(stream[pos + 4:pos + 4 + size]))
        except zlib.error:
            break
        pos += 4 + size
    return b"".join(out)


@dataclasses.dataclass
class Relayed:
    """Two controllers (not started), the one with the higher Raft address dialling the
    other through a recording relay (pysyncobj: the higher address dials)."""

    cluster: Cluster
    proxy: TcpProxy
    raft_peers: dict[int, str]

    def commit(self, canary: str, **overrides: Any) -> bytes:
        """Start both with ``overrides``, commit an id for broker ``canary``; what the relay
        forwarded, pysyncobj's frames decompressed."""
        c = self.cluster
        procs = c.add_controllers(2, **overrides)
        for i, proc in enumerate(procs):
            proc.config["raft_peers"] = self.raft_peers[i]
            proc.start()
        c.wait_for(c.controller_leader, what="a controller leader")
        _apply_id(c, canary)
        c.wait_for(lambda: all(canary.encode() in _journal(p) for p in procs),
                   what="the commit on both controllers")
        assert self.proxy.accepted >= 1
        return b"".join(_pysyncobj_text(bytes(s)) for s in self.proxy.streams)


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[Relayed]:
    proxy_port, low, high = sorted(free_port() for _ in range(3))
    assert f"127.0.0.1:{proxy_port}" < f"127.0.0.1:{low}" < f"127.0.0.1:{high}"
    peers = {0: f"n0-127.0.0.1:{low};n1-127.0.0.1:{high}",
             1: f"n0-127.0.0.1:{proxy_port};n1-127.0.0.1:{high}"}
    with Cluster(tmp_path / "c", insecure=True) as c, \
            TcpProxy("127.0.0.1", low, listen_port=proxy_port, record=True) as proxy:
        yield Relayed(c, proxy, peers)


def test_a_relay_between_tls_controllers_sees_no_plaintext(relayed: Relayed, keys: Keys) -> None:
    canary = "raft-relay-canary-" + os.urandom(6).hex()
    seen = relayed.commit(canary, per_node=keys.controllers(2))
    # The relay is the two's only link, so the commit on both went through it.
    assert len(seen) > 4096
    assert canary.encode() not in seen
    streams = [bytes(s) for s in relayed.proxy.streams if s]
    assert streams and all(s[0] == TLS_HANDSHAKE_BYTE for s in streams)  # TLS records only


def test_negative_control_a_relay_between_plain_controllers_sees_the_name(relayed: Relayed) -> None:
    canary = "raft-relay-canary-" + os.urandom(6).hex()
    assert canary.encode() in relayed.commit(canary)


# --- raw clients at the Raft port --------------------------------------------------------------


def _raw_attempt(address: str, context: ssl.SSLContext, claim: str | None) -> bytes:
    """Connect over TLS with ``context``, send pysyncobj's node-address message ``claim``
    (when given), and return what comes back before the peer closes or 2 s pass (b""
    when the handshake or the read fails)."""
    host, _, port = address.rpartition(":")
    received = b""
    with socket.create_connection((host, int(port)), timeout=2) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                if claim is not None:
                    tls.sendall(raft_frame(claim))
                while chunk := tls.recv(65536):
                    received += chunk
        except (ssl.SSLError, ConnectionError, TimeoutError):
            pass
    return received


@pytest.fixture(scope="module")
def tls_group(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Iterator[Cluster]:
    """Three controllers serving TLS without a cluster secret: TLS is the only guard."""
    with Cluster(tmp_path_factory.mktemp("raft-tls-raw"), insecure=True) as c:
        c.start_controllers(3, per_node=keys.controllers(3))
        _apply_id(c, "raw-client-group")
        yield c


def test_raw_clients_without_a_members_identity_get_nothing(tls_group: Cluster, keys: Keys,
                                                            tmp_path: Path) -> None:
    c = tls_group
    leader = _leader(c)
    member = next(p for p in c.controllers if p is not leader)  # whose address is claimed
    other = next(p for p in c.controllers if p not in (leader, member))
    member_id, other_id = int(member.node_id[1:]), int(other.node_id[1:])
    attempts = {
        "no certificate": (keys.raw(None), member.raft_address),
        "a broker's certificate": (keys.raw(BROKER), member.raft_address),
        "another CA's controller certificate": (keys.raw(_controller(member_id), keys.foreign),
                                                member.raft_address),
        "an expired controller certificate": (keys.raw(_controller(1), keys.expired), member.raft_address),
        "a controller of no member id": (keys.raw(_controller(3)), member.raft_address),
        "a member claiming another's address": (keys.raw(_controller(other_id)), member.raft_address),
    }
    changes = _role_changes(c)
    for what, (context, claim) in attempts.items():
        refused = _refusals(leader)
        assert _raw_attempt(leader.raft_address, context, claim) == b"", what
        c.wait_for(lambda: _refusals(leader) > refused, 5, what=f"the refusal of {what} logged")

    marker = tmp_path / "probe-marker"
    assert send_probe(leader.raft_address, marker) == b""
    c.wait_for(lambda: "wrong version number" in leader.log_text() or _refusals(leader) > refused + 1,
               5, what="the plaintext probe refused")
    assert not marker.exists()

    assert _leader(c) is leader and _role_changes(c) == changes
    _apply_id(c, "after-raw-clients")
    c.wait_for(lambda: all(b"after-raw-clients" in _journal(p) for p in c.controllers),
               what="a commit on every controller after the raw clients")
    # The negative control: the member's own certificate and address get the appends.
    got = _raw_attempt(leader.raft_address, keys.raw(_controller(member_id)), member.raft_address)
    assert b"append_entries" in _pysyncobj_text(got)
