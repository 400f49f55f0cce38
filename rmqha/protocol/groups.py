"""Subscription groups (consumer groups) as RocketMQ's admin tools set them.

:class:`SubscriptionGroupConfig` is RocketMQ's ``SubscriptionGroupConfig`` JSON, the body
of UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (``mqadmin updateSubGroup``) and the values of
GET_ALL_SUBSCRIPTIONGROUP_CONFIG's ``subscriptionGroupTable``.  The broker reads two of
its fields: ``consumeMessageOrderly`` (pop consumption of the group is FIFO: a queue's
next message waits until the previous is acked) and ``retryMaxTimes`` (deliveries before
the dead-letter queue).  Fields rmqha does not read are kept as they came, so a config
round-trips.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rmqha.errors import ConfigError

#: RocketMQ's ``TopicValidator.validateGroup``: the topic character set, 255 chars at most.
_VALID_GROUP = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_GROUP_CHARS = 255
#: RocketMQ's default ``retryMaxTimes`` (and ``maxReconsumeTimes``).
DEFAULT_RETRY_MAX_TIMES = 16

#: snake_case field -> RocketMQ's JSON name, for the fields rmqha models.
_FIELDS = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "consume_message_orderly": "consumeMessageOrderly",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
    "group_sys_flag": "groupSysFlag",
    "consume_timeout_minute": "consumeTimeoutMinute",
    "attributes": "attributes",
}
_BOOLS = {"consume_enable", "consume_from_min_enable", "consume_broadcast_enable",
          "consume_message_orderly", "notify_consumer_ids_changed_enable"}


def validate_group_name(name: str) -> None:
    if not name or len(name) > MAX_GROUP_CHARS or not _VALID_GROUP.match(name):
        raise ConfigError(f"consumer group {name!r} is invalid "
                          f"(1-{MAX_GROUP_CHARS} chars of [%|a-zA-Z0-9_-])")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise ConfigError(f"{name} must be true or false, got {value!r}")


@dataclass
class SubscriptionGroupConfig:
    """One consumer group's settings (RocketMQ's defaults)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    attributes: dict[str, str] = field(default_factory=dict)
    #: RocketMQ fields rmqha does not model (groupRetryPolicy, subscriptionDataSet, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_group_name(self.group_name)
        if not isinstance(self.retry_max_times, int) or self.retry_max_times < 0:
            raise ConfigError(f"retryMaxTimes of group {self.group_name!r} must be >= 0, "
                              f"got {self.retry_max_times!r}")

    def to_rocketmq(self) -> dict[str, Any]:
        out = dict(self.extra)
        for name, key in _FIELDS.items():
            value = getattr(self, name)
            out[key] = dict(value) if isinstance(value, dict) else value
        return out

    @classmethod
    def from_rocketmq(cls, data: Any) -> SubscriptionGroupConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"a subscription group config is a JSON object, got {data!r}")
        known = set(_FIELDS.values())
        kwargs: dict[str, Any] = {}
        for name, key in _FIELDS.items():
            if key not in data or data[key] is None:
                continue
            value = data[key]
            if name in _BOOLS:
                kwargs[name] = _bool(key, value)
            elif name == "attributes":
                if not isinstance(value, dict):
                    raise ConfigError(f"attributes must be an object, got {value!r}")
                kwargs[name] = {str(k): str(v) for k, v in value.items()}
            elif name == "group_name":
                kwargs[name] = str(value)
            else:
                try:
                    kwargs[name] = int(value)
                except (TypeError, ValueError):
                    raise ConfigError(f"{key} must be an integer, got {value!r}") from None
        if "group_name" not in kwargs:
            raise ConfigError("a subscription group config needs groupName")
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs)


class GroupTable:
    """The broker's subscription groups (the fold of the state log's group records)."""

    def __init__(self) -> None:
        self._groups: dict[str, SubscriptionGroupConfig] = {}

    def get(self, name: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(name)

    def put(self, config: SubscriptionGroupConfig) -> None:
        self._groups[config.group_name] = config

    def remove(self, name: str) -> bool:
        return self._groups.pop(name, None) is not None

    def items(self) -> list[tuple[str, SubscriptionGroupConfig]]:
        return sorted(self._groups.items())

    def replace_all(self, configs: list[SubscriptionGroupConfig]) -> None:
        self._groups = {c.group_name: c for c in configs}

    def __contains__(self, name: object) -> bool:
        return name in self._groups

    def __len__(self) -> int:
        return len(self._groups)
