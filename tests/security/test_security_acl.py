"""RocketMQ ACL 1.0 pieces: address patterns, plain_acl.yml, signatures, permissions, reload.

The signature vector below was captured from the official C++ client (rocketmq 0.4.4) with
AccessKey ``RocketMQ`` / secret ``12345678``; test_security_official_client.py captures
live frames.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from pathlib import Path

import pytest

from rmqha.errors import (
    AclAuthenticationError,
    AclError,
    AclPermissionError,
    ConfigError,
)
from rmqha.protocol.code_rules import RULES, CodeRule, Sender
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.security.acl import (
    ROCKETMQ_ADMIN_CODES,
    AclConfig,
    AclValidator,
    Perm,
    check_request,
    perm_allows,
    required_access,
)
from rmqha.security.acl_lane import SendLane
from rmqha.security.address_pattern import AddressPattern
from rmqha.security.signature import mac_for, sign, signature_matches, signed_content

PLAIN_ACL = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""

CPP_ROUTE_REQUEST = {"AccessKey": "RocketMQ", "OnsChannel": "ALIYUN",
                     "Signature": "p8pEJu5L0ZC7GO43xVqziXfrwNQ=", "topic": "TopicA"}


# --- address patterns --------------------------------------------------------------------


@pytest.mark.parametrize("pattern, inside, outside", [
    ("*", ["1.2.3.4", "::1"], []),
    ("*.*.*.*", ["8.8.8.8"], []),
    ("192.168.*.*", ["192.168.0.1", "192.168.255.9"], ["192.169.0.1", "10.0.0.1"]),
    ("192.168.1.*", ["192.168.1.77"], ["192.168.2.77"]),
    ("10.*.*.*", ["10.9.8.7"], ["11.0.0.1"]),
    ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101", "192.168.1.0"]),
    ("192.168.1-3.*", ["192.168.3.200"], ["192.168.4.1"]),
    ("192.168.1.{1,2}", ["192.168.1.1", "192.168.1.2"], ["192.168.1.3"]),
    ("192.168.1.1,192.168.1.5", ["192.168.1.5"], ["192.168.1.2"]),
    ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
    ("2001:db8::1", ["2001:0db8:0:0:0:0:0:1"], ["2001:db8::2"]),
    ("1050:0000:0000:0000:0005:0600:300c:*", ["1050::5:600:300c:326b"], ["1050::5:600:300d:1"]),
    ("1050::5:600:300c:*", ["1050::5:600:300c:1"], ["1051::5:600:300c:1"]),
    ("1050::5:600:300c:1-ff", ["1050::5:600:300c:a0"], ["1050::5:600:300c:100"]),
    ("2::ac5:78:1-200:*", ["2::ac5:78:1ff:ffff"], ["2::ac5:78:201:0"]),
    ("2001:db8::{1,2}", ["2001:db8::2"], ["2001:db8::3"]),
    ("", [], ["127.0.0.1"]),
])
def test_address_patterns_match_what_rocketmq_matches(pattern: str, inside: list[str],
                                                      outside: list[str]) -> None:
    p = AddressPattern.parse(pattern)
    for ip in inside:
        assert p.matches(ip), (pattern, ip)
    for ip in outside:
        assert not p.matches(ip), (pattern, ip)
    assert not p.matches("not-an-ip")


@pytest.mark.parametrize("pattern", [
    "192.168.1", "192.168.*.1", "*.168.1.1", "192.168.1.300", "192.168.1.5-2", "192.168.1.1-x",
    "192.168.1.{}", "192.168.{1,2}.3}", "192.168.1.1,bogus", "hostname", "1050::*:1",
    "1050:*::1-2", "192.168.1.1-300",
])
def test_bad_address_patterns_are_refused_naming_them(pattern: str) -> None:
    with pytest.raises(ConfigError, match="remote address pattern"):
        AddressPattern.parse(pattern)


# --- plain_acl.yml -----------------------------------------------------------------------


def test_rocketmq_sample_file_loads_as_written() -> None:
    config = AclConfig.parse(PLAIN_ACL)
    assert [p.text for p in config.global_white] == ["10.10.103.*", "192.168.0.*"]
    a = config.accounts["RocketMQ"]
    assert a.secret_key == "12345678" and not a.admin and a.white_address.matches_nothing
    assert a.default_topic_perm is Perm.DENY and a.default_group_perm is Perm.SUB
    assert a.perms["topicB"] == Perm.PUB | Perm.SUB and a.perms["%RETRY%groupA"] is Perm.DENY
    assert config.accounts["rocketmq2"].admin
    assert "12345678" not in repr(a)


def test_scalars_stay_the_text_written() -> None:
    text = "accounts:\n  - accessKey: 0123456\n    secretKey: 0777777\n    admin: yes\n"
    account = AclConfig.parse(text).accounts["0123456"]
    assert account.secret_key == "0777777" and account.admin
    assert account.default_topic_perm is Perm.DENY  # missing default perm: DENY


@pytest.mark.parametrize("text, names", [
    ("acounts: []\n", "'acounts'"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    topicPerm: [a=PUB]\n",
     "accounts[0] (accessKey 'RocketMQ'): unknown key(s) 'topicPerm'"),
    ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "accounts[0]: accessKey must have at least 7"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 123\n", "secretKey must have at least 7"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    defaultTopicPerm: PUB,SUB\n",
     "defaultTopicPerm: 'PUB,SUB' is not one of"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    topicPerms: [topicA]\n",
     "topicPerms[0]: 'topicA' is not name=PERM"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    groupPerms: [g=WRITE]\n",
     "groupPerms[0] ('g=WRITE'): 'WRITE'"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    whiteRemoteAddress: 1.2.3\n",
     "whiteRemoteAddress: remote address pattern '1.2.3'"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    admin: maybe\n", "admin: 'maybe'"),
    ("accounts:\n  - {accessKey: RocketMQ, secretKey: 12345678}\n  - {accessKey: RocketMQ, secretKey: 87654321}\n",
     "accounts[1] repeats accessKey 'RocketMQ'"),
    ("globalWhiteRemoteAddresses: [1.2.3.4, 300.1.1.1]\n", "globalWhiteRemoteAddresses[1]"),
    ("accounts: [\n", "not valid YAML"),
    ("- just\n- a list\n", "top level must be a mapping"),
])
def test_bad_files_are_refused_naming_the_entry(text: str, names: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(names)) as info:
        AclConfig.parse(text, "acl.yml")
    assert "acl.yml" in str(info.value)
    assert "12345678" not in str(info.value) and "87654321" not in str(info.value)


def test_empty_file_has_no_accounts() -> None:
    assert AclConfig.parse("").accounts == {}


# --- signatures --------------------------------------------------------------------------


def test_signature_of_a_captured_cpp_client_request() -> None:
    assert signature_matches(CPP_ROUTE_REQUEST, b"", "12345678")
    assert not signature_matches(CPP_ROUTE_REQUEST, b"", "12345679")
    assert not signature_matches({**CPP_ROUTE_REQUEST, "topic": "TopicB"}, b"", "12345678")
    # The content is the values in key order, Signature left out, then the body.
    assert signed_content(CPP_ROUTE_REQUEST, b"BODY") == b"RocketMQALIYUNTopicABODY"


def test_sign_round_trips_and_covers_the_body() -> None:
    fields = sign({"b": "TopicA", "a": "PG", "Signature": "stale"}, b"hello", "RocketMQ", "12345678")
    assert fields["AccessKey"] == "RocketMQ" and fields["Signature"] != "stale"
    assert signature_matches(fields, b"hello", "12345678")
    assert not signature_matches(fields, b"hellO", "12345678")
    assert not signature_matches({k: v for k, v in fields.items() if k != "Signature"}, b"hello", "12345678")
    tokened = sign({}, None, "RocketMQ", "12345678", security_token="tok")
    assert tokened["SecurityToken"] == "tok" and signature_matches(tokened, None, "12345678")


def test_old_clients_sign_without_unique_key_query() -> None:
    fields = sign({"topic": "T", "key": "k"}, None, "RocketMQ", "12345678")
    fields["_UNIQUE_KEY_QUERY"] = "true"  # added after signing, as clients <= 4.9.3 did
    assert signature_matches(fields, None, "12345678", version=400)
    assert not signature_matches(fields, None, "12345678", version=401)
    assert not signature_matches(fields, None, "12345678")


def test_keys_sort_in_java_string_order() -> None:
    # U+FF5E sorts after U+1F600 in UTF-16 code units (Java), before it in code points.
    fields = {"\U0001F600": "x", "\uff5e": "y"}
    assert signed_content(fields, None) == b"xy"


# --- permissions -------------------------------------------------------------------------


def _rocketmq_rules() -> dict[RequestCode, CodeRule]:
    """The declarations with RocketMQ's five admin codes only (what the negative controls
    below run with: the same accounts then may send rmqha's further admin codes)."""
    return {c: r if c in ROCKETMQ_ADMIN_CODES or not r.admin_only
            else dataclasses.replace(r, senders=r.senders | Sender.APPLICATION)
            for c, r in RULES.items()}


