"""The proxy's rules without I/O: status mapping, handles, validation, send conversion,
settings, routes, the gRPC signature, the config, and docs/proxy.md listing every key."""
from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from rmqha.client.route import TopicRoute
from rmqha.errors import ConfigError, ProxyError, RemotingError, RemotingTimeoutError
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.idempotence import Claim
from rmqha.protocol.message import decode_batch, decode_properties
from rmqha.protocol.topic_attributes import TopicMessageType
from rmqha.proxy import auth, sends, status
from rmqha.proxy.cluster import Deadline
from rmqha.proxy.config import ProxyConfig, load_proxy_config
from rmqha.proxy.handles import compose_handle, compose_transaction_id, parse_handle, parse_transaction_id
from rmqha.proxy.producing import Producing, _send_command
from rmqha.proxy.routing import assignments, route_queues
from rmqha.proxy.settings import consumer_settings, producer_settings
from rmqha.proxy.status import Code
from rmqha.proxy.validation import check_group, check_invisible_time, check_topic, polling_time
from rmqha.security.acl import AclConfig, Perm

CFG = ProxyConfig(namesrv_addr="127.0.0.1:9876")
REPO = Path(__file__).resolve().parents[2]


def refused(code: Code, fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ProxyError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value.message


# --- status ------------------------------------------------------------------------------------


def test_broker_codes_map_as_rocketmq_proxy() -> None:
    assert status.broker_code(ResponseCode.SUCCESS) == Code.OK
    assert status.broker_code(ResponseCode.SYSTEM_BUSY) == Code.TOO_MANY_REQUESTS
    assert status.broker_code(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST) == Code.CONSUMER_GROUP_NOT_FOUND
    assert status.broker_code(ResponseCode.TOPIC_NOT_EXIST) == Code.TOPIC_NOT_FOUND
    assert status.broker_code(ResponseCode.FLUSH_SLAVE_TIMEOUT) == Code.SLAVE_PERSISTENCE_TIMEOUT
    assert status.broker_code(ResponseCode.SYSTEM_ERROR) == Code.INTERNAL_SERVER_ERROR
    assert status.ack_code(ResponseCode.NO_MESSAGE) == Code.INVALID_RECEIPT_HANDLE
    assert status.transport_error(RemotingTimeoutError("slow"), "x").code == Code.PROXY_TIMEOUT
    assert status.transport_error(RemotingError("gone"), "x").code == Code.INTERNAL_SERVER_ERROR
    assert status.combined([Code.OK, Code.OK]) == Code.OK
    assert status.combined([Code.OK, Code.INVALID_RECEIPT_HANDLE]) == Code.MULTIPLE_RESULTS


def test_codes_mirror_the_generated_enum() -> None:
    for code in Code:
        assert pb.Code.Value(code.name) == code.value


# --- handles -----------------------------------------------------------------------------------


def test_receipt_handle_round_trip_and_refusals() -> None:
    broker = "0 1700000000000 30000 0 1 broker-a 3 17 2 0 T MACMAC"
    handle = parse_handle(compose_handle(broker, 4096))
    assert (handle.broker_handle, handle.broker_name, handle.queue_id, handle.offset,
            handle.commit_offset, handle.pop_time, handle.invisible_time, handle.retry) == (
        broker, "broker-a", 3, 17, 4096, 1700000000000, 30000, "1")
    refused(Code.INVALID_RECEIPT_HANDLE, parse_handle, "not a handle")
    refused(Code.INVALID_RECEIPT_HANDLE, parse_handle, broker)  # no commitlog offset appended
    refused(Code.INVALID_RECEIPT_HANDLE, parse_handle, "0 x 30000 0 1 b q 17 2 0 T M 5")


def test_transaction_id_round_trip_and_refusals() -> None:
    txn = parse_transaction_id(compose_transaction_id(99, "broker-a", "ID#with#hashes"))
    assert (txn.commit_offset, txn.broker_name, txn.broker_txn_id) == (99, "broker-a", "ID#with#hashes")
    for bad in ("", "forged", "x#broker#id", "12##id", "12#b#"):
        refused(Code.INVALID_TRANSACTION_ID, parse_transaction_id, bad)


# --- validation --------------------------------------------------------------------------------


def test_names_and_times() -> None:
    assert check_topic("orders") == "orders"
    for bad in ("", "a b", "x" * 128, "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_anything"):
        refused(Code.ILLEGAL_TOPIC, check_topic, bad)
    assert check_group("billing") == "billing"
    for bad in ("", "a/b", "CID_RMQ_SYS_X"):
        refused(Code.ILLEGAL_CONSUMER_GROUP, check_group, bad)
    assert check_invisible_time(5000, 1000, 10000) == 5000
    refused(Code.ILLEGAL_INVISIBLE_TIME, check_invisible_time, 999, 1000, 10000)
    refused(Code.ILLEGAL_INVISIBLE_TIME, check_invisible_time, 10001, 1000, 10000)
    assert polling_time(30000, None, 3000, 5000, 20000) == 20000
    assert polling_time(None, 8000, 3000, 5000, 20000) == 6500
    assert polling_time(10000, 6000, 3000, 5000, 20000) == 6000
    refused(Code.ILLEGAL_POLLING_TIME, polling_time, 10000, 4000, 3000, 5000, 20000)


# --- sends -------------------------------------------------------------------------------------


def msg(topic: str = "T", body: bytes = b"b", **system: object) -> pb.Message:
    m = pb.Message(body=body)
    m.topic.name = topic
    m.system_properties.message_id = str(system.pop("message_id", "ID1"))
    for key, value in system.items():
        setattr(m.system_properties, key, value)
    return m


def test_send_properties() -> None:
    m = msg(tag="t", message_group="G", message_type=pb.MessageType.FIFO)
    m.system_properties.keys.extend(["k1", "k2"])
    m.user_properties["color"] = "red"
    plan = sends.plan_send([m], "10.0.0.9", CFG, 1000)
    out = plan.messages[0]
    assert out.properties == {"color": "red", "TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "ID1",
                              "PGROUP": "T", "__SHARDINGKEY": "G", "__BORNHOST": "10.0.0.9"}
    assert out.message_type is TopicMessageType.FIFO and plan.sharding_key == "G"
    txn = sends.plan_send([msg(message_type=pb.MessageType.TRANSACTION)], "h", CFG, 0).messages[0]
    assert txn.properties["TRAN_MSG"] == "true" and txn.sys_flag == 4
    delayed = msg()
    delayed.system_properties.delivery_timestamp.FromMilliseconds(5000)
    assert sends.plan_send([delayed], "h", CFG, 0).messages[0].properties["TIMER_DELIVER_MS"] == "5000"


def test_idempotent_sends_carry_the_proxys_claim_and_only_ordinary_ones() -> None:
    """The proxy binds an ordinary send to its queue with its producer id and the queue's
    next sequence (a batch's header and entries alike); a delayed or transactional one
    goes unclaimed; a client may not set the keys, and a delivery does not show them."""

    async def main() -> tuple[list[Claim | None], RemotingCommand, RemotingCommand]:
        producing = Producing(CFG, None)  # type: ignore[arg-type]  # _bind needs no cluster
        delayed = msg()
        delayed.system_properties.delivery_timestamp.FromMilliseconds(5000)
        plans = [sends.plan_send(m, "h", CFG, 0) for m in
                 ([msg()], [msg(), msg(message_id="ID2")], [msg(message_type=pb.MessageType.TRANSACTION)],
                  [delayed])]
        tickets = [await producing._bind(p, "broker-a", 1, Deadline(1.0)) for p in plans]
        return ([t.claim if t else None for t in tickets], _send_command(plans[0], 1),
                _send_command(plans[1], 1))

    claims, single, batch = asyncio.run(main())
    first, second, txn, delayed_claim = claims
    assert first is not None and second is not None and (first.seq, second.seq) == (0, 1)
    assert first.producer == second.producer and txn is None and delayed_claim is None
    assert decode_properties(single.ext_fields["i"])["RMQHA_PRODUCER_SEQ"] == "0"
    assert decode_properties(batch.ext_fields["i"]) == {"RMQHA_PRODUCER_ID": second.producer,
                                                        "RMQHA_PRODUCER_SEQ": "1"}
    assert all(i.properties["RMQHA_PRODUCER_SEQ"] == "1" for i in decode_batch(batch.body))
    forged = msg()
    forged.user_properties["RMQHA_PRODUCER_ID"] = "someone-else"
    refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, sends.plan_send, [forged], "h", CFG, 0)
    off = Producing(ProxyConfig(namesrv_addr="x:1", idempotent_sends=False), None)  # type: ignore[arg-type]
    assert asyncio.run(off._bind(sends.plan_send([msg()], "h", CFG, 0), "broker-a", 1, Deadline(1.0))) is None


