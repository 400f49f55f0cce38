"""Topic attributes as RocketMQ 5 sets them (``mqadmin updateTopic -a +message.type=FIFO``)
and the topic message type a send is checked against.

The wire form of a change is RocketMQ's ``AttributeParser``: ``+key=value`` adds or
alters, ``-key`` deletes, comma separated (``+message.type=FIFO,-reserve.time``).  A new
topic takes only ``+`` entries; an existing topic's attributes are altered by them
(``AttributeUtil.alterCurrentAttributes``), and only keys RocketMQ knows
(``TopicAttributes``) with values it accepts.  The stored map has plain keys
(``{"message.type": "FIFO"}``), as RocketMQ's ``TopicConfig.attributes``.

A message's type comes from its properties (``TopicMessageType.parseFromMessageProperty``):
TRANSACTION (``TRAN_MSG=true``), DELAY (a delay level or a timer property), FIFO (a
sharding key, ``__SHARDINGKEY``), else NORMAL.  RocketMQ's proxy refuses a send whose type
differs from its topic's unless the topic is MIXED (``DefaultTopicMessageTypeValidator``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from rmqha.errors import ConfigError

#: The attribute naming a topic's message type.
MESSAGE_TYPE = "message.type"
#: RocketMQ's ``MessageConst.PROPERTY_SHARDING_KEY``: the message group of a FIFO message.
SHARDING_KEY = "__SHARDINGKEY"


class TopicMessageType(str, Enum):
    """RocketMQ's ``TopicMessageType``."""

    UNSPECIFIED = "UNSPECIFIED"
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


@dataclass(frozen=True)
class _Attribute:
    """One of RocketMQ's ``TopicAttributes``: whether an existing topic may change it, and
    the values it takes (an enum set, or a long range)."""

    changeable: bool
    values: frozenset[str] = frozenset()
    low: int | None = None
    high: int | None = None

    def check(self, key: str, value: str) -> None:
        if self.values:
            if value not in self.values:
                raise ConfigError(f"topic attribute {key}={value!r} is not one of "
                                  f"{', '.join(sorted(self.values))}")
            return
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"topic attribute {key}={value!r} is not an integer") from None
        assert self.low is not None and self.high is not None
        if not self.low <= number <= self.high:
            raise ConfigError(f"topic attribute {key}={number} is outside "
                              f"[{self.low}, {self.high}]")


#: RocketMQ's ``TopicAttributes.ALL``.
KNOWN: dict[str, _Attribute] = {
    "queue.type": _Attribute(False, frozenset({"BatchCQ", "SimpleCQ"})),
    "cleanup.policy": _Attribute(False, frozenset({"DELETE", "COMPACTION"})),
    MESSAGE_TYPE: _Attribute(True, frozenset(t.value for t in TopicMessageType)),
    "reserve.time": _Attribute(True, low=-1, high=2**63 - 1),
}


def parse_modification(text: str | None) -> dict[str, str]:
    """``+a=1,-b`` -> ``{"+a": "1", "-b": ""}`` (RocketMQ's ``AttributeParser.parseToMap``);
    ConfigError names the entry that is malformed or repeated."""
    out: dict[str, str] = {}
    if not text:
        return out
    for entry in text.split(","):
        key, eq, value = entry.partition("=")
        if eq and not key.startswith("+"):
            raise ConfigError(f"topic attribute {entry!r}: add or alter as +key=value")
        if not eq and not key.startswith("-"):
            raise ConfigError(f"topic attribute {entry!r}: delete as -key")
        if key in out:
            raise ConfigError(f"topic attribute {key!r} given twice")
        out[key] = value
    return out


def alter(current: Mapping[str, str], modification: Mapping[str, str], *,
          create: bool) -> dict[str, str]:
    """The attributes after applying a parsed modification (``AttributeUtil``): a new
    topic takes only additions; an existing one may add, alter (changeable keys only) and
    delete keys it has.  ConfigError says which entry is refused."""
    out = dict(current)
    seen: set[str] = set()
    for raw, value in modification.items():
        sign, key = raw[:1], raw[1:]
        if not key or "+" in key or "-" in key:
            raise ConfigError(f"topic attribute {raw!r} is malformed")
        if key in seen:
            raise ConfigError(f"topic attribute {key!r} altered twice")
        seen.add(key)
        attr = KNOWN.get(key)
        if attr is None:
            raise ConfigError(f"topic attribute {key!r} is not supported "
                              f"(known: {', '.join(sorted(KNOWN))})")
        if sign == "-":
            if create:
                raise ConfigError(f"a new topic takes only +key=value attributes, not {raw!r}")
            if key not in out:
                raise ConfigError(f"topic attribute {key!r} cannot be deleted: it is not set")
            if not attr.changeable:
                raise ConfigError(f"topic attribute {key!r} cannot be changed once set")
            del out[key]
            continue
        attr.check(key, value)
        if not create and key in current and current[key] != value and not attr.changeable:
            raise ConfigError(f"topic attribute {key!r} cannot be changed once set")
        if not create and key not in current and not attr.changeable:
            raise ConfigError(f"topic attribute {key!r} can only be set when the topic is created")
        out[key] = value
    return out


def topic_message_type(attributes: Mapping[str, str]) -> TopicMessageType | None:
    """The message type a topic declares, None when it declares none."""
    value = attributes.get(MESSAGE_TYPE)
    return None if value is None else TopicMessageType(value)


def message_type_of(properties: Mapping[str, str], *, prepared: bool = False) -> TopicMessageType:
    """A message's type from its properties (``prepared``: the sysFlag marks a
    transaction's half message, which RocketMQ's producers also mark with TRAN_MSG)."""
    if prepared or properties.get("TRAN_MSG") == "true":
        return TopicMessageType.TRANSACTION
    if any(k in properties for k in ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
                                     "TIMER_DELAY_MS")):
        return TopicMessageType.DELAY
    if SHARDING_KEY in properties:
        return TopicMessageType.FIFO
    return TopicMessageType.NORMAL


def type_mismatch(expected: TopicMessageType, actual: TopicMessageType) -> str | None:
    """RocketMQ's refusal text when a message of ``actual`` type may not go to a topic of
    ``expected`` type, else None."""
    if actual is TopicMessageType.UNSPECIFIED or (
            actual is not expected and expected is not TopicMessageType.MIXED):
        return (f"TopicMessageType validate failed, the expected type is {expected.value}, "
                f"but actual type is {actual.value}")
    return None
