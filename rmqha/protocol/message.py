"""What a message looks like on RocketMQ's client protocol, shared by broker and client.

Owns: the properties string (``k\\x01v\\x02``), reserved property keys, sysFlag bits and the
compression type kept in sysFlag bits 8-10 (RocketMQ 5: 0 or 3 zlib, 1 lz4, 2 zstd),
body compression and decompression, the batch body encoding (RocketMQ's
``MessageDecoder.encodeMessage`` layout), RocketMQ message ids (store host + commitlog
offset, and the client's ``UNIQ_KEY``), the tag hash used by consume-queue indexes, and
decoding the V1 store records that pull responses carry.
"""
from __future__ import annotations

import os
import socket
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag

import lz4.frame

from rmqha import _core
from rmqha._core import load
from rmqha._core import pull_answer_py as _pull_answer_py

# The properties codec is the records twins' (one codec, one behaviour), re-exported here.
from rmqha._core.records_py import NAME_VALUE_SEPARATOR as NAME_VALUE_SEPARATOR
from rmqha._core.records_py import PROPERTY_SEPARATOR as PROPERTY_SEPARATOR
from rmqha._core.records_py import decode_properties as decode_properties
from rmqha._core.records_py import encode_properties as encode_properties
from rmqha._core.records_py import find_property as find_property
from rmqha.errors import ProtocolError

# --- properties ---------------------------------------------------------------------------
# One codec for broker, store and client: the hot-path layer's (RocketMQ's
# MessageDecoder.messageProperties2String / string2messageProperties), re-exported here.


class Prop:
    """Reserved property keys (RocketMQ ``MessageConst``)."""

    UNIQ_KEY = "UNIQ_KEY"
    WAIT = "WAIT"
    TAGS = "TAGS"
    KEYS = "KEYS"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    TRANSACTION_ID = "__transactionId__"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    TIMER_DELAY_MS = "TIMER_DELAY_MS"
    TIMER_OUT_MS = "TIMER_OUT_MS"
    TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"


# --- sysFlag and compression ----------------------------------------------------------------


class SysFlag(IntFlag):
    """``MessageSysFlag`` bits of a message."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    #: PREPARED | COMMIT: RocketMQ's TRANSACTION_ROLLBACK_TYPE (0xC) in the transaction bits.
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80


COMPRESSION_TYPE_MASK = 0x700  # bits 8-10
COMPRESSION_TYPE_SHIFT = 8


class CompressionType(IntEnum):
    """RocketMQ 5 ``CompressionType`` values in sysFlag bits 8-10 (0 is read as zlib)."""

    LZ4 = 1
    ZSTD = 2
    ZLIB = 3


#: RocketMQ's default ``compressMsgBodyOverHowmuch``.
DEFAULT_COMPRESS_OVER_BYTES = 4096


class DecompressError(ProtocolError):
    """A body marked compressed did not decompress; ``offset`` says where it is stored."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        self.offset = offset
        super().__init__(message)


def compression_type(sys_flag: int) -> CompressionType | None:
    """The compression of a body with this sysFlag, or None when it is not compressed."""
    if not sys_flag & SysFlag.COMPRESSED:
        return None
    bits = (sys_flag & COMPRESSION_TYPE_MASK) >> COMPRESSION_TYPE_SHIFT
    if bits == 0:
        return CompressionType.ZLIB
    try:
        return CompressionType(bits)
    except ValueError:
        raise DecompressError(f"unknown compression type {bits} in sysFlag {sys_flag:#x}") from None


def compress(body: bytes, kind: CompressionType = CompressionType.LZ4) -> tuple[bytes, int]:
    """Compress a body; returns (bytes, the sysFlag bits that mark it)."""
    if kind is CompressionType.LZ4:
        data = lz4.frame.compress(body)
    elif kind is CompressionType.ZLIB:
        data = zlib.compress(body, 5)
    else:
        raise ProtocolError(f"compression {kind.name} is not supported for writing")
    return data, int(SysFlag.COMPRESSED) | (int(kind) << COMPRESSION_TYPE_SHIFT)


def decompress(body: bytes | memoryview, sys_flag: int, *, offset: int | None = None,
               limit: int = 256 * 1024 * 1024) -> bytes:
    """The plain body of a message; DecompressError (naming ``offset``) if it is broken.

    ``limit`` bounds the output so a hostile body cannot exhaust memory."""
    kind = compression_type(sys_flag)
    if kind is None:
        return bytes(body)
    where = f" at offset {offset}" if offset is not None else ""
    try:
        if kind is CompressionType.ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(bytes(body), limit)
            if d.unconsumed_tail or not d.eof:
                raise DecompressError(f"zlib body{where} is truncated or over {limit} bytes",
                                      offset)
            return out
        if kind is CompressionType.LZ4:
            d4 = lz4.frame.LZ4FrameDecompressor()
            plain: bytes = d4.decompress(bytes(body), max_length=limit)
            if not d4.eof:
                raise DecompressError(f"lz4 body{where} is truncated or over {limit} bytes",
                                      offset)
            return plain
    except (zlib.error, RuntimeError, ValueError) as exc:
        raise DecompressError(f"{kind.name.lower()} body{where} does not decompress: {exc}",
                              offset) from exc
    raise DecompressError(f"{kind.name.lower()} bodies{where} cannot be decompressed here",
                          offset)


