"""Broker state that must survive a failover: topics, consumer groups, offsets, pop progress.

Both are written as records to an internal topic of the commitlog (``STATE_TOPIC``,
queue 0), so HA replication carries them to the slaves like any message and a new master
already knows every topic and committed offset.  Each record body is one JSON object:

- ``{"op": "topic_put", "config": <RocketMQ TopicConfig>}``
- ``{"op": "topic_delete", "topic": T}``
- ``{"op": "offsets", "entries": [[group, topic, queue_id, offset], ...]}``
- ``{"op": "timer_done", "offsets": [q, ...]}`` — timer-queue offsets whose messages were
  delivered (timer messages are due out of order, so progress is a set above a low mark);
- ``{"op": "group_put", "config": <RocketMQ SubscriptionGroupConfig>}``,
  ``{"op": "group_delete", "group": G}`` — subscription groups (``mqadmin updateSubGroup``);
- ``pop_batch``, ``pop_ack``, ``pop_change``, ``pop_revive``, ``pop_key`` — pop
  consumption (see :mod:`rmqha.messaging.pop_state`);
- ``{"op": "request_mode", "topic": T, "group": G, "mode": "PULL"|"POP",
  "popShareQueueNum": N}`` — SET_MESSAGE_REQUEST_MODE (see :mod:`rmqha.messaging.assignment`);
- ``{"op": "checkpoint", "topics": [...], "offsets": [...], "timer": {...}, "groups": [...],
  "pop": {...}, "request_modes": [[T, G, mode, N], ...]}`` — the whole state; written
  before retention deletes segments, so the state never depends on deleted records.

The state is the fold of these records in log order (a checkpoint replaces everything);
records are applied as the index passes them (up to the confirm offset), and a master
also applies its own writes at once (see :class:`BrokerState`).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rmqha.errors import ConfigError, ProtocolError
from rmqha.messaging.assignment import ModeSetting, RequestModeTable, parse_mode
from rmqha.messaging.pop_state import POP_OPS, PopState
from rmqha.protocol.groups import GroupTable, SubscriptionGroupConfig
from rmqha.protocol.topics import TopicConfig, TopicTable

log = logging.getLogger(__name__)

#: The internal topic holding state records (RocketMQ reserves the ``RMQ_SYS_`` prefix).
STATE_TOPIC = "RMQ_SYS_RMQHA_STATE"

OffsetKey = tuple[str, str, int]  # group, topic, queue id


class OffsetTable:
    """Committed consumer offsets: (group, topic, queue) -> next offset to consume."""

    def __init__(self) -> None:
        self._offsets: dict[OffsetKey, int] = {}

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def set(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Store an offset; True when it changed."""
        key = (group, topic, queue_id)
        if self._offsets.get(key) == offset:
            return False
        self._offsets[key] = offset
        return True

    def entries(self) -> list[list[Any]]:
        return [[g, t, q, o] for (g, t, q), o in sorted(self._offsets.items())]

    def groups(self) -> set[str]:
        return {g for g, _, _ in self._offsets}

    def topics_of(self, group: str) -> frozenset[str]:
        """The topics a group has committed offsets on (RocketMQ's ``whichTopicByConsumer``)."""
        return frozenset(t for g, t, _ in self._offsets if g == group)

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self._offsets if k[1] == topic]:
            del self._offsets[key]

    def clear(self) -> None:
        self._offsets.clear()

    def __len__(self) -> int:
        return len(self._offsets)


class TimerProgress:
    """Which timer-queue offsets were delivered: everything below ``low``, plus ``done``."""

    def __init__(self) -> None:
        self.low = 0
        self.done: set[int] = set()

    def delivered(self, queue_offset: int) -> bool:
        return queue_offset < self.low or queue_offset in self.done

    def mark(self, offsets: Iterable[int]) -> None:
        self.done.update(int(o) for o in offsets if int(o) >= self.low)

    def advance_low(self, low: int) -> None:
        """Everything below ``low`` is delivered (or gone): forget the set below it."""
        if low > self.low:
            self.low = low
            self.done = {o for o in self.done if o >= low}
        while self.low in self.done:
            self.done.discard(self.low)
            self.low += 1

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low, "done": sorted(self.done)}

    def load(self, data: dict[str, Any] | None) -> None:
        self.low, self.done = 0, set()
        if data:
            self.low = int(data.get("low", 0))
            self.mark(data.get("done", []))


@dataclass
class StateRecord:
    """One decoded state record."""

    op: str
    data: dict[str, Any]


def topic_put_record(config: TopicConfig) -> bytes:
    return _dump({"op": "topic_put", "config": config.to_rocketmq()})


