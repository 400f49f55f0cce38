"""Who is connected to a broker: client heartbeats, consumer groups, orderly-queue locks.

Every broker answers GET_CONSUMER_LIST_BY_GROUP from its own heartbeat table (clients send
heartbeats to every broker of a topic), so this table is per broker and never replicated.
A client leaves it by UNREGISTER_CLIENT, when its connection closes, or after
``expire_s`` without a heartbeat (RocketMQ clients beat every 30 s).

Queue locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ) give one client of a group exclusive use of
a queue for orderly consumption; a lock lapses after ``lock_ttl_s`` unless renewed.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmqha.protocol.headers import ConsumerData, HeartbeatData

#: A RocketMQ MessageQueue: (topic, brokerName, queueId).
MQ = tuple[str, str, int]


@dataclass
class ClientInfo:
    client_id: str
    last_seen: float
    consumer_groups: set[str] = field(default_factory=set)
    producer_groups: set[str] = field(default_factory=set)
    #: group -> topic -> subscription expression
    subscriptions: dict[str, dict[str, str]] = field(default_factory=dict)
    connection: Any = None
    #: What its last heartbeat said besides the groups (mqadmin's consumerConnection and
    #: producerConnection show them): the frame's language and version, the consumers'
    #: entries as sent (consume type, message model, where to start).
    language: str = "JAVA"
    version: int = 0
    consumers: dict[str, ConsumerData] = field(default_factory=dict)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class ClientRegistry:
    """The heartbeat table; ``on_group_change(group)`` runs when a group's members change."""

    def __init__(self, expire_s: float = 120.0,
                 on_group_change: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.expire_s = expire_s
        self._clients: dict[str, ClientInfo] = {}
        self._on_group_change = on_group_change
        self._clock = clock

    def heartbeat(self, data: HeartbeatData, connection: Any = None, *, language: str = "JAVA",
                  version: int = 0) -> ClientInfo:
        """Record a HEART_BEAT body (``language`` and ``version``: its frame's)."""
        client_id = data.client_id
        now = self._clock()
        info = self._clients.get(client_id)
        before = set() if info is None else set(info.consumer_groups)
        if info is None:
            info = self._clients[client_id] = ClientInfo(client_id, now)
        info.last_seen = now
        if connection is not None:
            info.connection = connection
        subs = {c.group: {s.topic: s.expression for s in c.subscriptions}
                for c in data.consumers}
        groups = set(subs)
        info.consumer_groups = groups
        info.subscriptions = subs
        info.consumers = {c.group: c for c in data.consumers}
        info.language, info.version = language, version
        info.producer_groups = set(data.producer_groups)
        for group in groups ^ before:
            self._changed(group)
        return info

    def unregister(self, client_id: str, consumer_group: str = "",
                   producer_group: str = "") -> None:
        info = self._clients.get(client_id)
        if info is None:
            return
        if consumer_group:
            if consumer_group in info.consumer_groups:
                info.consumer_groups.discard(consumer_group)
                info.subscriptions.pop(consumer_group, None)
                self._changed(consumer_group)
        if producer_group:
            info.producer_groups.discard(producer_group)
        if not info.consumer_groups and not info.producer_groups:
            del self._clients[client_id]

    def connection_closed(self, connection: Any) -> list[str]:
        """Forget the clients that used this connection; returns their ids."""
        gone = [c for c, i in self._clients.items() if i.connection is connection]
        for cid in gone:
            info = self._clients.pop(cid)
            for group in info.consumer_groups:
                self._changed(group)
        return gone

    def expire(self) -> None:
        limit = self._clock() - self.expire_s
        for cid in [c for c, i in self._clients.items() if i.last_seen < limit]:
            info = self._clients.pop(cid)
            for group in info.consumer_groups:
                self._changed(group)

    def consumers(self, group: str) -> list[ClientInfo]:
        self.expire()
        return sorted((i for i in self._clients.values() if group in i.consumer_groups),
                      key=lambda i: i.client_id)

    def producer_members(self, group: str) -> list[ClientInfo]:
        """Every live producer of a group that heartbeats this broker (mqadmin
        producerConnection), connected or not."""
        self.expire()
        return sorted((i for i in self._clients.values() if group in i.producer_groups),
                      key=lambda i: i.client_id)

    def producers(self, group: str) -> list[ClientInfo]:
        """Live producers of a group with an open connection (transaction check-backs)."""
        self.expire()
        return sorted((i for i in self._clients.values() if group in i.producer_groups
                       and i.connection is not None and not getattr(i.connection, "closed", False)),
                      key=lambda i: i.client_id)

    def consumer_groups(self) -> set[str]:
        return {g for i in self._clients.values() for g in i.consumer_groups}

    def _changed(self, group: str) -> None:
        if self._on_group_change is not None:
            self._on_group_change(group)


class QueueLocks:
    """Orderly-consumption locks: (group, mq) -> (client id, expiry)."""

    def __init__(self, lock_ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lock_ttl_s = lock_ttl_s
        self._locks: dict[tuple[str, MQ], tuple[str, float]] = {}
        self._clock = clock
        #: Locks granted or renewed so far (metrics, tests).
        self.grants = 0

    def lock(self, group: str, client_id: str, mqs: list[MQ]) -> list[MQ]:
        """Lock what is free or already ours; returns the queues now held by ``client_id``."""
        now = self._clock()
        held = []
        for mq in mqs:
            key = (group, mq)
            owner = self._locks.get(key)
            if owner is None or owner[0] == client_id or owner[1] < now:
                self._locks[key] = (client_id, now + self.lock_ttl_s)
                held.append(mq)
                self.grants += 1
        return held

    def holders(self) -> dict[tuple[str, MQ], str]:
        """(group, queue) -> client id of every live lock."""
        now = self._clock()
        return {k: owner for k, (owner, until) in self._locks.items() if until >= now}

    def release_client(self, client_id: str, group: str | None = None) -> int:
        """Drop the locks of a client that left (of one group, or all), so its queues can
        move to another member at once."""
        keys = [k for k, (owner, _) in self._locks.items()
                if owner == client_id and (group is None or k[0] == group)]
        for k in keys:
            del self._locks[k]
        return len(keys)

    def unlock(self, group: str, client_id: str, mqs: list[MQ]) -> None:
        for mq in mqs:
            key = (group, mq)
            owner = self._locks.get(key)
            if owner is not None and owner[0] == client_id:
                del self._locks[key]


def parse_mq_set(body: dict[str, Any]) -> list[MQ]:
    out: list[MQ] = []
    for mq in _list(body.get("mqSet")):
        if isinstance(mq, dict):
            out.append((str(mq.get("topic", "")), str(mq.get("brokerName", "")),
                        int(mq.get("queueId", 0))))
    return out


def mq_json(mq: MQ) -> dict[str, Any]:
    return {"topic": mq[0], "brokerName": mq[1], "queueId": mq[2]}
