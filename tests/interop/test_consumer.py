"""RocketMQ 5.5.0's remoting consumers against rmqha, in both modes of the cluster.

Messages are produced with rmqha's own ``BlockingProducer`` (every SEND_OK recorded) and
consumed by the Java client in a driver (interop/.../PushConsume.java, LitePull.java); each
test judges exactly what the Java listener was handed against what was acknowledged:
nothing missing, nothing unknown, duplicates counted (none expected where nothing fails).
The results are tabled in docs/compatibility.md ("RocketMQ remoting Java client 5.5.0:
consuming").
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from consumer_support import LiveDriver, Sent, Verdict, assignments, produce, received_all
from interop_cluster import Grants, InteropCluster
from interop_support import json_lines
from rmqha_side import read_topic

from rmqha.client import BlockingProducer, Message
from rmqha.errors import SendError
from rmqha.protocol.codes import RequestCode, ResponseCode

QUEUES = 4
PUSH_TOPIC = "ic-push"
BROADCAST_TOPIC = "ic-broadcast"
ORDER_TOPIC = "ic-orderly"
RETRY_TOPIC = "ic-retry"
DLQ_TOPIC = "ic-dlq"
LITE_TOPIC = "ic-lite"
ASSIGN_TOPIC = "ic-assign"
POP_TOPIC = "ic-pop"
KILL_TOPIC = "ic-kill"
PUSH_GROUP = "ic-push-g"
BROADCAST_GROUP = "ic-broadcast-g"
ORDER_GROUP = "ic-orderly-g"
RETRY_GROUP = "ic-retry-g"
DLQ_GROUP = "ic-dlq-g"
LITE_GROUP = "ic-lite-g"
ASSIGN_GROUP = "ic-assign-g"
POP_GROUP = "ic-pop-g"
KILL_GROUP = "ic-kill-g"
READER = "ic-reader"
#: The group's %RETRY% topic is made at the consumer's first heartbeat, after the client
#: looked its route up: as with RocketMQ, the client learns it at its next name-server poll
#: (30 s) and pulls it after its next rebalance (20 s).  Retry tests poll every second and
#: rebalance every two (client settings: pollNameServerInterval and
#: rocketmq.client.rebalance.waitInterval).
QUICK_ROUTES = ("--poll-namesrv-ms", "1000", "--rebalance-ms", "2000")
#: How long a Java consumer may take to start, rebalance and see what was sent, on two busy cores
#: (a JVM alone took 30-50 s to start its consumer with the machine's load at 35).
WAIT_S = 120.0


@pytest.fixture(scope="module")
def interop_grants() -> Grants:
    topics = {t: "PUB|SUB" for t in (PUSH_TOPIC, BROADCAST_TOPIC, ORDER_TOPIC, RETRY_TOPIC, DLQ_TOPIC, LITE_TOPIC,
                                     ASSIGN_TOPIC, POP_TOPIC, KILL_TOPIC)}
    # A group's %RETRY% topic is covered by the group's grant, as in RocketMQ's ACL; the DLQ is
    # a topic like any other (read back here by rmqha's consumer).
    topics[f"%DLQ%{DLQ_GROUP}"] = "SUB"
    groups = [PUSH_GROUP, BROADCAST_GROUP, ORDER_GROUP, RETRY_GROUP, DLQ_GROUP, LITE_GROUP,
              ASSIGN_GROUP, POP_GROUP, KILL_GROUP, READER]
    return Grants(topics=topics, groups=groups)


def push(ic: InteropCluster, tmp_path: Path, name: str, *args: str) -> LiveDriver:
    return LiveDriver.start(ic, "PushConsume", *args, workdir=tmp_path / name)


def split_between(n: int, topic: str) -> Callable[[list[dict]], bool]:
    """A wait condition: ``n`` instances hold disjoint, non-empty queue sets covering the topic."""
    every = {f"pull:broker-a/{topic}/{q}" for q in range(QUEUES)}

    def condition(events: list[dict]) -> bool:
        held = assignments(events)
        sets = [held.get(i, set()) for i in range(n)]
        return all(sets) and sum(len(s) for s in sets) == QUEUES and set().union(*sets) == every
    return condition


def test_push_clustering_two_instances_split_queues(interop_cluster: InteropCluster, tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(PUSH_TOPIC, QUEUES)
    with push(ic, tmp_path, "push", "--group", PUSH_GROUP, "--topic", PUSH_TOPIC, "--consumers", "2") as driver:
        driver.wait_for(split_between(2, PUSH_TOPIC), WAIT_S, "two consumers splitting the queues")
        sent = produce(ic, PUSH_TOPIC, (f"push-{i}" for i in range(200)))
        driver.wait_for(received_all(sent), WAIT_S, "every acknowledged message")
        events = driver.stop()
    msgs = [e for e in events if e["event"] == "msg"]
    verdict = Verdict.of(sent, msgs)
    assert verdict.exact, verdict
    held: dict[int, set[str]] = {}
    for e in events:  # each message came to the instance that held its queue at the time
        if e["event"] == "assignment":
            held[e["consumer"]] = set(e["queues"])
        elif e["event"] == "msg":
            assert f"pull:broker-a/{PUSH_TOPIC}/{e['queueId']}" in held[e["consumer"]], (e, held)
            assert e["body"] == sent.acked[e["msgId"]][2] and e["queueOffset"] == sent.acked[e["msgId"]][1], e
    assert {m["consumer"] for m in msgs} == {0, 1}


def test_push_broadcasting_each_instance_gets_everything(interop_cluster: InteropCluster,
                                                         tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(BROADCAST_TOPIC, QUEUES)
    every = {f"pull:broker-a/{BROADCAST_TOPIC}/{q}" for q in range(QUEUES)}
    with push(ic, tmp_path, "broadcast", "--group", BROADCAST_GROUP, "--topic", BROADCAST_TOPIC,
              "--consumers", "2", "--model", "broadcasting") as driver:
        driver.wait_for(lambda ev: all(assignments(ev).get(i) == every for i in (0, 1)), WAIT_S,
                        "both consumers on every queue")
        sent = produce(ic, BROADCAST_TOPIC, (f"bc-{i}" for i in range(100)))
        driver.wait_for(lambda ev: received_all(sent, 0)(ev) and received_all(sent, 1)(ev), WAIT_S,
                        "every message at both consumers")
        events = driver.stop()
    for consumer in (0, 1):
        verdict = Verdict.of(sent, [e for e in events if e["event"] == "msg" and e["consumer"] == consumer])
        assert verdict.exact, (consumer, verdict)


def test_push_orderly_keeps_each_queue_in_order(interop_cluster: InteropCluster, tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(ORDER_TOPIC, QUEUES)
    with push(ic, tmp_path, "orderly", "--group", ORDER_GROUP, "--topic", ORDER_TOPIC, "--consumers", "2",
              "--listener", "orderly") as driver:
        driver.wait_for(split_between(2, ORDER_TOPIC), WAIT_S, "two orderly consumers splitting the queues")
        sent = Sent()
        for q in range(QUEUES):
            produce(ic, ORDER_TOPIC, (f"q{q}-{i:03d}" for i in range(40)), queue_id=q, sent=sent)
        driver.wait_for(received_all(sent), WAIT_S, "every acknowledged message")
        events = driver.stop()
    msgs = [e for e in events if e["event"] == "msg"]
    verdict = Verdict.of(sent, msgs)
    assert verdict.exact, verdict
    for q, bodies in sent.per_queue().items():
        seen = [m["body"] for m in msgs if m["queueId"] == q]
        assert seen == bodies, f"queue {q} consumed out of order: {seen}"
        assert len({m["consumer"] for m in msgs if m["queueId"] == q}) == 1


def deliveries(msgs: list[dict]) -> dict[str, list[int]]:
    """Each message id's reconsumeTimes, in delivery order."""
    out: dict[str, list[int]] = {}
    for m in msgs:
        out.setdefault(m["msgId"], []).append(m["reconsumeTimes"])
    return out