def test_send_refusals() -> None:
    big = ProxyConfig(namesrv_addr="x:1", max_message_size=4)
    refused(Code.MESSAGE_BODY_TOO_LARGE, sends.plan_send, [msg(body=b"12345")], "h", big, 0)
    refused(Code.MESSAGE_BODY_EMPTY, sends.plan_send, [msg(body=b"")], "h", CFG, 0)
    refused(Code.MESSAGE_CORRUPTED, sends.plan_send, [], "h", CFG, 0)
    refused(Code.MESSAGE_CORRUPTED, sends.plan_send, [msg("A"), msg("B")], "h", CFG, 0)
    refused(Code.ILLEGAL_MESSAGE_ID, sends.plan_send, [msg(message_id=" ")], "h", CFG, 0)
    refused(Code.ILLEGAL_MESSAGE_TAG, sends.plan_send, [msg(tag="a|b")], "h", CFG, 0)
    refused(Code.ILLEGAL_MESSAGE_GROUP, sends.plan_send, [msg(message_group="g" * 64)], "h", CFG, 0)
    system_key = msg()
    system_key.user_properties["TAGS"] = "x"
    refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, sends.plan_send, [system_key], "h", CFG, 0)
    control = msg()
    control.user_properties["k"] = "bad\x01value"
    refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, sends.plan_send, [control], "h", CFG, 0)
    far = msg()
    far.system_properties.delivery_timestamp.FromMilliseconds(CFG.max_delay_time_mills + 1)
    refused(Code.ILLEGAL_DELIVERY_TIME, sends.plan_send, [far], "h", CFG, 0)
    plan = sends.plan_send([msg(message_group="G")], "h", CFG, 0)
    refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, sends.check_type, plan, TopicMessageType.NORMAL, True)
    sends.check_type(plan, TopicMessageType.NORMAL, False)  # enableTopicMessageTypeCheck off
    sends.check_type(plan, TopicMessageType.MIXED, True)


