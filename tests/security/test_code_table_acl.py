"""Every code a broker serves, asked by an application account with and without the permission.

A name server and a broker with ACL on run in the test's loop over real sockets (the
broker's client port guarded as the broker process guards it, ``AclGuard.protect``).  The
account ``app-access`` holds PUB|SUB on topic ``Mine`` and SUB on group ``gMine``, DENY
everything else; ``admin-access`` is an admin.  The admin stores one message in ``Mine``
and one in ``Theirs`` and commits an offset of ``gTheirs``.

For every code served by the broker (:data:`PROBES`, checked to cover them all), the
application asks once for what it may not touch (``Theirs``, ``gTheirs``, the record of
``Theirs`` by its commitlog offset, a send into ``%RETRY%gTheirs``, an admin code) and
must be refused with an answer carrying no data (no body, no header field, no name of the
record's topic it did not name itself), and nothing stored changes; it asks once for its
own and must not be refused.  Listing codes must answer only its own topic and group.

The negative control hands the guard wrong declarations (a record read without its
record check, a send without its topic, a listing without its filter, an admin code open
to applications) and shows the same probes then report each of those codes as a leak.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from test_messaging import Env, LocalBroker

from rmqha.broker.acl_guard import acl_guard
from rmqha.broker.admin_info import BrokerAdminInfo
from rmqha.errors import RemoteCommandError
from rmqha.net.client import RemotingClient
from rmqha.protocol.code_rules import APP, RULES, CodeRule, Server, codes_served_by
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.message import BatchItem, encode_batch, parse_offset_msg_id
from rmqha.security.identity import Identity
from rmqha.security.signature import sign

rc = RequestCode
APP_KEY, APP_SECRET = "app-access", "app-secret-1"
ADMIN_KEY, ADMIN_SECRET = "admin-access", "admin-secret-1"
ACL = f"""\
accounts:
  - accessKey: {APP_KEY}
    secretKey: {APP_SECRET}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Mine=PUB|SUB]
    groupPerms: [gMine=SUB]
  - accessKey: {ADMIN_KEY}
    secretKey: {ADMIN_SECRET}
    admin: true