def test_refusals_answer_rocketmqs_code() -> None:
    assert AclError("x").response_code == ResponseCode.SYSTEM_ERROR


def test_perm_rules() -> None:
    assert perm_allows(Perm.PUB, Perm.PUB | Perm.SUB)
    assert not perm_allows(Perm.PUB, Perm.SUB)
    assert not perm_allows(Perm.SUB, Perm.DENY | Perm.SUB)
    assert perm_allows(Perm.ANY, Perm.SUB) and not perm_allows(Perm.ANY, Perm.DENY)


def test_required_access_per_request_code() -> None:
    def need(code: int, fields: dict[str, str], body: bytes | None = None) -> dict[str, Perm]:
        return dict(required_access(code, fields, body).resources)

    assert need(RequestCode.SEND_MESSAGE, {"topic": "T", "producerGroup": "PG"}) == {"T": Perm.PUB}
    assert need(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "T"}) == {"T": Perm.PUB}
    assert need(RequestCode.SEND_BATCH_MESSAGE, {"a": "PG", "b": "T"}) == {"T": Perm.PUB}
    assert need(RequestCode.SEND_MESSAGE_V2, {"a": "CG", "b": "%RETRY%CG"}) == {"%RETRY%CG": Perm.SUB}
    assert need(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "CG"}) == {
        "T": Perm.SUB, "%RETRY%CG": Perm.SUB}
    assert need(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "CG", "offset": "1"}) == {"%RETRY%CG": Perm.SUB}
    assert need(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "CG", "topic": "T"}) == {
        "%RETRY%CG": Perm.SUB, "T": Perm.SUB}
    assert need(RequestCode.QUERY_MESSAGE, {"topic": "T"}) == {"T": Perm.SUB}
    assert need(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"}) == {"%RETRY%CG": Perm.SUB}
    assert need(RequestCode.UNREGISTER_CLIENT, {"producerGroup": "PG", "consumerGroup": ""}) == {}
    assert need(RequestCode.UNREGISTER_CLIENT, {"consumerGroup": "CG"}) == {"%RETRY%CG": Perm.SUB}
    heartbeat = json.dumps({"clientID": "c", "producerDataSet": [{"groupName": "PG"}],
                            "consumerDataSet": [{"groupName": "CG", "subscriptionDataSet": [
                                {"topic": "T1"}, {"topic": "T2"}]}]}).encode()
    assert need(RequestCode.HEART_BEAT, {}, heartbeat) == {"%RETRY%CG": Perm.SUB, "T1": Perm.SUB, "T2": Perm.SUB}
    assert need(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}) == {"T": Perm.ANY}
    with pytest.raises(AclError, match="request code 34: the body is not JSON"):
        need(RequestCode.HEART_BEAT, {}, b"{not json")


