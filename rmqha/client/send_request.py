"""What one send puts on the wire: SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE requests.

A request is built once, UNIQ_KEYs and born timestamp included, and every attempt sends it
as it is (only the queue id changes), so a send retried after a timeout or a lost
connection carries the same ids and readers can drop the duplicate.  Single bodies over
``compress_over_bytes`` are compressed with lz4 and marked in sysFlag as RocketMQ 5 marks
it; batches travel uncompressed, as RocketMQ's clients send them (the broker would have to
inflate a compressed batch before storing it: 10-25% less throughput for the CPU it saves
on the wire), unless ``compress_batches`` asks for the whole batch body to be compressed.

A message with no properties of its own (no tags, keys or user properties: most of them)
takes a shortcut: its properties are a template with its UNIQ_KEY put in, the same bytes
the general path writes.

An attempt's whole frame is one call of the client send codec (:meth:`SendRequest.frame`,
``rmqha._core.send_codec``, compiled), the bytes the general codec writes for the same
command; an attempt that must be signed (ACL) builds the command instead.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rmqha._core import load
from rmqha.client.idempotence import Ticket
from rmqha.client.model import Message
from rmqha.errors import ClientError
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import VERSION
from rmqha.protocol.headers import SendHeader
from rmqha.protocol.idempotence import stamp_batch
from rmqha.protocol.message import (
    UNIQ_KEYS,
    CompressionType,
    Prop,
    SysFlag,
    compress,
    encode_batch_entries,
    encode_properties,
    new_uniq_key,
    new_uniq_keys,
)

#: The client send codec (compiled unless disabled): a request's frame in one call.
_CODEC = load("send_codec")
_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)
#: (An enum member read from its class costs more than the rest of a request's fields.)
_SINGLE = int(RequestCode.SEND_MESSAGE_V2)
_next_uid = UNIQ_KEYS.next
_TRANSACTION_BITS = int(SysFlag.TRANSACTION_PREPARED | SysFlag.TRANSACTION_COMMIT)

#: A batch entry: the body, its encoded properties and its flag.
BatchEntry = tuple[bytes, bytes, int]


def _encoded(props: dict[str, str]) -> bytes:
    """A message's encoded properties, keys sorted as the C++ client writes them (the
    codec keeps a map's order): a message's bytes do not depend on the order its
    properties were set in."""
    return encode_properties(sorted(props.items()))


#: The encoded properties of a message with none of its own, split where its UNIQ_KEY
#: goes: made by :func:`_encoded`, so the shortcut writes the same bytes.
_PLAIN_PROPS: tuple[str, str] = tuple(  # type: ignore[assignment]
    _encoded({Prop.UNIQ_KEY: "\x00", Prop.WAIT: "true"}).decode().split("\x00"))
#: The properties of a batch request's header.
_BATCH_PROPS = _encoded({Prop.WAIT: "true"}).decode()


def is_plain(msg: Message) -> bool:
    """No properties of its own: what it carries is its id and WAIT (:func:`_plain_properties`)."""
    return not (msg.properties or msg.tags or msg.keys)


def _plain_properties(uid: str) -> str:
    """The encoded properties of a plain message: nothing to build, sort or check."""
    return f"{_PLAIN_PROPS[0]}{uid}{_PLAIN_PROPS[1]}"


def _plain_entry(body: bytes, flag: int, uid: str) -> tuple[BatchEntry, int]:
    """The batch entry of a plain message and its size as
    :meth:`RequestBuilder.batch_entry` counts a message with properties of its own."""
    props = _plain_properties(uid)
    return (body, props.encode(), flag), 22 + len(body) + 4 * len(props)


def as_message(m: Message | bytes | str) -> Message:
    """What a send was handed, as a :class:`Message` (a str body travels as UTF-8)."""
    if isinstance(m, Message):
        return m
    if isinstance(m, str):
        return Message(m.encode("utf-8"))
    return Message(bytes(m))


def delay_properties(props: dict[str, str], delay_level: int | None,
                     deliver_at: int | None) -> None:
    """Add DELAY (a level, 1..N) or TIMER_DELIVER_MS (epoch ms) to a message's properties."""
    if delay_level is not None and deliver_at is not None:
        raise ClientError("give delay_level or deliver_at, not both")
    if delay_level is not None:
        if delay_level < 1:
            raise ClientError(f"delay_level must be at least 1, got {delay_level}")
        props[Prop.DELAY] = str(int(delay_level))
    elif deliver_at is not None:
        if deliver_at <= 0:
            raise ClientError(f"deliver_at must be an epoch time in ms, got {deliver_at}")
        props[Prop.TIMER_DELIVER_MS] = str(int(deliver_at))


