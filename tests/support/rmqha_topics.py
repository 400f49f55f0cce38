"""A broker group and topics for the rmqha Spark source's tests and benchmark.

Starts one broker group on a :class:`cluster.Cluster` (a master and ``slaves`` slaves,
all-ack so a send is acknowledged only once every SyncStateSet member holds it), creates
topics with a given number of queues on it, and sends numbered messages whose body,
tags, keys and properties say which message they are, so a reader's rows can be checked
field by field against the send results.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cluster import BrokerProc, Cluster

from rmqha.client import BlockingProducer, Message, SendResult
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import parse_offset_msg_id

GROUP = "broker-a"


@dataclass(frozen=True)
class Sent:
    """One acknowledged message, as a reader's row must show it."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    tags: str
    keys: str
    serial: str


def start_group(cluster: Cluster, slaves: int = 1, **cfg: Any) -> list[BrokerProc]:
    """A controller, a name server and broker-a (master first); waits for the whole set."""
    cluster.start_controllers(1)
    cluster.start_namesrv()
    brokers = [cluster.start_broker(GROUP, all_ack_in_sync_state_set=True, **cfg) for _ in range(1 + slaves)]
    cluster.wait_for(lambda: cluster.broker_role(brokers[0]) == "master", what="broker-a's master")
    if slaves:
        want = sorted(b.broker_id() for b in brokers)
        cluster.wait_for(lambda: cluster.replica_info(GROUP).sync_state_set == want, timeout=60,
                         what=f"SyncStateSet {want}")
    return brokers


def create_topic(cluster: Cluster, topic: str, queues: int) -> None:
    master = cluster.master_of(GROUP)
    assert master is not None
    resp = cluster.request(master.address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    cluster.wait_for(lambda: (r := cluster.route(topic)) is not None and r["queueDatas"]
                     and r["queueDatas"][0]["readQueueNums"] == queues, what=f"a route for {topic}")


def message(serial: int, size: int = 0) -> Message:
    body = (b"m%08d:" % serial).ljust(size, b"x")
    return Message(body=body, tags=f"t{serial % 3}", keys=f"k{serial}", properties={"serial": str(serial)})


def sent_of(topic: str, results: Iterable[SendResult], msgs: Iterable[Message]) -> list[Sent]:
    out = []
    for r, m in zip(results, msgs):
        out.append(Sent(topic, r.queue.queue_id, r.queue_offset, parse_offset_msg_id(r.offset_msg_id)[1],
                        m.body, m.tags or "", m.keys or "", m.properties["serial"]))
    return out


def send(namesrv: list[str], topic: str, serials: range, *, size: int = 0, batch: int = 64) -> list[Sent]:
    """Messages ``serials`` to ``topic``, spread over its queues; every one acknowledged."""
    msgs = [message(i, size) for i in serials]
    sent: list[Sent] = []
    with BlockingProducer(namesrv) as producer:
        for i in range(0, len(msgs), batch):
            chunk = msgs[i:i + batch]
            results = producer.send_batch(topic, chunk)
            assert all(r.ok for r in results), results
            sent += sent_of(topic, results, chunk)
    return sent
