"""The body of a pull answer (records back to back), pure-Python twin (same API and results
as ``pull_answer.pyx``).

Owns both ends of PULL_MESSAGE's body:

- :func:`assemble`, on the broker: a run of consume-queue units (RocketMQ ConsumeQueue
  units, 20 bytes each: commitlog offset int64, size int32, tag hash int64, big-endian)
  checked against the records they point at and the records copied into one bytes
  object, within a byte limit and a tag filter.  It never decides what to do about a
  damaged unit or record: it says where it stopped and why, and the caller takes its
  slow path (rebuild the queue, name the bad record) from there.
- :func:`decode`, on the client: a pull body into message objects, one call per answer.

The record layout is the one in ``records_py.py``.
"""
from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Callable, Container
from typing import Any

from rmqha._core.records_py import decode_properties
from rmqha.errors import ProtocolError

MESSAGE_MAGIC = 0xDAA320A7
#: Record bytes besides body, topic and properties.
FIXED_SIZE = 91
UNIT_SIZE = 20
#: The body CRC is stored masked (RocketMQ's UtilAll.crc32).
CRC_MASK = 0x7FFFFFFF
#: sysFlag bit of a compressed body (RocketMQ ``MessageSysFlag.COMPRESSED_FLAG``).
COMPRESSED = 0x1

#: How :func:`assemble` stopped (its second result).
DONE = 0      # every unit up to ``stop`` was checked
OUTSIDE = 1   # the unit at the returned index ends past the view: go on in the next one
MISMATCH = 2  # the unit at the returned index does not describe the record it points at
BAD_RECORD = 3  # the record at the returned index fails its lengths, offset or CRC check

_UNIT = struct.Struct(">qiq")
_HEAD_CHECK = struct.Struct(">iIiiiq")  # total, magic, body CRC, queue id, flag, queue offset
_I32 = struct.Struct(">i")
_Q = struct.Struct(">q")
_U16 = struct.Struct(">H")
_REC_HEAD = struct.Struct(">iIiiiqqiq4si q4si iqi")


def _unit_matches(view: Any, rel: int, size: int, qoff: int, queue_id: int,
                  topic: bytes) -> bool:
    """The consume-queue check (``queue_scan.check_units``): magic, size, queue, offset,
    topic."""
    total, magic, _, qid, _, rec_qoff = _HEAD_CHECK.unpack_from(view, rel)
    (blen,) = _I32.unpack_from(view, rel + 84)
    if (magic != MESSAGE_MAGIC or total != size or qid != queue_id or rec_qoff != qoff
            or not 0 <= blen <= size - FIXED_SIZE):
        return False
    tlen = view[rel + 88 + blen]
    return (tlen == len(topic) and FIXED_SIZE + blen + tlen <= size
            and bytes(view[rel + 89 + blen:rel + 89 + blen + tlen]) == topic)


def _record_sound(view: Any, rel: int, size: int, phys: int) -> bool:
    """The serving check (``records.scan`` on a matched unit): lengths add up, the offset
    field is where the record sits, the body CRC holds."""
    (blen,) = _I32.unpack_from(view, rel + 84)
    tlen = view[rel + 88 + blen]
    if tlen == 0:
        return False
    (plen,) = _U16.unpack_from(view, rel + 89 + blen + tlen)
    if FIXED_SIZE + blen + tlen + plen != size or _Q.unpack_from(view, rel + 28)[0] != phys:
        return False
    (crc,) = _I32.unpack_from(view, rel + 8)
    return zlib.crc32(view[rel + 88:rel + 88 + blen]) & CRC_MASK == crc


