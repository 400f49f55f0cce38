"""RocketMQ v1 message records, pure-Python twin (same API and bytes as ``records.pyx``).

Owns the byte layout of one commitlog record and the blank record that pads a segment's
end, the masked body CRC, and the validating scanner recovery uses.  Layout (big-endian):

    offset size field
         0    4 total size (whole record, this field included)
         4    4 magic 0xDAA320A7 (v1: IPv4 hosts)
         8    4 body CRC32 (zlib polynomial) & 0x7FFFFFFF
        12    4 queue id
        16    4 flag
        20    8 queue offset
        28    8 physical offset (global offset of this record's first byte)
        36    4 sys flag
        40    8 born timestamp (ms)
        48    8 born host (4-byte IPv4 + int32 port)
        56    8 store timestamp (ms)
        64    8 store host (4-byte IPv4 + int32 port)
        72    4 reconsume times
        76    8 prepared transaction offset
        84    4 body length, then the body
              1 topic length (unsigned), then the topic
              2 properties length (unsigned), then ``key\\x01value\\x02`` pairs

A blank record is ``total size | 0xCBD43194`` (8 bytes written) and fills a segment's rest.

A message record's last written byte is never 0: with properties it is theirs (canonical
properties end in ``\\x02``; the writers refuse any that end in NUL), without them the
topic's (the two bytes after it are the zero properties length; the writers refuse a topic
ending in NUL).  A record whose missing suffix reads as zeros (a torn write in a
zero-filled segment) therefore shows a zero there even when its sizes add up and its body
CRC passes: :func:`scan` stops at it (``ZERO_TAIL``).
"""
from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum

from rmqha.errors import CorruptRecordError, InvalidMessageError, MessageTooLargeError, StoreError

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
#: Bytes of a record without body, topic and properties.
FIXED_SIZE = 91
#: The blank record's written part; a segment always keeps room for it.
MIN_BLANK = 8
MAX_TOPIC_BYTES = 255
#: RocketMQ refuses properties longer than Short.MAX_VALUE.
MAX_PROPERTIES_BYTES = 32767
MAX_BODY_BYTES = 0x7FFFFFFF - FIXED_SIZE - MAX_TOPIC_BYTES - MAX_PROPERTIES_BYTES
CRC_MASK = 0x7FFFFFFF
#: Whether the CRC uses carry-less multiplication, 128-bit / 512-bit (never in this twin).
CRC_CLMUL = False
CRC_VCLMUL = False
_MADV_POPULATE_WRITE = 23
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

#: Everything up to and including the body length (84 + 4 bytes).
_HEAD = struct.Struct(">iIIiiqqiq8sq8siqi")
_HEAD_SIZE = _HEAD.size  # 88
_SIZE_MAGIC = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_Q = struct.Struct(">q")


