"""A new slave learns its master's HA address under ``aclEnable`` without TLS.

A broker holds no ACL account and, without TLS, no certificate either: it signs its
GET_BROKER_HA_STATUS with the cluster secret and the master's ACL guard takes that proof in
place of an account (:mod:`rmqha.broker.acl_guard`).  Real processes: one controller, one
name server and two brokers with the cluster secret and ``aclEnable``; the master's HA port
is moved off its client port + 1, so a slave that guessed would never replicate.

Negative controls: the same request unsigned, signed with another secret or replayed from a
raw client without an account is refused with nothing of the status returned; an admin
account still gets it (RocketMQ's own tools).  With the admission removed from the guard
the slave logs "refused its HA address", dials client port + 1 and the SyncStateSet stays
{master} (checked by hand, see the branch's report).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from security_wire import WRONG_SECRET, RawClient, frame

from rmqha.broker.acl_guard import acl_guard
from rmqha.errors import RemoteCommandError
from rmqha.net.client_security import ClientSecurity, Credentials
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import SIGNED_CODES, SharedSecretAuth
from rmqha.security.signature import sign
from rmqha.testing.local_cluster import Cluster, free_port

GROUP = "broker-a"
CODE = RequestCode.GET_BROKER_HA_STATUS
ACL = """\
accounts:
  - accessKey: admin-ak-1
    secretKey: admin-secret-1
    admin: true
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("hasigned")
    acl = base / "plain_acl.yml"
    acl.write_text(ACL)
    with Cluster(base / "cluster") as c:
        # The tests' own status queries go by the admin account, so that only the slave's
        # own request depends on the guard's admission by secret.
        c.client_security = ClientSecurity(None, _admin_hook)
        c.start_controllers(1)
        c.start_namesrv()
        c.a = c.start_broker(GROUP, acl_enable=True, acl_file=str(acl), ha_listen_port=free_port())
        c.wait_role(c.a, "master", 30)
        c.b = c.start_broker(GROUP, acl_enable=True, acl_file=str(acl))
        c.wait_role(c.b, "slave", 30)
        yield c


def _admin_hook(cmd: RemotingCommand) -> None:
    # Control requests carry the secret's proof, which a later field would break.
    if cmd.code not in SIGNED_CODES:
        Credentials("admin-ak-1", "admin-secret-1").sign(cmd)


def _ha_port(c: Cluster) -> int:
    return int(c.a.config["ha_listen_port"])


def test_the_slave_follows_the_moved_ha_port_and_joins_the_sync_state_set(live: Cluster) -> None:
    assert _ha_port(live) != int(live.a.address.rpartition(":")[2]) + 1
    live.wait_for(lambda: (i := live.replica_info(GROUP)) is not None and i.sync_state_set == [1, 2],
                  30, what="SyncStateSet {1, 2}: the slave replicates from the moved HA port")
    log = live.b.log_text()
    assert f"HA 127.0.0.1:{_ha_port(live)})" in log and "refused its HA address" not in log


def _refused(resp: RemotingCommand) -> bool:
    return resp.code == ResponseCode.SYSTEM_ERROR and not resp.body and "AccessKey" in (resp.remark or "")


def test_unsigned_wrongly_signed_and_replayed_requests_are_refused(live: Cluster) -> None:
    assert live.cluster_secret is not None
    with RawClient(live.a.address) as client:
        assert _refused(client.request(frame(CODE))), "unsigned"
        assert _refused(client.request(frame(CODE, secret=WRONG_SECRET))), "another secret"
        signed = frame(CODE, secret=live.cluster_secret)
        first = client.request(signed)
        assert first.code == ResponseCode.SUCCESS, first.remark
        assert first.json_body()["haAddress"] == f"127.0.0.1:{_ha_port(live)}"
        # The same frame again (a captured request): its nonce is spent.
        assert _refused(client.request(frame(CODE, signed.ext_fields, secret=None))), "replayed"
        tampered = frame(CODE, secret=live.cluster_secret)
        tampered.ext_fields["extra"] = "added after signing"
        assert _refused(client.request(tampered)), "changed after signing"


def test_an_admin_account_still_gets_the_status(live: Cluster) -> None:
    with RawClient(live.a.address) as client:
        resp = client.request(RemotingCommand.request(CODE, sign({}, None, "admin-ak-1", "admin-secret-1")))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.json_body()["haAddress"] == f"127.0.0.1:{_ha_port(live)}"



def test_the_guard_admits_only_a_fresh_proof_of_its_own_secret(tmp_path: Path) -> None:
    """The guard alone, no processes: the proof is taken once, only for GET_BROKER_HA_STATUS,
    and a broker without a secret (OpenAuth) admits none."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    conn: Any = SimpleNamespace(peer="127.0.0.1:1", peer_identity=None)
    guard = acl_guard(acl, auth=SharedSecretAuth("the-secret"))
    signed = frame(CODE, secret="the-secret")
    guard(signed, conn)  # admitted: no raise
    for refused in (frame(CODE), frame(CODE, secret=WRONG_SECRET), signed,
                    frame(RequestCode.GET_BROKER_EPOCH_CACHE, secret="the-secret")):
        with pytest.raises(RemoteCommandError):
            guard(refused, conn)
    with pytest.raises(RemoteCommandError):
        acl_guard(acl)(frame(CODE, secret="the-secret"), conn)