def test_message_groups_keep_their_queue() -> None:
    assert sends.java_string_hash("hello") == 99162322  # Java's "hello".hashCode()
    assert sends.java_string_hash("polygenelubricants") == -2147483648
    queues = {sends.pick_queue(f"group{i}", 8, turn) for i in range(50) for turn in range(3)}
    assert queues <= set(range(8)) and len(queues) > 4
    for i in range(50):
        assert len({sends.pick_queue(f"group{i}", 8, turn) for turn in range(5)}) == 1
    assert [sends.pick_queue("", 3, turn) for turn in range(4)] == [0, 1, 2, 0]


# --- settings and routes -----------------------------------------------------------------------


def test_settings_answered() -> None:
    client = pb.Settings(client_type=pb.ClientType.PRODUCER)
    out = producer_settings(client, CFG)
    assert out.client_type == pb.ClientType.PRODUCER and out.backoff_policy.max_attempts == 3
    assert out.publishing.max_body_size == CFG.max_message_size and out.publishing.validate_message_type
    consumer = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER)
    consumer.subscription.group.name = "g"
    group = SubscriptionGroupConfig(group_name="g", consume_message_orderly=True, retry_max_times=4)
    out = consumer_settings(consumer, CFG, group)
    assert out.subscription.fifo and out.backoff_policy.max_attempts == 5
    assert out.subscription.long_polling_timeout.seconds == 20
    assert out.backoff_policy.customized_backoff.next[0].seconds == 1


def test_routes_point_at_the_proxy() -> None:
    route = TopicRoute.from_json("T", {
        "queueDatas": [{"brokerName": "b", "readQueueNums": 2, "writeQueueNums": 3, "perm": 6},
                       {"brokerName": "gone", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}],
        "brokerDatas": [{"cluster": "c", "brokerName": "b", "brokerAddrs": {"1": "10.0.0.1:10911"}}]})
    endpoints = pb.Endpoints(addresses=[pb.Address(host="proxy", port=8081)])
    queues = route_queues(route, pb.Resource(name="T"), TopicMessageType.MIXED, endpoints)
    assert [(q.broker.name, q.broker.id, q.id, q.permission) for q in queues] == [
        ("b", 0, 0, pb.Permission.WRITE), ("b", 0, 1, pb.Permission.READ_WRITE),
        ("b", 0, 2, pb.Permission.READ_WRITE)]
    assert len(queues[0].accept_message_types) == 4
    assert [a.message_queue.id for a in assignments(route, pb.Resource(name="T"), False, endpoints)] == [-1]
    assert [a.message_queue.id for a in assignments(route, pb.Resource(name="T"), True, endpoints)] == [0, 1]


