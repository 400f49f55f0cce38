"""One queue of a topic as the Spark source names it, and offsets keyed by it.

A queue is (topic, broker group, queue id): RocketMQ's MessageQueue.  In offsets JSON
(the options, and each micro-batch's offsets in Spark's checkpoint) it is written
``{"<topic>": {"<broker group>:<queue id>": offset}}``: JSON keys are strings, and the
nesting by topic is what Kafka's source users read.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class QueueId:
    topic: str
    broker: str
    queue_id: int

    @property
    def key(self) -> str:
        return f"{self.broker}:{self.queue_id}"

    @classmethod
    def parse(cls, topic: str, key: str) -> QueueId:
        """``broker-a:3`` of ``topic``; ValueError naming ``key`` when it is not one."""
        broker, sep, qid = str(key).rpartition(":")
        if not sep or not broker or not qid.isdigit():
            raise ValueError(f"topic {topic}: queue {key!r} is not '<broker group>:<queue id>'")
        return cls(topic, broker, int(qid))


def offsets_to_json(offsets: Mapping[QueueId, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for q in sorted(offsets):
        out.setdefault(q.topic, {})[q.key] = int(offsets[q])
    return out


def offsets_from_json(data: Mapping[str, Mapping[str, int]]) -> dict[QueueId, int]:
    return {QueueId.parse(topic, key): int(offset)
            for topic, queues in data.items() for key, offset in queues.items()}
