"""RocketMQ 5.5.0's remoting DefaultMQProducer against rmqha, in both modes of the cluster.

One Java driver run (interop/.../ProducerDriver.java) sends with the Java client in every
way it offers (sync, async, oneway, batches, orderly through a MessageQueueSelector), each
to its own topic, and prints what the client was told; each test then reads its topic back
with rmqha's own consumer and checks that every message the client saw acknowledged is
stored, once, with its body, keys, tags and user property, in the queue and at the offset
the client was told.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from interop_cluster import Grants, InteropCluster
from interop_support import json_lines
from rmqha_side import Stored, read_topic

TOPICS = {"sync": "interop-sync", "async": "interop-async", "oneway": "interop-oneway",
          "batch": "interop-batch", "orderly": "interop-orderly"}
READER = "interop-reader"
COUNT = 40
BATCH = 8
ORDER_KEYS, PER_KEY = 4, 10
QUEUES = 4

Line = dict[str, Any]


@pytest.fixture(scope="module")
def interop_grants() -> Grants:
    return Grants(topics={topic: "PUB|SUB" for topic in TOPICS.values()}, groups=[READER])


@pytest.fixture(scope="module")
def sent(interop_cluster: InteropCluster) -> dict[str, list[Line]]:
    """One driver run for the module's cluster: command -> the lines it printed."""
    ic = interop_cluster
    for topic in TOPICS.values():
        ic.create_topic(topic, QUEUES)
    t = TOPICS
    out = ic.run("ProducerDriver",
                 "sync", t["sync"], "sync", str(COUNT), "--",
                 "async", t["async"], "async", str(COUNT), "--",
                 "oneway", t["oneway"], "oneway", str(COUNT), "--",
                 "batch", t["batch"], "batch", str(COUNT), str(BATCH), "--",
                 "orderly", t["orderly"], "orderly", str(ORDER_KEYS), str(PER_KEY),
                 timeout=240)
    lines = json_lines(out.stdout)
    assert lines and lines[-1] == {"done": True}, out.stdout[-2000:]
    by_cmd: dict[str, list[Line]] = defaultdict(list)
    for line in lines[:-1]:
        by_cmd[line["cmd"]].append(line)
    return by_cmd


def acked(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line.get("status") == "SEND_OK"]


def unique(stored: list[Stored]) -> dict[str, Stored]:
    by_id: dict[str, Stored] = {}
    for s in stored:
        assert s.msg_id not in by_id, f"{s.msg_id} stored twice: {by_id[s.msg_id]} and {s}"
        by_id[s.msg_id] = s
    return by_id


def check_same(s: Stored, run: str, i: int) -> None:
    """The stored message is the one the driver sent as number ``i`` of ``run``."""
    assert (s.body, s.keys, s.tags) == (f"body-{run}-{i}", f"key-{run}-{i}", f"t{i % 3}"), s
    assert s.properties.get("seq") == str(i), s


def check_stored(results: list[Line], stored: list[Stored], run: str) -> None:
    """Every SEND_OK of the driver is stored once, where the client was told, unchanged."""
    by_id = unique(stored)
    for r in results:
        assert r["msgId"] in by_id, f"acknowledged {r} is not stored (read {len(stored)})"
        s = by_id[r["msgId"]]
        check_same(s, run, r["i"])
        assert (s.queue_id, s.queue_offset) == (r["queueId"], r["queueOffset"]), (r, s)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_acknowledged_sends_are_stored(interop_cluster: InteropCluster, sent: dict[str, list[Line]],
                                       mode: str) -> None:
    results = acked(sent[mode])
    assert len(results) == COUNT, sent[mode]
    assert sorted(r["i"] for r in results) == list(range(COUNT))
    stored = read_topic(interop_cluster, TOPICS[mode], READER, COUNT, settle_s=0.5)
    assert len(stored) == COUNT
    check_stored(results, stored, mode)


def test_oneway_sends_are_stored(interop_cluster: InteropCluster, sent: dict[str, list[Line]]) -> None:
    """Oneway sends get no answer; each of them is stored once all the same."""
    assert [line["i"] for line in sent["oneway"]] == list(range(COUNT))
    stored = read_topic(interop_cluster, TOPICS["oneway"], READER, COUNT, settle_s=0.5)
    assert len(unique(stored)) == COUNT
    for s in stored:
        check_same(s, "oneway", int(s.properties["seq"]))


def test_batches_are_stored_in_one_queue_each(interop_cluster: InteropCluster,
                                              sent: dict[str, list[Line]]) -> None:
    results = acked(sent["batch"])
    assert len(results) == COUNT, sent["batch"]
    assert all(r["batchIds"] == BATCH for r in results), "one unique id per batched message"
    stored = read_topic(interop_cluster, TOPICS["batch"], READER, COUNT, settle_s=0.5)
    assert len(stored) == COUNT
    check_stored(results, stored, "batch")
    for start in range(0, COUNT, BATCH):
        batch = [r for r in results if start <= r["i"] < start + BATCH]
        assert len({r["queueId"] for r in batch}) == 1, batch
        base = batch[0]["queueOffset"]
        assert [r["queueOffset"] for r in batch] == list(range(base, base + BATCH)), batch


def test_orderly_sends_keep_each_key_in_one_queue_in_order(interop_cluster: InteropCluster,
                                                           sent: dict[str, list[Line]]) -> None:
    results = acked(sent["orderly"])
    assert len(results) == ORDER_KEYS * PER_KEY, sent["orderly"]
    stored = read_topic(interop_cluster, TOPICS["orderly"], READER, len(results), settle_s=0.5)
    check_stored(results, stored, "orderly")
    by_key: dict[str, list[Stored]] = defaultdict(list)
    for s in stored:
        by_key[s.properties["orderKey"]].append(s)
    assert len(by_key) == ORDER_KEYS
    for key, messages in by_key.items():
        assert len({s.queue_id for s in messages}) == 1, f"{key} spread over queues: {messages}"
        in_queue = sorted(messages, key=lambda s: s.queue_offset)
        assert [int(s.properties["orderSeq"]) for s in in_queue] == list(range(PER_KEY)), in_queue
