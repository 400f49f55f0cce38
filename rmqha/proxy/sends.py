"""A gRPC SendMessageRequest as the broker's send: checks, properties, sysFlag, queue.

RocketMQ's ``SendMessageActivity`` and ``ProducerProcessor``, without I/O:

- every message of a request names the same topic (MESSAGE_CORRUPTED), has a body
  (MESSAGE_BODY_EMPTY) no larger than ``maxMessageSize`` (MESSAGE_BODY_TOO_LARGE), a
  message id (ILLEGAL_MESSAGE_ID), a tag, keys, message group and user properties that
  pass RocketMQ's checks (ILLEGAL_MESSAGE_TAG / _KEY / _GROUP / _PROPERTY_KEY,
  MESSAGE_PROPERTIES_TOO_LARGE) and, for a delay, a delivery time within
  ``maxDelayTimeMills`` (ILLEGAL_DELIVERY_TIME);
- the message becomes RocketMQ's properties: ``UNIQ_KEY`` = message id, ``TAGS``,
  ``KEYS`` (space separated), ``__SHARDINGKEY`` = message group, ``TIMER_DELIVER_MS`` =
  delivery timestamp, ``TRAN_MSG`` (+ ``CHECK_IMMUNITY_TIME_IN_SECONDS``) for a
  transaction, ``PGROUP`` = the topic (gRPC producers have no group: the topic names the
  producers a check-back goes to), ``TRACE_CONTEXT``, ``__BORNHOST``, ``BORN_TIMESTAMP``;
- a message of another type than its topic's ``message.type`` is refused with
  MESSAGE_PROPERTY_CONFLICT_WITH_TYPE (``enableTopicMessageTypeCheck``);
- the queue: a message group picks one by hash (so a group stays on one queue, in
  order), anything else the next in turn.
"""
from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rmqha.errors import ProxyError
from rmqha.protocol.idempotence import PRODUCER_ID, PRODUCER_SEQ
from rmqha.protocol.message import Prop, SysFlag, encode_properties
from rmqha.protocol.topic_attributes import (
    SHARDING_KEY,
    TopicMessageType,
    message_type_of,
    type_mismatch,
)
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.status import Code
from rmqha.proxy.validation import check_tag, check_topic, has_control_character

TRACE_CONTEXT = "TRACE_CONTEXT"
BORN_HOST = "__BORNHOST"
BORN_TIMESTAMP = "BORN_TIMESTAMP"
#: ``Encoding.GZIP`` of apache.rocketmq.v2.
ENCODING_GZIP = 2
#: ``MessageType.TRANSACTION`` of apache.rocketmq.v2.
MESSAGE_TYPE_TRANSACTION = 4

#: RocketMQ's ``MessageConst.STRING_HASH_SET``: keys a user property may not take (and
#: that a delivered message does not show among its user properties).
SYSTEM_PROPERTY_KEYS = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
    "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
    "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
    "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
    "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
    "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL",
    "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#",
})


#: An idempotent send's claim (``rmqha.protocol.idempotence``): only the proxy sets it (a
#: user property of that name is refused) and a delivered message does not show it.
IDEMPOTENCE_KEYS = frozenset({PRODUCER_ID, PRODUCER_SEQ})


@dataclass
class OutgoingMessage:
    """One message ready for SEND_MESSAGE_V2 / a batch entry."""

    body: bytes
    properties: dict[str, str]
    sys_flag: int
    message_type: TopicMessageType
    message_group: str
    born_timestamp: int


@dataclass
class SendPlan:
    """A checked request: its topic and messages (one, or a batch)."""

    topic: str
    messages: list[OutgoingMessage] = field(default_factory=list)
    #: An idempotent send's claim as encoded pairs (a batch header carries it too).
    claim: str = ""

    @property
    def transactional(self) -> bool:
        return any(m.sys_flag & SysFlag.TRANSACTION_PREPARED for m in self.messages)

    @property
    def sharding_key(self) -> str:
        """The message group a single message is sent under ("" for none or a batch)."""
        return self.messages[0].message_group if len(self.messages) == 1 else ""


