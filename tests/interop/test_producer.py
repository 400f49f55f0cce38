"""RocketMQ 5.5.0's remoting DefaultMQProducer against rmqha, in both modes of the cluster.

Each test runs a Java driver (interop/.../ProducerDriver.java) that sends with the Java
client and prints what the client was told; the test then reads the topic back with
rmqha's own consumer and checks that every message the client saw acknowledged is stored,
once, with its body, keys and tags, in the queue and at the offset the client was told.
"""
from __future__ import annotations

import pytest
from interop_cluster import Grants, InteropCluster
from interop_support import json_lines
from rmqha_side import Stored, read_topic

SYNC_TOPIC = "interop-sync"
READER = "interop-reader"


@pytest.fixture(scope="module")
def interop_grants() -> Grants:
    return Grants(topics={SYNC_TOPIC: "PUB|SUB"}, groups=[READER])


def acked(lines: list[dict]) -> list[dict]:
    return [line for line in lines if line.get("status") == "SEND_OK"]


def check_stored(results: list[dict], stored: list[Stored], run: str) -> None:
    """Every SEND_OK of the driver is stored once, where the client was told, unchanged."""
    by_id: dict[str, Stored] = {}
    for s in stored:
        assert s.msg_id not in by_id, f"{s.msg_id} stored twice"
        by_id[s.msg_id] = s
    for r in results:
        assert r["msgId"] in by_id, f"acknowledged {r} is not stored (read {len(stored)})"
        s = by_id[r["msgId"]]
        i = r["i"]
        assert (s.body, s.keys, s.tags) == (f"body-{run}-{i}", f"key-{run}-{i}", f"t{i % 3}"), s
        assert (s.queue_id, s.queue_offset) == (r["queueId"], r["queueOffset"]), (r, s)
        assert s.properties.get("seq") == str(i), s


def test_sync_send(interop_cluster: InteropCluster) -> None:
    ic = interop_cluster
    ic.create_topic(SYNC_TOPIC, 4)
    run = "sync"
    out = ic.run("ProducerDriver", "sync", SYNC_TOPIC, run, "40")
    results = acked(json_lines(out.stdout))
    assert len(results) == 40, out.stdout
    stored = read_topic(ic, SYNC_TOPIC, READER, 40)
    assert len(stored) == 40
    check_stored(results, stored, run)