def test_push_reconsume_later_redelivers_through_retry_topic(interop_cluster: InteropCluster,
                                                             tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(RETRY_TOPIC, QUEUES)
    with push(ic, tmp_path, "retry", "--group", RETRY_GROUP, "--topic", RETRY_TOPIC, "--later-until", "1",
              "--retry-delay-level", "1", *QUICK_ROUTES) as driver:
        driver.wait_for(lambda ev: len(assignments(ev).get(0, ())) == QUEUES, WAIT_S, "the consumer's queues")
        sent = produce(ic, RETRY_TOPIC, (f"retry-{i}" for i in range(5)))
        driver.wait_for(lambda ev: sent.ids() <= {e["msgId"] for e in ev if e.get("accepted") is True},
                        WAIT_S, "every message accepted on its redelivery")
        events = driver.stop()
    msgs = [e for e in events if e["event"] == "msg"]
    assert Verdict.of(sent, [m for m in msgs if m["accepted"]]).exact
    assert deliveries(msgs) == {i: [0, 1] for i in sent.ids()}, msgs
    for m in msgs:
        # A redelivery came back through %RETRY%<group>: the broker keeps the original topic in
        # RETRY_TOPIC, which the client puts back as the message's topic (RocketMQ's
        # resetRetryAndNamespace); a first delivery has no RETRY_TOPIC (the driver's JSON omits nulls).
        assert m["topic"] == RETRY_TOPIC and m["body"] == sent.acked[m["msgId"]][2], m
        assert m.get("retryTopic") == (RETRY_TOPIC if m["reconsumeTimes"] else None), m


def test_push_dead_letter_after_max_reconsume_times(interop_cluster: InteropCluster, tmp_path: Path) -> None:
    ic = interop_cluster
    topic = DLQ_TOPIC
    ic.create_topic(topic, QUEUES)
    with push(ic, tmp_path, "dlq", "--group", DLQ_GROUP, "--topic", topic, "--later-until", "-1",
              "--retry-delay-level", "1", "--max-reconsume-times", "2", *QUICK_ROUTES) as driver:
        driver.wait_for(lambda ev: len(assignments(ev).get(0, ())) == QUEUES, WAIT_S, "the consumer's queues")
        sent = produce(ic, topic, (f"dlq-{i}" for i in range(3)))
        driver.wait_for(lambda ev: (d := deliveries([e for e in ev if e.get("event") == "msg"])).keys()
                        >= sent.ids() and all(len(d[i]) >= 3 for i in sent.ids()),
                        WAIT_S, "three deliveries of each message")
        dead = read_topic(ic, f"%DLQ%{DLQ_GROUP}", READER, 3, timeout=WAIT_S)
        events = driver.stop()
    msgs = [e for e in events if e["event"] == "msg" and e["msgId"] in sent.ids()]
    assert deliveries(msgs) == {i: [0, 1, 2] for i in sent.ids()}, msgs
    assert sorted(d.msg_id for d in dead) == sorted(sent.ids()), dead
    assert sorted(d.body for d in dead) == sorted(b for _, _, b in sent.acked.values())


def lite(ic: InteropCluster, tmp_path: Path, name: str, *args: str) -> list[dict]:
    out = ic.run("LitePull", *args, "--log-dir", str(tmp_path / name), timeout=WAIT_S + 30)
    return json_lines(out.stdout)


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


def next_offsets(msgs: list[dict]) -> dict[str, int]:
    """Per queue, the offset after the last message received: what a commit should store."""
    out: dict[str, int] = {}
    for m in msgs:
        name = f"broker-a/{m['topic']}/{m['queueId']}"
        out[name] = max(out.get(name, 0), m["queueOffset"] + 1)
    return out


def broker_offset(ic: InteropCluster, group: str, topic: str, queue_id: int) -> int | None:
    """QUERY_CONSUMER_OFFSET at the master: the offset rmqha stored for the group."""
    resp = ic.cluster.request(ic.master().address, RequestCode.QUERY_CONSUMER_OFFSET,
                              {"consumerGroup": group, "topic": topic, "queueId": queue_id})
    return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None


def test_lite_pull_subscribe_commit_then_resume(interop_cluster: InteropCluster, tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(LITE_TOPIC, QUEUES)
    first = produce(ic, LITE_TOPIC, (f"lite-{i}" for i in range(40)))
    events = lite(ic, tmp_path, "lite1", "--group", LITE_GROUP, "--topic", LITE_TOPIC, "--count", "40",
                  "--commit", "persist")
    assert of(events, "queues")[0]["queues"] == [f"broker-a/{LITE_TOPIC}/{q}" for q in range(QUEUES)]
    assert Verdict.of(first, of(events, "msg")).exact and not of(events, "extra"), events
    committed = of(events, "committed")[0]["offsets"]
    assert committed == next_offsets(of(events, "msg")), committed
    ic.cluster.wait_for(lambda: all(broker_offset(ic, LITE_GROUP, LITE_TOPIC, q) == committed[
        f"broker-a/{LITE_TOPIC}/{q}"] for q in range(QUEUES)), 10, what="the committed offsets at the broker")
    second = produce(ic, LITE_TOPIC, (f"lite-more-{i}" for i in range(20)))
    events = lite(ic, tmp_path, "lite2", "--group", LITE_GROUP, "--topic", LITE_TOPIC, "--count", "20")
    assert Verdict.of(second, of(events, "msg")).exact and not of(events, "extra"), events


def test_lite_pull_assign_seek_commit_sync_then_restart(interop_cluster: InteropCluster,
                                                        tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(ASSIGN_TOPIC, QUEUES)
    sent = produce(ic, ASSIGN_TOPIC, (f"a0-{i}" for i in range(30)), queue_id=0)
    produce(ic, ASSIGN_TOPIC, (f"a1-{i}" for i in range(10)), queue_id=1, sent=sent)
    produce(ic, ASSIGN_TOPIC, (f"a2-{i}" for i in range(5)), queue_id=2, sent=sent)
    args = ("--group", ASSIGN_GROUP, "--topic", ASSIGN_TOPIC, "--mode", "assign", "--queues", "0,1")
    events = lite(ic, tmp_path, "assign1", *args, "--seek", "0:10", "--count", "30", "--commit", "sync")
    want = {i for i, (q, off, _) in sent.acked.items() if (q == 0 and off >= 10) or q == 1}
    got = [m["msgId"] for m in of(events, "msg")]
    assert sorted(got) == sorted(want) and not of(events, "extra"), events
    assert of(events, "committed")[0]["offsets"] == {f"broker-a/{ASSIGN_TOPIC}/0": 30,
                                                     f"broker-a/{ASSIGN_TOPIC}/1": 10}, events
    more = produce(ic, ASSIGN_TOPIC, (f"a0-more-{i}" for i in range(5)), queue_id=0)
    events = lite(ic, tmp_path, "assign2", *args, "--count", "5")
    assert Verdict.of(more, of(events, "msg")).exact and not of(events, "extra"), events
    assert [m["queueOffset"] for m in of(events, "msg")] == list(range(30, 35))


def test_push_pop_mode_with_broker_side_assignment(interop_cluster: InteropCluster, tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(POP_TOPIC, QUEUES)
    out = ic.run("RequestMode", "--group", POP_GROUP, "--topic", POP_TOPIC, "--mode", "POP",
                 "--log-dir", str(tmp_path / "mode"), admin=True)
    assert [e["mode"] for e in json_lines(out.stdout)] == ["POP"], out.stdout
    with push(ic, tmp_path, "pop", "--group", POP_GROUP, "--topic", POP_TOPIC, "--consumers", "2",
              "--pop") as driver:
        driver.wait_for(lambda ev: all(assignments(ev).get(i) == {f"pop:broker-a/{POP_TOPIC}/-1"}
                                       for i in (0, 1)), WAIT_S, "both consumers popping every queue")
        sent = produce(ic, POP_TOPIC, (f"pop-{i}" for i in range(80)))
        driver.wait_for(received_all(sent), WAIT_S, "every acknowledged message")
        events = driver.stop()
    verdict = Verdict.of(sent, of(events, "msg"))
    assert verdict.exact, verdict
    for m in of(events, "msg"):
        assert m["body"] == sent.acked[m["msgId"]][2] and m["queueOffset"] == sent.acked[m["msgId"]][1], m


class PacedProducer(threading.Thread):
    """rmqha's producer sending numbered messages, about 200 a second, until told to stop;
    ``sent`` holds every SEND_OK, ``failed`` the sends that raised (not acknowledged)."""

    def __init__(self, ic: InteropCluster, topic: str) -> None:
        super().__init__(name="paced-producer", daemon=True)
        self.ic, self.topic = ic, topic
        self.sent, self.failed = Sent(), 0
        self.halt = threading.Event()

    def run(self) -> None:
        with BlockingProducer(self.ic.namesrv, group="interop-consumer-paced",
                              **self.ic.client_options()) as producer:
            i = 0
            while not self.halt.wait(0.005):
                body = f"kill-{i}"
                i += 1
                try:
                    result = producer.send(self.topic, Message(body.encode(), keys=body))
                except SendError:
                    self.failed += 1
                    continue
                if result.ok:
                    self.sent.acked[result.msg_id] = (result.queue.queue_id, result.queue_offset, body)


def test_push_consumer_rides_through_master_sigkill(interop_cluster: InteropCluster, tmp_path: Path) -> None:
    ic = interop_cluster
    ic.create_topic(KILL_TOPIC, QUEUES)
    producer = PacedProducer(ic, KILL_TOPIC)
    try:
        with push(ic, tmp_path, "kill", "--group", KILL_GROUP, "--topic", KILL_TOPIC,
                  "--poll-namesrv-ms", "1000") as driver:
            driver.wait_for(lambda ev: len(assignments(ev).get(0, ())) == QUEUES, WAIT_S, "the consumer's queues")
            producer.start()
            driver.wait_for(lambda ev: len(of(ev, "msg")) >= 200, WAIT_S, "200 messages before the kill")
            killed, new = ic.kill_master()
            at_kill = len(driver.messages())
            driver.wait_for(lambda ev: len(of(ev, "msg")) >= at_kill + 400, WAIT_S,
                            f"400 more messages after {killed.name} was killed ({new.name} master)")
            producer.halt.set()
            producer.join(30)
            sent = producer.sent
            driver.wait_for(received_all(sent), WAIT_S, "every acknowledged message")
            events = driver.stop()
    finally:
        producer.halt.set()
        ic.heal()
    verdict = Verdict.of(sent, of(events, "msg"))
    print(f"master SIGKILL ({ic.mode.value}): {len(sent.acked)} acknowledged, {producer.failed} sends "
          f"failed, {len(verdict.unexpected)} received but not acknowledged, "
          f"{sum(n - 1 for n in verdict.duplicates.values())} duplicate deliveries")
    assert not verdict.missing, f"{len(verdict.missing)} acknowledged messages never consumed"
    assert not of(events, "started")[1:], "the consumer was restarted"