class ScanStop(IntEnum):
    """Why :func:`scan` stopped; the first two are clean ends, the rest cut the log."""

    END = 0          # reached the requested end exactly
    ZEROS = 1        # an all-zero header: the unwritten part of a preallocated segment
    BLANK = 2        # a valid blank record filled the rest of the segment
    TORN = 3         # a record or header runs past the end: incomplete write
    BAD_MAGIC = 4    # neither the message nor the blank magic
    BAD_SIZE = 5     # total size out of bounds, or a blank not ending the segment
    BAD_LENGTHS = 6  # body/topic/properties lengths do not sum to the total size
    BAD_CRC = 7      # body CRC mismatch
    BAD_OFFSET = 8   # the physical-offset field is not where the record sits
    ZERO_TAIL = 9    # a checked record's last written byte is 0: its tail never came


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32 with zlib semantics (``zlib.crc32``)."""
    return zlib.crc32(data, value)


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """The record's body CRC: CRC-32 masked with 0x7FFFFFFF (RocketMQ's UtilAll.crc32)."""
    return zlib.crc32(body) & CRC_MASK


def message_size(body_len: int, topic_len: int, properties_len: int) -> int:
    return FIXED_SIZE + body_len + topic_len + properties_len


def encode_properties(
        properties: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> bytes:
    """The one properties codec's encoder: ``key\\x01value\\x02`` per pair of a map (or of
    ``(key, value)`` pairs) in its order (RocketMQ's
    ``MessageDecoder.messageProperties2String``: no sorting, so any order a client sends is
    what decoding and encoding again gives back).  A pair with an empty value is left out:
    every RocketMQ reader drops it (see :func:`decode_properties`), so it would be bytes
    nobody reads.  InvalidMessageError for a key or value that is not a str, an empty key,
    a separator inside a key or value, or an overlong result."""
    if not properties:
        return b""
    parts = []
    items = getattr(properties, "items", None)
    # The separators as literals: this runs for every property of every message sent.
    for key, value in (items() if items is not None else properties):  # type: ignore[str-unpack]
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidMessageError(f"property {key!r}: keys and values must be str")
        if not key:
            raise InvalidMessageError("property keys must not be empty")
        if "\x01" in key or "\x02" in key or "\x01" in value or "\x02" in value:
            raise InvalidMessageError(
                f"property {key!r}: keys and values must not contain \\x01 or \\x02")
        if value:
            parts.append(f"{key}\x01{value}\x02")
    try:
        out = "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(f"properties are not encodable as UTF-8: {exc}") from None
    if len(out) > MAX_PROPERTIES_BYTES:
        raise InvalidMessageError(
            f"properties encode to {len(out)} bytes; the limit is {MAX_PROPERTIES_BYTES}")
    return out


def decode_properties(raw: str | bytes | bytearray | memoryview | None) -> dict[str, str]:
    """The one properties codec's decoder, RocketMQ's ``string2messageProperties``: pairs
    split at ``\\x02``, each split at its first ``\\x01``; a pair with no ``\\x01``, an
    empty key or an empty value is skipped (as the Java reader skips it, and the older
    ``String.split`` one did: it drops the trailing empty string a value-less pair leaves);
    a repeated key keeps its last value.  Bytes are read as UTF-8 (bad bytes replaced)."""
    if not raw:
        return {}
    text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", errors="replace")
    out: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        key, _, value = pair.partition(NAME_VALUE_SEPARATOR)
        if key and value:
            out[key] = value
    return out


def find_property(props: bytes | memoryview, key: bytes) -> bytes | None:
    """One property's value straight from the raw bytes (no full parse): index builders
    only need TAGS."""
    raw = bytes(props)
    needle = key + b"\x01"
    pos = 0
    while True:
        at = raw.find(needle, pos)
        if at < 0:
            return None
        if at == 0 or raw[at - 1] == 0x02:
            start = at + len(needle)
            end = raw.find(b"\x02", start)
            return raw[start:] if end < 0 else raw[start:end]
        pos = at + 1


def _check_room(buf_len: int, pos: int, size: int) -> None:
    if pos < 0 or size < 0 or pos + size > buf_len:
        raise StoreError(f"record of {size} bytes at {pos} does not fit a buffer of {buf_len}")


#: Why a record may not end in a zero byte (the refusals below say it).
_ZERO_TAIL_REASON = "recovery tells a torn record by its zero last byte"
_NUL_TOPIC = f"topic ends in a NUL byte: {_ZERO_TAIL_REASON}"


def _nul_property(properties: bytes | memoryview) -> str:
    """The refusal of properties ending in NUL, naming the last property's key."""
    last = bytes(properties).rsplit(b"\x02", 1)[-1].partition(b"\x01")[0]
    return (f"property {last.decode('utf-8', 'replace')!r} ends in a NUL byte: "
            f"{_ZERO_TAIL_REASON}")


def _check_fields(topic: bytes, properties: bytes, host_a: bytes, host_b: bytes) -> None:
    if not 0 < len(topic) <= MAX_TOPIC_BYTES:
        raise InvalidMessageError(f"topic must be 1..{MAX_TOPIC_BYTES} bytes, got {len(topic)}")
    if topic[-1] == 0:
        raise InvalidMessageError(_NUL_TOPIC)
    if len(properties) > MAX_PROPERTIES_BYTES:
        raise InvalidMessageError(f"properties of {len(properties)} bytes exceed {MAX_PROPERTIES_BYTES}")
    if properties and properties[-1] == 0:
        raise InvalidMessageError(_nul_property(properties))
    if len(host_a) != 8 or len(host_b) != 8:
        raise InvalidMessageError("hosts must be 8 bytes (IPv4 + int32 port)")


