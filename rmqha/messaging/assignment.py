"""Broker-side queue assignment (RocketMQ 5's server load balancing): the rules, no I/O.

A Java push consumer with ``clientRebalance = false`` asks a broker which queues are its
own (QUERY_ASSIGNMENT) instead of computing them.  The answer depends on the topic/group's
*message request mode* (SET_MESSAGE_REQUEST_MODE; the broker's
``defaultMessageRequestMode`` otherwise, and always PULL for a ``%RETRY%`` topic):

- PULL: the group's readable queues split between its consumers by the strategy the
  client names (``AVG``: contiguous runs, ``AVG_BY_CIRCLE``: round robin), over the queues
  and client ids each sorted as RocketMQ sorts them;
- POP: with ``popShareQueueNum`` at most 0, or at least the number of consumers less one,
  every consumer pops every broker of the topic (one assignment per broker, queue id -1);
  else a consumer gets its own share plus the shares of the ``popShareQueueNum``
  consumers after it in the client list (more consumers than queues: one queue each,
  round robin);
- a BROADCASTING consumer gets every readable queue.

:class:`RequestModeTable` holds the modes set per (topic, group); it is part of the
replicated broker state (:mod:`rmqha.messaging.state`), so a new master answers as the old.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rmqha.errors import ProtocolError
from rmqha.protocol.topics import PERM_READ, RETRY_GROUP_TOPIC_PREFIX

#: A RocketMQ MessageQueue: (topic, brokerName, queueId); tuples sort as RocketMQ's compareTo.
MQ = tuple[str, str, int]
#: ``allocate(current client id, all queues, all client ids)``
Strategy = Callable[[str, Sequence[MQ], Sequence[str]], list[MQ]]

#: The queue id of an assignment that pops every queue of a broker.
ALL_QUEUES = -1


class RequestMode(enum.Enum):
    PULL = "PULL"
    POP = "POP"


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


@dataclass(frozen=True)
class ModeSetting:
    """What SET_MESSAGE_REQUEST_MODE stored for a topic and group."""

    mode: RequestMode = RequestMode.PULL
    pop_share_queue_num: int = 0


def parse_mode(value: Any, field: str = "mode") -> RequestMode:
    try:
        return RequestMode(str(value).upper())
    except ValueError:
        raise ProtocolError(f"{field} {value!r} is not PULL or POP") from None


def parse_model(value: Any) -> MessageModel:
    try:
        return MessageModel(str(value or "CLUSTERING").upper())
    except ValueError:
        raise ProtocolError(f"messageModel {value!r} is not CLUSTERING or BROADCASTING") from None


# --- strategies (RocketMQ's AllocateMessageQueueAveragely / ...ByCircle) -------------------


def allocate_averagely(cid: str, mqs: Sequence[MQ], cids: Sequence[str]) -> list[MQ]:
    """Contiguous runs, the first ``len(mqs) % len(cids)`` consumers one queue longer."""
    if cid not in cids:
        return []
    index, n, m = cids.index(cid), len(mqs), len(cids)
    mod = n % m
    size = 1 if n <= m else n // m + (1 if mod > 0 and index < mod else 0)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return list(mqs[start:start + max(0, min(size, n - start))])


def allocate_by_circle(cid: str, mqs: Sequence[MQ], cids: Sequence[str]) -> list[MQ]:
    """Queue i to consumer i mod len(cids)."""
    if cid not in cids:
        return []
    index = cids.index(cid)
    return [mq for i, mq in enumerate(mqs) if i % len(cids) == index]


STRATEGIES: dict[str, Strategy] = {"AVG": allocate_averagely, "AVG_BY_CIRCLE": allocate_by_circle}


def allocate_for_pop(strategy: Strategy, cid: str, mqs: Sequence[MQ], cids: Sequence[str],
                     share: int) -> list[MQ]:
    """A POP consumer's queues (see the module docstring)."""
    if share <= 0 or share >= len(cids) - 1:
        return sorted({(t, b, ALL_QUEUES) for t, b, _ in mqs})
    if len(cids) > len(mqs):
        return [mqs[cids.index(cid) % len(mqs)]] if cid in cids else []
    out = strategy(cid, mqs, cids)
    if cid in cids:
        index = cids.index(cid)
        for step in range(1, share + 1):
            out += strategy(cids[(index + step) % len(cids)], mqs, cids)
    return out


