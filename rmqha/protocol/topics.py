"""Topic configurations of a broker: queue counts, permissions, and their file.

A :class:`TopicConfig` carries RocketMQ's fields (``topicName``, ``readQueueNums``,
``writeQueueNums``, ``perm``, ``topicSysFlag``, ``order``, ``attributes``; see
:mod:`rmqha.protocol.topic_attributes`) and renders them the way the name server and
RocketMQ's tools expect.  :class:`TopicTable` is the broker's table; it is
saved to ``topics.json`` atomically (temp file, fsync, rename, directory fsync) after every
change.  The replicated truth is the state log (see :mod:`rmqha.messaging.state`); the file
is the local copy an operator reads and the seed used before the log says anything.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqha.errors import ConfigError

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_READ_WRITE = PERM_READ | PERM_WRITE

#: RocketMQ's topic the C++ client falls back to when a topic has no route.
DEFAULT_TOPIC = "TBW102"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

_VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_BYTES = 127  # the V1 record keeps the topic length in one signed byte
MAX_QUEUE_NUMS = 1024


def validate_topic_name(topic: str) -> None:
    """RocketMQ's rule: letters, digits, ``%|_-``, at most 127 bytes."""
    if not topic or len(topic.encode("utf-8")) > MAX_TOPIC_BYTES or not _VALID_TOPIC.match(topic):
        raise ConfigError(f"topic {topic!r} is invalid (1-127 chars of [%|a-zA-Z0-9_-])")


def rocketmq_topic_config(topic_name: str, read_queue_nums: int, write_queue_nums: int, perm: int,
                          topic_sys_flag: int, order: bool,
                          attributes: dict[str, str] | None = None) -> dict[str, Any]:
    """RocketMQ's ``TopicConfig`` JSON, as brokers register it and the name server serves it."""
    return {
        "topicName": topic_name,
        "readQueueNums": read_queue_nums,
        "writeQueueNums": write_queue_nums,
        "perm": perm,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": topic_sys_flag,
        "order": order,
        "attributes": dict(attributes or {}),
    }


@dataclass
class TopicConfig:
    """One topic on this broker."""

    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0
    order: bool = False
    #: RocketMQ 5 topic attributes with plain keys (``{"message.type": "FIFO"}``).
    attributes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_topic_name(self.topic_name)
        for name in ("read_queue_nums", "write_queue_nums"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= MAX_QUEUE_NUMS:
                raise ConfigError(f"{name} of topic {self.topic_name!r} must be "
                                  f"1..{MAX_QUEUE_NUMS}, got {value!r}")
        if not isinstance(self.perm, int) or not 0 <= self.perm <= 15:
            raise ConfigError(f"perm of topic {self.topic_name!r} must be 0..15, got {self.perm!r}")

    @property
    def queue_nums(self) -> int:
        """Queues that exist (hold data or may): the larger of the read and write counts."""
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_rocketmq(self) -> dict[str, Any]:
        """RocketMQ's ``TopicConfig`` JSON (what ``topicConfigTable`` holds)."""
        return rocketmq_topic_config(self.topic_name, self.read_queue_nums, self.write_queue_nums,
                                     self.perm, self.topic_sys_flag, self.order, self.attributes)

    @classmethod
    def from_rocketmq(cls, data: dict[str, Any]) -> TopicConfig:
        try:
            return cls(
                topic_name=str(data["topicName"]),
                read_queue_nums=int(data.get("readQueueNums", 8)),
                write_queue_nums=int(data.get("writeQueueNums", 8)),
                perm=int(data.get("perm", PERM_READ_WRITE)),
                topic_sys_flag=int(data.get("topicSysFlag", 0)),
                order=str(data.get("order", False)).lower() == "true",
                attributes=_attributes(data.get("attributes")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad topic config {data!r}: {exc}") from exc


def _attributes(raw: Any) -> dict[str, str]:
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise TypeError(f"attributes must be an object, got {raw!r}")
    return {str(k): str(v) for k, v in raw.items()}


def write_atomically(path: Path, data: bytes) -> None:
    """Replace a file so a crash leaves either the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TopicTable:
    """The broker's topics; ``path`` (optional) is rewritten atomically on every change."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._topics: dict[str, TopicConfig] = {}

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text("utf-8"))
            table = data["topicConfigTable"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"topic file {self.path} is unreadable: {exc}") from exc
        self._topics = {name: TopicConfig.from_rocketmq(cfg) for name, cfg in table.items()}

    def save(self) -> None:
        if self.path is None:
            return
        body = {"topicConfigTable": {n: c.to_rocketmq() for n, c in sorted(self._topics.items())}}
        write_atomically(self.path, json.dumps(body, indent=1, sort_keys=True).encode("utf-8"))

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    def items(self) -> list[tuple[str, TopicConfig]]:
        return list(self._topics.items())

    def put(self, config: TopicConfig, *, persist: bool = True) -> None:
        self._topics[config.topic_name] = config
        if persist:
            self.save()

    def remove(self, topic: str, *, persist: bool = True) -> bool:
        found = self._topics.pop(topic, None) is not None
        if found and persist:
            self.save()
        return found

    def replace_all(self, configs: list[TopicConfig], *, persist: bool = True) -> None:
        self._topics = {c.topic_name: c for c in configs}
        if persist:
            self.save()
