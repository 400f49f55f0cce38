"""RocketMQ 5's pop consumption on the wire: names, header fields and the batch-ack body.

What RocketMQ's clients and proxy read (``PopMessageProcessor``, ``ExtraInfoUtil``,
``KeyBuilder``, ``ConsumeInitMode``, ``BatchAck``):

- every popped message carries ``POP_CK``, its receipt handle (``extraInfo``): fields
  separated by one space, ``ckQueueOffset popTime invisibleTime reviveQid retry brokerName
  queueId queueOffset`` (``retry`` is "0" for the topic itself, "1" for the group's pop
  retry topic ``%RETRY%<group>_<topic>``); clients parse fields 0-7 and hand the whole
  string back to ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME.  rmqha appends its own
  fields after these (see :mod:`rmqha.messaging.receipt`);
- the POP_MESSAGE response header: ``popTime``, ``invisibleTime``, ``reviveQid`` (999 for
  FIFO pops), ``restNum``, and per queue ``startOffsetInfo`` (``retry queueId offset``),
  ``msgOffsetInfo`` (``retry queueId o1,o2,...``) and ``orderCountInfo``
  (``retry qo<queueId>%<offset> count``), entries joined by ``;``;
- BATCH_ACK_MESSAGE's body ``{"brokerName", "acks": [BatchAck]}``, a BatchAck naming one
  pop (``c`` group, ``t`` topic, ``r`` retry, ``so`` start offset, ``q`` queue, ``rq``
  revive queue, ``pt`` pop time, ``it`` invisible time, ``b`` the acked offsets as a Java
  ``BitSet`` relative to ``so``, base64 of ``toByteArray()``); rmqha also reads ``rh``,
  the receipt handles themselves, which is what makes a batch ack verifiable.
"""
from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from rmqha.errors import ProtocolError
from rmqha.protocol.topics import RETRY_GROUP_TOPIC_PREFIX

#: Message property carrying the receipt handle of a popped message.
POP_CK = "POP_CK"
#: Message property: when the message was first popped (set on its first revive).
FIRST_POP_TIME = "1ST_POP_TIME"
#: RocketMQ's ``MessageConst.KEY_SEPARATOR`` between extraInfo fields.
SEPARATOR = " "
#: The revive queue id RocketMQ gives FIFO pops (``KeyBuilder.POP_ORDER_REVIVE_QUEUE``).
ORDER_REVIVE_QID = 999
#: The most messages one pop may ask for.
MAX_POP_MESSAGES = 32
#: extraInfo's retry field: the message is on the topic itself / on the pop retry topic.
NORMAL_FLAG = "0"
RETRY_FLAG = "1"
RETRY_V2_FLAG = "2"


class ConsumeInitMode(IntEnum):
    """Where a group with no progress on a queue starts (RocketMQ's ``ConsumeInitMode``)."""

    MIN = 0
    MAX = 1


def pop_retry_topic(group: str, topic: str) -> str:
    """``KeyBuilder.buildPopRetryTopicV1``: where the group's expired pops of ``topic`` go."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


def retry_flag(topic: str) -> str:
    """extraInfo's ``retry`` field for a message read from ``topic``."""
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return RETRY_V2_FLAG if "+" in topic else RETRY_FLAG
    return NORMAL_FLAG


def real_topic(topic: str, group: str, flag: str) -> str:
    """``ExtraInfoUtil.getRealTopic``: the queue's topic from the topic a client names (the
    original one, or already the retry topic) and the handle's retry flag."""
    if flag == NORMAL_FLAG or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return topic
    if flag == RETRY_FLAG:
        return pop_retry_topic(group, topic)
    if flag == RETRY_V2_FLAG:
        return f"{RETRY_GROUP_TOPIC_PREFIX}{group}+{topic}"
    raise ProtocolError(f"retry flag {flag!r} is not 0, 1 or 2")


def original_topic(topic: str, group: str) -> str:
    """``KeyBuilder.parseNormalTopic``: the topic a pop retry topic stands for."""
    for sep in ("_", "+"):
        prefix = f"{RETRY_GROUP_TOPIC_PREFIX}{group}{sep}"
        if topic.startswith(prefix):
            return topic[len(prefix):]
    return topic