def _millis(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def _body(message: Any, cfg: ProxyConfig) -> bytes:
    body = bytes(message.body)
    if message.system_properties.body_encoding == ENCODING_GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProxyError(Code.MESSAGE_CORRUPTED, f"GZIP body does not inflate: {exc}") from None
    if cfg.enable_message_body_empty_check and not body:
        raise ProxyError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(body) > cfg.max_message_size:
        raise ProxyError(Code.MESSAGE_BODY_TOO_LARGE,
                         f"message body of {len(body)} bytes exceeds the max {cfg.max_message_size}")
    return body


def _user_properties(message: Any, cfg: ProxyConfig) -> tuple[dict[str, str], int]:
    """The user properties (checked) and their size in bytes."""
    props = dict(message.user_properties)
    if len(props) > cfg.user_property_max_num:
        raise ProxyError(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                         f"too many user properties ({len(props)}), max is {cfg.user_property_max_num}")
    size = 0
    for key, value in props.items():
        if key in SYSTEM_PROPERTY_KEYS or key in IDEMPOTENCE_KEYS:
            raise ProxyError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}")
        if has_control_character(key) or has_control_character(value):
            raise ProxyError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                             f"the key or value of property {key!r} cannot contain control character")
        size += len(key.encode()) + len(value.encode())
    return props, size


def _keys(keys: Sequence[str]) -> int:
    size = 0
    for key in keys:
        if key and not key.strip():
            raise ProxyError(Code.ILLEGAL_MESSAGE_KEY, "key cannot be the char sequence of whitespace")
        if has_control_character(key):
            raise ProxyError(Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} cannot contain control character")
        size += len(key.encode())
    return size


def _message_group(group: str, cfg: ProxyConfig) -> str:
    if not group:
        return group
    if not group.strip():
        raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, "message group cannot be the char sequence of whitespace")
    if len(group.encode()) >= cfg.max_message_group_size:
        raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP,
                         f"message group exceed the max size {cfg.max_message_group_size}")
    if has_control_character(group):
        raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character")
    return group


