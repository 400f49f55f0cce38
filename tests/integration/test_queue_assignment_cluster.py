"""Server-side queue assignment with real processes: QUERY_ASSIGNMENT and
SET_MESSAGE_REQUEST_MODE as RocketMQ 5's Java push consumers (``clientRebalance=false``)
and its admin tool send them, over raw remoting.

Two broker groups (``broker-a``: a master and an in-sync slave; ``broker-b``: a master)
hold one topic.  A master answers with the queues of the topic's whole route at the name
server, split between the consumers that heartbeat it (PULL), then, once the group's mode
is POP, one pop-every-queue assignment per broker group.  Refused mode changes change
nothing; the mode is replicated state: after the master's SIGKILL the new master answers
in POP too.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from cluster import Cluster

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand

TOPIC, GROUP = "Assigned", "assigned-group"
SETTINGS = {"all_ack_in_sync_state_set": True, "slave_timeout_ms": 3000}
Assignment = set[tuple[tuple[str, str, int], str]]


@pytest.fixture
def cluster(tmp_path: Any) -> Any:
    with Cluster(tmp_path) as c:
        yield c


def heartbeat(cluster: Cluster, addr: str, client_id: str) -> None:
    body = {"clientID": client_id, "producerDataSet": [], "heartbeatFingerprint": 0,
            "consumerDataSet": [{
                "groupName": GROUP, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [],
                                         "codeSet": [], "subVersion": 1, "expressionType": "TAG"}]}]}
    resp = cluster.request(addr, RequestCode.HEART_BEAT, {}, body)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def assignment(cluster: Cluster, addr: str, client_id: str) -> Assignment | None:
    """The client's assignments, or None when the answer has none (RocketMQ's null)."""
    resp = cluster.request(addr, RequestCode.QUERY_ASSIGNMENT, {}, {
        "topic": TOPIC, "consumerGroup": GROUP, "clientId": client_id, "strategyName": "AVG",
        "messageModel": "CLUSTERING"})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    found = json.loads(resp.body).get("messageQueueAssignments")
    if found is None:
        return None
    return {((a["messageQueue"]["topic"], a["messageQueue"]["brokerName"],
              a["messageQueue"]["queueId"]), a["mode"]) for a in found}


def set_mode(cluster: Cluster, addr: str, topic: str = TOPIC, **body: Any) -> RemotingCommand:
    return cluster.request(addr, RequestCode.SET_MESSAGE_REQUEST_MODE, {},
                           {"topic": topic, "consumerGroup": GROUP, **body}, timeout=6)


def create_topic(cluster: Cluster, addr: str) -> None:
    resp = cluster.request(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}, timeout=6)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def both_groups_routed(cluster: Cluster) -> bool:
    route = cluster.route(TOPIC) or {}
    return {q["brokerName"] for q in route.get("queueDatas", [])} == {"broker-a", "broker-b"}


def test_assignment_follows_mode_and_survives_failover(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, slave = cluster.start_group("broker-a", 2, in_sync=True, **SETTINGS)
    (other,) = cluster.start_group("broker-b", 1, **SETTINGS)
    for addr in (master.address, other.address):
        create_topic(cluster, addr)
    cluster.wait_for(lambda: both_groups_routed(cluster), what="a route over both groups")
    for cid in ("c1", "c2"):
        heartbeat(cluster, master.address, cid)

    # PULL (the default): the route's four queues, two to each consumer in AVG order.
    c1, c2 = assignment(cluster, master.address, "c1"), assignment(cluster, master.address, "c2")
    assert c1 == {((TOPIC, "broker-a", q), "PULL") for q in (0, 1)}
    assert c2 == {((TOPIC, "broker-b", q), "PULL") for q in (0, 1)}  # from the name server's route
    assert assignment(cluster, master.address, "stranger") == set()  # heartbeats nowhere

    # Refused changes leave PULL in place.
    refusals = [(set_mode(cluster, master.address, f"%RETRY%{GROUP}", mode="POP"), ResponseCode.NO_PERMISSION),
                (set_mode(cluster, master.address, "NoSuchTopic", mode="POP"), ResponseCode.TOPIC_NOT_EXIST),
                (set_mode(cluster, master.address, mode="PUSH"), ResponseCode.INVALID_PARAMETER),
                (set_mode(cluster, slave.address, mode="POP"), ResponseCode.SERVICE_NOT_AVAILABLE)]
    assert [(r.code, want) for r, want in refusals] == [(want, want) for _, want in refusals], \
        [r.remark for r, _ in refusals]
    assert assignment(cluster, master.address, "c1") == c1

    pop_all = {((TOPIC, "broker-a", -1), "POP"), ((TOPIC, "broker-b", -1), "POP")}
    resp = set_mode(cluster, master.address, mode="POP", popShareQueueNum=0)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert assignment(cluster, master.address, "c1") == pop_all
    assert assignment(cluster, master.address, "c2") == pop_all
    assert assignment(cluster, other.address, "c1") is None  # broker-b: c1 heartbeats broker-a only

    master.kill()
    new = cluster.wait_for(lambda: cluster.master_of("broker-a"), timeout=30, what="a new master")
    assert new is slave
    heartbeat(cluster, new.address, "c1")
    # The new master applies the replicated mode record when it confirms it, a moment after
    # it takes over (until then it answers from the state it had indexed as a slave).
    cluster.wait_for(lambda: assignment(cluster, new.address, "c1") == pop_all, timeout=10,
                     what="the new master answering the replicated POP mode")