def topic_delete_record(topic: str) -> bytes:
    return _dump({"op": "topic_delete", "topic": topic})


def offsets_record(entries: Iterable[tuple[str, str, int, int]]) -> bytes:
    return _dump({"op": "offsets", "entries": [list(e) for e in entries]})


def timer_done_record(offsets: Iterable[int], low: int) -> bytes:
    return _dump({"op": "timer_done", "offsets": sorted(offsets), "low": low})


def group_put_record(config: SubscriptionGroupConfig) -> bytes:
    return _dump({"op": "group_put", "config": config.to_rocketmq()})


def group_delete_record(group: str) -> bytes:
    return _dump({"op": "group_delete", "group": group})


def request_mode_record(topic: str, group: str, setting: ModeSetting) -> bytes:
    return _dump({"op": "request_mode", "topic": topic, "group": group,
                  "mode": setting.mode.value, "popShareQueueNum": setting.pop_share_queue_num})


def pop_record(data: dict[str, Any]) -> bytes:
    """The body of a pop record built by :mod:`rmqha.messaging.pop_state`."""
    return _dump(data)


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode_record(body: bytes | memoryview) -> StateRecord:
    try:
        data = json.loads(bytes(body))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"state record is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("op"), str):
        raise ProtocolError("state record has no op")
    return StateRecord(data["op"], data)


class BrokerState:
    """Topics, groups, offsets and pop progress: the fold of the state log."""

    def __init__(self, topics: TopicTable) -> None:
        self.topics = topics
        self.offsets = OffsetTable()
        self.timer = TimerProgress()
        self.groups = GroupTable()
        self.pop = PopState()
        self.request_modes = RequestModeTable()

    def checkpoint_record(self) -> bytes:
        return _dump({
            "op": "checkpoint",
            "topics": [c.to_rocketmq() for _, c in sorted(self.topics.items())],
            "offsets": self.offsets.entries(),
            "timer": self.timer.to_json(),
            "groups": [c.to_rocketmq() for _, c in self.groups.items()],
            "pop": self.pop.to_json(),
            "request_modes": self.request_modes.entries(),
        })

    def clear(self) -> None:
        """Forget what the log folded (the topic table is the caller's to reset)."""
        self.offsets.clear()
        self.groups.replace_all([])
        self.pop.clear()
        self.request_modes.clear()

    def apply(self, body: bytes | memoryview, *, persist: bool = True) -> StateRecord | None:
        """Apply one record; a bad record is logged and skipped (it cannot be fixed here)."""
        try:
            rec = decode_record(body)
            self._apply(rec, persist)
        except (ProtocolError, ConfigError, KeyError, TypeError, ValueError) as exc:
            log.error("skipping bad state record: %s", exc)
            return None
        return rec

    def _apply(self, rec: StateRecord, persist: bool) -> None:
        d = rec.data
        if rec.op == "topic_put":
            self.topics.put(TopicConfig.from_rocketmq(d["config"]), persist=persist)
        elif rec.op in POP_OPS:
            self.pop.apply(rec.op, d)
        elif rec.op == "topic_delete":
            self.topics.remove(str(d["topic"]), persist=persist)
            self.offsets.drop_topic(str(d["topic"]))
            self.pop.drop_topic(str(d["topic"]))
            self.request_modes.drop_topic(str(d["topic"]))
        elif rec.op == "request_mode":
            self.request_modes.put(str(d["topic"]), str(d["group"]), ModeSetting(
                parse_mode(d["mode"]), int(d.get("popShareQueueNum", 0))))
        elif rec.op == "group_put":
            self.groups.put(SubscriptionGroupConfig.from_rocketmq(d["config"]))
        elif rec.op == "group_delete":
            self.groups.remove(str(d["group"]))
        elif rec.op == "offsets":
            for group, topic, queue_id, offset in d["entries"]:
                self.offsets.set(str(group), str(topic), int(queue_id), int(offset))
        elif rec.op == "checkpoint":
            self.topics.replace_all([TopicConfig.from_rocketmq(c) for c in d["topics"]],
                                    persist=persist)
            self.offsets.clear()
            for group, topic, queue_id, offset in d["offsets"]:
                self.offsets.set(str(group), str(topic), int(queue_id), int(offset))
            self.timer.load(d.get("timer"))
            self.groups.replace_all([SubscriptionGroupConfig.from_rocketmq(c)
                                     for c in d.get("groups", [])])
            self.pop.load(d.get("pop"))
            self.request_modes.load(d.get("request_modes", []))
        elif rec.op == "timer_done":
            self.timer.mark(d["offsets"])
            self.timer.advance_low(int(d.get("low", 0)))
        else:
            raise ProtocolError(f"unknown state op {rec.op!r}")