@dataclass
class SendRequest:
    """One send request as every attempt sends it: the header's values (UNIQ_KEYs and born
    timestamp included) and body are fixed once, so a retry carries the same ids; each
    attempt adds its opaque and queue id (:meth:`frame`, :meth:`header`)."""

    topic: str
    code: int
    group: str
    sys_flag: int
    born_ms: int
    flag: int
    #: The encoded properties, as the header's ``i`` carries them.
    properties: str
    body: bytes
    uniq_keys: list[str]
    queue_id: int | None
    #: Sent by an idempotent producer: bound to one queue and sequence at its first attempt.
    idempotent: bool = False
    #: Its queue and claim once bound (:meth:`bind`).
    ticket: Ticket | None = None

    def bind(self, ticket: Ticket) -> None:
        """Bind to the ticket's queue, its claim added to the properties (a batch's header
        and every entry): every attempt from now on carries them."""
        self.ticket = ticket
        self.queue_id = ticket.queue.queue_id
        pairs = ticket.claim.properties()
        self.properties += pairs
        if self.code == _BATCH:
            self.body = stamp_batch(self.body, pairs.encode())

    @property
    def batch(self) -> bool:
        return self.code == _BATCH

    @property
    def header(self) -> dict[str, str]:
        """The send header's ext fields (:meth:`SendHeader.fields`, V2 letters), every
        value the string it travels as; the queue id is added per attempt."""
        return SendHeader.fields(self.group, self.topic, self.sys_flag, self.born_ms,
                                 self.flag, self.properties, self.batch)

    def frame(self, opaque: int, queue_id: int) -> bytes:
        """The whole frame of an attempt to queue ``queue_id``, in one compiled call: the
        bytes :func:`rmqha.protocol.command.encode` writes for the command
        ``Sender.command`` makes (unsigned: a signing hook needs the command)."""
        return _CODEC.encode_send(self.code, opaque, VERSION, self.group, self.topic,
                                  self.sys_flag, self.born_ms, self.flag, self.properties,
                                  self.code == _BATCH, queue_id, self.body)


