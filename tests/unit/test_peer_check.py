"""rmqha.net.peer_check and rmqha.controller.peer_rules: who may send a control request, by
certificate identity; a missing identity refused only where the port enforces mutual TLS."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from rmqha.controller.peer_rules import need_for
from rmqha.controller.state import ReplicasState
from rmqha.net.peer_check import ADMIN_ROLES, Need, PeerCheck
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings

A0 = Identity.broker("c1", "ga", "ga-0")
B0 = Identity.broker("c1", "gb", "gb-0")
OTHER_CLUSTER = Identity.broker("c2", "ga", "ga-0")
ENFORCING = TlsSettings(server_mode=TlsMode.ENFORCING, server_need_client_auth=ClientAuth.REQUIRE)


def _conn(identity: Identity | None) -> Any:
    return SimpleNamespace(peer_identity=identity, peer="127.0.0.1:5555")


def _cmd(code: int, **ext: str) -> RemotingCommand:
    return RemotingCommand.request(code, ext)


def test_need_allows_the_broker_named_and_the_roles_given() -> None:
    need = Need.broker("c1", "ga", or_roles=ADMIN_ROLES)
    assert need.allows(A0) and need.allows(Identity.admin("x")) and need.allows(Identity.controller("n0"))
    assert not need.allows(B0) and not need.allows(OTHER_CLUSTER) and not need.allows(Identity.client("x"))
    assert Need.broker(None, "ga").allows(OTHER_CLUSTER)  # no cluster named: the group decides
    assert not Need(frozenset({Role.CONTROLLER})).allows(A0)
    assert need.describe() == "rmqha:broker/c1/ga/<name> or rmqha:admin/<name> or rmqha:controller/<name>"


@pytest.mark.parametrize(("settings", "refused"), [
    (ENFORCING, True),
    (TlsSettings(server_mode=TlsMode.ENFORCING, server_need_client_auth=ClientAuth.OPTIONAL), True),
    (TlsSettings(server_mode=TlsMode.ENFORCING, server_need_client_auth=ClientAuth.NONE), False),
    (TlsSettings(server_mode=TlsMode.PERMISSIVE, server_need_client_auth=ClientAuth.REQUIRE), False),
    (TlsSettings(), False),
])
def test_a_missing_identity_is_refused_only_under_enforcing_client_auth(settings: TlsSettings,
                                                                         refused: bool) -> None:
    cmd = _cmd(RequestCode.REGISTER_BROKER, clusterName="c1", brokerName="ga")
    resp = PeerCheck(settings).refusal(cmd, _conn(None), Need.broker("c1", "ga"))
    assert (resp is not None) is refused
    if resp is not None:
        assert resp.code == ResponseCode.NO_PERMISSION
        assert "rmqha:broker/c1/ga/<name>" in (resp.remark or "") and "rmqha certs" in (resp.remark or "")


def test_a_present_identity_is_checked_in_every_mode() -> None:
    cmd = _cmd(RequestCode.REGISTER_BROKER, clusterName="c1", brokerName="ga")
    for settings in (ENFORCING, TlsSettings(server_mode=TlsMode.PERMISSIVE)):
        check = PeerCheck(settings)
        assert check.refusal(cmd, _conn(A0), Need.broker("c1", "ga")) is None
        resp = check.refusal(cmd, _conn(B0), Need.broker("c1", "ga"))
        assert resp is not None and resp.code == ResponseCode.NO_PERMISSION
        assert str(B0) in (resp.remark or "")


def test_guarded_handler_runs_only_when_let_in() -> None:
    ran: list[str] = []

    async def handler(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ran.append(str(conn.peer_identity))
        return cmd.response()

    guarded = PeerCheck(ENFORCING).guarded(lambda cmd: Need(frozenset({Role.CONTROLLER})), handler)
    cmd = _cmd(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)
    assert asyncio.run(guarded(cmd, _conn(A0))).code == ResponseCode.NO_PERMISSION
    assert asyncio.run(guarded(cmd, _conn(Identity.controller("n0")))).code == ResponseCode.SUCCESS
    assert ran == ["rmqha:controller/n0"]


def test_controller_rules() -> None:
    state = ReplicasState()
    group = {"clusterName": "c1", "brokerName": "ga"}
    for code in (RequestCode.BROKER_HEARTBEAT, RequestCode.CONTROLLER_REGISTER_BROKER,
                 RequestCode.CONTROLLER_APPLY_BROKER_ID):
        need = need_for(_cmd(code, **group), state)
        assert need is not None and need.allows(A0) and not need.allows(B0)
        assert not need.allows(Identity.admin("x"))  # nobody speaks for a broker
    elect = need_for(_cmd(RequestCode.CONTROLLER_ELECT_MASTER, **group), state)
    assert elect is not None and elect.allows(A0) and elect.allows(Identity.admin("x"))
    designated = need_for(_cmd(RequestCode.CONTROLLER_ELECT_MASTER, designateElect="true", **group), state)
    assert designated is not None and not designated.allows(A0) and designated.allows(Identity.admin("x"))
    for code in (RequestCode.CLEAN_BROKER_DATA, RequestCode.UPDATE_CONTROLLER_CONFIG):
        need = need_for(_cmd(code, **group), state)
        assert need is not None and not need.allows(A0) and need.allows(Identity.controller("n0"))
    assert need_for(_cmd(RequestCode.CONTROLLER_GET_REPLICA_INFO, **group), state) is None
    # ALTER_SYNC_STATE_SET names no cluster: any broker of the group (no group on record).
    alter = need_for(_cmd(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, brokerName="ga"), state)
    assert alter is not None and alter.allows(OTHER_CLUSTER) and not alter.allows(B0)
    # With the group on record, its cluster is the one the sender's certificate must name.
    state.apply({"type": "apply_broker_id", "expect_revision": state.revision, "cluster": "c1",
                 "broker_name": "ga", "broker_id": 1, "address": "127.0.0.1:1", "register_code": "x"})
    assert state.group("ga") is not None
    alter = need_for(_cmd(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, brokerName="ga"), state)
    assert alter is not None and alter.allows(A0) and not alter.allows(OTHER_CLUSTER)