"""
#: What an ACL refusal's remark says (rmqha.security.acl, rmqha.messaging.context).
REFUSAL = re.compile(r"accessKey=|needs an admin|no declaration|permission for the record")
#: Codes the broker process serves itself (not its messaging service): asked at its guard
#: below (test_the_broker_process_own_codes_by_account_and_certificate).
OWN = {rc.NOTIFY_BROKER_ROLE_CHANGED, rc.GET_BROKER_EPOCH_CACHE, rc.GET_BROKER_HA_STATUS,
       *BrokerAdminInfo.CODES}


@dataclass
class Seeded:
    """Offsets of what the admin stored."""

    mine: int = 0
    theirs: int = 0


@dataclass(frozen=True)
class Request:
    fields: Mapping[str, Any]
    body: bytes = b""
    as_admin: bool = False


@dataclass(frozen=True)
class Probe:
    """One code asked for what the account may not see, and for what it may."""

    code: RequestCode
    forbidden: Callable[[Seeded], Request]
    allowed: Callable[[Seeded], Request]
    #: A listing: the forbidden ask succeeds but must not name Theirs / gTheirs.
    listing: bool = False
    #: What the allowed ask must answer (None: anything but a refusal).
    ok: frozenset[int] | None = frozenset({ResponseCode.SUCCESS})
    name: str = ""


def _props(keys: str) -> str:
    return f"KEYS\x01{keys}\x02"


def _send(topic: str, group: str = "PG") -> Request:
    return Request({"producerGroup": group, "topic": topic, "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0,
                    "flag": 0, "properties": _props("k1"), "reconsumeTimes": 0}, b"payload")


def _send_v2(topic: str, group: str = "PG", batch: bool = False) -> Request:
    body = encode_batch([BatchItem(b"payload", {"KEYS": "k1"})]) if batch else b"payload"
    return Request({"a": group, "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0,
                    "i": "" if batch else _props("k1"), "j": 0, "m": "true" if batch else "false"}, body)


def _pull(topic: str, group: str) -> Request:
    return Request({"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0,
                    "maxMsgNums": 32, "sysFlag": 0, "commitOffset": -1, "suspendTimeoutMillis": 0,
                    "subscription": "*", "subVersion": 0})


def _pop(topic: str, group: str = "gMine") -> Request:
    return Request({"consumerGroup": group, "topic": topic, "queueId": -1, "maxMsgNums": 1,
                    "invisibleTime": 30000, "pollTime": 0, "bornTime": 0, "initMode": 0})


def _ack(topic: str, change: bool = False) -> Request:
    fields = {"consumerGroup": "gMine", "topic": topic, "queueId": 0, "extraInfo": "0 0 0 0 0 b 0 0",
              "offset": 0}
    return Request({**fields, "invisibleTime": 30000} if change else fields)


def _batch_ack(topic: str) -> Request:
    return Request({}, json.dumps({"acks": [{"c": "gMine", "t": topic, "r": "0", "so": 0, "q": 0,
                                             "rq": 0, "pt": 1, "it": 30000, "b": "AQ==",
                                             "rh": ["x"]}]}).encode())


def _queue(topic: str) -> Request:
    return Request({"topic": topic, "queueId": 0, "timestamp": 0})


def _offsets(group: str, topic: str, commit: int | None = None) -> Request:
    fields: dict[str, Any] = {"consumerGroup": group, "topic": topic, "queueId": 0}
    return Request(fields if commit is None else {**fields, "commitOffset": commit})


def _heartbeat(group: str, topic: str) -> Request:
    return Request({}, json.dumps({"clientID": "probe@1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
         "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [],
                                  "subVersion": 0, "expressionType": "TAG"}]}]}).encode())


def _locks(group: str, topic: str) -> Request:
    return Request({}, json.dumps({"consumerGroup": group, "clientId": "probe@1", "onlyThisBroker": False,
                                   "mqSet": [{"topic": topic, "brokerName": "broker-a", "queueId": 0}]}).encode())


def _assignment(topic: str) -> Request:
    return Request({}, json.dumps({"topic": topic, "consumerGroup": "gMine", "clientId": "probe@1",
                                   "strategyName": "AVG", "messageModel": "CLUSTERING"}).encode())


def _admin(code: RequestCode, fields: Mapping[str, Any], body: Any = b"", **kw: Any) -> Probe:
    """An admin-only code: the application asks, then the admin asks the same."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Probe(code, lambda s: Request(fields, raw), lambda s: Request(fields, raw, as_admin=True), **kw)


