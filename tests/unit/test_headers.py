"""Request headers as the clients send them: send headers by V1 long names and V2 letters,
every other request's header class built to its wire fields and parsed back, the
HEART_BEAT body, and the errors that name a missing or malformed field."""
from __future__ import annotations

from typing import Any

import pytest

from rmqha.errors import ProtocolError
from rmqha.protocol import headers
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import SendHeader


def test_v2_letters_and_v1_names_read_the_same_send() -> None:
    v2 = SendHeader.parse({"a": "pg", "b": "T", "e": "3", "f": "4", "g": "1700000000000",
                              "h": "7", "i": "KEYS\x01k\x02", "j": "2", "m": "true",
                              "l": "16"}, v2=True)
    v1 = SendHeader.parse({"producerGroup": "pg", "topic": "T", "queueId": "3",
                              "sysFlag": "4", "bornTimestamp": "1700000000000", "flag": "7",
                              "properties": "KEYS\x01k\x02", "reconsumeTimes": "2",
                              "batch": "1", "maxReconsumeTimes": "16"}, v2=False)
    assert v2 == v1 == SendHeader("pg", "T", 3, 4, 1700000000000, 7, "KEYS\x01k\x02", 2, True, 16)


def test_absent_or_empty_fields_take_their_defaults() -> None:
    h = SendHeader.parse({"b": "T", "e": "", "f": "", "m": ""}, v2=True)
    assert (h.producer_group, h.queue_id, h.sys_flag, h.born_timestamp, h.flag,
            h.properties, h.reconsume_times, h.batch, h.max_reconsume_times) == (
        "", -1, 0, 0, 0, "", 0, False, None)
    assert SendHeader.parse({"b": "T", "m": "false", "l": "x"}, v2=True).batch is False


