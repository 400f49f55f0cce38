"""The pieces behind tests/security's attack tests, each with the input that makes it fire.

:mod:`rmqha.protocol.request_auth` (signing, every way a proof fails, the nonce cache,
token comparison), :mod:`rmqha.security.secret_policy` (where the secret comes from, when a
process may run without one), the controller's heartbeat rules and the broker's lease fit,
and attack 5: no secret or token in rmqha is compared with ``==``/``!=``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rmqha.broker.config import BrokerConfig
from rmqha.broker.replicas_manager import ReplicasManager
from rmqha.controller.config import ControllerConfig
from rmqha.controller.heartbeat import BrokerHeartbeatManager
from rmqha.controller.logic import ControllerLogic
from rmqha.controller.state import ReplicasState
from rmqha.errors import ConfigError, RequestAuthError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand, decode, encode
from rmqha.protocol.request_auth import (
    NONCE_FIELD,
    SIGNATURE_FIELD,
    TIMESTAMP_FIELD,
    NonceCache,
    OpenAuth,
    SharedSecretAuth,
    check,
    request_auth,
    tokens_match,
)
from rmqha.security.secret import read_secret_text
from rmqha.security.secret_policy import (
    check_optional_secret,
    require_controller_secret,
    resolve_secret,
)

SECRET = "unit-secret"
RMQHA = Path(__file__).resolve().parents[2] / "rmqha"


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def heartbeat(**ext: object) -> RemotingCommand:
    fields = {"brokerName": "g", "brokerId": 1, "brokerAddr": "127.0.0.1:1", "epoch": 1, **ext}
    return RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, fields, b"body")


def over_the_wire(cmd: RemotingCommand) -> RemotingCommand:
    return decode(encode(cmd))


# --- request_auth -------------------------------------------------------------------------


def test_a_signed_request_verifies_after_the_wire_and_only_once():
    auth = SharedSecretAuth(SECRET)
    cmd = over_the_wire(auth.sign(heartbeat()))
    assert {TIMESTAMP_FIELD, NONCE_FIELD, SIGNATURE_FIELD} <= set(cmd.ext_fields)
    SharedSecretAuth(SECRET).verify(cmd)  # another process holding the secret
    receiver = SharedSecretAuth(SECRET)
    receiver.verify(cmd)
    with pytest.raises(RequestAuthError, match="already used"):
        receiver.verify(cmd)


@pytest.mark.parametrize("change", ["ext", "add", "drop", "body", "code", "timestamp", "nonce"])
def test_any_change_after_signing_breaks_the_signature(change):
    cmd = SharedSecretAuth(SECRET).sign(heartbeat())
    if change == "ext":
        cmd.ext_fields["epoch"] = "51"
    elif change == "add":
        cmd.ext_fields["maxOffset"] = str(2**40)
    elif change == "drop":
        del cmd.ext_fields["brokerAddr"]
    elif change == "body":
        cmd.body = b"other"
    elif change == "code":
        cmd.code = int(RequestCode.CONTROLLER_REGISTER_BROKER)
    elif change == "timestamp":
        cmd.ext_fields[TIMESTAMP_FIELD] = str(int(cmd.ext_fields[TIMESTAMP_FIELD]) + 1)
    else:
        cmd.ext_fields[NONCE_FIELD] = "0" * 32
    with pytest.raises(RequestAuthError, match="bad signature"):
        SharedSecretAuth(SECRET).verify(cmd)


def test_unsigned_wrong_secret_stale_and_future_requests_are_refused():
    clock = Clock()
    auth = SharedSecretAuth(SECRET, wall_clock=clock)
    with pytest.raises(RequestAuthError, match="unsigned request"):
        auth.verify(heartbeat())
    with pytest.raises(RequestAuthError, match="bad signature"):
        auth.verify(SharedSecretAuth("other").sign(heartbeat()))
    sent = int(clock.t * 1000)
    for skew, words in ((31, "old"), (-31, "in the future")):
        cmd = auth.sign(heartbeat(), timestamp_ms=sent - skew * 1000)
        with pytest.raises(RequestAuthError, match=f"stale request.*{words}"):
            auth.verify(cmd)
    auth.verify(auth.sign(heartbeat(), timestamp_ms=sent - 29_000))  # control: inside the window


def test_refusals_say_why_but_never_the_secret():
    cmd = SharedSecretAuth("other").sign(heartbeat())
    resp = check(SharedSecretAuth(SECRET), cmd)
    assert resp is not None and resp.code == ResponseCode.NO_PERMISSION and resp.is_response
    assert "BROKER_HEARTBEAT" in resp.remark and "bad signature" in resp.remark
    assert SECRET not in resp.remark and SECRET not in repr(SharedSecretAuth(SECRET))
    assert check(SharedSecretAuth(SECRET), SharedSecretAuth(SECRET).sign(heartbeat())) is None


def test_only_state_changing_codes_are_signed_and_checked():
    auth = SharedSecretAuth(SECRET)
    read = RemotingCommand.request(RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": "g"})
    assert auth.sign(read).ext_fields == {"brokerName": "g"}
    auth.verify(read)  # no proof needed
    with pytest.raises(RequestAuthError):
        auth.verify(heartbeat())


def test_without_a_secret_nothing_is_signed_or_checked():
    auth = request_auth(None)
    assert isinstance(auth, OpenAuth) and not auth.enabled
    assert auth.sign(heartbeat()).ext_fields.get(SIGNATURE_FIELD) is None
    auth.verify(heartbeat())
    assert isinstance(request_auth(SECRET), SharedSecretAuth)


def test_nonce_cache_forgets_after_its_ttl_and_refuses_when_full():
    clock = Clock(0.0)
    cache = NonceCache(ttl_s=60, capacity=2, clock=clock)
    cache.add("a")
    cache.add("b")
    with pytest.raises(RequestAuthError, match="already used"):
        cache.add("a")
    with pytest.raises(RequestAuthError, match="too many"):
        cache.add("c")  # evicting a live nonce would reopen its replay
    clock.t = 61.0
    cache.add("a")  # its request is too old to pass the timestamp check by now
    assert len(cache) == 1


def test_tokens_match_in_constant_time_on_any_text():
    assert tokens_match("s3cret", "s3cret")
    assert not tokens_match("s3cre", "s3cret") and not tokens_match(None, "s3cret")
    assert not tokens_match("jalapeño", "s3cret") and tokens_match("jalapeño", "jalapeño")


def _plain_comparisons_of_secrets(source: str) -> list[str]:
    """``==``/``!=`` comparisons that mention a token, secret or signature."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            text = ast.unparse(node)
            if any(word in text.lower() for word in ("token", "secret", "signature")):
                found.append(text)
    return found