ANY = None
PROBES: list[Probe] = [
    Probe(rc.SEND_MESSAGE, lambda s: _send("Theirs"), lambda s: _send("Mine")),
    Probe(rc.SEND_MESSAGE_V2, lambda s: _send_v2("Theirs"), lambda s: _send_v2("Mine")),
    Probe(rc.SEND_MESSAGE_V2, lambda s: _send_v2("%RETRY%gTheirs", "gMine"),
          lambda s: _send_v2("%RETRY%gMine", "gMine"), ok=ANY, name="send into another group's retry topic"),
    Probe(rc.SEND_BATCH_MESSAGE, lambda s: _send_v2("Theirs", batch=True), lambda s: _send_v2("Mine", batch=True)),
    Probe(rc.CONSUMER_SEND_MSG_BACK, lambda s: Request({"group": "gMine", "offset": s.theirs, "delayLevel": 0}),
          lambda s: Request({"group": "gMine", "offset": s.mine, "delayLevel": 0})),
    Probe(rc.CONSUMER_SEND_MSG_BACK, lambda s: Request({"group": "gTheirs", "offset": s.mine, "delayLevel": 0}),
          lambda s: Request({"group": "gMine", "offset": s.mine, "delayLevel": 0}), name="send back as another group"),
    Probe(rc.END_TRANSACTION,
          lambda s: Request({"producerGroup": "PG", "commitLogOffset": s.theirs, "commitOrRollback": 8}),
          lambda s: Request({"producerGroup": "PG", "commitLogOffset": s.mine, "commitOrRollback": 8}), ok=ANY),
    Probe(rc.PULL_MESSAGE, lambda s: _pull("Theirs", "gMine"), lambda s: _pull("Mine", "gMine")),
    Probe(rc.LITE_PULL_MESSAGE, lambda s: _pull("Theirs", "gMine"), lambda s: _pull("Mine", "gMine")),
    Probe(rc.PULL_MESSAGE, lambda s: _pull("Mine", "gTheirs"), lambda s: _pull("Mine", "gMine"),
          name="pull as another group"),
    Probe(rc.POP_MESSAGE, lambda s: _pop("Theirs"), lambda s: _pop("Mine"), ok=ANY),
    Probe(rc.ACK_MESSAGE, lambda s: _ack("Theirs"), lambda s: _ack("Mine"), ok=ANY),
    Probe(rc.CHANGE_MESSAGE_INVISIBLETIME, lambda s: _ack("Theirs", True), lambda s: _ack("Mine", True), ok=ANY),
    Probe(rc.BATCH_ACK_MESSAGE, lambda s: _batch_ack("Theirs"), lambda s: _batch_ack("Mine"), ok=ANY),
    Probe(rc.QUERY_MESSAGE, lambda s: Request({"topic": "Theirs", "key": "k1", "maxNum": 32}),
          lambda s: Request({"topic": "Mine", "key": "k1", "maxNum": 32})),
    Probe(rc.VIEW_MESSAGE_BY_ID, lambda s: Request({"offset": s.theirs}), lambda s: Request({"offset": s.mine})),
    Probe(rc.GET_MAX_OFFSET, lambda s: _queue("Theirs"), lambda s: _queue("Mine")),
    Probe(rc.GET_MIN_OFFSET, lambda s: _queue("Theirs"), lambda s: _queue("Mine")),
    Probe(rc.SEARCH_OFFSET_BY_TIMESTAMP, lambda s: _queue("Theirs"), lambda s: _queue("Mine")),
    Probe(rc.GET_EARLIEST_MSG_STORETIME, lambda s: _queue("Theirs"), lambda s: _queue("Mine")),
    Probe(rc.QUERY_CONSUMER_OFFSET, lambda s: _offsets("gTheirs", "Mine"), lambda s: _offsets("gMine", "Mine"),
          ok=ANY),
    Probe(rc.QUERY_CONSUMER_OFFSET, lambda s: _offsets("gMine", "Theirs"), lambda s: _offsets("gMine", "Mine"),
          ok=ANY, name="offset of another topic"),
    Probe(rc.UPDATE_CONSUMER_OFFSET, lambda s: _offsets("gTheirs", "Theirs", 1),
          lambda s: _offsets("gMine", "Mine", 1)),
    Probe(rc.HEART_BEAT, lambda s: _heartbeat("gTheirs", "Mine"), lambda s: _heartbeat("gMine", "Mine")),
    Probe(rc.UNREGISTER_CLIENT, lambda s: Request({"clientID": "probe@1", "consumerGroup": "gTheirs"}),
          lambda s: Request({"clientID": "probe@1", "consumerGroup": "gMine"})),
    Probe(rc.GET_CONSUMER_LIST_BY_GROUP, lambda s: Request({"consumerGroup": "gTheirs"}),
          lambda s: Request({"consumerGroup": "gMine"}), ok=ANY),
    Probe(rc.LOCK_BATCH_MQ, lambda s: _locks("gTheirs", "Mine"), lambda s: _locks("gMine", "Mine")),
    Probe(rc.LOCK_BATCH_MQ, lambda s: _locks("gMine", "Theirs"), lambda s: _locks("gMine", "Mine"),
          name="lock another topic's queue"),
    Probe(rc.UNLOCK_BATCH_MQ, lambda s: _locks("gTheirs", "Mine"), lambda s: _locks("gMine", "Mine")),
    Probe(rc.CHECK_CLIENT_CONFIG, lambda s: Request({}, b'{"group": "gTheirs", "clientId": "probe@1"}'),
          lambda s: Request({}, b'{"group": "gMine", "clientId": "probe@1"}')),
    Probe(rc.QUERY_ASSIGNMENT, lambda s: _assignment("Theirs"), lambda s: _assignment("Mine"), ok=ANY),
    _admin(rc.SET_MESSAGE_REQUEST_MODE, {}, {"topic": "Mine", "consumerGroup": "gMine", "mode": "PULL"}),
    _admin(rc.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, {"groupName": "gNew"}),
    _admin(rc.DELETE_SUBSCRIPTIONGROUP, {"groupName": "gNew"}),
    _admin(rc.UPDATE_AND_CREATE_TOPIC, {
        "topic": "Fresh", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}),
    _admin(rc.DELETE_TOPIC_IN_BROKER, {"topic": "Fresh"}),
    Probe(rc.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, lambda s: Request({}), lambda s: Request({}), listing=True),
    Probe(rc.GET_ALL_TOPIC_CONFIG, lambda s: Request({}), lambda s: Request({}), listing=True),
    # What mqadmin asks (admin accounts only; an admin's answer may be "not online" and such).
    _admin(rc.GET_TOPIC_STATS_INFO, {"topic": "Mine"}, ok=ANY),
    _admin(rc.GET_TOPIC_CONFIG, {"topic": "Mine"}, ok=ANY),
    _admin(rc.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "Mine"}, ok=ANY),
    _admin(rc.GET_CONSUME_STATS, {"consumerGroup": "gMine", "topic": "Mine"}, ok=ANY),
    _admin(rc.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "gMine"}, ok=ANY),
    _admin(rc.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"}, ok=ANY),
    _admin(rc.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "Mine", "group": "gMine", "timestamp": 0, "isForce": "true"},
           ok=ANY),
]