def _batch_body(*entries: tuple[str, str], long_names: bool = False) -> bytes:
    """A BatchAckMessageRequestBody naming (group, topic) per entry."""
    g, t = ("consumerGroup", "topic") if long_names else ("c", "t")
    return json.dumps({"brokerName": "broker-a", "acks": [
        {g: group, t: topic, "r": "0", "so": 5, "q": 0, "rq": 0, "pt": 1, "it": 30000,
         "b": "AQ==", "rh": ["handle"]} for group, topic in entries]}).encode()


@pytest.mark.parametrize("code", [RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE,
                                  RequestCode.CHANGE_MESSAGE_INVISIBLETIME])
def test_pop_codes_need_sub_on_topic_and_group(code: RequestCode) -> None:
    def need(fields: dict[str, str]) -> dict[str, Perm]:
        return dict(required_access(code, fields, None).resources)

    assert need({"consumerGroup": "CG", "topic": "T", "queueId": "-1"}) == {
        "T": Perm.SUB, "%RETRY%CG": Perm.SUB}
    # A redelivered message comes from the group's pop retry topic: it stands for T.
    assert need({"consumerGroup": "CG", "topic": "%RETRY%CG_T"}) == {
        "T": Perm.SUB, "%RETRY%CG": Perm.SUB}
    assert need({"consumerGroup": "CG", "topic": "%RETRY%CG+T"}) == {
        "T": Perm.SUB, "%RETRY%CG": Perm.SUB}
    # Another group's retry topic is that group's: checked as it.
    assert need({"consumerGroup": "CG", "topic": "%RETRY%other_T"}) == {
        "%RETRY%other_T": Perm.SUB, "%RETRY%CG": Perm.SUB}
    assert need({"consumerGroup": "CG", "topic": "%RETRY%CG"}) == {"%RETRY%CG": Perm.SUB}