def write_message(buf, pos: int, topic: bytes, body, properties: bytes, queue_id: int,
                  flag: int, queue_offset: int, physical_offset: int, sys_flag: int,
                  born_timestamp: int, born_host: bytes, store_timestamp: int,
                  store_host: bytes, reconsume_times: int,
                  prepared_transaction_offset: int) -> int:
    """Encode one record at ``buf[pos:]``; returns its size.  Nothing is written on error."""
    _check_fields(topic, properties, born_host, store_host)
    blen = len(body)
    if blen > MAX_BODY_BYTES:
        raise MessageTooLargeError(f"body of {blen} bytes is too large")
    size = FIXED_SIZE + blen + len(topic) + len(properties)
    _check_room(len(buf), pos, size)
    _HEAD.pack_into(buf, pos, size, MESSAGE_MAGIC, zlib.crc32(body) & CRC_MASK, queue_id, flag,
                    queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
                    store_timestamp, store_host, reconsume_times,
                    prepared_transaction_offset, blen)
    p = pos + _HEAD_SIZE
    buf[p:p + blen] = body
    p += blen
    tlen = len(topic)
    buf[p] = tlen
    buf[p + 1:p + 1 + tlen] = topic
    p += 1 + tlen
    plen = len(properties)
    _U16.pack_into(buf, p, plen)
    buf[p + 2:p + 2 + plen] = properties
    return size


def _check_batch_range(buf, pos: int, limit: int) -> None:
    """StoreError unless the buffer a batch is written into holds [pos, limit)."""
    if pos < 0 or limit > len(buf) or pos > limit:
        raise StoreError(f"batch range {pos}..{limit} outside a buffer of {len(buf)}")


def write_batch(buf, pos: int, limit: int, topic: bytes, bodies: Sequence, start: int,
                properties: bytes, queue_id: int, flag: int, queue_offset: int,
                base_offset: int, sys_flag: int, born_timestamp: int, born_host: bytes,
                store_timestamp: int, store_host: bytes, reconsume_times: int,
                prepared_transaction_offset: int, offsets_out=None,
                max_record: int = 0x7FFFFFFF) -> tuple[int, int]:
    """Encode ``bodies[start:]`` from ``pos`` while each record ends at or before ``limit``.

    Record i gets queue offset ``queue_offset + i`` (i counted from ``start``) and physical
    offset ``base_offset + its position``; ``offsets_out[start + i]`` receives that offset
    when given.  Returns ``(records written, end position)``.  Every body is checked first
    (type, and record size <= ``max_record``), so a bad one raises before anything is written.
    """
    _check_fields(topic, properties, born_host, store_host)
    extra = FIXED_SIZE + len(topic) + len(properties)
    n = len(bodies)
    if not 0 <= start <= n:
        raise StoreError(f"start {start} outside a batch of {n}")
    for i in range(start, n):
        body = bodies[i]
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise InvalidMessageError(f"body {i} is {type(body).__name__}, not bytes-like")
        if len(body) > MAX_BODY_BYTES or extra + len(body) > max_record:
            raise MessageTooLargeError(
                f"message {i}: a record of {extra + len(body)} bytes exceeds the limit of "
                f"{min(max_record, 0x7FFFFFFF)}")
    if offsets_out is not None and len(offsets_out) < n:
        raise StoreError(f"offsets_out must hold {n} int64 values")
    _check_batch_range(buf, pos, limit)
    tlen = len(topic)
    plen = len(properties)
    tail = bytes((tlen,)) + topic + _U16.pack(plen) + properties
    pack = _HEAD.pack_into
    count = 0
    for i in range(start, n):
        body = bodies[i]
        blen = len(body)
        size = extra + blen
        if pos + size > limit:
            break
        phys = base_offset + pos
        pack(buf, pos, size, MESSAGE_MAGIC, zlib.crc32(body) & CRC_MASK, queue_id, flag,
             queue_offset + count, phys, sys_flag, born_timestamp, born_host,
             store_timestamp, store_host, reconsume_times, prepared_transaction_offset, blen)
        p = pos + _HEAD_SIZE
        buf[p:p + blen] = body
        buf[p + blen:pos + size] = tail
        if offsets_out is not None:
            offsets_out[i] = phys
        pos += size
        count += 1
    return count, pos


