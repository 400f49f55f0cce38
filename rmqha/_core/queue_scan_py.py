"""The commitlog walk behind the consume-queue index, pure-Python twin (same API and
results as ``queue_scan.pyx``).

Owns reading, per record, what a consume queue keeps (queue id, queue offset, physical
offset, size, the TAGS hash) and grouping consecutive records of one queue into runs, so
:class:`rmqha.store.consume_queue.ConsumeQueueIndex` grows by one write into a queue file
per run instead of Python work per message.  A run's entries travel as RocketMQ
ConsumeQueue units, ready to be copied into the file: 20 bytes each, big-endian commitlog
offset (int64), size (int32) and tag hash (int64).
"""
from __future__ import annotations

import struct
from collections.abc import Callable

# The reference reading of one property (the compiled twin has its own C search).
from rmqha._core.records_py import find_property

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
#: Record bytes besides body, topic and properties.
FIXED_SIZE = 91

_HEAD = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_Q = struct.Struct(">q")
_U16 = struct.Struct(">H")
_TAGS = b"TAGS\x01"

#: RocketMQ's ConsumeQueue unit: commitlog offset, size, tag hash (``CQ_STORE_UNIT_SIZE``).
UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size

#: (topic bytes, queue id, first queue offset, units (UNIT_SIZE bytes per record), indexes
#: in the run of the records a watcher wants)
Run = tuple[bytes, int, int, bytes, list[int]]


def _layout(view: memoryview | bytes, pos: int, total: int) -> tuple[int, int, int]:
    """(body length, topic length, properties length) of the record at ``pos`` (``total``
    bytes, all readable); the last is -1 when they do not add up to ``total``."""
    (blen,) = _I32.unpack_from(view, pos + 84)
    tlen = view[pos + 88 + blen] if 0 <= blen <= total - FIXED_SIZE else 0
    if not tlen or FIXED_SIZE + blen + tlen > total:
        return blen, tlen, -1
    (plen,) = _U16.unpack_from(view, pos + 89 + blen + tlen)
    return blen, tlen, plen if FIXED_SIZE + blen + tlen + plen == total else -1


