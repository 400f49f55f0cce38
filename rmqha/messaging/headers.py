"""Request headers of the client protocol, parsed from ``extFields``.

RocketMQ clients send header fields as JSON numbers or strings (C++ mixes both; the codec
turns them all into strings), Java's V2 send header uses one-letter names, and booleans
come as ``true``/``false`` or ``1``/``0``.  Each dataclass here accepts all of these and
raises :class:`~rmqha.errors.ProtocolError` naming the field that is missing or wrong.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rmqha.errors import ProtocolError

Ext = Mapping[str, str]

#: PullMessageRequestHeader.sysFlag bits (``PullSysFlag``).
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_CLASS_FILTER = 0x8


def req_str(ext: Ext, name: str) -> str:
    value = ext.get(name)
    if value is None:
        raise ProtocolError(f"header field {name!r} is missing")
    return value


def opt_int(ext: Ext, name: str, default: int) -> int:
    value = ext.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"header field {name!r} is not an integer: {value!r}") from None


def req_int(ext: Ext, name: str) -> int:
    value = req_str(ext, name)
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"header field {name!r} is not an integer: {value!r}") from None


def opt_bool(ext: Ext, name: str, default: bool = False) -> bool:
    value = ext.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true")


#: SendHeader field -> its name in SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE and in SEND_MESSAGE.
_SEND_V2_NAMES = dict(producer_group="a", topic="b", queue_id="e", sys_flag="f",
                      born_timestamp="g", flag="h", properties="i", reconsume_times="j",
                      batch="m", max_reconsume_times="l")
_SEND_V1_NAMES = dict(producer_group="producerGroup", topic="topic", queue_id="queueId",
                      sys_flag="sysFlag", born_timestamp="bornTimestamp", flag="flag",
                      properties="properties", reconsume_times="reconsumeTimes",
                      batch="batch", max_reconsume_times="maxReconsumeTimes")


@dataclass
class SendHeader:
    """SEND_MESSAGE (V1 names), SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (letters a..n)."""

    producer_group: str
    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    batch: bool
    max_reconsume_times: int | None = None

    @classmethod
    def from_ext(cls, ext: Ext, *, v2: bool) -> SendHeader:
        names = _SEND_V2_NAMES if v2 else _SEND_V1_NAMES
        max_rt = ext.get(names["max_reconsume_times"]) or ""
        return cls(
            producer_group=ext.get(names["producer_group"], ""),
            topic=req_str(ext, names["topic"]),
            queue_id=opt_int(ext, names["queue_id"], -1),
            sys_flag=opt_int(ext, names["sys_flag"], 0),
            born_timestamp=opt_int(ext, names["born_timestamp"], 0),
            flag=opt_int(ext, names["flag"], 0),
            properties=ext.get(names["properties"], "") or "",
            reconsume_times=opt_int(ext, names["reconsume_times"], 0),
            batch=opt_bool(ext, names["batch"]),
            max_reconsume_times=int(max_rt) if max_rt.lstrip("-").isdigit() else None,
        )


@dataclass
class PullHeader:
    """PULL_MESSAGE request header."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_ms: int
    subscription: str | None

    @classmethod
    def from_ext(cls, ext: Ext) -> PullHeader:
        return cls(
            consumer_group=req_str(ext, "consumerGroup"),
            topic=req_str(ext, "topic"),
            queue_id=req_int(ext, "queueId"),
            queue_offset=req_int(ext, "queueOffset"),
            max_msg_nums=opt_int(ext, "maxMsgNums", 32),
            sys_flag=opt_int(ext, "sysFlag", 0),
            commit_offset=opt_int(ext, "commitOffset", -1),
            suspend_timeout_ms=opt_int(ext, "suspendTimeoutMillis", 0),
            subscription=ext.get("subscription"),
        )