def test_batch_ack_needs_sub_on_every_entry() -> None:
    def need(body: bytes | None) -> dict[str, Perm]:
        return dict(required_access(RequestCode.BATCH_ACK_MESSAGE, {}, body).resources)

    assert need(_batch_body(("CG", "T1"), ("CG2", "%RETRY%CG2_T2"))) == {
        "T1": Perm.SUB, "%RETRY%CG": Perm.SUB, "T2": Perm.SUB, "%RETRY%CG2": Perm.SUB}
    assert need(_batch_body(("CG", "T1"), long_names=True)) == {
        "T1": Perm.SUB, "%RETRY%CG": Perm.SUB}
    for bad in [b"{not json", b"[]", b'{"acks": 3}', b'{"acks": [{"c": "CG"}]}',
                b'{"acks": [{"c": 1, "t": "T"}]}', b'{"acks": ["x"]}', None]:
        with pytest.raises(AclError, match=r"request code 200151: .* \(read for the ACL check\)"):
            need(bad)


def test_pop_requests_are_checked_against_the_accounts_perms() -> None:
    config = AclConfig.parse(PLAIN_ACL)

    def check(code: int, fields: dict[str, str], body: bytes | None = None) -> None:
        check_request(config, *_signed(code, fields, body), "172.16.0.9")

    pop = {"consumerGroup": "groupC", "topic": "topicC", "queueId": "-1", "maxMsgNums": "32",
           "invisibleTime": "30000"}
    check(RequestCode.POP_MESSAGE, pop)
    check(RequestCode.ACK_MESSAGE, {**pop, "topic": "%RETRY%groupC_topicC"})
    check(RequestCode.BATCH_ACK_MESSAGE, {}, _batch_body(("groupC", "topicC"), ("groupB", "topicB")))
    for code in (RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
        with pytest.raises(AclPermissionError, match="no SUB permission for topic:topicA"):
            check(code, {**pop, "topic": "topicA"})
        with pytest.raises(AclPermissionError, match="no SUB permission for group:groupA"):
            check(code, {**pop, "consumerGroup": "groupA"})
        with pytest.raises(AclPermissionError, match="no SUB default permission for topic:other"):
            check(code, {**pop, "topic": "other"})
    # One entry the account may not settle refuses the whole batch.
    with pytest.raises(AclPermissionError, match="no SUB permission for topic:topicA"):
        check(RequestCode.BATCH_ACK_MESSAGE, {}, _batch_body(("groupC", "topicC"), ("groupC", "topicA")))
    with pytest.raises(AclPermissionError, match="no SUB permission for group:groupA"):
        check(RequestCode.BATCH_ACK_MESSAGE, {}, _batch_body(("groupA", "topicC")))


@pytest.mark.parametrize("code", [RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                  RequestCode.DELETE_SUBSCRIPTIONGROUP])
@pytest.mark.parametrize("rocketmq", [True, False])
def test_subscription_group_changes_need_an_admin(code: RequestCode, rocketmq: bool) -> None:
    config = AclConfig.parse(PLAIN_ACL)
    kw = {"rules": _rocketmq_rules()} if rocketmq else {}
    body = json.dumps({"groupName": "groupB"}).encode()
    fields = {"groupName": "groupB"}
    # groupB is PUB|SUB for RocketMQ, yet changing the group is an admin's.
    with pytest.raises(AclPermissionError, match=f"request code {int(code)} needs an admin"):
        check_request(config, *_signed(code, fields, body), "172.16.0.9", **kw)
    check_request(config, *_signed(code, fields, body, ak="rocketmq2"), "172.16.0.9", **kw)
    # Negative control: the same account lists the groups (not an admin code).
    check_request(config, *_signed(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}), "172.16.0.9",
                  **kw)