def _transaction(sp: Any, props: dict[str, str], cfg: ProxyConfig) -> int:
    """Marks a transactional message; its sysFlag bits."""
    if sp.message_type != MESSAGE_TYPE_TRANSACTION:
        return 0
    props[Prop.TRANSACTION_PREPARED] = "true"
    if sp.HasField("orphaned_transaction_recovery_duration"):
        seconds = int(sp.orphaned_transaction_recovery_duration.seconds)
        if seconds > cfg.max_transaction_recovery_second:
            raise ProxyError(Code.BAD_REQUEST, f"the max transaction recovery time of message is "
                             f"too large, max is {cfg.max_transaction_recovery_second}")
        props[Prop.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    return int(SysFlag.TRANSACTION_PREPARED)


def _delay(sp: Any, props: dict[str, str], cfg: ProxyConfig, now_ms: int) -> None:
    if not sp.HasField("delivery_timestamp"):
        return
    due = _millis(sp.delivery_timestamp)
    if due - now_ms > cfg.max_delay_time_mills:
        raise ProxyError(Code.ILLEGAL_DELIVERY_TIME, f"the max delay time of message is too "
                         f"large, max is {cfg.max_delay_time_mills} ms")
    props[Prop.TIMER_DELIVER_MS] = str(due)


def _system_properties(message: Any, topic: str, peer_host: str, cfg: ProxyConfig,
                       now_ms: int) -> tuple[dict[str, str], int, int]:
    """(properties, sysFlag, size of tag and keys)."""
    sp = message.system_properties
    props: dict[str, str] = {}
    check_tag(sp.tag)
    if sp.tag:
        props[Prop.TAGS] = sp.tag
    keys = list(sp.keys)
    size = _keys(keys) + len(sp.tag.encode())
    if keys:
        props[Prop.KEYS] = " ".join(keys)
    if not sp.message_id.strip():
        raise ProxyError(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    props[Prop.UNIQ_KEY] = sp.message_id
    sys_flag = _transaction(sp, props, cfg)
    _delay(sp, props, cfg, now_ms)
    props[Prop.PRODUCER_GROUP] = topic
    group = _message_group(sp.message_group, cfg)
    if group:
        props[SHARDING_KEY] = group
    if sp.trace_context:
        props[TRACE_CONTEXT] = sp.trace_context
    props[BORN_HOST] = sp.born_host or peer_host
    if sp.HasField("born_timestamp"):
        props[BORN_TIMESTAMP] = str(_millis(sp.born_timestamp))
    return props, sys_flag, size


def outgoing(message: Any, topic: str, peer_host: str, cfg: ProxyConfig,
             now_ms: int) -> OutgoingMessage:
    """One checked message of a send (see the module doc)."""
    body = _body(message, cfg)
    user, user_size = _user_properties(message, cfg)
    props, sys_flag, sys_size = _system_properties(message, topic, peer_host, cfg, now_ms)
    if user_size + sys_size > cfg.max_user_property_size:
        raise ProxyError(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"the total size of user property "
                         f"is too large, max is {cfg.max_user_property_size}")
    props = {**user, **props}
    born = int(props.get(BORN_TIMESTAMP, now_ms))
    return OutgoingMessage(body, props, sys_flag, message_type_of(props),
                           message.system_properties.message_group, born)


def plan_send(messages: Sequence[Any], peer_host: str, cfg: ProxyConfig, now_ms: int) -> SendPlan:
    """The checked request, or ProxyError with RocketMQ's status."""
    if not messages:
        raise ProxyError(Code.MESSAGE_CORRUPTED, "no message to send")
    topic = check_topic(messages[0].topic.name)
    plan = SendPlan(topic)
    for message in messages:
        if message.topic.name != topic:
            raise ProxyError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
        plan.messages.append(outgoing(message, topic, peer_host, cfg, now_ms))
    if len(plan.messages) > 1 and any(m.message_type is not TopicMessageType.NORMAL
                                      for m in plan.messages):
        raise ProxyError(Code.BAD_REQUEST, "only normal messages can be sent in one request "
                         "together (a batch cannot be transactional, delayed or FIFO)")
    return plan


def check_type(plan: SendPlan, topic_type: TopicMessageType, enabled: bool) -> None:
    """MESSAGE_PROPERTY_CONFLICT_WITH_TYPE if a message does not fit its topic's type."""
    if not enabled:
        return
    for message in plan.messages:
        refusal = type_mismatch(topic_type, message.message_type)
        if refusal is not None:
            raise ProxyError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, refusal)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def consistent_hash(key: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash``, what RocketMQ's proxy puts a message group
    on a queue with: the same group always lands on the same queue."""
    state = key & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        draw = (state >> 33) + 1
        if draw >= 1 << 31:  # Java's int overflow of (int)(state >>> 33) + 1
            draw -= 1 << 32
        following = int((candidate + 1) / (draw / 2147483648.0))
        if 0 <= following < buckets:
            candidate = following
        else:
            return candidate


def pick_queue(sharding_key: str, queue_count: int, turn: int) -> int:
    """The index of the writable queue a send goes to."""
    if sharding_key:
        return consistent_hash(java_string_hash(sharding_key), queue_count)
    return turn % queue_count


def send_header(plan: SendPlan, queue_id: int) -> dict[str, Any]:
    """SEND_MESSAGE_V2's header (RocketMQ's one-letter names) for a single message."""
    m = plan.messages[0]
    return {"a": plan.topic, "b": plan.topic, "c": "TBW102", "d": 4, "e": queue_id,
            "f": m.sys_flag, "g": m.born_timestamp, "h": 0,
            "i": encode_properties(m.properties).decode(), "j": 0, "m": False}


def batch_header(plan: SendPlan, queue_id: int) -> dict[str, Any]:
    """SEND_BATCH_MESSAGE's header; the body is the batch (rmqha.protocol.message)."""
    return {**send_header(plan, queue_id), "i": plan.claim, "m": True}
