"""The rules of broker-side queue assignment (:mod:`rmqha.messaging.assignment`): RocketMQ's
allocation strategies, the POP share, the effective mode, and the replicated mode table."""
from __future__ import annotations

import pytest

from rmqha.errors import ProtocolError
from rmqha.messaging.assignment import (
    ALL_QUEUES,
    AssignmentQuery,
    MessageModel,
    ModeSetting,
    RequestMode,
    allocate_averagely,
    allocate_by_circle,
    allocate_for_pop,
    assign,
    assignments_json,
    effective_mode,
    readable_queues,
)
from rmqha.messaging.queue_assignment import parse_mode_request
from rmqha.messaging.state import BrokerState, request_mode_record, topic_delete_record
from rmqha.protocol.topics import TopicTable

MQS = [("t", "a", q) for q in range(4)] + [("t", "b", q) for q in range(4)]


def query(cid: str, strategy: str = "AVG", model: MessageModel = MessageModel.CLUSTERING) -> AssignmentQuery:
    return AssignmentQuery("t", "g", cid, strategy, model)


def test_averagely_matches_rocketmq() -> None:
    cids = ["c0", "c1", "c2"]
    # 8 queues over 3: the first 8 % 3 = 2 consumers get one more, in contiguous runs.
    assert [len(allocate_averagely(c, MQS, cids)) for c in cids] == [3, 3, 2]
    assert allocate_averagely("c2", MQS, cids) == MQS[6:]
    assert allocate_averagely("x", MQS, cids) == []
    # More consumers than queues: one each, the rest none.
    many = [f"c{i}" for i in range(10)]
    assert [len(allocate_averagely(c, MQS, many)) for c in many] == [1] * 8 + [0, 0]


def test_by_circle() -> None:
    assert allocate_by_circle("c1", MQS, ["c0", "c1", "c2"]) == [MQS[1], MQS[4], MQS[7]]


def test_every_queue_assigned_once() -> None:
    for n in range(1, 12):
        cids = [f"c{i:02d}" for i in range(n)]
        for strategy in (allocate_averagely, allocate_by_circle):
            got = [mq for c in cids for mq in strategy(c, MQS, cids)]
            assert sorted(got) == MQS, (strategy.__name__, n)


def test_pop_share() -> None:
    cids = ["c0", "c1", "c2", "c3"]
    brokers = [("t", "a", ALL_QUEUES), ("t", "b", ALL_QUEUES)]
    # share <= 0, or >= consumers - 1: every consumer pops every broker.
    assert allocate_for_pop(allocate_averagely, "c0", MQS, cids, 0) == brokers
    assert allocate_for_pop(allocate_averagely, "c0", MQS, cids, 3) == brokers
    # share 1: its own two queues and those of the consumer after it (c3 wraps to c0).
    assert allocate_for_pop(allocate_averagely, "c3", MQS, cids, 1) == MQS[6:] + MQS[:2]
    # More consumers than queues: one queue each, round robin.
    many = [f"c{i}" for i in range(10)]
    assert allocate_for_pop(allocate_averagely, "c9", MQS, many, 2) == [MQS[1]]


def test_assign_answers_and_non_answers() -> None:
    pull, pop = ModeSetting(), ModeSetting(RequestMode.POP, 0)
    assert assign(query("c1"), MQS, ["c1", "c0"], pull) == MQS[4:]  # client ids sorted first
    assert assign(query("c1"), MQS, ["c1"], pop) == [("t", "a", -1), ("t", "b", -1)]
    assert assign(query("c1", model=MessageModel.BROADCASTING), MQS, [], pull) == MQS
    assert assign(query("c1", "NO_SUCH"), MQS, ["c1"], pull) is None
    assert assign(query("c1"), MQS, [], pull) is None  # nobody heartbeats the group
    assert assign(query("c1"), [], ["c1"], pull) is None
    assert assignments_json(None, RequestMode.PULL) == {}
    assert assignments_json([("t", "a", 1)], RequestMode.POP) == {"messageQueueAssignments": [
        {"messageQueue": {"topic": "t", "brokerName": "a", "queueId": 1}, "mode": "POP"}]}


def test_effective_mode() -> None:
    stored = ModeSetting(RequestMode.POP, 2)
    assert effective_mode("t", stored, RequestMode.PULL, -1) == stored
    assert effective_mode("t", None, RequestMode.POP, -1) == ModeSetting(RequestMode.POP, -1)
    assert effective_mode("t", None, RequestMode.PULL, 5) == ModeSetting(RequestMode.PULL, 0)
    assert effective_mode("%RETRY%g", None, RequestMode.POP, -1) == ModeSetting(RequestMode.PULL)


def test_readable_queues_skip_write_only_groups() -> None:
    assert readable_queues("t", [("b", 2, 6), ("a", 1, 4), ("c", 3, 2)]) == [
        ("t", "a", 0), ("t", "b", 0), ("t", "b", 1)]


def test_bodies_are_checked() -> None:
    ok = AssignmentQuery.from_json({"topic": "t", "consumerGroup": "g", "clientId": "c",
                                    "strategyName": "AVG", "messageModel": "BROADCASTING"})
    assert ok.model is MessageModel.BROADCASTING
    for bad, why in [({"topic": "t", "consumerGroup": "g"}, "clientId"),
                     ({"topic": "t", "consumerGroup": "g", "clientId": "c", "messageModel": "X"},
                      "messageModel"), ([], "JSON object")]:
        with pytest.raises(ProtocolError, match=why):
            AssignmentQuery.from_json(bad)
    assert parse_mode_request({"topic": "t", "consumerGroup": "g", "mode": "pop",
                               "popShareQueueNum": 1})[2] == ModeSetting(RequestMode.POP, 1)
    for bad, why in [({"topic": "t", "consumerGroup": "g", "mode": "PUSH"}, "PULL or POP"),
                     ({"topic": "t", "consumerGroup": "g", "popShareQueueNum": "1"}, "integer"),
                     ({"consumerGroup": "g"}, "topic")]:
        with pytest.raises(ProtocolError, match=why):
            parse_mode_request(bad)


def test_modes_fold_and_checkpoint() -> None:
    state = BrokerState(TopicTable())
    assert state.apply(request_mode_record("t", "g", ModeSetting(RequestMode.POP, 1))) is not None
    state.apply(request_mode_record("u", "g", ModeSetting(RequestMode.POP, 0)))
    assert state.request_modes.get("t", "g") == ModeSetting(RequestMode.POP, 1)
    copy = BrokerState(TopicTable())
    copy.apply(state.checkpoint_record())
    assert copy.request_modes.entries() == state.request_modes.entries() == [
        ["t", "g", "POP", 1], ["u", "g", "POP", 0]]
    state.apply(topic_delete_record("t"))
    assert state.request_modes.get("t", "g") is None and state.request_modes.get("u", "g")
    # A bad record is skipped and changes nothing.
    assert state.apply(b'{"op":"request_mode","topic":"u","group":"g","mode":"PUSH"}') is None
    assert state.request_modes.get("u", "g") == ModeSetting(RequestMode.POP, 0)