def strip_compression(sys_flag: int) -> int:
    return sys_flag & ~(int(SysFlag.COMPRESSED) | COMPRESSION_TYPE_MASK)


# --- tags ------------------------------------------------------------------------------------


def tag_hash(tag: str | None) -> int:
    """Java ``String.hashCode`` of a tag (what RocketMQ stores in consume queues); 0 for none."""
    if not tag:
        return 0
    h = 0
    data = tag.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def parse_subscription(expression: str | None) -> frozenset[str] | None:
    """Tags of a TAG subscription (``A || B``); None means every message (``*``)."""
    if expression is None:
        return None
    tags = [t.strip() for t in expression.split("||")]
    tags = [t for t in tags if t]
    if not tags or "*" in tags:
        return None
    return frozenset(tags)


# --- batch bodies ------------------------------------------------------------------------------


_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length
_PROP_LEN = struct.Struct(">h")


@dataclass
class BatchItem:
    """One message inside a batch send."""

    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


def encode_batch(items: Iterable[BatchItem]) -> bytes:
    """The batch body: per message TOTALSIZE MAGIC BODYCRC FLAG BODYLEN body PROPLEN props."""
    return encode_batch_entries((item.body, encode_properties(item.properties), item.flag)
                                for item in items)


def encode_batch_entries(entries: Iterable[tuple[bytes, bytes, int]]) -> bytes:
    """:func:`encode_batch` of ``(body, encoded properties, flag)`` entries, for a caller
    that has the properties encoded already (the producer's plain messages)."""
    parts: list[bytes] = []
    head, prop_len = _BATCH_HEAD.pack, _PROP_LEN.pack
    for body, props, flag in entries:
        if len(props) > 32767:
            raise ProtocolError(f"properties of {len(props)} bytes exceed 32767")
        body_len = len(body)
        parts += (head(22 + body_len + len(props), 0, 0, flag, body_len), body,
                  prop_len(len(props)), props)
    return b"".join(parts)


def decode_batch(body: bytes | memoryview, *, max_items: int = 65536) -> list[BatchItem]:
    """Split a batch body; ProtocolError on any length that does not fit."""
    mv = memoryview(body)
    pos, n = 0, len(mv)
    items: list[BatchItem] = []
    while pos < n:
        if n - pos < 22:
            raise ProtocolError(f"batch entry at {pos} shorter than its header")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(mv, pos)
        if total < 22 or total > n - pos or body_len < 0 or 20 + body_len + 2 > total:
            raise ProtocolError(f"batch entry at {pos}: bad sizes total={total} body={body_len}")
        b_start = pos + 20
        (props_len,) = struct.unpack_from(">h", mv, b_start + body_len)
        if props_len < 0 or 20 + body_len + 2 + props_len != total:
            raise ProtocolError(f"batch entry at {pos}: bad properties length {props_len}")
        p_start = b_start + body_len + 2
        items.append(BatchItem(
            body=bytes(mv[b_start : b_start + body_len]),
            properties=decode_properties(bytes(mv[p_start : p_start + props_len])),
            flag=flag,
        ))
        if len(items) > max_items:
            raise ProtocolError(f"batch holds more than {max_items} messages")
        pos += total
    return items


# --- message ids -------------------------------------------------------------------------------


def _ipv4_bytes(host: str) -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        return b"\x7f\x00\x00\x01"


