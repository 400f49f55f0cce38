"""The gRPC clients connected to this proxy: their settings and Telemetry streams.

A client names itself in every call (``x-mq-client-id``) and sends its Settings over
Telemetry; the proxy keeps, per client id, the last Settings and the open Telemetry
streams it may write to (an asyncio queue each, drained by the stream's handler).  That
is what it needs to answer a consumer's receive with the group's rules, to know which
topics connected producers publish (their transaction check-backs come to the proxy), and
to hand a check-back to one of those producers, and when it was last heard from (its
Settings and Heartbeats: the proxy stops renewing the deliveries of a silent client).  A
client is forgotten when it says it terminates, or when its last stream closes.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: ``ClientType.PRODUCER`` of apache.rocketmq.v2.
PRODUCER = 1

Stream = asyncio.Queue  # of TelemetryCommand (Any: the generated class)


def now_ms() -> int:
    """The proxy's monotonic clock in ms."""
    return int(time.monotonic() * 1000)


@dataclass
class ClientRecord:
    client_id: str
    settings: Any = None
    streams: list[Stream] = field(default_factory=list)
    #: When the client was last heard from (monotonic ms).
    seen_ms: int = field(default_factory=lambda: now_ms())

    @property
    def producer_topics(self) -> set[str]:
        if self.settings is None or self.settings.client_type != PRODUCER:
            return set()
        return {t.name for t in self.settings.publishing.topics}


class ClientRegistry:
    """Settings and Telemetry streams per client id."""

    def __init__(self) -> None:
        self._clients: dict[str, ClientRecord] = {}

    def get(self, client_id: str) -> ClientRecord | None:
        return self._clients.get(client_id)

    def settings(self, client_id: str) -> Any:
        record = self._clients.get(client_id)
        return None if record is None else record.settings

    def update(self, client_id: str, settings: Any, stream: Stream) -> bool:
        """Record a client's Settings sent over ``stream``; whether its published topics
        changed (the brokers are told at once then)."""
        record = self._clients.setdefault(client_id, ClientRecord(client_id))
        before = record.producer_topics
        record.settings = settings
        record.seen_ms = now_ms()
        if stream not in record.streams:
            record.streams.append(stream)
        return record.producer_topics != before

    def heard_from(self, client_id: str) -> None:
        """A Heartbeat of ``client_id`` (nothing for a client that sent no Settings yet)."""
        record = self._clients.get(client_id)
        if record is not None:
            record.seen_ms = now_ms()

    def seen_ms(self, client_id: str) -> int | None:
        """When ``client_id`` was last heard from; None if the proxy does not know it."""
        record = self._clients.get(client_id)
        return None if record is None else record.seen_ms

    def stream_closed(self, client_id: str, stream: Stream) -> None:
        record = self._clients.get(client_id)
        if record is None:
            return
        if stream in record.streams:
            record.streams.remove(stream)
        if not record.streams:
            del self._clients[client_id]

    def remove(self, client_id: str) -> ClientRecord | None:
        return self._clients.pop(client_id, None)

    def producer_groups(self) -> set[str]:
        """Topics of connected producers: the producer groups a check-back names."""
        return {t for r in self._clients.values() if r.streams for t in r.producer_topics}

    def producer_stream(self, topic: str) -> Stream | None:
        """A stream of a connected producer of ``topic`` (chosen at random), or None."""
        streams = [s for r in self._clients.values() if topic in r.producer_topics
                   for s in r.streams]
        return random.choice(streams) if streams else None

    def all_streams(self) -> Iterable[Stream]:
        return [s for r in self._clients.values() for s in r.streams]
