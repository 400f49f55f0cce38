"""A stored message as a RocketMQ 5 client receives it (``GrpcConverter.buildMessage``).

The record a broker returns (a popped message, a half message being checked back) is
decoded by :func:`rmqha.protocol.message.decode_record` (body inflated) and becomes an
``apache.rocketmq.v2.Message``: user properties are those outside RocketMQ's system keys;
the system properties carry the tag, keys, message id (``UNIQ_KEY``, else the offset id),
an MD5 digest of the body, the message type read from the properties (TRANSACTION, DELAY,
FIFO, NORMAL), born and store times and hosts, the delivery time of a delayed message,
the message group, the receipt handle, queue id and offset, and the delivery attempt
(reconsume times + 1); a dead-lettered message names where it came from.
"""
from __future__ import annotations

import hashlib
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from rmqha.protocol.message import Prop, ReceivedMessage
from rmqha.protocol.topic_attributes import SHARDING_KEY, TopicMessageType, message_type_of
from rmqha.proxy.sends import BORN_HOST, IDEMPOTENCE_KEYS, SYSTEM_PROPERTY_KEYS, TRACE_CONTEXT

#: Properties rmqha's brokers add that a client is not shown either.
_HIDDEN = SYSTEM_PROPERTY_KEYS | {SHARDING_KEY, TRACE_CONTEXT, Prop.TRANSACTION_ID,
                                  Prop.TRANSACTION_CHECK_TIMES,
                                  Prop.CHECK_IMMUNITY_TIME_IN_SECONDS} | IDEMPOTENCE_KEYS
_TYPES = {
    TopicMessageType.NORMAL: pb.MessageType.NORMAL,
    TopicMessageType.FIFO: pb.MessageType.FIFO,
    TopicMessageType.DELAY: pb.MessageType.DELAY,
    TopicMessageType.TRANSACTION: pb.MessageType.TRANSACTION,
}
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"


def _set_millis(ts: Any, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)
    ts.nanos *= 1_000_000


def _system_properties(msg: ReceivedMessage, sp: Any) -> None:
    props = msg.properties
    if msg.tags is not None:
        sp.tag = msg.tags
    if msg.keys:
        sp.keys.extend(k for k in msg.keys.split(" ") if k)
    sp.message_id = msg.msg_id
    sp.body_digest.type = pb.DigestType.MD5
    sp.body_digest.checksum = hashlib.md5(msg.body).hexdigest().upper()
    sp.body_encoding = pb.Encoding.IDENTITY
    sp.message_type = _TYPES[message_type_of(props)]
    _set_millis(sp.born_timestamp, msg.born_timestamp)
    sp.born_host = props.get(BORN_HOST) or msg.born_host
    _set_millis(sp.store_timestamp, msg.store_timestamp)
    sp.store_host = msg.store_host
    if Prop.TIMER_DELIVER_MS in props and props[Prop.TIMER_DELIVER_MS].isdigit():
        _set_millis(sp.delivery_timestamp, int(props[Prop.TIMER_DELIVER_MS]))
    if SHARDING_KEY in props:
        sp.message_group = props[SHARDING_KEY]
    if TRACE_CONTEXT in props:
        sp.trace_context = props[TRACE_CONTEXT]


def delivered(msg: ReceivedMessage, receipt_handle: str | None = None,
              topic: str | None = None) -> Any:
    """The ``apache.rocketmq.v2.Message`` of a stored message (``topic`` overrides the
    record's, e.g. a half message's real topic)."""
    out = pb.Message()
    out.topic.name = topic or msg.topic
    out.user_properties.update({k: v for k, v in msg.properties.items() if k not in _HIDDEN})
    out.body = msg.body
    sp = out.system_properties
    _system_properties(msg, sp)
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    sp.queue_id = msg.queue_id
    sp.queue_offset = msg.queue_offset
    sp.delivery_attempt = msg.reconsume_times + 1
    origin = msg.properties.get(DLQ_ORIGIN_TOPIC)
    if origin is not None and DLQ_ORIGIN_MESSAGE_ID in msg.properties:
        sp.dead_letter_queue.topic = origin
        sp.dead_letter_queue.message_id = msg.properties[DLQ_ORIGIN_MESSAGE_ID]
    return out


def check_back_message(msg: ReceivedMessage) -> Any:
    """The message a RecoverOrphanedTransactionCommand carries: the half message under its
    real topic, typed TRANSACTION."""
    real = msg.properties.get(Prop.REAL_TOPIC) or msg.topic
    out = delivered(msg, topic=real)
    out.system_properties.message_type = pb.MessageType.TRANSACTION
    return out