def offset_msg_id(store_host: str, commit_offset: int) -> str:
    """RocketMQ's ``offsetMsgId``: hex of store ip(4) | port(int32) | commitlog offset(int64)."""
    host, _, port = store_host.rpartition(":")
    return (_ipv4_bytes(host) + struct.pack(">iq", int(port), commit_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """(store ``ip:port``, commitlog offset) of an ``offsetMsgId``."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ProtocolError(f"message id {msg_id!r} is not hex") from None
    if len(raw) != 16:
        raise ProtocolError(f"message id {msg_id!r} is not 16 bytes")
    port, offset = struct.unpack_from(">iq", raw, 4)
    return f"{socket.inet_ntoa(raw[:4])}:{port}", offset


#: ip, pid and a random per-process part, as hex once (the 10 fixed bytes of every id).
_uniq_prefix_hex = (
    _ipv4_bytes(socket.gethostname()) + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
).hex().upper()
#: The process's one UNIQ_KEY maker (one counter for every producer of the process), the
#: client send codec's: 32 upper-case hex laid out like RocketMQ's
#: ``MessageClientIDSetter``: ip, pid and a random per-process part (fixed), then the
#: milliseconds since the start of the month and a 16-bit counter.
UNIQ_KEYS = load("send_codec").UniqKeys(_uniq_prefix_hex)


def new_uniq_key() -> str:
    """A client message id (see :data:`UNIQ_KEYS`)."""
    return UNIQ_KEYS.next()


def new_uniq_keys(count: int) -> list[str]:
    """``count`` ids as :func:`new_uniq_key` makes them, reading the clock once (a batch's)."""
    return UNIQ_KEYS.take(count)


# --- V1 store records (pull bodies) ---------------------------------------------------------

_pull_answer = _core.load("pull_answer")

MAGIC_V1 = 0xDAA320A7
REC_FIXED = 91  # record size without body, topic and properties


@dataclass
class ReceivedMessage:
    """A message as a consumer sees it (body decompressed)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    body: bytes
    properties: dict[str, str]
    sys_flag: int = 0
    flag: int = 0
    born_timestamp: int = 0
    store_timestamp: int = 0
    born_host: str = ""
    store_host: str = ""
    reconsume_times: int = 0
    broker_name: str = ""
    #: Set when a compressed body did not decompress: the body is the raw stored bytes.
    decompress_error: str | None = None

    @property
    def msg_id(self) -> str:
        """The client id (UNIQ_KEY) when present, else the offset id, like RocketMQ."""
        return self.properties.get(Prop.UNIQ_KEY) or offset_msg_id(self.store_host,
                                                                  self.commit_offset)

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(Prop.KEYS)


def decode_record(data: bytes | memoryview, pos: int = 0, *, broker_name: str = "",
                  inflate: bool = True) -> tuple[ReceivedMessage, int]:
    """Decode the V1 record at ``pos``; returns (message, record size).  With ``inflate``
    the body is decompressed, and a body that fails to is kept raw with
    ``decompress_error`` set (naming its offset), so nothing is dropped silently."""
    return _pull_answer_py.decode_one(memoryview(data), pos, broker_name, ReceivedMessage,
                                      _inflate if inflate else None)


def _inflate(body: bytes, sys_flag: int, commit_offset: int) -> tuple[bytes, str | None]:
    """A compressed body's plain bytes, or the raw ones and why they did not inflate."""
    try:
        return decompress(body, sys_flag, offset=commit_offset), None
    except DecompressError as exc:
        return body, str(exc)


def decode_records(data: bytes | memoryview, *, broker_name: str = "",
                   max_records: int = 1 << 20) -> list[ReceivedMessage]:
    """Decode concatenated V1 store records (a pull body) into messages, as
    :func:`decode_record` does each, in one call of the ``pull_answer`` twin."""
    return _pull_answer.decode(data, broker_name, ReceivedMessage, _inflate, max_records)


def reencode_record(raw: bytes | memoryview, body: bytes, sys_flag: int) -> bytes:
    """A copy of one V1 record with another body and sysFlag (sizes and body CRC
    recomputed, every other field kept): how a broker hands an lz4 body to a client that
    only inflates zlib."""
    mv = memoryview(raw)
    (total,) = struct.unpack_from(">i", mv, 0)
    (body_len,) = struct.unpack_from(">i", mv, 84)
    tail = mv[88 + body_len : total]
    out = bytearray(mv[:88])
    struct.pack_into(">i", out, 0, 88 + len(body) + len(tail))
    struct.pack_into(">i", out, 8, zlib.crc32(body) & 0x7FFFFFFF)
    struct.pack_into(">i", out, 36, sys_flag)
    struct.pack_into(">i", out, 84, len(body))
    out += body
    out += tail
    return bytes(out)


def rewrite_record(raw: bytes | memoryview, properties: Mapping[str, str], *,
                   topic: str | None = None, reconsume_times: int | None = None) -> bytes:
    """A copy of one V1 record with other properties (and optionally another topic and
    reconsume times), body and every other field kept: how a broker hands a popped message
    its receipt handle (RocketMQ re-encodes pop retry messages under their original topic
    the same way)."""
    mv = memoryview(raw)
    (body_len,) = struct.unpack_from(">i", mv, 84)
    t = 88 + body_len
    old_topic = bytes(mv[t + 1 : t + 1 + mv[t]])
    topic_b = old_topic if topic is None else topic.encode("utf-8")
    if len(topic_b) > 127:
        raise ProtocolError(f"topic {topic!r} is longer than 127 bytes")
    props_b = encode_properties(properties)
    if len(props_b) > 32767:
        raise ProtocolError(f"properties of {len(props_b)} bytes exceed 32767")
    out = bytearray(mv[:t])
    out.append(len(topic_b))
    out += topic_b
    out += struct.pack(">H", len(props_b))
    out += props_b
    struct.pack_into(">i", out, 0, len(out))
    if reconsume_times is not None:
        struct.pack_into(">i", out, 72, reconsume_times)
    return bytes(out)


def record_reconsume_times(raw: bytes | memoryview) -> int:
    """The reconsume times field of a V1 record."""
    return int(struct.unpack_from(">i", raw, 72)[0])


def record_properties(raw: bytes | memoryview) -> bytes:
    """The properties bytes of a V1 record (no full decode)."""
    view = memoryview(raw)
    body_len = int.from_bytes(view[84:88], "big", signed=True)
    t = 88 + body_len
    p = t + 1 + view[t]
    return bytes(view[p + 2 : p + 2 + int.from_bytes(view[p : p + 2], "big")])
