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
        # Every send parses this: the fields inline, as opt_int would read them; anything
        # that does not convert goes through the per-field path, which names it.
        get = ext.get
        topic = get(names["topic"])
        if topic is not None:
            try:
                qid, sf, born, fl, rt = (get(names["queue_id"]), get(names["sys_flag"]),
                                         get(names["born_timestamp"]), get(names["flag"]),
                                         get(names["reconsume_times"]))
                max_rt = get(names["max_reconsume_times"]) or ""
                batch = get(names["batch"])
                return cls(
                    producer_group=get(names["producer_group"], ""),
                    topic=topic,
                    queue_id=int(qid) if qid else -1,
                    sys_flag=int(sf) if sf else 0,
                    born_timestamp=int(born) if born else 0,
                    flag=int(fl) if fl else 0,
                    properties=get(names["properties"], "") or "",
                    reconsume_times=int(rt) if rt else 0,
                    batch=False if not batch else batch.strip().lower() in ("1", "true"),
                    max_reconsume_times=int(max_rt) if max_rt.lstrip("-").isdigit() else None,
                )
            except ValueError:
                pass
        # Something is missing or does not convert: find which and say so.
        req_str(ext, names["topic"])
        for name in ("queue_id", "sys_flag", "born_timestamp", "flag", "reconsume_times"):
            opt_int(ext, names[name], 0)
        raise ProtocolError(f"header field {names['max_reconsume_times']!r} is not an integer: "
                            f"{ext.get(names['max_reconsume_times'])!r}")


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


@dataclass
class PopHeader:
    """POP_MESSAGE request header (RocketMQ's ``PopMessageRequestHeader``)."""

    consumer_group: str
    topic: str
    #: -1: any readable queue of the topic.
    queue_id: int
    max_msg_nums: int
    invisible_time: int
    poll_time: int
    born_time: int
    init_mode: int
    exp_type: str | None
    exp: str | None
    order: bool
    attempt_id: str | None

    @classmethod
    def from_ext(cls, ext: Ext) -> PopHeader:
        queue_id = req_int(ext, "queueId")
        return cls(
            consumer_group=req_str(ext, "consumerGroup"),
            topic=req_str(ext, "topic"),
            queue_id=-1 if queue_id < 0 else queue_id,
            max_msg_nums=req_int(ext, "maxMsgNums"),
            invisible_time=req_int(ext, "invisibleTime"),
            poll_time=opt_int(ext, "pollTime", 0),
            born_time=opt_int(ext, "bornTime", 0),
            init_mode=opt_int(ext, "initMode", 0),
            exp_type=ext.get("expType") or None,
            exp=ext.get("exp") or None,
            order=opt_bool(ext, "order"),
            attempt_id=ext.get("attemptId") or None,
        )


@dataclass
class AckHeader:
    """ACK_MESSAGE (``AckMessageRequestHeader``) and CHANGE_MESSAGE_INVISIBLETIME
    (``ChangeInvisibleTimeRequestHeader``, which adds ``invisibleTime``) request headers."""

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int
    #: Only CHANGE_MESSAGE_INVISIBLETIME carries it.
    invisible_time: int | None = None

    @classmethod
    def from_ext(cls, ext: Ext, *, change: bool = False) -> AckHeader:
        return cls(
            consumer_group=req_str(ext, "consumerGroup"),
            topic=req_str(ext, "topic"),
            queue_id=req_int(ext, "queueId"),
            extra_info=req_str(ext, "extraInfo"),
            offset=req_int(ext, "offset"),
            invisible_time=req_int(ext, "invisibleTime") if change else None,
        )