# --- SEND_BATCH bodies -------------------------------------------------------------------
#
# A batch send's body is a run of entries, TOTALSIZE MAGIC BODYCRC FLAG BODYLEN (int32 each)
# body PROPLEN (int16) properties, the properties already in the record's own
# ``key\x01value\x02`` form.  When every entry's properties are canonical (what decoding
# them to a map and encoding that map again gives back byte for byte), the entries can be
# stored as they came, without a Python object per message.

_ENTRY_HEAD = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length
_I16 = struct.Struct(">h")
#: An entry's bytes besides its body and properties.
BATCH_ENTRY_FIXED = 22
#: Keys one canonical property map may hold before :func:`batch_plain` gives up on it.
MAX_PLAIN_KEYS = 64


def _plain_properties(raw: bytes, reserved_keys: tuple[bytes, ...],
                      reserved_prefixes: tuple[bytes, ...]) -> bool:
    if raw[-1] != 2:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    seen: set[bytes] = set()
    for pair in raw[:-1].split(b"\x02"):
        key, _, value = pair.partition(b"\x01")
        if (not key or not value or b"\x01" in value or key in seen or key in reserved_keys
                or key.startswith(reserved_prefixes) or len(seen) == MAX_PLAIN_KEYS):
            return False
        seen.add(key)
    return True


def properties_plain(raw: bytes, reserved_keys: tuple[bytes, ...] = (),
                     reserved_prefixes: tuple[bytes, ...] = ()) -> bool:
    """Whether encoded properties are canonical (see :func:`batch_plain`; empty is) and
    hold none of the reserved keys: then they can be stored as they are."""
    return not raw or _plain_properties(raw, reserved_keys, reserved_prefixes)


def batch_plain(batch, max_items: int, reserved_keys: tuple[bytes, ...] = (),
                reserved_prefixes: tuple[bytes, ...] = ()) -> int:
    """How many entries a batch body holds, when all of them can be stored as they came;
    -1 when not: a size that does not add up, more than ``max_items`` entries, or
    properties that are not canonical (invalid UTF-8, an empty or repeated key, an empty
    value, a pair without exactly one ``\x01``, no closing ``\x02``, more than 64 keys)
    or hold a key of ``reserved_keys`` or starting with one of ``reserved_prefixes``.  The
    caller then decodes the batch the long way, which says what is wrong."""
    mv = memoryview(batch)
    n = len(mv)
    pos = count = 0
    entry = _ENTRY_HEAD.unpack_from
    while pos < n:
        if n - pos < BATCH_ENTRY_FIXED:
            return -1
        total, _magic, _crc, _flag, blen = entry(mv, pos)
        if total < BATCH_ENTRY_FIXED or total > n - pos or blen < 0 or 22 + blen > total:
            return -1
        (plen,) = _I16.unpack_from(mv, pos + 20 + blen)
        if plen < 0 or 22 + blen + plen != total:
            return -1
        count += 1
        if count > max_items:
            return -1
        if plen and not _plain_properties(bytes(mv[pos + 22 + blen:pos + total]),
                                          reserved_keys, reserved_prefixes):
            return -1
        pos += total
    return count