def test_no_secret_or_token_is_compared_with_equality_operators():
    """Attack 5: ``!=`` on a token leaks, through timing, how much of a guess was right."""
    # Negative control: the comparison the controller used to make is found.
    assert _plain_comparisons_of_secrets(
        'if token and cmd.ext_fields.get("adminToken") != token:\n    pass\n')
    found = {str(p.relative_to(RMQHA)): hits for p in RMQHA.rglob("*.py")
             if (hits := _plain_comparisons_of_secrets(p.read_text(encoding="utf-8")))}
    assert not found, found


# --- cluster_secret -----------------------------------------------------------------------


def test_secret_comes_from_the_value_else_the_file_else_the_fallback(tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-file\nignored\n")
    assert resolve_secret("value", path) == "value"
    assert resolve_secret(None, path, "fallback") == "from-file"
    assert resolve_secret("", None, None, "fallback") == "fallback"
    assert resolve_secret(None, None) is None
    with pytest.raises(ConfigError, match="does not exist"):
        read_secret_text(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_secret_text(tmp_path / "empty")


def test_controller_needs_a_secret_or_allow_insecure_on_loopback():
    peers = {"controller_peers": "n0-127.0.0.1:9878;n1-127.0.0.1:9879"}
    with pytest.raises(ConfigError, match="no cluster secret.*cluster_secret.*RMQHA_CLUSTER_SECRET"):
        ControllerConfig(**peers).check_security()
    assert ControllerConfig(**peers, allow_insecure=True).check_security() is None
    legacy = "legacy-raft-password"
    assert ControllerConfig(**peers, raft_password=legacy).check_security() == legacy
    with pytest.raises(ConfigError, match="6 bytes; at least 16"):
        ControllerConfig(**peers, raft_password="legacy").check_security()
    both = ControllerConfig(**peers, cluster_secret="shared", raft_password="raft-only")
    assert (both.secret(), both.raft_secret()) == ("shared", "raft-only")
    for remote in ({"controller_peers": "n0-127.0.0.1:9878;n1-10.0.0.2:9878"},
                   {**peers, "listen_host": "0.0.0.0"},
                   {**peers, "raft_peers": "n0-127.0.0.1:1;n1-10.0.0.2:2"}):
        with pytest.raises(ConfigError, match="not loopback"):
            ControllerConfig(**remote, allow_insecure=True).check_security()


def test_name_server_and_broker_without_secret_stay_on_loopback(caplog):
    check_optional_secret(None, False, ["127.0.0.1"], "name server x")
    assert "without a cluster secret" in caplog.text
    with pytest.raises(ConfigError, match="listens on 0.0.0.0.*allow_insecure"):
        check_optional_secret(None, False, ["0.0.0.0"], "name server x")
    check_optional_secret(None, True, ["0.0.0.0"], "name server x")
    check_optional_secret("a-secret-of-16-bytes", False, ["0.0.0.0"], "name server x")
    with pytest.raises(ConfigError, match="1 bytes; at least 16"):
        check_optional_secret("s", False, ["0.0.0.0"], "name server x")
    with pytest.raises(ConfigError, match="no cluster secret"):
        require_controller_secret(None, False, ["127.0.0.1"], "controller n0")


# --- controller heartbeat rules -----------------------------------------------------------


def _state_with_group() -> ReplicasState:
    state = ReplicasState()
    for i in (1, 2):
        state.apply({"type": "apply_broker_id", "cluster": "c", "broker_name": "g", "broker_id": i,
                     "address": f"127.0.0.1:{i}", "register_code": "x", "expect_revision": state.revision})
    state.apply({"type": "elect", "broker_name": "g", "new_master": 1, "expect_revision": state.revision})
    return state


def test_heartbeat_refused_unless_registered_from_its_address_at_a_reached_epoch():
    logic = ControllerLogic(_state_with_group(), BrokerHeartbeatManager())
    assert logic.heartbeat_refusal("g", 2, "127.0.0.1:2", 1) is None  # control
    assert logic.heartbeat_refusal("g", 2, "127.0.0.1:2", None) is None
    cases = {("g", 9, "127.0.0.1:9", 1): ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
             ("x", 1, "127.0.0.1:1", 1): ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
             ("g", 2, "10.6.6.6:1", 1): ResponseCode.CONTROLLER_BROKER_ID_INVALID,
             ("g", 2, "127.0.0.1:2", 51): ResponseCode.NO_PERMISSION}
    for args, code in cases.items():
        decision = logic.heartbeat_refusal(*args)
        assert decision is not None and decision.code == code, args


def test_signed_heartbeats_must_come_newer_per_broker():
    hb = BrokerHeartbeatManager()
    assert hb.is_newer("g", 1, 1000) and hb.is_newer("g", 1, None)
    hb.on_heartbeat("c", "g", 1, "127.0.0.1:1", signed_ms=1000)
    assert not hb.is_newer("g", 1, 1000) and not hb.is_newer("g", 1, 999)
    assert hb.is_newer("g", 1, 1001) and hb.is_newer("g", 2, 1)
    hb.remove_group("g")
    assert hb.is_newer("g", 1, 1000)


# --- broker: the lease fits the timeout the controllers apply -----------------------------


class _NoController:
    addresses: tuple[str, ...] = ()


def test_master_lease_shrinks_to_the_shortest_timeout_a_controller_applies(tmp_path):
    cfg = BrokerConfig(controller_addr=["127.0.0.1:1"], store_dir=tmp_path,
                       controller_heartbeat_timeout_ms=6000, master_lease_margin_ms=1600)
    cfg.validate()
    rm = ReplicasManager(cfg, _NoController(), listener=None)  # type: ignore[arg-type]
    assert rm.lease.lease_s == pytest.approx(4.4)
    rm._fit_lease("c1", 6000)
    assert rm.lease.lease_s == pytest.approx(4.4)  # control: nothing capped
    rm._fit_lease("c2", 3000)
    assert rm.lease.lease_s == pytest.approx(1.4)
    rm._fit_lease("c2", 10_000)
    assert rm.lease.lease_s == pytest.approx(4.4)  # never longer than configured
