"""Brokers serving TLS replicate over mutual TLS, as real processes on 127.0.0.1.

A controller, a name server and a broker group of two, each broker with its own certificate from
``rmqha certs dev-cluster`` and a client port that is only ``permissive`` and asks for no
client certificate: the HA port still speaks TLS only and checks the slave's certificate
(it is an internal link).  The master's ``ha`` status names the slave's certificate, a
send is acknowledged with the slave's copy, and a plaintext connection to the HA port is
refused with one log line and gets no byte.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from tls_pki import client_tls, config_keys, server_tls

from rmqha.client import BlockingProducer, Message, SendStatus
from rmqha.net.client_security import ClientSecurity, client_context
from rmqha.protocol.message import parse_offset_msg_id
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth, TlsMode
from rmqha.store.commitlog import CommitLog

CLUSTER = "rmqha-test"
GROUP = "broker-a"


def _keys(pki: Path, identity: Identity, mode: TlsMode = TlsMode.ENFORCING,
          client_auth: ClientAuth = ClientAuth.REQUIRE) -> dict[str, Any]:
    """A process's config: its port as told, TLS with its certificate on its own links."""
    ca = pki / certs.CA_CERT
    keys = config_keys(server_tls(pki, identity, ca, mode=mode, client_auth=client_auth))
    links = config_keys(client_tls(pki, identity, ca))
    keys.update({k: v for k, v in links.items() if k.startswith("tls_client") or k == "tls_enable"})
    return keys


def _plaintext_gets(address: str) -> bytes:
    """What a plaintext slave's first bytes get from ``address`` before it is closed."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"\x00\x00\x00\x40" + b"\x00" * 60)
        got = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:  # closed with our bytes unread
                return got
            if not chunk:
                return got
            got += chunk
    raise AssertionError(f"the HA port kept a plaintext link open ({len(got)} bytes)")


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    d = tmp_path / "pki"
    certs.dev_cluster(d, cluster=CLUSTER, controllers=1, groups={GROUP: 2}, namesrv=1)
    return d


def test_brokers_replicate_over_mutual_tls_behind_a_permissive_client_port(tmp_path: Path, pki: Path) -> None:
    admin = client_tls(pki, Identity.admin("admin"), pki / certs.CA_CERT)
    with Cluster(tmp_path / "cluster", cluster_name=CLUSTER) as c:
        c.client_security = ClientSecurity(client_context(admin))
        c.start_controllers(1, **_keys(pki, Identity.controller("n0")))
        ns = c.start_namesrv(**_keys(pki, Identity.namesrv("ns0")))
        brokers = [c.start_broker(GROUP, all_ack_in_sync_state_set=True,
                                  **_keys(pki, Identity.broker(CLUSTER, GROUP, f"{GROUP}-{i}"),
                                          TlsMode.PERMISSIVE, ClientAuth.NONE))
                   for i in range(2)]
        master, slave = brokers
        c.wait_role(master, "master", 30)
        c.wait_role(slave, "slave", 30)
        links = c.wait_for(lambda: c.broker_status(master).get("ha", {}).get("slaves"), 30,
                           what="the slave's HA link")
        assert [(s["tls"], s["certificate"]) for s in links] == [(True, str(Identity.broker(CLUSTER, GROUP,
                                                                                             f"{GROUP}-1")))]
        assert c.broker_status(slave)["ha"]["tls"] is True
        c.wait_for(lambda: len(c.broker_status(master)["syncStateSet"]) == 2, 30, what="the slave in sync")
        c.wait_for(lambda: c.route("TBW102") is not None, 30, what="the master registered")

        client = client_tls(pki, Identity.client("client"), pki / certs.CA_CERT)
        with BlockingProducer(ns.address, tls=client, retry_deadline_s=20) as p:
            sent = p.send("TopicHaTls", Message(b"replicated over TLS"))
        assert sent.status is SendStatus.SEND_OK  # every SyncStateSet member holds it
        _, offset = parse_offset_msg_id(sent.offset_msg_id)

        assert _plaintext_gets(master.ha_address) == b""
        c.wait_for(lambda: master.log_contains("refusing HA link from"), 10, what="the refusal logged")
        assert "TLS only" in next(line for line in master.log_text().splitlines() if "refusing HA link" in line)

        # The acknowledged message is in the slave's own store, byte for byte the master's.
        slave.stop()
        master.stop()
        seg = int(master.config["segment_bytes"])
        logs = [CommitLog(b.commitlog_dir, segment_bytes=seg, prefault=False) for b in (master, slave)]
        try:
            copies = [log.read_message(offset) for log in logs]
            assert copies[1].body == b"replicated over TLS"
            assert copies[0] == copies[1]
        finally:
            for log in logs:
                log.close()