def assemble(view: memoryview | bytes, base: int, units: bytes, start: int, stop: int,
             first_qoff: int, queue_id: int, topic: bytes, hashes: Container[int] | None,
             max_bytes: int, total: int, taken: int) -> tuple[int, int, int, int, bytes]:
    """Check units ``start..stop-1`` (unit ``i`` is queue offset ``first_qoff + i``)
    against the records they point at in ``view`` (global offset ``base``) and copy the
    records the answer takes.

    The answer takes units in order while its bytes stay within ``max_bytes`` (the first
    record always fits); a unit whose tag hash is not in ``hashes`` (when given) is taken
    but its record is left out.  ``total`` and ``taken`` are the answer's bytes and units
    so far (from earlier views); once a unit did not fit (``taken < start``) nothing more
    is taken, but the units that follow are still checked.  A record is copied only once
    its unit matches (magic, size, queue id, queue offset, topic) and the record is sound
    (lengths, offset field, body CRC).

    Returns ``(i, how, taken, total, records)``: the first unit not checked and why the
    walk stopped there (:data:`DONE`, :data:`OUTSIDE`, :data:`MISMATCH`,
    :data:`BAD_RECORD`), the updated counts, and the records copied from this view.
    """
    if start < 0 or stop * UNIT_SIZE > len(units) or start > stop:
        raise ValueError("unit range outside the units given")
    n = len(view)
    open_ = taken >= start
    out = bytearray()
    for i in range(start, stop):
        phys, size, tag = _UNIT.unpack_from(units, UNIT_SIZE * i)
        rel = phys - base
        if rel < 0:
            return i, MISMATCH, taken, total, bytes(out)
        if rel + size > n:
            return i, OUTSIDE, taken, total, bytes(out)
        if size < FIXED_SIZE or not _unit_matches(view, rel, size, first_qoff + i, queue_id,
                                                  topic):
            return i, MISMATCH, taken, total, bytes(out)
        if not open_:
            continue
        if total and total + size > max_bytes:
            open_ = False
            continue
        if hashes is not None and tag not in hashes:
            taken = i + 1
            continue
        if not _record_sound(view, rel, size, phys):
            return i, BAD_RECORD, taken, total, bytes(out)
        taken = i + 1
        total += size
        out += view[rel:rel + size]
    return stop, DONE, taken, total, bytes(out)


def _host(ip: bytes, port: int) -> str:
    return f"{socket.inet_ntoa(ip)}:{port}"


#: ``inflate(body, sys_flag, commit_offset) -> (plain body, error or None)`` for a body
#: whose sysFlag says it is compressed.
Inflate = Callable[[bytes, int, int], tuple[bytes, "str | None"]]


def decode(data: bytes | memoryview, broker_name: str, make: Callable[..., Any],
           inflate: Inflate, max_records: int) -> list[Any]:
    """Decode concatenated V1 records (a pull body) into ``make(topic=..., ...)`` objects
    (the fields of :class:`rmqha.protocol.message.ReceivedMessage`; ``make`` must keep
    them in its instance ``__dict__``, as a plain dataclass does: the compiled twin fills
    that directly).  Compressed bodies go through ``inflate``.  ProtocolError names the
    first record that is not whole or not V1, or a body of more than ``max_records``."""
    mv = memoryview(data)
    pos = 0
    out: list[Any] = []
    while pos < len(mv):
        record, total = decode_one(mv, pos, broker_name, make, inflate)
        out.append(record)
        if len(out) > max_records:
            raise ProtocolError(f"more than {max_records} records in one body")
        pos += total
    return out


def decode_one(mv: memoryview, pos: int, broker_name: str, make: Callable[..., Any],
               inflate: Inflate | None) -> tuple[Any, int]:
    """The V1 record at ``pos`` as ``make(...)``, and its size (``inflate`` None: a
    compressed body is kept as stored).  The one reader of a record's fields:
    :func:`rmqha.protocol.message.decode_record` is this with ``ReceivedMessage``."""
    n = len(mv)
    if n - pos < FIXED_SIZE:
        raise ProtocolError(f"record at {pos}: {n - pos} bytes left, need {FIXED_SIZE}")
    (total, magic, _crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_ip,
     born_port, store_ts, store_ip, store_port, reconsume, _prep, body_len
     ) = _REC_HEAD.unpack_from(mv, pos)
    if magic != MESSAGE_MAGIC:
        raise ProtocolError(f"record at {pos}: magic {magic:#x} is not V1")
    if total < FIXED_SIZE or total > n - pos or body_len < 0 or body_len > total - FIXED_SIZE:
        raise ProtocolError(f"record at {pos}: bad sizes total={total} body={body_len}")
    t = pos + 88 + body_len
    topic_len = mv[t]
    if FIXED_SIZE + body_len + topic_len > total:
        raise ProtocolError(f"record at {pos}: topic runs past the record")
    (props_len,) = _U16.unpack_from(mv, t + 1 + topic_len)
    if FIXED_SIZE + body_len + topic_len + props_len != total:
        raise ProtocolError(f"record at {pos}: sizes do not add up to {total}")
    body = bytes(mv[pos + 88:t])
    error: str | None = None
    if sys_flag & COMPRESSED and inflate is not None:
        body, error = inflate(body, sys_flag, phys)
    p = t + 3 + topic_len
    return make(
        topic=bytes(mv[t + 1:t + 1 + topic_len]).decode("utf-8", errors="replace"),
        queue_id=queue_id, queue_offset=queue_offset, commit_offset=phys, body=body,
        properties=decode_properties(mv[p:p + props_len]), sys_flag=sys_flag, flag=flag,
        born_timestamp=born_ts, store_timestamp=store_ts,
        born_host=_host(born_ip, born_port), store_host=_host(store_ip, store_port),
        reconsume_times=reconsume, broker_name=broker_name, decompress_error=error), total
