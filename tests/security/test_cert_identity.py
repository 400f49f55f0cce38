"""Certificate identities checked against what a request claims, on real processes.

One module-scoped cluster on 127.0.0.1 where every remoting port enforces mutual TLS
(certificates from ``rmqha.security.certs.dev_cluster``), with a cluster secret and the
brokers' ``aclEnable``: a controller, a name server and group ``broker-a`` (master ``a``
id 1, slave ``b`` id 2; ``b`` polls the controller once a minute, so a role change reaches
it only through a notice).  The attacker is an insider: it holds the cluster secret (every
probe is correctly signed) and a valid certificate of the cluster's CA, but one naming
someone else: broker ``broker-b-0`` of group ``broker-b``, a client, an admin.  So the
certificate identity is the only thing that stops each probe.  Each refusal is
NO_PERMISSION naming the certificate and who was expected, and nothing changes; each has a
negative control, the same signed request with a certificate that fits, which goes through.
A certificate of the CA naming no rmqha identity (an application's) is refused too: the
ports enforce mutual TLS.
"""
from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, free_port
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from security_wire import RawClient, frame
from tls_pki import client_tls, config_keys, server_tls

from rmqha.net.client_security import ClientSecurity, Credentials, client_context
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import FrameDecoder, RemotingCommand
from rmqha.protocol.request_auth import SIGNATURE_FIELD
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import TlsSettings
from rmqha.security.tls import client_context as ssl_client_context

CLUSTER = "sec"
GROUP = "broker-a"
OTHER = "broker-b"
ACL = """\
accounts:
  - accessKey: app-ak-1
    secretKey: app-secret-1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: admin-ak-1
    secretKey: admin-secret-1
    admin: true
"""
IMPOSTOR = Identity.broker(CLUSTER, OTHER, f"{OTHER}-0")
CLIENT = Identity.client("client")
ADMIN = Identity.admin("admin")
CONTROLLER = Identity.controller("n0")


def _identity_keys(pki: Path, identity: Identity) -> dict[str, Any]:
    ca = pki / certs.CA_CERT
    keys = config_keys(server_tls(pki, identity, ca))
    keys.update({k: v for k, v in config_keys(client_tls(pki, identity, ca)).items()
                 if k.startswith("tls_client") or k == "tls_enable"})
    return keys


def _hook(creds: Credentials) -> Any:
    """The admin account's ACL signature on requests to brokers (control requests carry
    the cluster secret's proof instead, which a later field would break)."""
    def hook(cmd: RemotingCommand) -> None:
        if SIGNATURE_FIELD not in cmd.ext_fields:
            creds.sign(cmd)
    return hook


def _application_cert(pki: Path) -> Path:
    """A certificate of the cluster's CA naming no rmqha identity (an application's, say:
    only a DNS name); its pair is written as ``app-cert.crt`` / ``.key`` in ``pki``."""
    ca = certs.load_ca(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "an application")]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("app.example")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    stem = pki / "app-cert"
    stem.with_suffix(".key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    stem.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return stem


class TlsRawClient(RawClient):
    """:class:`RawClient` over TLS with one certificate: a peer that shares no code with
    rmqha's clients but holds a certificate of the cluster's CA (``identity`` None: one
    naming no rmqha identity, see :func:`_application_cert`)."""

    def __init__(self, address: str, pki: Path, identity: Identity | None, timeout: float = 5.0) -> None:
        host, _, port = address.rpartition(":")
        if identity is None:
            stem = _application_cert(pki)
            settings = TlsSettings(client_enable=True, client_cert_path=f"{stem}.crt",
                                   client_key_path=f"{stem}.key",
                                   client_trust_cert_path=str(pki / certs.CA_CERT))
        else:
            settings = client_tls(pki, identity, pki / certs.CA_CERT)
        context = ssl_client_context(settings)
        raw = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = context.wrap_socket(raw)
        self._decoder = FrameDecoder()
        self._ready: list[RemotingCommand] = []
        self._endpoint = None


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("certid")
    pki = base / "pki"
    certs.dev_cluster(pki, cluster=CLUSTER, controllers=1, groups={GROUP: 2, OTHER: 1}, namesrv=1)
    acl = base / "plain_acl.yml"
    acl.write_text(ACL)
    with Cluster(base / "cluster", cluster_name=CLUSTER) as c:
        c.pki = pki  # type: ignore[attr-defined]
        admin = client_context(client_tls(pki, ADMIN, pki / certs.CA_CERT))
        c.client_security = ClientSecurity(admin, _hook(Credentials("admin-ak-1", "admin-secret-1")))
        c.start_controllers(1, **_identity_keys(pki, CONTROLLER))
        c.start_namesrv(**_identity_keys(pki, Identity.namesrv("ns0")))

        def broker(i: int, **extra: Any) -> Any:
            return c.start_broker(GROUP, acl_enable=True, acl_file=str(acl),
                                  **_identity_keys(pki, Identity.broker(CLUSTER, GROUP, f"{GROUP}-{i}")),
                                  **extra)
        # Not its client port + 1: b must learn it from a, by its broker certificate.
        c.a = broker(0, ha_listen_port=free_port())
        c.wait_role(c.a, "master", 30)
        c.b = broker(1, sync_broker_metadata_period_ms=60_000)
        c.wait_role(c.b, "slave", 30)
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == [1, 2],
                   30, what="SyncStateSet {1, 2} (brokers registered and beating over mTLS)")
        c.wait_for(lambda: (c.group_route(GROUP) or {}).get("brokerAddrs") == {"0": c.a.address,
                                                                              "2": c.b.address},
                   30, what="both brokers in the name server's routes")
        yield c