# --- the whole answer ----------------------------------------------------------------------


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"QUERY_ASSIGNMENT body has no {key}")
    return value


@dataclass(frozen=True)
class AssignmentQuery:
    """One QUERY_ASSIGNMENT body (RocketMQ's QueryAssignmentRequestBody)."""

    topic: str
    group: str
    client_id: str
    strategy: str
    model: MessageModel

    @classmethod
    def from_json(cls, body: Any) -> AssignmentQuery:
        if not isinstance(body, dict):
            raise ProtocolError("QUERY_ASSIGNMENT body is not a JSON object")
        topic, group, client = (_text(body, k) for k in ("topic", "consumerGroup", "clientId"))
        return cls(topic, group, client, str(body.get("strategyName") or "AVG"),
                   parse_model(body.get("messageModel")))


def effective_mode(topic: str, stored: ModeSetting | None, default: RequestMode,
                   default_share: int) -> ModeSetting:
    """The mode a query is answered in: the stored one, else the broker's default (PULL
    for a retry topic, as RocketMQ)."""
    if stored is not None:
        return stored
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return ModeSetting(RequestMode.PULL)
    return ModeSetting(default, default_share if default is RequestMode.POP else 0)


def readable_queues(topic: str, queue_datas: Iterable[tuple[str, int, int]]) -> list[MQ]:
    """The topic's subscribable queues from its route's (brokerName, readQueueNums, perm)."""
    return sorted((topic, broker, q) for broker, nums, perm in queue_datas
                  if perm & PERM_READ for q in range(nums))


def assign(query: AssignmentQuery, mqs: Sequence[MQ], cids: Sequence[str],
           setting: ModeSetting) -> list[MQ] | None:
    """The client's queues; None when there is no valid answer (unknown strategy, or the
    client is not among the group's consumers): RocketMQ's client then keeps what it has."""
    if query.model is MessageModel.BROADCASTING:
        return list(mqs)
    strategy = STRATEGIES.get(query.strategy)
    if strategy is None or not cids:
        return None
    ordered = sorted(cids)
    if setting.mode is RequestMode.POP:
        return allocate_for_pop(strategy, query.client_id, mqs, ordered, setting.pop_share_queue_num)
    return strategy(query.client_id, mqs, ordered) if mqs else None


def assignments_json(mqs: Iterable[MQ] | None, mode: RequestMode) -> dict[str, Any]:
    """QueryAssignmentResponseBody: a set of MessageQueueAssignment (no field when None)."""
    if mqs is None:
        return {}
    return {"messageQueueAssignments": [
        {"messageQueue": {"topic": t, "brokerName": b, "queueId": q}, "mode": mode.value}
        for t, b, q in sorted(set(mqs))]}


# --- the replicated table ------------------------------------------------------------------


class RequestModeTable:
    """(topic, group) -> the mode SET_MESSAGE_REQUEST_MODE stored."""

    def __init__(self) -> None:
        self._modes: dict[tuple[str, str], ModeSetting] = {}

    def get(self, topic: str, group: str) -> ModeSetting | None:
        return self._modes.get((topic, group))

    def put(self, topic: str, group: str, setting: ModeSetting) -> None:
        self._modes[(topic, group)] = setting

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self._modes if k[0] == topic]:
            del self._modes[key]

    def clear(self) -> None:
        self._modes.clear()

    def entries(self) -> list[list[Any]]:
        return [[t, g, s.mode.value, s.pop_share_queue_num]
                for (t, g), s in sorted(self._modes.items())]

    def load(self, entries: Iterable[Sequence[Any]]) -> None:
        self._modes = {(str(t), str(g)): ModeSetting(parse_mode(m), int(n))
                       for t, g, m, n in entries}

    def __len__(self) -> int:
        return len(self._modes)