@dataclass
class QueueInfo:
    """The response header's per-queue fields of one pop, built up queue by queue."""

    start: list[str] = field(default_factory=list)
    offsets: list[str] = field(default_factory=list)
    order_counts: list[str] = field(default_factory=list)

    def add(self, topic: str, queue_id: int, start_offset: int,
            offsets: list[int], counts: list[int] | None = None) -> None:
        flag = retry_flag(topic)
        self.start.append(f"{flag}{SEPARATOR}{queue_id}{SEPARATOR}{start_offset}")
        self.offsets.append(f"{flag}{SEPARATOR}{queue_id}{SEPARATOR}"
                            + ",".join(str(o) for o in offsets))
        for offset, count in zip(offsets, counts or ()):
            self.order_counts.append(
                f"{flag}{SEPARATOR}qo{queue_id}%{offset}{SEPARATOR}{count}")

    def header(self) -> dict[str, str]:
        out = {"startOffsetInfo": ";".join(self.start), "msgOffsetInfo": ";".join(self.offsets)}
        if self.order_counts:
            out["orderCountInfo"] = ";".join(self.order_counts)
        return out


# --- batch ack ---------------------------------------------------------------------------------


@dataclass
class BatchAck:
    """One entry of a BATCH_ACK_MESSAGE body."""

    group: str
    topic: str
    retry: str
    start_offset: int
    queue_id: int
    revive_qid: int
    pop_time: int
    invisible_time: int
    #: Queue offsets the bit set names (start offset + bit).
    offsets: list[int]
    #: rmqha's extension: the receipt handles being acked.
    handles: list[str]


def bitset_offsets(encoded: Any, start: int) -> list[int]:
    """Offsets named by a Java ``BitSet`` that fastjson wrote as base64 of
    ``toByteArray()`` (little-endian: bit i is byte i // 8, bit i % 8)."""
    if encoded in (None, ""):
        return []
    if not isinstance(encoded, str):
        raise ProtocolError(f"batch ack bit set must be a base64 string, got {encoded!r}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"batch ack bit set {encoded!r} is not base64") from None
    return [start + i * 8 + bit for i, byte in enumerate(raw) for bit in range(8)
            if byte >> bit & 1]


def bitset_encode(bits: Iterable[int]) -> str:
    """base64 of a Java ``BitSet.toByteArray()`` holding ``bits`` (the client side)."""
    wanted = sorted(set(bits))
    if not wanted:
        return ""
    raw = bytearray(wanted[-1] // 8 + 1)
    for bit in wanted:
        raw[bit // 8] |= 1 << (bit % 8)
    return base64.b64encode(bytes(raw)).decode()


def _field(entry: dict[str, Any], short: str, long: str, kind: type, where: str) -> Any:
    value = entry.get(short, entry.get(long))
    if value is None:
        raise ProtocolError(f"{where}: field {short!r} ({long}) is missing")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"{where}: field {short!r} ({long}) is not a {kind.__name__}: "
                            f"{value!r}") from None


def parse_batch_ack_body(body: bytes) -> tuple[str, list[BatchAck]]:
    """(brokerName, entries) of a BATCH_ACK_MESSAGE body; ProtocolError names what is wrong."""
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise ProtocolError(f"batch ack body is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("acks"), list):
        raise ProtocolError("batch ack body must be an object with an 'acks' list")
    out = []
    for i, entry in enumerate(data["acks"]):
        where = f"acks[{i}]"
        if not isinstance(entry, dict):
            raise ProtocolError(f"{where} is not an object")
        start = _field(entry, "so", "startOffset", int, where)
        handles = entry.get("rh", [])
        if not isinstance(handles, list) or not all(isinstance(h, str) for h in handles):
            raise ProtocolError(f"{where}: field 'rh' must be a list of receipt handles")
        out.append(BatchAck(
            group=_field(entry, "c", "consumerGroup", str, where),
            topic=_field(entry, "t", "topic", str, where),
            retry=str(entry.get("r", entry.get("retry", NORMAL_FLAG))),
            start_offset=start,
            queue_id=_field(entry, "q", "queueId", int, where),
            revive_qid=int(entry.get("rq", entry.get("reviveQueueId", 0)) or 0),
            pop_time=_field(entry, "pt", "popTime", int, where),
            invisible_time=_field(entry, "it", "invisibleTime", int, where),
            offsets=bitset_offsets(entry.get("b", entry.get("bitSet")), start),
            handles=handles,
        ))
    return str(data.get("brokerName") or ""), out