def ctl(live: Cluster) -> str:
    return live.controller_addresses[0]


def ns(live: Cluster) -> str:
    return live.namesrvs[0].address


def ask_as(live: Cluster, identity: Identity | None, address: str, code: int, ext: dict[str, Any],
           body: Any = b"", *, signed: bool = True) -> RemotingCommand:
    """One request over TLS with ``identity``'s certificate, signed with the cluster secret."""
    with TlsRawClient(address, live.pki, identity) as client:  # type: ignore[attr-defined]
        return client.request(frame(code, ext, body, secret=live.cluster_secret if signed else None))


def refused_as(resp: RemotingCommand, peer: Identity, *expected: str) -> bool:
    remark = resp.remark or ""
    return (resp.code == ResponseCode.NO_PERMISSION and f"certificate names {peer}" in remark
            and all(e in remark for e in expected))


def view(live: Cluster) -> dict[str, Any]:
    config = live.request(ctl(live), RequestCode.GET_CONTROLLER_CONFIG).body.decode()
    return {"replica_info": live.replica_info(GROUP), "sync_state": live.sync_state_data(GROUP),
            "unclean": "enableElectUncleanMaster=false" in config,
            "route": live.group_route(GROUP)}


def _broker_writes(live: Cluster) -> dict[int, tuple[dict[str, Any], Any]]:
    """What a broker of ``broker-a`` sends the controller for itself (b's id and address)."""
    info = live.replica_info(GROUP)
    assert info is not None
    group = {"clusterName": CLUSTER, "brokerName": GROUP}
    return {
        RequestCode.CONTROLLER_APPLY_BROKER_ID: (
            {**group, "appliedBrokerId": 3, "registerCheckCode": f"{live.b.address};1"}, b""),
        RequestCode.CONTROLLER_REGISTER_BROKER: ({**group, "brokerId": 2, "brokerAddress": live.b.address}, b""),
        RequestCode.BROKER_HEARTBEAT: (
            {**group, "brokerId": 2, "brokerAddr": live.b.address, "epoch": info.master_epoch,
             "maxOffset": 2**40}, b""),
        RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: (
            {"brokerName": GROUP, "masterBrokerId": 1, "masterEpoch": info.master_epoch},
            {"syncStateSet": [1], "syncStateSetEpoch": info.sync_state_set_epoch}),
        RequestCode.CONTROLLER_ELECT_MASTER: ({**group, "brokerId": 2}, b""),
    }


def test_a_broker_acts_on_the_controller_only_as_its_own_group(live: Cluster) -> None:
    before = view(live)
    for code, (ext, body) in _broker_writes(live).items():
        resp = ask_as(live, IMPOSTOR, ctl(live), code, ext, body)
        assert refused_as(resp, IMPOSTOR, f"rmqha:broker/{CLUSTER}/{GROUP}/<name>"), (code, resp.remark)
    assert view(live) == before
    # Negative control: the same signed heartbeat with the certificate of b's group is taken.
    ext, body = _broker_writes(live)[RequestCode.BROKER_HEARTBEAT]
    member = Identity.broker(CLUSTER, GROUP, f"{GROUP}-1")
    for _ in range(3):  # b's own heartbeat may be signed after this one and arrive first
        resp = ask_as(live, member, ctl(live), RequestCode.BROKER_HEARTBEAT, {**ext, "maxOffset": -1})
        if "not newer" not in (resp.remark or ""):
            break
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_admin_requests_need_an_admin_or_controller_certificate(live: Cluster) -> None:
    member = Identity.broker(CLUSTER, GROUP, f"{GROUP}-0")
    group = {"clusterName": CLUSTER, "brokerName": GROUP}
    probes: dict[int, tuple[dict[str, Any], Any]] = {
        RequestCode.CONTROLLER_ELECT_MASTER: ({**group, "brokerId": 2, "designateElect": "true"}, b""),
        RequestCode.CLEAN_BROKER_DATA: ({**group, "brokerIdSetToClean": "2", "isCleanLivingBroker": "true"}, b""),
        RequestCode.UPDATE_CONTROLLER_CONFIG: ({}, b"enableElectUncleanMaster=true\n"),
    }
    before = view(live)
    for peer in (member, CLIENT):
        for code, (ext, body) in probes.items():
            resp = ask_as(live, peer, ctl(live), code, ext, body)
            assert refused_as(resp, peer, "rmqha:admin/<name>", "rmqha:controller/<name>"), (code, resp.remark)
    assert view(live) == before
    # Negative control: the admin's certificate changes the setting (and sets it back).
    for value in ("true", "false"):
        resp = ask_as(live, ADMIN, ctl(live), RequestCode.UPDATE_CONTROLLER_CONFIG, {},
                      f"enableElectUncleanMaster={value}\n")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert view(live) == before