async def _ask(addr: str, code: int, req: Request) -> RemotingCommand:
    key, secret = (ADMIN_KEY, ADMIN_SECRET) if req.as_admin else (APP_KEY, APP_SECRET)
    fields = {k: str(v) for k, v in req.fields.items()}
    async with RemotingClient(addr) as client:
        return await client.request(RemotingCommand.request(code, sign(fields, req.body, key, secret), req.body))


def _label(p: Probe) -> str:
    return p.name or p.code.name


def forbidden_leak(p: Probe, req: Request, resp: RemotingCommand) -> str | None:
    """What the answer to a forbidden ask gave away (None: refused, nothing given)."""
    if p.listing:
        named = [n for n in (b'"Theirs"', b'"gTheirs"', b"%RETRY%gTheirs") if n in resp.body]
        return f"listed {named}" if named or resp.code != ResponseCode.SUCCESS else None
    remark = resp.remark or ""
    asked = json.dumps(dict(req.fields)) + req.body.decode(errors="replace")
    if resp.code == ResponseCode.SUCCESS or not REFUSAL.search(remark):
        return f"not refused: code {resp.code} {remark!r}"
    if resp.body or resp.ext_fields:
        return f"refused with data: body {len(resp.body)} bytes, fields {sorted(resp.ext_fields)}"
    if "Theirs" in remark and "Theirs" not in asked:
        return f"refusal names what the ask did not: {remark!r}"
    return None


def allowed_failure(p: Probe, resp: RemotingCommand) -> str | None:
    """Why the answer to an allowed ask is wrong (None: it is right)."""
    if p.listing:
        return None if b'"Mine"' in resp.body or b'"gMine"' in resp.body else f"lists nothing: {resp.body[:200]!r}"
    if resp.code == ResponseCode.SYSTEM_ERROR and REFUSAL.search(resp.remark or ""):
        return f"refused: {resp.remark}"
    if p.ok is not None and resp.code not in p.ok:
        return f"code {resp.code} {resp.remark!r}"
    return None