def java_hash_ascii(raw: bytes) -> int | None:
    """Java ``String.hashCode`` of an ASCII tag; None when it is not ASCII (UTF-16 code
    units then differ from bytes, and the caller's own function decides)."""
    if not raw.isascii():
        return None
    h = 0
    for c in raw:
        h = (31 * h + c) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def index_runs(view: memoryview | bytes, base: int, watched_topics: frozenset[bytes],
               watched_prop: bytes | None,
               tag_hash: Callable[[bytes], int]) -> tuple[int, list[Run], tuple[int, int, int] | None]:
    """Walk the whole records of ``view`` (global offset ``base``); returns ``(bytes
    consumed, runs, bad)``.

    Blank records are stepped over; the walk stops before a record or blank that runs past
    the view.  ``bad`` is ``(position, magic, total size)`` when the walk stopped at
    something that is not a record (or whose lengths do not add up), else None.  A record
    is "watched" when its topic is in ``watched_topics`` or its properties contain
    ``watched_prop``.  ``tag_hash(raw)`` hashes a non-ASCII TAGS value (ASCII ones are
    hashed here, as Java's ``String.hashCode``); a record without TAGS, or with an empty
    one, hashes to 0.
    """
    n = len(view)
    pos = 0
    runs: list[Run] = []
    cur: tuple[bytes, int] | None = None
    first = last = 0
    units = bytearray()
    hits: list[int] = []

    def close() -> None:
        if cur is not None:
            runs.append((cur[0], cur[1], first, bytes(units), hits))

    bad: tuple[int, int, int] | None = None
    while n - pos >= 8:
        total, magic = _HEAD.unpack_from(view, pos)
        if magic == BLANK_MAGIC:
            if total <= 0 or total > n - pos:
                break
            pos += total
            continue
        if magic != MESSAGE_MAGIC or total < FIXED_SIZE:
            bad = (pos, magic, total)
            break
        if total > n - pos:
            break
        blen, tlen, plen = _layout(view, pos, total)
        if plen < 0:
            bad = (pos, magic, total)
            break
        (queue_id,) = _I32.unpack_from(view, pos + 12)
        (qoff,) = _Q.unpack_from(view, pos + 20)
        t = pos + 89 + blen
        topic = bytes(view[t:t + tlen])
        props = bytes(view[t + tlen + 2:t + tlen + 2 + plen])
        tag = 0
        if plen and _TAGS in props:
            raw = find_property(props, b"TAGS")
            if raw:
                h = java_hash_ascii(raw)
                tag = tag_hash(raw) if h is None else h
        if cur is None or cur != (topic, queue_id) or qoff != last + 1:
            close()
            cur = (topic, queue_id)
            first = qoff
            units, hits = bytearray(), []
        if topic in watched_topics or (watched_prop is not None and plen
                                       and watched_prop in props):
            hits.append(len(units) // UNIT_SIZE)
        units += UNIT.pack(base + pos, total, tag)
        last = qoff
        pos += total
    close()
    return pos, runs, bad


_HEAD_CHECK = struct.Struct(">iIiiiq")  # total, magic, body CRC, queue id, flag, queue offset


def check_units(view: memoryview | bytes, base: int, units: bytes, start: int, stop: int,
                first_qoff: int, queue_id: int, topic: bytes) -> tuple[int, bool]:
    """Check units ``start..stop-1`` of ``units`` (unit ``i`` is queue offset ``first_qoff
    + i``) against the records they point at in ``view`` (global offset ``base``): magic,
    total size, queue id, queue offset and topic.  Returns ``(i, bad)``: the first unit not
    checked, and whether it failed (False: it lies outside the view, or ``i == stop``)."""
    if start < 0 or stop * UNIT_SIZE > len(units) or start > stop:
        raise ValueError("unit range outside the units given")
    n = len(view)
    for i in range(start, stop):
        phys, size, _ = UNIT.unpack_from(units, UNIT_SIZE * i)
        rel = phys - base
        if rel < 0:
            return i, True  # units go up the log: this one is out of order
        if rel + size > n:
            return i, False
        if size < FIXED_SIZE:
            return i, True
        total, magic, _, qid, _, qoff = _HEAD_CHECK.unpack_from(view, rel)
        (blen,) = _I32.unpack_from(view, rel + 84)
        if (magic != MESSAGE_MAGIC or total != size or qid != queue_id
                or qoff != first_qoff + i or not 0 <= blen <= size - FIXED_SIZE):
            return i, True
        tlen = view[rel + 88 + blen]
        if (tlen != len(topic) or FIXED_SIZE + blen + tlen > size
                or bytes(view[rel + 89 + blen:rel + 89 + blen + tlen]) != topic):
            return i, True
    return stop, False


class QueueSink:
    """Where :func:`dispatch` writes one queue's next units: the mapping ``mm`` of the
    queue file holding queue offset ``next`` (whose first unit is queue offset ``start``),
    writable below queue offset ``limit`` (blocks allocated, the file's end).  ``limit =
    0`` disarms it: every record of the queue goes the general way.  ``gen`` is the last
    :func:`dispatch` call that wrote through it; ``key`` is what that call reports."""

    __slots__ = ("key", "topic", "queue_id", "mm", "start", "next", "limit", "gen")

    def __init__(self, key: object, topic: bytes, queue_id: int) -> None:
        self.key = key
        self.topic = topic
        self.queue_id = queue_id
        self.mm: object = None
        self.start = 0
        self.next = 0
        self.limit = 0
        self.gen = 0


def dispatch(view: memoryview | bytes, base: int, sinks: dict[tuple[bytes, int], QueueSink],
             watched_topics: frozenset[bytes], watched_prop: bytes | None,
             tag_hash: Callable[[bytes], int], gen: int) -> tuple[int, int, list[object]]:
    """Write the unit of each whole record of ``view`` (global offset ``base``) straight
    into its queue's file through ``sinks[(topic, queue id)]``; returns ``(bytes consumed,
    records written, the keys of the sinks written)``.

    The walk stops before the first record it does not take, for the general dispatch to
    take from there: a blank, something that is not a record, a record past the view, a
    watched one (topic in ``watched_topics`` or ``watched_prop`` among its properties, as
    :func:`index_runs` reads them), or one whose queue has no armed sink, whose queue
    offset is not the sink's ``next`` or which has no room below its ``limit``.  Units
    are :func:`index_runs`'s bytes."""
    n = len(view)
    pos = count = 0
    grown: list[object] = []
    while n - pos >= 8:
        total, magic = _HEAD.unpack_from(view, pos)
        if magic != MESSAGE_MAGIC or total < FIXED_SIZE or total > n - pos:
            break
        blen, tlen, plen = _layout(view, pos, total)
        if plen < 0:
            break
        (queue_id,) = _I32.unpack_from(view, pos + 12)
        (qoff,) = _Q.unpack_from(view, pos + 20)
        t = pos + 89 + blen
        topic = bytes(view[t:t + tlen])
        props = bytes(view[t + tlen + 2:t + tlen + 2 + plen])
        if topic in watched_topics or (watched_prop is not None and plen
                                       and watched_prop in props):
            break
        sink = sinks.get((topic, queue_id))
        if sink is None or qoff != sink.next or qoff >= sink.limit:
            break
        tag = 0
        if plen and _TAGS in props:
            raw = find_property(props, b"TAGS")
            if raw:
                h = java_hash_ascii(raw)
                tag = tag_hash(raw) if h is None else h
        at = (qoff - sink.start) * UNIT_SIZE
        try:
            if at < 0 or at + UNIT_SIZE > len(sink.mm):  # type: ignore[arg-type]
                break
            UNIT.pack_into(sink.mm, at, base + pos, total, tag)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            break  # a mapping closed since the sink was armed: the general way reopens it
        sink.next = qoff + 1
        if sink.gen != gen:
            sink.gen = gen
            grown.append(sink.key)
        count += 1
        pos += total
    return pos, count, grown