# --- the gRPC signature ------------------------------------------------------------------------


ACL = AclConfig.parse("""
globalWhiteRemoteAddresses: [10.9.9.*]
accounts:
  - accessKey: aliceUser
    secretKey: aliceSecret
    defaultTopicPerm: DENY
    topicPerms: [orders=PUB]
    groupPerms: [billing=SUB]
""")


def signed(ak: str, sk: str, date: str = "20240102T030405Z") -> dict[str, str]:
    header = (f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
              f"Signature={auth.signature(sk, date)}")
    return {"authorization": header, "x-mq-date-time": date}


#: The clock of the checks below: the signatures' own time (the window has its own test).
SIGNED_AT = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp()


def test_signature_and_permissions() -> None:
    send = auth.Needs({"orders": Perm.PUB}, {})
    auth.check(ACL, signed("aliceUser", "aliceSecret"), "127.0.0.1", send, now=SIGNED_AT)
    auth.check(ACL, {}, "10.9.9.1", send, now=SIGNED_AT)  # globally white-listed
    cases = [
        (signed("aliceUser", "nope"), send, "check signature failed"),
        (signed("bobUser", "aliceSecret"), send, "no ACL account"),
        ({}, send, "carries no authorization"),
        (signed("aliceUser", "aliceSecret"), auth.Needs({"other": Perm.PUB}, {}), "has no PUB"),
        (signed("aliceUser", "aliceSecret"), auth.Needs({}, {"payroll": Perm.SUB}), "group:payroll"),
        ({"authorization": "Basic abc"}, send, "not MQv2-HMAC-SHA1"),
    ]
    for metadata, needs, why in cases:
        assert why in refused(Code.UNAUTHORIZED, auth.check, ACL, metadata, "127.0.0.1", needs, now=SIGNED_AT)


# --- config and docs ---------------------------------------------------------------------------


def test_rocketmq_proxy_json(tmp_path: Path) -> None:
    path = tmp_path / "rmq-proxy.json"
    path.write_text(json.dumps({"rocketMQClusterName": "C1", "namesrvAddr": "a:1;b:2",
                                "grpcServerPort": 18081, "maxMessageSize": 1024}))
    cfg = load_proxy_config(path)
    assert (cfg.rocketmq_cluster_name, cfg.namesrv_list, cfg.grpc_server_port, cfg.max_message_size) == (
        "C1", ["a:1", "b:2"], 18081, 1024)
    assert cfg.acl_file == tmp_path / "plain_acl.yml"
    for bad, why in [({"grpcServerPort": 1}, "namesrvAddr is required"),
                     ({"namesrvAddr": "a:1", "remotingListenPrt": 8080}, "unknown .* key 'remotingListenPrt'"),
                     ({"namesrvAddr": "a:1", "proxyMode": "LOCAL"}, "proxyMode 'LOCAL' is not supported.*CLUSTER"),
                     ({"namesrvAddr": "a:1", "tlsCertPath": "/etc/cert.pem"}, "tlsCertPath.*tls.server.certPath"),
                     ({"namesrvAddr": "a:1", "maxMessageSize": 0}, "max_message_size")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=why):
            load_proxy_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_proxy_config(path)


def documented_keys(text: str) -> set[str]:
    return set(re.findall(r"^\| `(\w+)` \|", text, re.M))


def test_docs_list_every_key() -> None:
    keys = {f for f in ProxyConfig.__dataclass_fields__}
    text = (REPO / "docs" / "proxy.md").read_text()
    assert keys - documented_keys(text) == set()
    # Negative control: a page without a key's row fails the same check.
    assert keys - documented_keys(text.replace("| `route_ttl_ms` |", "| route_ttl_ms |")) == {"route_ttl_ms"}
