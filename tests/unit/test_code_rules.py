"""Every request code has one declaration (rmqha.protocol.code_rules), and every server
serves exactly the codes its declarations say it serves.

The codes a server serves are read from its dispatcher after it registered its handlers
(a broker's messaging service and its own codes, a name server, a controller, a client's
route table): a code registered without a declaration fails here, naming it, and a
declaration claiming a server that does not register the code fails too.  The negative
controls register a code without a declaration and show both the test's check and the
servers' own start-up check (``require_declared``) catch it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmqha.broker.broker import BROKER_OWN_CODES
from rmqha.client.route import ClientSession
from rmqha.controller.config import ControllerConfig
from rmqha.controller.server import ControllerServer
from rmqha.errors import AclPermissionError, ProtocolError
from rmqha.messaging import MessageService
from rmqha.messaging.context import MessagingConfig
from rmqha.namesrv.config import NamesrvConfig
from rmqha.namesrv.server import NameServer
from rmqha.protocol import request_auth
from rmqha.protocol.code_rules import (
    ADMIN_ONLY_CODES,
    APPEND_CODES,
    RULES,
    Found,
    Kind,
    Named,
    Need,
    Server,
    codes_served_by,
    markdown_table,
    require_declared,
    resources_of,
    topic_resource,
    unclassified,
)
from rmqha.protocol.codes import RequestCode
from rmqha.security.acl import AclConfig, check_request
from rmqha.security.signature import sign
from rmqha.store import CommitLog
from rmqha.testing.local_cluster import free_port


def _broker_codes(tmp_path: Path) -> frozenset[int]:
    log = CommitLog(tmp_path / "commitlog", segment_bytes=1 << 20, prefault=False,
                    store_host=("127.0.0.1", 1))
    svc = MessageService(log, store_dir=tmp_path, config=MessagingConfig(broker_address="127.0.0.1:1"),
                         broker_name="b", broker_id=0, replication=None)
    try:
        return frozenset(int(c) for c in [*svc.handlers(), *svc.immediate_handlers(), *BROKER_OWN_CODES])
    finally:
        svc.close()
        log.close()


def _namesrv_codes() -> frozenset[int]:
    return NameServer(NamesrvConfig(listen_port=free_port())).server.dispatcher.served_codes()


def _controller_codes(tmp_path: Path) -> frozenset[int]:
    config = ControllerConfig(controller_peers=f"n0-127.0.0.1:{free_port()}", controller_self_id="n0",
                              controller_store_path=tmp_path / "c", allow_insecure=True)
    return ControllerServer(config).remoting.dispatcher.served_codes()


def _client_codes() -> frozenset[int]:
    """What a client's connections to brokers answer (a broker's questions)."""
    dispatcher: Any = ClientSession("127.0.0.1:1").client("127.0.0.1:2")._dispatcher
    return frozenset(dispatcher.served_codes())


def _served(tmp_path: Path) -> dict[Server, frozenset[int]]:
    return {Server.BROKER: _broker_codes(tmp_path / "b"), Server.NAMESRV: _namesrv_codes(),
            Server.CONTROLLER: _controller_codes(tmp_path), Server.CLIENT: _client_codes()}


def _mismatches(served: dict[Server, frozenset[int]]) -> list[str]:
    out = [f"{server.name} serves {code} without a declaration"
           for server, codes in served.items() for code in unclassified(codes)]
    for server, codes in served.items():
        declared = codes_served_by(server)
        out += [f"{server.name} serves {RequestCode(c).name} but its declaration says "
                f"{RULES[RequestCode(c)].served_by}" for c in sorted(codes - declared) if c in RULES]
        out += [f"{RequestCode(c).name} declares {server.name}, which does not serve it"
                for c in sorted(declared - codes)]
    return out


def test_every_served_code_is_declared_and_served_where_declared(tmp_path: Path) -> None:
    assert _mismatches(_served(tmp_path)) == []


def test_every_request_code_has_a_declaration() -> None:
    assert [c.name for c in RequestCode if c not in RULES] == []
    assert all(rule.code == code for code, rule in RULES.items())


def test_negative_control_an_undeclared_code_is_listed_and_refused(tmp_path: Path) -> None:
    served = _served(tmp_path)
    served[Server.BROKER] = served[Server.BROKER] | {123456}
    served[Server.NAMESRV] = served[Server.NAMESRV] - {int(RequestCode.GET_BROKER_CLUSTER_INFO)}
    assert _mismatches(served) == ["BROKER serves 123456 without a declaration",
                                   "GET_BROKER_CLUSTER_INFO declares NAMESRV, which does not serve it"]
    with pytest.raises(ProtocolError, match="request code\\(s\\) 123456 without a declaration"):
        require_declared([int(RequestCode.SEND_MESSAGE), 123456], "the broker")
    # The ACL refuses it too, even for an account that may do everything else.
    config = AclConfig.parse("accounts:\n  - accessKey: someone1\n    secretKey: secret-key-1\n"
                             "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: SUB\n")
    with pytest.raises(AclPermissionError, match="request code 123456 has no declaration"):
        check_request(config, 123456, sign({}, None, "someone1", "secret-key-1"), None, "10.0.0.1")


def test_the_old_lists_are_read_from_the_table() -> None:
    """What the broker fences, what needs the secret's proof and what only admins send are
    the declarations' (the values the hand-kept lists had, plus the admin codes)."""
    assert APPEND_CODES == {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
    assert request_auth.NAMESRV_SIGNED_CODES == {RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER}
    assert request_auth.BROKER_SIGNED_CODES == {RequestCode.NOTIFY_BROKER_ROLE_CHANGED}
    assert len(request_auth.CONTROLLER_SIGNED_CODES) == 7
    assert {RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.SET_MESSAGE_REQUEST_MODE,
            RequestCode.GET_BROKER_EPOCH_CACHE, RequestCode.DELETE_SUBSCRIPTIONGROUP} <= ADMIN_ONLY_CODES
    assert RequestCode.PULL_MESSAGE not in ADMIN_ONLY_CODES


def test_every_declared_field_is_a_field_the_request_carries() -> None:
    """A header or body field a declaration names is read by resources_of: a request that
    carries it names its resource (a misspelt field would name nothing and pass)."""
    for code, rule in RULES.items():
        for res in rule.resources:
            if res.found is Found.HEADER:
                named = resources_of(code, {res.field: "X"}, None)
                assert named, (code.name, res.field)
            elif res.found is Found.BODY_FIELD:
                named = resources_of(code, {}, json.dumps({res.field: "X"}).encode())
                assert named, (code.name, res.field)


def test_retry_and_dead_letter_topics_are_their_groups() -> None:
    assert topic_resource("%RETRY%g1", Need.PUB) == Named(Kind.GROUP, "g1", Need.SUB)
    assert topic_resource("%DLQ%g1", Need.PUB) == Named(Kind.GROUP, "g1", Need.SUB)
    assert topic_resource("%RETRY%g1_T", Need.SUB, ("g1",)) == Named(Kind.TOPIC, "T", Need.SUB)
    assert topic_resource("T", Need.PUB) == Named(Kind.TOPIC, "T", Need.PUB)
    # A send into another group's retry topic names that group, whatever the header's group.
    assert resources_of(RequestCode.SEND_MESSAGE_V2, {"a": "mine", "b": "%RETRY%theirs"}, None) == [
        Named(Kind.GROUP, "theirs", Need.SUB)]


def test_queue_lists_in_bodies_name_their_topics() -> None:
    body = json.dumps({"consumerGroup": "g", "clientId": "c", "mqSet": [
        {"topic": "T1", "brokerName": "b", "queueId": 0}, {"topic": "T2", "brokerName": "b", "queueId": 1}]})
    assert resources_of(RequestCode.LOCK_BATCH_MQ, {}, body.encode()) == [
        Named(Kind.GROUP, "g", Need.SUB), Named(Kind.TOPIC, "T1", Need.SUB), Named(Kind.TOPIC, "T2", Need.SUB)]
    with pytest.raises(ProtocolError, match="not a list of queues"):
        resources_of(RequestCode.LOCK_BATCH_MQ, {}, b'{"mqSet": 3}')



def test_docs_list_the_table() -> None:
    """docs/security.md lists the declarations as they are (regenerate the block between
    the code-table markers with ``rmqha.protocol.code_rules.markdown_table()``)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    block = text.split("<!-- code-table:begin", 1)[1].split("-->\n", 1)[1].split("<!-- code-table:end -->")[0]
    assert block == markdown_table()



def test_the_module_docstring_figures_are_the_tables() -> None:
    import rmqha.protocol.code_rules as module
    doc = " ".join((module.__doc__ or "").split())
    served = {s: len(codes_served_by(s)) for s in Server if s.value}
    none = sum(1 for r in RULES.values() if not r.served_by.value)
    for text in (f"Of the {len(RULES)} codes", f"the broker serves {served[Server.BROKER]}",
                 f"name server {served[Server.NAMESRV]}", f"the controller {served[Server.CONTROLLER]}",
                 f"clients {served[Server.CLIENT]}", f"stand for {served[Server.PROXY]}",
                 f"{none} are served by none", f"{len(ADMIN_ONLY_CODES)} are for admin accounts"):
        assert text in doc, text