def test_request_mode_change_needs_an_admin() -> None:
    """SET_MESSAGE_REQUEST_MODE changes how a group's consumers are assigned queues: an
    admin's, as rmqha keeps it; QUERY_ASSIGNMENT is any signed account's."""
    config = AclConfig.parse(PLAIN_ACL)
    body = json.dumps({"topic": "topicB", "consumerGroup": "groupB", "mode": "POP"}).encode()
    mode = _signed(RequestCode.SET_MESSAGE_REQUEST_MODE, {}, body)
    with pytest.raises(AclPermissionError, match="request code 401 needs an admin"):
        check_request(config, *mode, "172.16.0.9")
    check_request(config, *_signed(RequestCode.SET_MESSAGE_REQUEST_MODE, {}, body, ak="rocketmq2"), "172.16.0.9")
    check_request(config, *_signed(RequestCode.QUERY_ASSIGNMENT, {}, body), "172.16.0.9")
    # Negative control: with RocketMQ's own admin codes the same account may change it.
    check_request(config, *mode, "172.16.0.9", rules=_rocketmq_rules())


def _signed(code: int, fields: dict[str, str], body: bytes | None = None,
            ak: str = "RocketMQ", sk: str = "12345678") -> tuple[int, dict[str, str], bytes | None]:
    return code, sign(fields, body, ak, sk), body


