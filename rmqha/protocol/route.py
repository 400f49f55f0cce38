"""Topic routes as the name servers answer GET_ROUTEINFO_BY_TOPIC, and RocketMQ's MessageQueue.

:class:`TopicRoute` is a route's queue data (per broker group: queue counts, permission)
and broker data (per group: its brokers' addresses by id, the master at id 0), parsed
once from the JSON body (:meth:`TopicRoute.from_json`, ProtocolError naming what was
wrong) and never changed in place: a refresh replaces it.  The queues a producer may write
and a consumer may read follow RocketMQ's rules.  Below both the client (which looks
routes up) and the broker (server-side queue assignment reads the same answer).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rmqha.errors import ProtocolError
from rmqha.protocol.topics import PERM_READ, PERM_WRITE


@dataclass(frozen=True, order=True)
class MessageQueue:
    """RocketMQ's MessageQueue: ordering is RocketMQ's (topic, brokerName, queueId)."""

    topic: str
    broker_name: str
    queue_id: int


MASTER_ID = 0


@dataclass
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]

    @property
    def master(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def any_address(self) -> str | None:
        """Master if present, else the lowest id (where RocketMQ clients read from)."""
        if not self.broker_addrs:
            return None
        return self.broker_addrs.get(MASTER_ID) or self.broker_addrs[min(self.broker_addrs)]


@dataclass
class TopicRoute:
    topic: str
    queue_datas: list[QueueData]
    broker_datas: dict[str, BrokerData]
    fetched_at: float = field(default_factory=time.monotonic)
    #: publish_queues() of this route, computed once (a route is never changed in place:
    #: a refresh replaces it).
    _publish: list[MessageQueue] | None = field(default=None, init=False, repr=False,
                                                compare=False)
    #: publish_targets() of this route, computed once.
    _targets: list[tuple[MessageQueue, str]] | None = field(default=None, init=False,
                                                          repr=False, compare=False)

    @classmethod
    def from_json(cls, topic: str, data: dict[str, Any]) -> TopicRoute:
        try:
            qds = [QueueData(str(q["brokerName"]), int(q["readQueueNums"]),
                             int(q["writeQueueNums"]), int(q["perm"]))
                   for q in data.get("queueDatas") or []]
            bds = {}
            for b in data.get("brokerDatas") or []:
                addrs = {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()}
                bds[str(b["brokerName"])] = BrokerData(str(b.get("cluster", "")),
                                                       str(b["brokerName"]), addrs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"bad route for {topic}: {exc}") from exc
        return cls(topic, qds, bds)

    def publish_queues(self) -> list[MessageQueue]:
        """Writable queues on broker groups whose master is known (RocketMQ's rule).
        Computed once per route; callers must not change the list."""
        if self._publish is not None:
            return self._publish
        out: list[MessageQueue] = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            bd = self.broker_datas.get(qd.broker_name)
            if not qd.perm & PERM_WRITE or bd is None or bd.master is None:
                continue
            out.extend(MessageQueue(self.topic, qd.broker_name, i)
                       for i in range(qd.write_queue_nums))
        self._publish = out
        return out

    def publish_targets(self) -> list[tuple[MessageQueue, str]]:
        """publish_queues(), each with its group's master address: where a send to it
        goes.  Computed once per route (a send picks from it without looking anything up)."""
        if self._targets is None:
            self._targets = [(q, self.broker_datas[q.broker_name].master or "")
                             for q in self.publish_queues()]
        return self._targets

    def subscribe_queues(self) -> list[MessageQueue]:
        out: list[MessageQueue] = []
        for qd in self.queue_datas:
            if qd.perm & PERM_READ and qd.broker_name in self.broker_datas:
                out.extend(MessageQueue(self.topic, qd.broker_name, i)
                           for i in range(qd.read_queue_nums))
        return sorted(out)

    def addresses(self) -> list[str]:
        return sorted({a for b in self.broker_datas.values() for a in b.broker_addrs.values()})