def write_batch_entries(buf, pos: int, limit: int, topic: bytes, batch, src: int,
                        queue_id: int, queue_offset: int, base_offset: int, sys_flag: int,
                        born_timestamp: int, born_host: bytes, store_timestamp: int,
                        store_host: bytes, offsets_out, sizes_out, index: int,
                        max_record: int = 0x7FFFFFFF) -> tuple[int, int, int]:
    """Encode the entries of a batch body (see :func:`batch_plain`) from byte ``src`` as
    records from ``pos`` while each ends at or before ``limit``.

    Each record keeps its entry's flag and properties; the one counted ``i`` from here gets
    queue offset ``queue_offset + i`` and physical offset ``base_offset + its position``,
    stored in ``offsets_out[index + i]`` (int64) with its size in ``sizes_out[index + i]``
    (int32).  Returns ``(records written, end position, next src)``.  Every remaining entry
    is checked first (sizes, record size <= ``max_record``), so a bad one raises before
    anything is written.
    """
    _check_fields(topic, b"", born_host, store_host)
    tlen = len(topic)
    mv = memoryview(batch)
    n = len(mv)
    if not 0 <= src <= n:
        raise StoreError(f"batch position {src} outside a body of {n} bytes")
    entry = _ENTRY_HEAD.unpack_from
    p = src
    k = index
    while p < n:
        if n - p < BATCH_ENTRY_FIXED:
            raise InvalidMessageError(f"batch entry at {p} shorter than its header")
        total, _magic, _crc, _flag, blen = entry(mv, p)
        plen = -1
        if 0 <= blen <= total - 22 and total <= n - p:
            plen = _I16.unpack_from(mv, p + 20 + blen)[0]
        if total < BATCH_ENTRY_FIXED or total > n - p or plen < 0 or 22 + blen + plen != total:
            raise InvalidMessageError(f"batch entry at {p}: sizes do not add up")
        if plen and mv[p + total - 1] == 0:
            raise InvalidMessageError(
                f"batch entry at {p}: {_nul_property(mv[p + total - plen:p + total])}")
        size = FIXED_SIZE + blen + tlen + plen
        if size > max_record:
            raise MessageTooLargeError(
                f"message {k}: a record of {size} bytes exceeds the limit of "
                f"{min(max_record, 0x7FFFFFFF)}")
        p += total
        k += 1
    if offsets_out is not None and len(offsets_out) < k:
        raise StoreError(f"offsets_out must hold {k} int64 values")
    if sizes_out is not None and len(sizes_out) < k:
        raise StoreError(f"sizes_out must hold {k} int32 values")
    _check_batch_range(buf, pos, limit)
    pack = _HEAD.pack_into
    count = 0
    while src < n:
        total, _magic, _crc, flag, blen = entry(mv, src)
        plen = total - 22 - blen
        size = FIXED_SIZE + blen + tlen + plen
        if pos + size > limit:
            break
        body = mv[src + 20:src + 20 + blen]
        phys = base_offset + pos
        pack(buf, pos, size, MESSAGE_MAGIC, zlib.crc32(body) & CRC_MASK, queue_id, flag,
             queue_offset + count, phys, sys_flag, born_timestamp, born_host,
             store_timestamp, store_host, 0, 0, blen)
        q = pos + _HEAD_SIZE
        buf[q:q + blen] = body
        q += blen
        buf[q] = tlen
        buf[q + 1:q + 1 + tlen] = topic
        q += 1 + tlen
        buf[q:q + 2 + plen] = mv[src + 20 + blen:src + total]
        if offsets_out is not None:
            offsets_out[index + count] = phys
        if sizes_out is not None:
            sizes_out[index + count] = size
        pos += size
        src += total
        count += 1
    return count, pos, src


# --- runs of plain sends --------------------------------------------------------------

#: Why :func:`write_plain_run` stopped: every send written; the next does not fit before
#: ``limit`` (reserve or roll, then call again); the next goes one by one (a check it
#: does not pass, a topic not in ``topics``, or a run's key table full).
RUN_STOP_DONE = 0
RUN_STOP_FULL = 1
RUN_STOP_SINGLE = 2
#: At most this many (topic, queue) keys in one call.
RUN_MAX_KEYS = 32
_V6_HOSTS = 0x30
_INT32_MAX = 0x7FFFFFFF
_INT64_MAX = 0x7FFFFFFFFFFFFFFF