async def _seed(b: LocalBroker) -> Seeded:
    admin = Request({}, as_admin=True)
    for topic in ("Mine", "Theirs"):
        created = await _ask(b.address, rc.UPDATE_AND_CREATE_TOPIC, dataclasses.replace(admin, fields={
            "topic": topic, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}))
        assert created.code == ResponseCode.SUCCESS, created.remark
    for group in ("gMine", "gTheirs"):
        made = await _ask(b.address, rc.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                          Request({}, json.dumps({"groupName": group}).encode(), as_admin=True))
        assert made.code == ResponseCode.SUCCESS, made.remark
    seeded = Seeded()
    for topic in ("Mine", "Theirs"):
        sent = await _ask(b.address, rc.SEND_MESSAGE, dataclasses.replace(_send(topic), as_admin=True))
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        setattr(seeded, topic.lower(), parse_offset_msg_id(sent.ext_fields["msgId"])[1])
    committed = await _ask(b.address, rc.UPDATE_CONSUMER_OFFSET,
                           dataclasses.replace(_offsets("gTheirs", "Theirs", 1), as_admin=True))
    assert committed.code == ResponseCode.SUCCESS, committed.remark
    return seeded


@dataclass
class Outcome:
    leaks: dict[str, str] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    log_grew: int = 0
    their_offset: str = ""


async def probe_all(b: LocalBroker, seeded: Seeded, probes: list[Probe], *, allowed: bool = True) -> Outcome:
    out = Outcome()
    before = b.log.max_offset
    for p in probes:
        req = p.forbidden(seeded)
        leak = forbidden_leak(p, req, await _ask(b.address, p.code, req))
        if leak:
            out.leaks[_label(p)] = leak
    out.log_grew = b.log.max_offset - before
    offset = await _ask(b.address, rc.QUERY_CONSUMER_OFFSET,
                        dataclasses.replace(_offsets("gTheirs", "Theirs"), as_admin=True))
    out.their_offset = offset.ext_fields.get("offset", "")
    for p in probes if allowed else []:
        failure = allowed_failure(p, await _ask(b.address, p.code, p.allowed(seeded)))
        if failure:
            out.failures[_label(p)] = failure
    return out


def _run(tmp_path: Path, body: Callable[[LocalBroker, Seeded], Any]) -> Any:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)

    async def main() -> Any:
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            return await body(b, await _seed(b))

    return asyncio.run(asyncio.wait_for(main(), 240))


def test_probes_cover_every_code_the_broker_serves() -> None:
    served = codes_served_by(Server.BROKER) - OWN
    assert sorted(RequestCode(c).name for c in served - {p.code for p in PROBES}) == []


def test_every_code_refuses_without_permission_and_serves_with_it(tmp_path: Path) -> None:
    out = _run(tmp_path, lambda b, s: probe_all(b, s, PROBES))
    assert out.leaks == {}
    assert out.failures == {}
    assert out.log_grew == 0, "a refused ask stored something"
    assert out.their_offset == "1", "a refused ask changed gTheirs' offset"


def _wrong(rules: Mapping[RequestCode, CodeRule]) -> dict[RequestCode, CodeRule]:
    """Declarations with four mistakes: each must show up as a leak."""
    wrong = dict(rules)
    for code in (rc.VIEW_MESSAGE_BY_ID, rc.SEND_MESSAGE_V2, rc.GET_ALL_TOPIC_CONFIG):
        wrong[code] = dataclasses.replace(wrong[code], resources=())
    wrong[rc.DELETE_TOPIC_IN_BROKER] = dataclasses.replace(wrong[rc.DELETE_TOPIC_IN_BROKER], senders=APP)
    return wrong


