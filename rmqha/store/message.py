"""What one commitlog record holds, seen from Python: the decoded :class:`StoredMessage`,
where a batch went (:class:`BatchAppendResult`), the 8-byte v1 host encoding, and the
checks an append makes on its fields before the codec writes them."""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from array import array
from rmqha._core._protocols import RecordsTwin
from typing import Any

from rmqha.errors import InvalidMessageError

_HOST = struct.Struct(">4si")
# sys flag bits for IPv6 born/store hosts: v1 records carry IPv4 only.
SYSFLAG_V6_HOSTS = 0x10 | 0x20
INT32_MAX = 0x7FFFFFFF


@dataclass(slots=True)
class StoredMessage:
    """One decoded commitlog record (every field of the RocketMQ v1 format).

    Not frozen: a frozen dataclass's ``__init__`` costs several microseconds per record,
    which would dominate reading a log back.
    """

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    body_crc: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    properties: dict[str, str]
    magic: int


@dataclass(frozen=True, slots=True)
class BatchAppendResult:
    """Where ``append_batch`` put its records.

    ``offsets[i]`` is record i's physical offset; its size is ``overhead + len(body i)``;
    its queue offset ``first_queue_offset + i``.
    """

    offsets: array[int]
    first_queue_offset: int
    count: int
    overhead: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class EntriesAppendResult:
    """Where ``append_batch_entries`` put the entries of a batch body: record i at
    ``offsets[i]``, ``sizes[i]`` bytes long, with queue offset ``first_queue_offset + i``."""

    offsets: array[int]
    sizes: array[int]
    first_queue_offset: int
    count: int
    end_offset: int


def encode_host(host: str, port: int) -> bytes:
    """8-byte v1 host: IPv4 address + int32 port."""
    try:
        packed = socket.inet_aton(host)
    except OSError as exc:
        raise InvalidMessageError(f"host {host!r} is not an IPv4 address") from exc
    if not 0 <= port <= 0xFFFF:
        raise InvalidMessageError(f"port {port} out of range")
    return _HOST.pack(packed, port)


def decode_host(raw: bytes) -> tuple[str, int]:
    ip, port = _HOST.unpack(raw)
    return socket.inet_ntoa(ip), port


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    if not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidMessageError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")


def topic_bytes(codec: RecordsTwin, topic: str | bytes) -> bytes:
    """The topic as the record stores it (UTF-8), or InvalidMessageError naming the fault."""
    if isinstance(topic, str):
        try:
            tb = topic.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessageError(f"topic is not encodable as UTF-8: {exc}") from None
    elif isinstance(topic, bytes):
        tb = topic
    else:
        raise InvalidMessageError(f"topic must be str, got {type(topic).__name__}")
    if not tb:
        raise InvalidMessageError("topic must not be empty")
    if len(tb) > codec.MAX_TOPIC_BYTES:
        raise InvalidMessageError(
            f"topic is {len(tb)} bytes; the limit is {codec.MAX_TOPIC_BYTES}")
    return tb


def check_fields(queue_id: int, flag: int, sys_flag: int, reconsume_times: int,
                 prepared_transaction_offset: int, born_timestamp: int | None) -> None:
    """InvalidMessageError unless every integer field fits its slot in a v1 record."""
    _check_int("queue_id", queue_id, 0, INT32_MAX)
    _check_int("flag", flag, -INT32_MAX - 1, INT32_MAX)
    _check_int("sys_flag", sys_flag, 0, INT32_MAX)
    if sys_flag & SYSFLAG_V6_HOSTS:
        raise InvalidMessageError("sys_flag marks IPv6 hosts; v1 records hold IPv4 only")
    _check_int("reconsume_times", reconsume_times, 0, INT32_MAX)
    _check_int("prepared_transaction_offset", prepared_transaction_offset, 0, (1 << 63) - 1)
    if born_timestamp is not None:
        _check_int("born_timestamp", born_timestamp, 0, (1 << 63) - 1)


def to_message(codec: RecordsTwin, names: dict[bytes, object], f: tuple[Any, ...]) -> StoredMessage:
    """A :class:`StoredMessage` from the codec's decoded fields ``f``; ``names`` caches
    decoded topics and hosts (they repeat from record to record: decode each once)."""
    topic = names.get(f[15])
    if topic is None:
        topic = f[15].decode("utf-8", "replace")
        if len(names) < 4096:
            names[f[15]] = topic
    born = names.get(f[9])
    if born is None:
        born = names[f[9]] = decode_host(f[9])
    store = names.get(f[11])
    if store is None:
        store = names[f[11]] = decode_host(f[11])
    return StoredMessage(
        topic=topic, body=f[14], queue_id=f[3],  # type: ignore[arg-type]
        queue_offset=f[5], physical_offset=f[6], size=f[0], body_crc=f[2], flag=f[4],
        sys_flag=f[7], born_timestamp=f[8], born_host=born,  # type: ignore[arg-type]
        store_timestamp=f[10], store_host=store, reconsume_times=f[12],  # type: ignore[arg-type]
        prepared_transaction_offset=f[13],
        properties=codec.decode_properties(f[16]) if f[16] else {}, magic=f[1])
