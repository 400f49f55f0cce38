"""What the tests check from the rmqha side: a topic read back with rmqha's own consumer.

A Java driver says what it was told was acknowledged; these helpers read what the cluster
actually stored, with rmqha's Python client (the application's account and certificate in
tls-acl mode), so a test compares two independent views.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from interop_cluster import InteropCluster

from rmqha.client.consumer import BlockingConsumer
from rmqha.protocol.message import ReceivedMessage


@dataclass(frozen=True)
class Stored:
    """One message as rmqha serves it to a consumer."""

    msg_id: str
    body: str
    keys: str | None
    tags: str | None
    queue_id: int
    queue_offset: int
    properties: dict[str, str]
    store_timestamp: int

    @classmethod
    def of(cls, m: ReceivedMessage) -> Stored:
        return cls(m.msg_id, m.body.decode("utf-8", "replace"), m.keys, m.tags, m.queue_id,
                   m.queue_offset, dict(m.properties), m.store_timestamp)


def read_topic(ic: InteropCluster, topic: str, group: str, expect: int, *,
               timeout: float = 30.0, settle_s: float = 0.0) -> list[Stored]:
    """Every message of ``topic`` from the oldest, as ``group``: returns once ``expect``
    arrived (then keeps reading ``settle_s`` more, to catch extras) or at ``timeout``."""
    got: list[Stored] = []
    with BlockingConsumer(ic.namesrv, group=group, topics=topic, **ic.client_options()) as consumer:
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(Stored.of(m) for m in consumer.poll(timeout=1.0))
        settle_end = time.monotonic() + settle_s
        while time.monotonic() < settle_end:
            got.extend(Stored.of(m) for m in consumer.poll(timeout=0.5))
    return got
