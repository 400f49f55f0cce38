"""Pure-Python twin of the message index's hot path: scanning commitlog records and adding
their keys to an index file's hash table (see :mod:`rmqha.store.message_index` for
the file layout).  Writes the same bytes as the compiled twin (``message_index.pyx``)."""
from __future__ import annotations

import struct
import zlib

HEADER_SIZE = 128
ENTRY_SIZE = 24
MAGIC_V1 = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
REC_FIXED = 91

#: add_records status: what stopped the scan at the returned position.
DONE = 0  # reached ``end`` (a partial record there waits for more bytes)
FULL = 1  # the next record's keys do not fit this file: rotate, then call again
NOT_A_RECORD = 2  # no record starts here (logged by the caller)
BLANK = 3  # a blank runs past ``end`` (the caller skips to the segment end)

_HEAD = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_Q = struct.Struct(">q")
_ENTRY = struct.Struct(">qqIi")
_SLOT = struct.Struct(">i")


def prop(props: bytes, needle: bytes) -> bytes | None:
    """The value of the property whose ``name\\x01`` is ``needle`` in raw property bytes."""
    at = props.find(needle)
    while at > 0 and props[at - 1] != 0x02:
        at = props.find(needle, at + 1)
    if at < 0:
        return None
    start = at + len(needle)
    end = props.find(b"\x02", start)
    return props[start:] if end < 0 else props[start:end]


#: At most this many keys of one record are indexed (the unique id counts as one).
MAX_KEYS = 64


def record_keys(props: bytes, max_key_bytes: int) -> list[bytes]:
    """UNIQ_KEY then the KEYS words (space separated), without repeats or empty words, at
    most MAX_KEYS, then without those longer than ``max_key_bytes``."""
    out: list[bytes] = []
    uniq = prop(props, b"UNIQ_KEY\x01")
    if uniq:
        out.append(uniq)
    keys = prop(props, b"KEYS\x01")
    if keys:
        for word in keys.split(b" "):
            if word and len(out) < MAX_KEYS and word not in out:
                out.append(word)
    return [k for k in out if len(k) <= max_key_bytes]


def add_records(view: memoryview | bytes, pos: int, end: int, base: int, mm: object,
                slot_count: int, entries_at: int, capacity: int, count: int, min_ts: int,
                max_ts: int, skip: tuple[bytes, ...],
                max_key_bytes: int) -> tuple[int, int, int, int, int, int]:
    """Add the keys of every whole record in ``view[pos:end]`` (record at ``p`` is at commit
    offset ``base + p``) to the file mapped at ``mm``.

    Returns ``(position, count, min_ts, max_ts, entries added, status)``: the position is
    where the scan stopped (the start of the record not taken, for FULL and NOT_A_RECORD).
    """
    if slot_count <= 0:
        raise ValueError("slot_count must be positive")
    if end > len(view):
        raise ValueError("end is past the view")
    size = len(mm)  # type: ignore[arg-type]
    if entries_at + capacity * ENTRY_SIZE > size or HEADER_SIZE + slot_count * 4 > size:
        raise ValueError("the index file mapping is smaller than its header says")
    added = 0
    while end - pos >= 8:
        total, magic = _HEAD.unpack_from(view, pos)
        if magic == BLANK_MAGIC:
            if total <= 0 or total > end - pos:
                return pos, count, min_ts, max_ts, added, BLANK
            pos += total
            continue
        if magic != MAGIC_V1 or total < REC_FIXED:
            return pos, count, min_ts, max_ts, added, NOT_A_RECORD
        if total > end - pos:
            break
        (body_len,) = _I32.unpack_from(view, pos + 84)
        t = pos + 88 + body_len
        if body_len < 0 or t + 3 > pos + total:
            return pos, count, min_ts, max_ts, added, NOT_A_RECORD
        topic_len = view[t]
        if t + 3 + topic_len > pos + total:
            return pos, count, min_ts, max_ts, added, NOT_A_RECORD
        topic = bytes(view[t + 1 : t + 1 + topic_len])
        (props_len,) = _U16.unpack_from(view, t + 1 + topic_len)
        p = t + 3 + topic_len
        if props_len and p + props_len <= pos + total and topic not in skip:
            keys = record_keys(bytes(view[p : p + props_len]), max_key_bytes)
            if keys:
                if count + len(keys) > capacity and count:
                    return pos, count, min_ts, max_ts, added, FULL
                (ts,) = _Q.unpack_from(view, pos + 56)
                phys = base + pos
                prefix = zlib.crc32(b"#", zlib.crc32(topic))
                first = count == 0
                for k in keys:
                    if count >= capacity:
                        break
                    h = zlib.crc32(k, prefix)
                    s = HEADER_SIZE + 4 * (h % slot_count)
                    _ENTRY.pack_into(mm, entries_at + count * ENTRY_SIZE, phys, ts, h,
                                     _SLOT.unpack_from(mm, s)[0])
                    count += 1
                    added += 1
                    _SLOT.pack_into(mm, s, count)
                if first or ts < min_ts:
                    min_ts = ts
                if ts > max_ts:
                    max_ts = ts
        pos += total
    return pos, count, min_ts, max_ts, added, DONE