def _register(group: str, addr: str, broker_id: int, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    ext = {"brokerName": group, "brokerAddr": addr, "clusterName": CLUSTER, "haServerAddr": addr,
           "brokerId": broker_id, "masterEpoch": epoch}
    body = {"topicConfigSerializeWrapper": {"topicConfigTable": {}, "dataVersion": {"stateVersion": epoch}}}
    return ext, body


def test_a_broker_registers_on_the_name_server_only_as_itself(live: Cluster) -> None:
    before = live.group_route(GROUP)
    assert before is not None
    ext, body = _register(GROUP, "127.0.0.1:1", 0, before["masterEpoch"] + 1)
    resp = ask_as(live, IMPOSTOR, ns(live), RequestCode.REGISTER_BROKER, ext, body)
    assert refused_as(resp, IMPOSTOR, f"rmqha:broker/{CLUSTER}/{GROUP}/<name>"), resp.remark
    leave = {"brokerName": GROUP, "brokerAddr": live.b.address, "clusterName": CLUSTER, "brokerId": 2}
    resp = ask_as(live, IMPOSTOR, ns(live), RequestCode.UNREGISTER_BROKER, leave)
    assert refused_as(resp, IMPOSTOR, f"rmqha:broker/{CLUSTER}/{GROUP}/<name>"), resp.remark
    assert live.group_route(GROUP) == before
    # Negative control: the same certificate registers its own group, signed the same way.
    ext, body = _register(OTHER, "127.0.0.1:2", 0, 1)
    with TlsRawClient(ns(live), live.pki, IMPOSTOR) as conn:  # type: ignore[attr-defined]
        resp = conn.request(frame(RequestCode.REGISTER_BROKER, ext, body, secret=live.cluster_secret))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert (live.group_route(OTHER) or {}).get("masterAddr") == "127.0.0.1:2"


def test_broker_epoch_cache_needs_admin_or_a_cluster_certificate(live: Cluster) -> None:
    code = RequestCode.GET_BROKER_EPOCH_CACHE
    # A client's certificate: the ACL applies (no AccessKey, then a non-admin account).
    resp = ask_as(live, CLIENT, live.a.address, code, {}, signed=False)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "AccessKey" in (resp.remark or ""), resp.remark
    with TlsRawClient(live.a.address, live.pki, CLIENT) as client:  # type: ignore[attr-defined]
        cmd = RemotingCommand.request(code)
        Credentials("app-ak-1", "app-secret-1").sign(cmd)
        resp = client.request(cmd)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "admin account" in (resp.remark or ""), resp.remark
    # The admin account (over a client's certificate) gets it, and so do the cluster's own
    # certificates without any account.
    with TlsRawClient(live.a.address, live.pki, CLIENT) as client:  # type: ignore[attr-defined]
        cmd = RemotingCommand.request(code)
        Credentials("admin-ak-1", "admin-secret-1").sign(cmd)
        resp = client.request(cmd)
    assert resp.code == ResponseCode.SUCCESS and resp.json_body()["brokerId"] == 0, resp.remark  # a master says 0
    for peer in (Identity.broker(CLUSTER, GROUP, f"{GROUP}-1"), ADMIN, CONTROLLER):
        resp = ask_as(live, peer, live.a.address, code, {}, signed=False)
        assert resp.code == ResponseCode.SUCCESS, (peer, resp.remark)


def test_a_slave_learns_its_masters_ha_address_by_its_broker_certificate(live: Cluster) -> None:
    """A broker holds no ACL account; GET_BROKER_HA_STATUS, by which a new slave learns the
    HA address its master advertises, takes a cluster certificate instead (without it the
    slave dialled the master's client port + 1: nothing there, or past a proxy)."""
    code = RequestCode.GET_BROKER_HA_STATUS
    ha = live.a.config["ha_listen_port"]
    assert ha != int(live.a.address.rpartition(":")[2]) + 1
    assert f"HA 127.0.0.1:{ha})" in live.b.log_text() and "refused its HA address" not in live.b.log_text()
    for peer in (Identity.broker(CLUSTER, GROUP, f"{GROUP}-1"), ADMIN, CONTROLLER):
        resp = ask_as(live, peer, live.a.address, code, {}, signed=False)
        assert resp.code == ResponseCode.SUCCESS, (peer, resp.remark)
        assert resp.json_body()["haAddress"] == f"127.0.0.1:{ha}"
    # Negative control: a client's certificate without an account is left to the ACL.
    resp = ask_as(live, CLIENT, live.a.address, code, {}, signed=False)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "AccessKey" in (resp.remark or ""), resp.remark


def _notice(broker_id: int, address: str, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"masterAddress": address, "masterEpoch": epoch, "syncStateSetEpoch": 99,
             "masterBrokerId": broker_id}, {"syncStateSet": [broker_id], "syncStateSetEpoch": 99})