class RequestBuilder:
    """Builds one producer group's send requests (see the module docstring)."""

    def __init__(self, group: str, *, compress_over_bytes: int, compression: CompressionType,
                 max_batch_bytes: int, compress_batches: bool, idempotent: bool = False) -> None:
        if idempotent and compress_batches:
            raise ClientError("an idempotent producer cannot compress whole batches "
                              "(each entry carries its claim; compress_batches=False)")
        self.group = group
        #: Ordinary sends and batches are marked idempotent (see rmqha.client.idempotence).
        self.idempotent = idempotent
        self.compress_over_bytes = compress_over_bytes
        self.compression = compression
        self.max_batch_bytes = max_batch_bytes
        self.compress_batches = compress_batches

    def properties(self, msg: Message, uid: str | None = None) -> dict[str, str]:
        """The properties a message travels with: its own, its tags and keys, its
        UNIQ_KEY (``uid`` or a new one, unless it names its own) and WAIT."""
        props = dict(msg.properties)
        if msg.tags:
            props[Prop.TAGS] = msg.tags
        if msg.keys:
            props[Prop.KEYS] = msg.keys
        if Prop.UNIQ_KEY not in props:
            props[Prop.UNIQ_KEY] = uid or new_uniq_key()
        props[Prop.WAIT] = "true"
        return props

    def single(self, topic: str, message: Message | bytes | str, queue_id: int | None,
               delay_level: int | None = None, deliver_at: int | None = None) -> SendRequest:
        """The request of ``Producer.send`` (BlockingProducer builds it the same way)."""
        if delay_level is None and deliver_at is None:
            if type(message) is bytes:  # a body alone: no Message made for it
                return self._plain(topic, message, 0, queue_id)
            msg = as_message(message)
            if is_plain(msg):
                return self._plain(topic, msg.body, msg.flag, queue_id)
        else:
            msg = as_message(message)
        props = self.properties(msg)
        if delay_level is not None or deliver_at is not None:
            delay_properties(props, delay_level, deliver_at)
            req = self.message(topic, msg, props, queue_id)
            req.idempotent = False  # stored in the schedule topic first: not idempotent
            return req
        return self.message(topic, msg, props, queue_id)

    def _plain(self, topic: str, body: bytes, flag: int, queue_id: int | None) -> SendRequest:
        uid = _next_uid()
        return self._request(topic, body, flag, _plain_properties(uid), uid, queue_id, 0)

    def message(self, topic: str, msg: Message, props: dict[str, str],
                queue_id: int | None, sys_flag: int = 0) -> SendRequest:
        """SEND_MESSAGE_V2 of one message with these properties (a transaction's prepared
        message adds its own properties and ``sys_flag``); the body is compressed when
        over ``compress_over_bytes``."""
        return self.encoded(topic, msg, _encoded(props).decode(), props[Prop.UNIQ_KEY],
                            queue_id, sys_flag)

    def encoded(self, topic: str, msg: Message, properties: str, uid: str,
                queue_id: int | None, sys_flag: int = 0) -> SendRequest:
        """:meth:`message` with the properties encoded already."""
        return self._request(topic, msg.body, msg.flag, properties, uid, queue_id, sys_flag)

    def _request(self, topic: str, body: bytes, flag: int, properties: str, uid: str,
                 queue_id: int | None, sys_flag: int) -> SendRequest:
        if 0 <= self.compress_over_bytes < len(body):
            body, compressed = compress(body, self.compression)
            sys_flag |= compressed
        # A transaction's half message is stored elsewhere first: not idempotent.
        return SendRequest(topic, _SINGLE, self.group, sys_flag,
                           time.time_ns() // 1_000_000, flag, properties, body, [uid],
                           queue_id, self.idempotent and not sys_flag & _TRANSACTION_BITS)

    def batches(self, topic: str, messages: Sequence[Message | bytes | str],
                queue_id: int | None) -> Iterator[SendRequest]:
        """The SEND_BATCH_MESSAGE requests of ``Producer.send_batch``: one per chunk of at
        most ``max_batch_bytes``, each built when the one before it was sent."""
        # Every item checked before the first chunk leaves; a body alone stays as it is.
        msgs = [m if type(m) is bytes else as_message(m) for m in messages]
        if all(type(m) is bytes for m in msgs):  # bodies alone: the codec writes each chunk
            yield from self._plain_batches(topic, msgs, queue_id)  # type: ignore[arg-type]
            return
        chunk: list[BatchEntry] = []
        uids: list[str] = []
        size = 0
        for m, uid in zip(msgs, new_uniq_keys(len(msgs))):
            if isinstance(m, Message):
                entry, uid, item_size = self.batch_entry(m, uid)
            else:
                entry, item_size = _plain_entry(m, 0, uid)  # no Message made for a body alone
            if chunk and size + item_size > self.max_batch_bytes:
                yield self.chunk(topic, chunk, uids, queue_id)
                chunk, uids, size = [], [], 0
            chunk.append(entry)
            uids.append(uid)
            size += item_size
        if chunk:
            yield self.chunk(topic, chunk, uids, queue_id)

    def _plain_batches(self, topic: str, bodies: list[bytes],
                       queue_id: int | None) -> Iterator[SendRequest]:
        """:meth:`batches` of bodies alone: each chunk one codec call (the entries and the
        cut :meth:`batches` makes of them one by one)."""
        uids = UNIQ_KEYS.take(len(bodies))
        start = 0
        while start < len(bodies):
            body, end = _CODEC.encode_plain_batch(bodies, uids, _PLAIN_PROPS[0], _PLAIN_PROPS[1],
                                                  start, self.max_batch_bytes)
            yield self._batch(topic, body, uids[start:end], queue_id)
            start = end

    def batch_entry(self, msg: Message, uid: str) -> tuple[BatchEntry, str, int]:
        """``msg`` as a batch entry, the UNIQ_KEY it carries (``uid`` unless the message
        names its own) and the upper bound of its encoded size that chunks are cut by
        (header, body, the property pairs counted four bytes a character)."""
        if is_plain(msg):
            entry, size = _plain_entry(msg.body, msg.flag, uid)
            return entry, uid, size
        props = self.properties(msg, uid)
        size = 22 + len(msg.body) + sum(len(k) + len(v) + 2 for k, v in props.items()) * 4
        entry = (msg.body, _encoded(props), msg.flag)
        return entry, props[Prop.UNIQ_KEY], size

    def chunk(self, topic: str, chunk: list[BatchEntry], uids: list[str],
              queue_id: int | None) -> SendRequest:
        """One SEND_BATCH_MESSAGE of these entries (their ids in ``uids``)."""
        return self._batch(topic, encode_batch_entries(chunk), uids, queue_id)

    def _batch(self, topic: str, body: bytes, uids: list[str],
               queue_id: int | None) -> SendRequest:
        sys_flag = 0
        if (self.compress_batches and self.compress_over_bytes >= 0
                and len(body) > self.compress_over_bytes):
            # The whole batch travels compressed; the broker inflates it before storing.
            body, sys_flag = compress(body, self.compression)
        return SendRequest(topic, _BATCH, self.group, sys_flag,
                           time.time_ns() // 1_000_000, 0, _BATCH_PROPS, body, uids, queue_id,
                           self.idempotent)