def test_check_follows_rocketmqs_order() -> None:
    config = AclConfig.parse(PLAIN_ACL)

    def check(request: tuple[int, dict[str, str], bytes | None], ip: str = "172.16.0.9") -> None:
        check_request(config, *request, ip, rules=_rocketmq_rules())

    check(_signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicB"}, b"x"))
    check(_signed(RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupC"}))
    check(_signed(RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupD"}))  # default SUB
    with pytest.raises(AclPermissionError, match="no PUB permission for topic:topicC"):
        check(_signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicC"}))
    with pytest.raises(AclPermissionError, match="no PUB default permission for topic:other"):
        check(_signed(RequestCode.SEND_MESSAGE, {"topic": "other", "producerGroup": "PG"}))
    with pytest.raises(AclPermissionError, match="no SUB permission for group:groupA"):
        check(_signed(RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupA"}))
    with pytest.raises(AclPermissionError, match="needs an admin account"):
        check(_signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "new"}))
    # The trace topic is open to any signed account.
    check(_signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "RMQ_SYS_TRACE_TOPIC"}))
    # Admin account: every code and resource, signature still checked outside its white list.
    check(_signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "new"}, ak="rocketmq2"))
    with pytest.raises(AclAuthenticationError, match="check signature failed for accessKey=rocketmq2"):
        check(_signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "new"}, ak="rocketmq2", sk="wrong-secret"))
    # Its white address skips the signature; the global white list skips everything.
    check(_signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "new"}, ak="rocketmq2", sk="wrong-secret"),
          ip="192.168.1.20")
    check((RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "new"}, None), ip="10.10.103.5")
    with pytest.raises(AclAuthenticationError, match="carries no AccessKey"):
        check((RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicB"}, None))
    with pytest.raises(AclAuthenticationError, match="no ACL account for accessKey=nobody12"):
        check(_signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicB"}, ak="nobody12"))
    unsigned = {"AccessKey": "RocketMQ", "a": "PG", "b": "topicB"}
    with pytest.raises(AclAuthenticationError, match="carries no Signature"):
        check((RequestCode.SEND_MESSAGE_V2, unsigned, None))


def test_rmqha_keeps_more_codes_for_admins() -> None:
    config = AclConfig.parse(PLAIN_ACL)
    reset = _signed(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "topicB", "group": "groupB"})
    check_request(config, *reset, "172.16.0.9", rules=_rocketmq_rules())
    with pytest.raises(AclPermissionError, match="request code 222 needs an admin account") as info:
        check_request(config, *reset, "172.16.0.9")
    assert info.value.response_code == ResponseCode.SYSTEM_ERROR and "12345678" not in str(info.value)


# --- the validator and its reload --------------------------------------------------------


def _rewrite(path: Path, text: str) -> None:
    before = path.stat().st_mtime_ns
    path.write_text(text)
    # Make the change visible even where mtime is coarse.
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def test_validator_reloads_good_files_and_keeps_accounts_on_bad_ones(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(PLAIN_ACL)
    v = AclValidator(path, recheck_interval_s=0)
    request = _signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicB"}, b"x", ak="newcomer",
                      sk="newcomer-secret")
    with pytest.raises(AclAuthenticationError, match="no ACL account for accessKey=newcomer"):
        v.check(*request, "172.16.0.9")

    _rewrite(path, PLAIN_ACL + "  - accessKey: newcomer\n    secretKey: newcomer-secret\n"
                               "    defaultTopicPerm: PUB\n")
    v.check(*request, "172.16.0.9")

    caplog.set_level(logging.ERROR, logger="rmqha.security.acl")
    _rewrite(path, "accounts:\n  - accessKey: newcomer\n    secretKey: newcomer-secret\n    bogus: 1\n")
    v.check(*request, "172.16.0.9")  # the old accounts still hold
    assert "unknown key(s) 'bogus'" in caplog.text and "keeping the 3 account(s)" in caplog.text
    assert "newcomer-secret" not in caplog.text
    v.check(*request, "172.16.0.9")
    assert caplog.text.count("unknown key(s)") == 1  # logged once per version of the file

    path.unlink()
    v.check(*request, "172.16.0.9")
    path.write_text("accounts: []\n")
    with pytest.raises(AclAuthenticationError):
        v.check(*request, "172.16.0.9")


def test_validator_checks_the_file_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(PLAIN_ACL)
    v = AclValidator(path, recheck_interval_s=3600)
    _rewrite(path, "accounts: []\n")
    request = _signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicB"})
    v.check(*request, "172.16.0.9")  # not looked at yet
    assert v.reload_if_changed()
    with pytest.raises(AclAuthenticationError):
        v.check(*request, "172.16.0.9")


def test_validator_needs_a_readable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        AclValidator(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("accounts: 3\n")
    with pytest.raises(ConfigError, match="accounts must be a list"):
        AclValidator(bad)


def test_sends_into_a_groups_retry_or_dead_letter_topic_need_the_groups_sub(tmp_path: Path) -> None:
    """An account that may publish anywhere still may not write into another group's retry
    or dead-letter topic: the topic names the group, whatever the header's group says; the
    plain-send lane leaves such sends to the ordinary check."""
    text = ("accounts:\n  - accessKey: anywhere1\n    secretKey: anywhere-secret\n"
            "    defaultTopicPerm: PUB\n    defaultGroupPerm: DENY\n    groupPerms: [mine=SUB]\n")
    config = AclConfig.parse(text)

    def send(topic: str) -> tuple[int, dict[str, str], bytes | None]:
        return _signed(RequestCode.SEND_MESSAGE_V2, {"a": "mine", "b": topic}, b"x",
                       ak="anywhere1", sk="anywhere-secret")

    for topic in ("%RETRY%theirs", "%DLQ%theirs"):
        with pytest.raises(AclPermissionError, match="no SUB default permission for group:theirs"):
            check_request(config, *send(topic), "172.16.0.9")
    for topic in ("%RETRY%mine", "%DLQ%mine", "anyTopic"):  # negative control: the same sends pass
        check_request(config, *send(topic), "172.16.0.9")
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    lane = SendLane(AclValidator(path))
    mac = mac_for("anywhere-secret")

    def admits(topic: str) -> bool:
        fields = f"anywhere1mine{topic}".encode()
        return lane.admits("anywhere1", topic, mac.base64(fields, b"x"), fields, b"x", {},
                           "172.16.0.9")

    assert admits("anyTopic")
    assert not admits("%DLQ%theirs") and not admits("%RETRY%theirs")