def test_negative_control_wrong_declarations_show_as_leaks(tmp_path: Path) -> None:
    picked = [p for p in PROBES if p.code in (rc.VIEW_MESSAGE_BY_ID, rc.SEND_MESSAGE_V2,
                                              rc.GET_ALL_TOPIC_CONFIG, rc.DELETE_TOPIC_IN_BROKER, rc.PULL_MESSAGE)]

    async def body(b: LocalBroker, seeded: Seeded) -> tuple[Outcome, Outcome]:
        right = await probe_all(b, seeded, picked, allowed=False)
        assert b.server is not None
        b.server.dispatcher.guard.validator.rules = _wrong(RULES)  # type: ignore[union-attr]
        return right, await probe_all(b, seeded, picked, allowed=False)

    right, wrong = _run(tmp_path, body)
    assert right.leaks == {}
    assert sorted(wrong.leaks) == ["DELETE_TOPIC_IN_BROKER", "GET_ALL_TOPIC_CONFIG", "SEND_MESSAGE_V2",
                                   "VIEW_MESSAGE_BY_ID", "send into another group's retry topic"], wrong.leaks
    assert "pull as another group" not in wrong.leaks and "PULL_MESSAGE" not in wrong.leaks
    assert wrong.log_grew > 0  # the wrongly open send stored its message


def test_the_broker_process_own_codes_by_account_and_certificate(tmp_path: Path) -> None:
    """The three codes the broker process serves itself, at its guard: an application
    account and an application's certificate are refused the epoch cache and the HA status,
    an admin account or a cluster certificate gets them; the controller's role notice
    passes the guard to the checks of its own handler (secret's proof, controller
    certificate), which tests/security/test_notice_channel.py covers."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    guard = acl_guard(acl)

    def conn(identity: Identity | None = None) -> Any:
        return SimpleNamespace(peer="127.0.0.1:1", peer_identity=identity)

    def admitted(code: RequestCode, key: str | None, identity: Identity | None = None) -> bool:
        secret = {APP_KEY: APP_SECRET, ADMIN_KEY: ADMIN_SECRET}.get(key or "", "")
        fields = sign({}, None, key, secret) if key else {}
        try:
            guard(RemotingCommand.request(code, fields), conn(identity))
        except RemoteCommandError:
            return False
        return True

    for code in (rc.GET_BROKER_EPOCH_CACHE, rc.GET_BROKER_HA_STATUS):
        assert not admitted(code, APP_KEY)
        assert not admitted(code, APP_KEY, Identity.client("app"))
        assert admitted(code, ADMIN_KEY)
        assert admitted(code, None, Identity.broker("c", "g", "b0"))
        assert admitted(code, None, Identity.admin("ops"))
    assert admitted(rc.NOTIFY_BROKER_ROLE_CHANGED, None)
    # Negative control: a code the broker does not declare for applications, opened.
    guard.validator.rules = {**RULES, rc.GET_BROKER_EPOCH_CACHE: dataclasses.replace(
        RULES[rc.GET_BROKER_EPOCH_CACHE], senders=APP)}
    assert admitted(rc.GET_BROKER_EPOCH_CACHE, APP_KEY)


def test_codes_the_broker_does_not_serve_give_an_application_nothing(tmp_path: Path) -> None:
    """Every other declared code, asked of the broker by the application account naming
    ``Theirs`` and ``gTheirs`` wherever its declaration looks: refused (by the ACL or as
    not supported), with no body and no header field."""
    others = sorted(set(RULES) - codes_served_by(Server.BROKER))
    fields = {"topic": "Theirs", "consumerGroup": "gTheirs", "group": "gTheirs", "producerGroup": "gTheirs",
              "b": "Theirs", "brokerName": "broker-a", "clusterName": "c", "offset": "0"}

    async def body(b: LocalBroker, seeded: Seeded) -> dict[str, str]:
        gave: dict[str, str] = {}
        for code in others:
            resp = await _ask(b.address, code, Request(fields))
            if resp.code == ResponseCode.SUCCESS or resp.body or resp.ext_fields:
                gave[code.name] = f"code {resp.code}, body {len(resp.body)} bytes, fields {sorted(resp.ext_fields)}"
        return gave

    assert len(others) > 30
    assert _run(tmp_path, body) == {}