def _int_in(v: object, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi


def _plain_send_size(send: tuple, tb: bytes | None, qid: int, max_record: int) -> int:
    """The record size of a send the run may take, or -1 when it goes one by one."""
    if (type(send) is not tuple or len(send) < 11 or type(tb) is not bytes or qid < 0
            or not 0 < len(tb) <= MAX_TOPIC_BYTES or tb[-1] == 0):
        return -1
    props, body, sys_flag = send[8], send[10], send[5]
    if (type(props) is not bytes or type(body) is not bytes
            or not _int_in(sys_flag, 0, _INT32_MAX) or sys_flag & _V6_HOSTS
            or not _int_in(send[6], 0, _INT64_MAX)
            or not _int_in(send[7], -_INT32_MAX - 1, _INT32_MAX)
            or not _int_in(send[9], 0, _INT32_MAX)
            or len(props) > MAX_PROPERTIES_BYTES or len(body) > MAX_BODY_BYTES):
        return -1
    size = FIXED_SIZE + len(body) + len(tb) + len(props)
    if size > max_record or (props and not _plain_properties(props, (), ())):
        return -1
    return size


def write_plain_run(buf, pos: int, limit: int, base_offset: int, sends: list, start: int,
                    stop: int, queue_ids, topics: dict, queue_offsets: dict,
                    born_default: int, born_host: bytes, store_timestamp: int,
                    store_host: bytes, offsets_out, sizes_out, queue_offsets_out,
                    max_record: int = 0x7FFFFFFF) -> tuple[int, int, int]:
    """Encode plain sends ``sends[start:stop]`` (``send_frames``' tuples) as records from
    ``pos`` while each ends at or before ``limit``: the bytes :func:`write_message` writes
    one by one, send i with queue id ``queue_ids[i]``, topic bytes ``topics[send topic]``,
    the next queue offset of its (topic bytes, queue id) in ``queue_offsets`` (advanced),
    its born timestamp or ``born_default`` when 0, and physical offset ``base_offset +
    its position``.  ``offsets_out[i]`` / ``sizes_out[i]`` / ``queue_offsets_out[i]``
    (array('q'), array('i'), array('q')) receive them.  Returns ``(records written, end
    position, RUN_STOP_*)``; a send a check refuses is not written and ends the run."""
    if stop > len(sends) or start < 0 or start > stop:
        raise StoreError(f"run {start}..{stop} outside {len(sends)} sends")
    _check_fields(b"-", b"", born_host, store_host)
    _check_batch_range(buf, pos, limit)
    for arr, code, name in ((queue_ids, "i", "queue_ids"), (offsets_out, "q", "offsets_out"),
                            (sizes_out, "i", "sizes_out"),
                            (queue_offsets_out, "q", "queue_offsets_out")):
        if memoryview(arr).format != code or len(arr) < stop:
            raise StoreError(f"{name} must hold {stop} int{8 if code == 'q' else 32} values")
    nexts: dict[tuple[bytes, int], int] = {}
    count, why = 0, RUN_STOP_DONE
    try:
        for i in range(start, stop):
            send = sends[i]
            qid = queue_ids[i]
            tb = topics.get(send[3]) if type(send) is tuple and len(send) >= 11 else None
            size = _plain_send_size(send, tb, qid, max_record)
            if size < 0 or tb is None:
                why = RUN_STOP_SINGLE
                break
            if pos + size > limit:
                why = RUN_STOP_FULL
                break
            key = (tb, qid)
            qoff = nexts.get(key)
            if qoff is None:
                if len(nexts) == RUN_MAX_KEYS:
                    why = RUN_STOP_SINGLE
                    break
                qoff = queue_offsets.get(key, 0)
                if not _int_in(qoff, 0, _INT64_MAX):
                    why = RUN_STOP_SINGLE
                    break
            nexts[key] = qoff + 1
            write_message(buf, pos, tb, send[10], send[8], qid, send[7], qoff,
                          base_offset + pos, send[5], send[6] or born_default, born_host,
                          store_timestamp, store_host, send[9], 0)
            offsets_out[i] = base_offset + pos
            sizes_out[i] = size
            queue_offsets_out[i] = qoff
            pos += size
            count += 1
    finally:
        queue_offsets.update(nexts)
    return count, pos, why


def write_blank(buf, pos: int, size: int) -> None:
    """Write the blank record header (``size`` = bytes left in the segment, >= 8)."""
    if size < MIN_BLANK:
        raise StoreError(f"a blank record needs at least {MIN_BLANK} bytes, got {size}")
    _check_room(len(buf), pos, size)
    _SIZE_MAGIC.pack_into(buf, pos, size, BLANK_MAGIC)


def _check_record(buf, pos: int, end: int, seg_end: int, base_offset: int, verify: bool):
    """(size, stop) for the record at pos; stop is None when the record is valid.  With
    ``verify`` its body CRC and last written byte are checked too."""
    if end - pos < MIN_BLANK:
        if not any(buf[pos:end]):
            return 0, ScanStop.ZEROS
        return 0, ScanStop.TORN
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if total == 0 and magic == 0:
        return 0, ScanStop.ZEROS
    if magic == BLANK_MAGIC:
        if total != seg_end - pos:
            return 0, ScanStop.BAD_SIZE
        if total > end - pos:
            return 0, ScanStop.TORN
        return total, ScanStop.BLANK
    if magic != MESSAGE_MAGIC:
        return 0, ScanStop.BAD_MAGIC
    if total < FIXED_SIZE or total > seg_end - pos:
        return 0, ScanStop.BAD_SIZE
    if total > end - pos:
        return 0, ScanStop.TORN
    blen = _I32.unpack_from(buf, pos + 84)[0]
    if blen < 0 or blen > total - FIXED_SIZE:
        return 0, ScanStop.BAD_LENGTHS
    tlen = buf[pos + 88 + blen]
    if tlen == 0 or FIXED_SIZE + blen + tlen > total:
        return 0, ScanStop.BAD_LENGTHS
    plen = _U16.unpack_from(buf, pos + 89 + blen + tlen)[0]
    if FIXED_SIZE + blen + tlen + plen != total:
        return 0, ScanStop.BAD_LENGTHS
    if _Q.unpack_from(buf, pos + 28)[0] != base_offset + pos:
        return 0, ScanStop.BAD_OFFSET
    if verify:
        crc = _I32.unpack_from(buf, pos + 8)[0]
        if zlib.crc32(buf[pos + 88:pos + 88 + blen]) & CRC_MASK != crc:
            return 0, ScanStop.BAD_CRC
        # The properties' last byte, or without them the topic's (before the length's two).
        if buf[pos + total - (1 if plen else 3)] == 0:
            return 0, ScanStop.ZERO_TAIL
    return total, None


def scan(buf, pos: int, end: int, base_offset: int, verify_from: int,
         table: dict | None = None, lower: bool = False,
         seg_end: int = -1) -> tuple[int, int, int]:
    """Walk and validate records in ``buf[pos:end]``; returns ``(stop position, ScanStop, count)``.

    ``buf`` is a whole segment: a blank record must reach ``len(buf)`` exactly, and ``end``
    is where the written data ends (a record or blank running past it is TORN).  Records that
    end past global offset ``verify_from`` are checked whole: body CRC (BAD_CRC) and last
    written byte (ZERO_TAIL, see the module's docstring).  With ``table``, every message
    updates ``table[(topic bytes, queue id)]`` to its queue offset + 1 or, with ``lower``,
    to the smallest queue offset seen (used to forget records being truncated).

    ``seg_end`` (>= ``end``) says where the segment ends, counted from ``buf[0]``, when
    ``buf`` is only a piece of it (a replicated block; ``base_offset`` is then the global
    offset of ``buf[0]``); a blank record must reach it and the stop position of a blank
    is ``seg_end``.
    """
    n = len(buf)
    if seg_end < 0:
        seg_end = n
    if pos < 0 or end > n or pos > end or seg_end < end:
        raise StoreError(f"scan range {pos}..{end} outside a buffer of {n} "
                         f"(segment end {seg_end})")
    count = 0
    while pos < end:
        head = base_offset + pos
        # A record that starts below verify_from but runs past it was not all flushed
        # (a slave flushes mid-record): its CRC is checked too.
        verify = head >= verify_from or (
            end - pos >= 4 and head + _I32.unpack_from(buf, pos)[0] > verify_from)
        size, stop = _check_record(buf, pos, end, seg_end, base_offset, verify)
        if stop is not None:
            if stop == ScanStop.BLANK:
                return seg_end, int(stop), count
            return pos, int(stop), count
        if table is not None:
            blen = _I32.unpack_from(buf, pos + 84)[0]
            tlen = buf[pos + 88 + blen]
            key = (bytes(buf[pos + 89 + blen:pos + 89 + blen + tlen]),
                   _I32.unpack_from(buf, pos + 12)[0])
            qoff = _Q.unpack_from(buf, pos + 20)[0]
            if lower:
                old = table.get(key)
                if old is None or qoff < old:
                    table[key] = qoff
            else:
                table[key] = qoff + 1
        pos += size
        count += 1
    return pos, int(ScanStop.END), count


def decode(buf, pos: int, limit: int, verify_crc: bool = True) -> tuple:
    """Decode the message at ``pos`` (ending at or before ``limit``) into a 17-tuple:

    (total_size, magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
    born_timestamp, born_host(8 bytes), store_timestamp, store_host(8 bytes),
    reconsume_times, prepared_transaction_offset, body, topic, properties) -- bytes copied.
    CorruptRecordError if it is not a valid message (with ``verify_crc``, also a body CRC
    or last byte that fails :func:`scan`'s check).
    """
    if pos < 0 or limit > len(buf) or pos > limit:
        raise StoreError(f"decode range {pos}..{limit} outside a buffer of {len(buf)}")
    if limit - pos < MIN_BLANK:
        raise CorruptRecordError(f"no record header at {pos}: only {limit - pos} bytes")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        raise CorruptRecordError(f"record at {pos} is a blank (segment padding), not a message")
    phys = _Q.unpack_from(buf, pos + 28)[0] if limit - pos >= 36 else 0
    size, stop = _check_record(buf, pos, limit, limit, phys - pos, verify_crc)
    if stop is not None:
        raise CorruptRecordError(f"invalid record at {pos}: {ScanStop(stop).name}")
    head = _HEAD.unpack_from(buf, pos)
    blen = head[14]
    p = pos + 88
    body = bytes(buf[p:p + blen])
    p += blen
    tlen = buf[p]
    topic = bytes(buf[p + 1:p + 1 + tlen])
    p += 1 + tlen
    plen = _U16.unpack_from(buf, p)[0]
    props = bytes(buf[p + 2:p + 2 + plen])
    return head[:14] + (body, topic, props)


def prefault(buf, start: int = 0, end: int | None = None) -> None:
    """Fault in every page of a writable buffer from ``start`` to ``end`` (default: its
    end), without changing a byte.

    On an mmap this asks the kernel (MADV_POPULATE_WRITE) in 4 MiB steps, so other threads
    get the GIL between steps; elsewhere it reads one byte per page (write faults remain).
    """
    n = len(buf) if end is None or end < 0 else end
    if not 0 <= start <= n <= len(buf):
        raise StoreError(f"prefault range {start}..{n} outside a buffer of {len(buf)}")
    if isinstance(buf, mmap.mmap):
        step = 4 << 20
        pos = start - start % mmap.PAGESIZE
        try:
            while pos < n:
                buf.madvise(_MADV_POPULATE_WRITE, pos, min(step, n - pos))
                pos += step
            return
        except OSError:
            pass  # kernel before 5.14: touch pages instead
    mv = memoryview(buf)
    try:
        total = 0
        for i in range(start, n, 4096):
            total += mv[i]
    finally:
        mv.release()


def resident(buf, start: int, end: int) -> bool:
    """Whether the pages of ``buf[start:end]`` are in memory.  Python has no mincore: this
    twin cannot tell and answers True (the caller then takes its fast path as if warm)."""
    if start < 0 or start >= end or end > len(buf):
        raise StoreError(f"resident range {start}..{end} outside a buffer of {len(buf)}")
    return True