@pytest.mark.parametrize(("ext", "named"), [
    ({"e": "1"}, "'b' is missing"),
    ({"b": "T", "e": "one"}, "'e' is not an integer: 'one'"),
    ({"b": "T", "g": "1.5"}, "'g' is not an integer: '1.5'"),
    ({"b": "T", "j": "0x1"}, "'j' is not an integer"),
    ({"b": "T", "l": "--5"}, "'l' is not an integer: '--5'"),
])
def test_a_malformed_field_is_named(ext: dict[str, str], named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        SendHeader.parse(ext, v2=True)


# --- build and parse, one class per request ------------------------------------------------

H = headers
#: Each header with the ext fields it travels as, in order (what rmqha's client sent as
#: literal dicts before these classes, and what RocketMQ's headers name the fields).
CASES = [
    (H.PullHeader(consumer_group="G", topic="T", queue_id=3, queue_offset=17, max_msg_nums=32,
                  sys_flag=6, commit_offset=0, suspend_timeout_ms=15000, subscription="a || b"),
     {"consumerGroup": "G", "topic": "T", "queueId": "3", "queueOffset": "17",
      "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "15000",
      "subscription": "a || b", "subVersion": "0"}),
    (H.QueryConsumerOffsetHeader(consumer_group="G", topic="T", queue_id=1),
     {"consumerGroup": "G", "topic": "T", "queueId": "1"}),
    (H.QueryConsumerOffsetHeader(consumer_group="G", topic="T", queue_id=1,
                                 set_zero_if_not_found=False),
     {"consumerGroup": "G", "topic": "T", "queueId": "1", "setZeroIfNotFound": "false"}),
    (H.UpdateConsumerOffsetHeader(consumer_group="G", topic="T", queue_id=2, commit_offset=99),
     {"consumerGroup": "G", "topic": "T", "queueId": "2", "commitOffset": "99"}),
    (H.ConsumerListHeader(consumer_group="G"), {"consumerGroup": "G"}),
    (H.ConsumerIdsChangedHeader(consumer_group="G"), {"consumerGroup": "G"}),
    (H.UnregisterClientHeader(client_id="1.2.3.4@9#1", consumer_group="G"),
     {"clientID": "1.2.3.4@9#1", "consumerGroup": "G", "producerGroup": ""}),
    (H.EndTransactionHeader(producer_group="PG", tran_state_table_offset=5,
                            commit_log_offset=4096, commit_or_rollback=8,
                            from_transaction_check=False, msg_id="ID", transaction_id="ID"),
     {"producerGroup": "PG", "tranStateTableOffset": "5", "commitLogOffset": "4096",
      "commitOrRollback": "8", "fromTransactionCheck": "false", "msgId": "ID",
      "transactionId": "ID"}),
    (H.CheckTransactionStateHeader(tran_state_table_offset=5, commit_log_offset=4096,
                                   msg_id="ID", transaction_id="TX", offset_msg_id="OFF",
                                   topic="T", broker_name="broker-a"),
     {"tranStateTableOffset": "5", "commitLogOffset": "4096", "msgId": "ID",
      "transactionId": "TX", "offsetMsgId": "OFF", "topic": "T", "brokerName": "broker-a"}),
    (H.QueryMessageHeader(topic="T", key="k", max_num=32, begin_timestamp=0,
                          end_timestamp=2**63 - 1),
     {"topic": "T", "key": "k", "maxNum": "32", "beginTimestamp": "0",
      "endTimestamp": str(2**63 - 1)}),
    (H.QueryMessageHeader(topic="T", key="UID", max_num=32, begin_timestamp=1,
                          end_timestamp=2, unique_key=True),
     {"topic": "T", "key": "UID", "maxNum": "32", "beginTimestamp": "1",
      "endTimestamp": "2", "_UNIQUE_KEY_QUERY": "true"}),
    (H.ViewMessageHeader(offset=123456), {"offset": "123456"}),
    (H.RouteInfoHeader(topic="T"), {"topic": "T"}),
    (H.CreateTopicHeader(topic="T", read_queue_nums=8, write_queue_nums=4, perm=6),
     {"topic": "T", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "4",
      "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}),
    (H.CreateTopicHeader(topic="T", read_queue_nums=8, write_queue_nums=8, perm=6,
                         admin_token="secret"),
     {"topic": "T", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "8",
      "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
      "adminToken": "secret"}),
    (H.DeleteTopicHeader(topic="T"), {"topic": "T"}),
]


@pytest.mark.parametrize(("header", "ext"), CASES, ids=lambda c: type(c).__name__)
def test_each_header_builds_its_wire_fields_and_parses_them_back(header: Any,
                                                                 ext: dict[str, str]) -> None:
    built = header.build()
    assert list(built.items()) == list(ext.items())  # names, values and order
    assert type(header).parse(ext) == header
    # What a request carries is the same ext fields (every value a string already).
    assert RemotingCommand.request(1, built).ext_fields == ext


def test_absent_optional_fields_take_their_defaults() -> None:
    pull = H.PullHeader.parse({"consumerGroup": "G", "topic": "T", "queueId": "0",
                               "queueOffset": "5", "maxMsgNums": "", "sysFlag": ""})
    assert (pull.max_msg_nums, pull.sys_flag, pull.commit_offset, pull.suspend_timeout_ms,
            pull.subscription, pull.sub_version) == (32, 0, -1, 0, None, 0)
    end = H.EndTransactionHeader.parse({"producerGroup": "PG", "commitLogOffset": "7",
                                        "commitOrRollback": "12"})
    assert (end.tran_state_table_offset, end.from_transaction_check, end.msg_id,
            end.transaction_id) == (0, False, "", None)
    create = H.CreateTopicHeader.parse({"topic": "T"})
    assert (create.read_queue_nums, create.write_queue_nums, create.perm, create.order) == (
        8, None, 6, False)
    assert H.UnregisterClientHeader.parse({}) == H.UnregisterClientHeader()
    query = H.QueryMessageHeader.parse({"topic": "T", "key": "k"})
    assert (query.max_num, query.begin_timestamp, query.end_timestamp, query.unique_key) == (
        0, 0, 2**63 - 1, None)


@pytest.mark.parametrize(("value", "parsed"), [
    ("true", True), ("TRUE", True), ("1", True), (" true ", True),
    ("false", False), ("0", False), ("no", False), ("", None)])
def test_booleans_read_as_java_and_cpp_write_them(value: str, parsed: bool | None) -> None:
    h = H.QueryConsumerOffsetHeader.parse({"consumerGroup": "G", "topic": "T", "queueId": "0",
                                           "setZeroIfNotFound": value})
    assert h.set_zero_if_not_found is parsed


@pytest.mark.parametrize(("cls", "ext", "named"), [
    (H.PullHeader, {"consumerGroup": "G", "topic": "T", "queueOffset": "0"},
     "'queueId' is missing"),
    (H.PullHeader, {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "x"},
     "'queueOffset' is not an integer: 'x'"),
    (H.PullHeader, {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "1",
                    "maxMsgNums": "3.5"}, "'maxMsgNums' is not an integer: '3.5'"),
    (H.UpdateConsumerOffsetHeader, {"consumerGroup": "G", "topic": "T", "queueId": "1"},
     "'commitOffset' is missing"),
    (H.UpdateConsumerOffsetHeader, {"consumerGroup": "G", "topic": "T", "queueId": "1",
                                    "commitOffset": ""}, "'commitOffset' is missing"),
    (H.QueryConsumerOffsetHeader, {"topic": "T", "queueId": "1"}, "'consumerGroup' is missing"),
    (H.ConsumerListHeader, {}, "'consumerGroup' is missing"),
    (H.EndTransactionHeader, {"commitLogOffset": "1", "commitOrRollback": "8"},
     "'producerGroup' is missing"),
    (H.EndTransactionHeader, {"producerGroup": "PG", "commitLogOffset": "1",
                              "commitOrRollback": "commit"},
     "'commitOrRollback' is not an integer: 'commit'"),
    (H.QueryMessageHeader, {"topic": "T"}, "'key' is missing"),
    (H.ViewMessageHeader, {"offset": "0x10"}, "'offset' is not an integer: '0x10'"),
    (H.CreateTopicHeader, {"topic": "T", "perm": "rw"}, "'perm' is not an integer: 'rw'"),
    (H.RouteInfoHeader, {"Topic": "T"}, "'topic' is missing"),
])
def test_a_missing_or_malformed_field_is_named(cls: Any, ext: dict[str, str],
                                               named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        cls.parse(ext)


def test_send_header_builds_what_it_parses_by_letters_or_names() -> None:
    h = SendHeader("pg", "T", 3, 4, 1700000000000, 7, "KEYS\x01k\x02", 2, True, 16)
    v2, v1 = h.build(), h.build(v2=False)
    assert list(v2) == ["a", "b", "c", "d", "f", "g", "h", "i", "j", "k", "m", "l", "e"]
    assert (v2["c"], v2["d"], v2["k"]) == ("TBW102", "4", "false")
    assert v1["producerGroup"] == "pg" and v1["queueId"] == "3" and v1["batch"] == "true"
    assert SendHeader.parse(v2, v2=True) == SendHeader.parse(v1, v2=False) == h
    # The producer's per-send fields are build()'s without the queue id (added per attempt).
    fields = SendHeader.fields("pg", "T", 4, 1700000000000, 7, "KEYS\x01k\x02", True, 2)
    assert {**fields, "l": "16", headers.SEND_V2_QUEUE_ID: "3"} == v2
    assert SendHeader.parse({**fields, "e": "-1"}, v2=True) == SendHeader(
        "pg", "T", -1, 4, 1700000000000, 7, "KEYS\x01k\x02", 2, True, None)


def test_heartbeat_body_round_trips_and_reads_what_clients_send() -> None:
    hb = H.HeartbeatData("c1", [H.ConsumerData("G", [H.SubscriptionData("T", "a || b", 5)])],
                         ["PG"])
    assert H.HeartbeatData.parse(hb.build()) == hb
    assert hb.build() == {
        "clientID": "c1",
        "consumerDataSet": [{"groupName": "G", "consumeType": "CONSUME_PASSIVELY",
                             "messageModel": "CLUSTERING",
                             "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                             "subscriptionDataSet": [{"topic": "T", "subString": "a || b",
                                                      "subVersion": 5}]}],
        "producerDataSet": [{"groupName": "PG"}]}
    # The C++ client: clientId, ordinals; entries without a group are skipped.
    cpp = H.HeartbeatData.parse({
        "clientId": "c2", "consumerDataSet": [
            {"groupName": "G", "consumeType": 1, "subscriptionDataSet": [{"topic": "T"}]},
            {"consumeType": 1}, "junk"],
        "producerDataSet": [{"groupName": ""}, {"groupName": "PG"}]})
    assert cpp == H.HeartbeatData("c2", [H.ConsumerData("G", [H.SubscriptionData("T")])],
                                  ["PG"])
    for bad, named in (([], "not a JSON object"), ({"consumerDataSet": []}, "'clientID'")):
        with pytest.raises(ProtocolError, match=named):
            H.HeartbeatData.parse(bad)