def test_role_notices_come_only_from_a_controller_certificate(live: Cluster) -> None:
    a, b = live.a, live.b
    epoch = live.replica_info(GROUP).master_epoch  # type: ignore[union-attr]
    ext, body = _notice(2, b.address, epoch + 1)
    # A broker of b's own group, another group's broker, a client, an admin: all signed.
    member = Identity.broker(CLUSTER, GROUP, f"{GROUP}-0")
    for peer in (member, IMPOSTOR, CLIENT, ADMIN):
        resp = ask_as(live, peer, b.address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body)
        assert refused_as(resp, peer, "rmqha:controller/<name>"), (peer, resp.remark)
    status = live.broker_status(b)
    assert (status["role"], status["masterEpoch"], status["masterAddress"]) == ("slave", epoch, a.address)
    assert status["unconfirmedNoticesIgnored"] == 0  # none reached the handler
    # Negative control: the controller's certificate gets the same notice to the handler
    # (which asks the controller leader, whose record does not confirm it).
    resp = ask_as(live, CONTROLLER, b.address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    status = live.broker_status(b)
    assert status["unconfirmedNoticesIgnored"] == 1
    assert (status["role"], status["masterEpoch"]) == ("slave", epoch)


def test_a_certificate_without_an_rmqha_identity_is_refused_under_enforcing_mtls(live: Cluster) -> None:
    """A certificate of the cluster's CA that names nobody (an application's) passes the TLS
    handshake, but no control request: the ports enforce mutual TLS, so the sender must be
    named.  (The tests above are its negative control: the same signed requests with a
    certificate that names the right process go through.)"""
    before = view(live)
    ext, body = _broker_writes(live)[RequestCode.BROKER_HEARTBEAT]
    registration = _register(GROUP, "127.0.0.1:3", 0, 1)
    epoch = live.replica_info(GROUP).master_epoch  # type: ignore[union-attr]
    for address, code, e, b in [
        (ctl(live), RequestCode.BROKER_HEARTBEAT, ext, body),
        (ctl(live), RequestCode.UPDATE_CONTROLLER_CONFIG, {}, b"enableElectUncleanMaster=true\n"),
        (ns(live), RequestCode.REGISTER_BROKER, *registration),
        (live.b.address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, *_notice(2, live.b.address, epoch + 1)),
    ]:
        resp = ask_as(live, None, address, code, e, b)
        assert resp.code == ResponseCode.NO_PERMISSION, (code, resp.code, resp.remark)
        assert "has none with an rmqha identity" in (resp.remark or ""), resp.remark
    assert view(live) == before
    assert live.broker_status(live.b)["role"] == "slave"


def test_a_real_failover_moves_the_slave_by_the_controllers_notice_over_mtls(live: Cluster) -> None:
    """Last (it kills the master).  b polls once a minute, so it becomes master in seconds
    only by the leader's notice, over TLS with the controller's certificate and the
    secret's channel inside it (the broker takes a notice no other way here)."""
    epoch = live.replica_info(GROUP).master_epoch  # type: ignore[union-attr]
    live.a.kill()
    live.wait_role(live.b, "master", 20)
    assert live.broker_status(live.b)["masterEpoch"] == epoch + 1
    assert live.b.log_contains("notification (confirmed): master of broker-a is now 2")
    assert not live.controllers[0].log_contains(f"role-change notice to {live.b.address} failed")
