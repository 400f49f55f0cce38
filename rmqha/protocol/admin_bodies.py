"""The JSON bodies of RocketMQ's admin answers that mqadmin reads, written as RocketMQ writes them.

RocketMQ serialises these with fastjson2, whose maps keyed by a ``MessageQueue`` put the
queue's JSON object itself in the key position (``{{"brokerName":"a","queueId":0,"topic":
"t"}:{...}}``): not JSON, but what ``TopicStatsTable``, ``ConsumeStats`` and
decode, so :func:`queue_keyed` writes exactly that.  Field names follow
the Java classes (``TopicOffset``, ``OffsetWrapper``, ``Connection``, ``ConsumerConnection``,
``ProducerConnection``, ``KVTable``); a broker's configuration travels as a Java properties
text (``MixAll.properties2String``).  Only the fields mqadmin prints or decides on are
filled; the rest keep the Java defaults (absent).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: A RocketMQ MessageQueue: (topic, brokerName, queueId).
Queue = tuple[str, str, int]


def queue_json(queue: Queue) -> dict[str, Any]:
    topic, broker_name, queue_id = queue
    return {"brokerName": broker_name, "queueId": queue_id, "topic": topic}


def queue_keyed(entries: Iterable[tuple[Queue, Mapping[str, Any]]]) -> str:
    """A fastjson2 ``Map<MessageQueue, V>``: each key the queue's JSON object."""
    parts = [f"{_dump(queue_json(q))}:{_dump(dict(v))}" for q, v in sorted(entries)]
    return "{" + ",".join(parts) + "}"


def topic_stats_body(offsets: Iterable[tuple[Queue, int, int, int]]) -> bytes:
    """``TopicStatsTable``: per queue (queue, min offset, max offset, last store time ms)."""
    table = queue_keyed((q, {"minOffset": lo, "maxOffset": hi, "lastUpdateTimestamp": ts})
                        for q, lo, hi, ts in offsets)
    return ('{"offsetTable":' + table + "}").encode()


@dataclass(frozen=True)
class QueueProgress:
    """One ``OffsetWrapper`` of ``ConsumeStats``."""

    queue: Queue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int


def consume_stats_body(progress: Iterable[QueueProgress], consume_tps: float = 0.0) -> bytes:
    table = queue_keyed((p.queue, {"brokerOffset": p.broker_offset, "consumerOffset": p.consumer_offset,
                                   "pullOffset": p.consumer_offset, "lastTimestamp": p.last_timestamp})
                        for p in progress)
    return ('{"consumeTps":' + _dump(consume_tps) + ',"offsetTable":' + table + "}").encode()


@dataclass(frozen=True)
class ClientConnection:
    """One ``Connection`` (a client that heartbeats the broker)."""

    client_id: str
    client_addr: str
    language: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"clientAddr": self.client_addr, "clientId": self.client_id,
                "language": self.language, "version": self.version}


def subscription_json(topic: str, expression: str, version: int = 0) -> dict[str, Any]:
    """A ``SubscriptionData``: a tag expression's tags and their hash codes as Java has them."""
    tags = [] if expression.strip() in ("", "*") else [t.strip() for t in expression.split("||") if t.strip()]
    return {"classFilterMode": False, "codeSet": [java_hash(t) for t in tags], "expressionType": "TAG",
            "subString": expression or "*", "subVersion": version, "tagsSet": tags, "topic": topic}


def consumer_connection_body(connections: Iterable[ClientConnection], subscriptions: Mapping[str, str], *,
                             consume_type: str, message_model: str, consume_from_where: str) -> bytes:
    body = {"connectionSet": [c.to_json() for c in connections],
            "consumeFromWhere": consume_from_where, "consumeType": consume_type,
            "messageModel": message_model,
            "subscriptionTable": {t: subscription_json(t, e) for t, e in sorted(subscriptions.items())}}
    return _dump(body).encode()


def producer_connection_body(connections: Iterable[ClientConnection]) -> bytes:
    return _dump({"connectionSet": [c.to_json() for c in connections]}).encode()


def kv_table_body(table: Mapping[str, str]) -> bytes:
    """``KVTable``: every value a string."""
    return _dump({"table": {k: str(v) for k, v in table.items()}}).encode()


def properties_text(values: Mapping[str, Any]) -> str:
    """``MixAll.properties2String``: ``key=value`` lines (None as empty), escaped so Java's
    ``Properties.load`` reads the same strings back."""
    return "".join(f"{_escape(k, key=True)}={_escape('' if v is None else _java_text(v))}\n"
                   for k, v in values.items())


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (tag codes in a SubscriptionData)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _java_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    return str(value)


def _escape(text: str, *, key: bool = False) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    return out


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
