"""The client's send request encode and send answer decode, pure-Python twin (same API,
bytes and results as ``send_codec.pyx``).

Owns three things a producer does for every message:

- :class:`UniqKeys`: the client message ids (``UNIQ_KEY``), 32 upper-case hex laid out like
  RocketMQ's ``MessageClientIDSetter``: a fixed 20-hex prefix (ip, pid, a random
  per-process part), the milliseconds since the start of the current month (8 hex, UTC)
  and a 16-bit counter (4 hex).
- :func:`encode_send`: the whole remoting frame of a SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE
  request (total length, header length, JSON header, body), the bytes
  ``rmqha.protocol.command.encode`` writes for the command the producer would build: header
  keys ``code, language, version, opaque, flag, extFields`` in that order, no remark, and
  the send header's V2 letters ``a b c d f g h i j k m`` then the queue id ``e``; strings
  escaped as orjson escapes them (``"``, ``\\``, control characters; everything else raw
  UTF-8).
- :func:`decode_send_answer`: what a producer reads from a send's answer frame (without its
  total length): an :class:`Answer` (``code, opaque, flag, remark, msg_id, queue_id,
  queue_offset, put_status, master_address``), an absent field as ``None``.  ``None`` instead of a tuple when the frame
  is well formed but not one this reads (a binary header, a field of an unexpected JSON
  type): the caller decodes it the general way.  ProtocolError when the frame is broken.
- :func:`match_answers`: the answers at the start of a read handed to the futures of the
  sends waiting for them, matched by opaque (a connection's pending sends).
- :func:`encode_plain_batch`: a SEND_BATCH_MESSAGE body of plain messages (bodies alone,
  each with its UNIQ_KEY in a properties template), cut where the producer cuts chunks.
"""
from __future__ import annotations

import calendar
import itertools
import struct
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from rmqha.errors import ProtocolError

#: What the producer sends as ``defaultTopic`` and its queue count (RocketMQ's client
#: defaults; ``rmqha.protocol.headers.SendHeader.fields``).
DEFAULT_TOPIC = "TBW102"
LANGUAGE = "PYTHON"
#: The answer fields :func:`decode_send_answer` returns, in its tuple's order after
#: ``(code, opaque, flag, remark)``.
ANSWER_FIELDS: tuple[str, ...] = ("msgId", "queueId", "queueOffset", "putStatus",
                                  "masterAddress")

_LEN = struct.Struct(">ii")
_I32 = struct.Struct(">i")
#: Header length occupies the low 24 bits of the second int32.
_HEADER_LENGTH_MASK = 0xFFFFFF



class Answer(NamedTuple):
    """A decoded send answer: the frame's own fields, then :data:`ANSWER_FIELDS` (an absent
    one None).  Named fields, read as fast as slots (a C getter each); both twins make it
    with ``tuple.__new__``, which skips the Python-level ``__new__`` a NamedTuple's call
    runs."""

    code: int
    opaque: int
    flag: int
    remark: str | None
    msg_id: str | None
    queue_id: str | None
    queue_offset: str | None
    put_status: str | None
    master_address: str | None


#: An :class:`Answer` from its nine values in one tuple (see its docstring).
_new_tuple = tuple.__new__


def month_bounds(now_ms: int) -> tuple[int, int]:
    """[start, end) of the UTC month holding ``now_ms``, in epoch ms."""
    t = time.gmtime(now_ms // 1000)
    start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)) * 1000
    ny, nm = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return start, calendar.timegm((ny, nm, 1, 0, 0, 0)) * 1000


class UniqKeys:
    """One process's UNIQ_KEY maker (see the module docstring).  No lock: ``next()`` on an
    ``itertools.count`` is atomic under the GIL, so threads never share a counter value."""

    def __init__(self, prefix: str) -> None:
        if len(prefix) != 20 or prefix.strip("0123456789ABCDEF"):
            raise ValueError(f"a UNIQ_KEY prefix is 20 upper-case hex digits, got {prefix!r}")
        self.prefix = prefix
        self._counter = itertools.count()
        self._month = (0, 0)

    def next(self) -> str:
        """A new id."""
        n = next(self._counter)
        return f"{self._time_hex()}{n & 0xFFFF:04X}"

    def take(self, count: int) -> list[str]:
        """``count`` new ids, reading the clock once (a batch's)."""
        head = self._time_hex()
        counter = self._counter
        return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(count)]

    def _time_hex(self) -> str:
        now = time.time_ns() // 1_000_000
        start, end = self._month
        if not start <= now < end:
            self._month = start, end = month_bounds(now)
        return f"{self.prefix}{(now - start) & 0xFFFFFFFF:08X}"


def encode_send(code: int, opaque: int, version: int, group: str, topic: str, sys_flag: int,
                born_ms: int, flag: int, properties: str, batch: bool, queue_id: int,
                body: bytes) -> bytes:
    """The whole frame of one send request (see the module docstring)."""
    header = {
        "code": code, "language": LANGUAGE, "version": version, "opaque": opaque, "flag": 0,
        "extFields": {
            "a": group, "b": topic, "c": DEFAULT_TOPIC, "d": "4", "f": str(sys_flag),
            "g": str(born_ms), "h": str(flag), "i": properties, "j": "0", "k": "false",
            "m": "true" if batch else "false", "e": str(queue_id),
        },
    }
    try:
        raw = orjson.dumps(header)
    except TypeError as exc:  # a lone surrogate, a str subclass orjson will not take
        raise ProtocolError(f"cannot encode the header of a send to {topic!r}: {exc}") from exc
    return b"".join((_LEN.pack(4 + len(raw) + len(body), len(raw)), raw, body))


def decode_send_answer(frame: bytes | bytearray | memoryview) -> Answer | None:
    """The fields of a send's answer frame (see the module docstring)."""
    header = _json_header(frame)
    if header is None:
        return None
    code, opaque, flag = header.get("code"), header.get("opaque", 0), header.get("flag", 0)
    remark = header.get("remark")
    if not (type(code) is int and type(opaque) is int and type(flag) is int):
        return None
    if remark is not None and type(remark) is not str:
        return None
    ext = header.get("extFields") or {}
    if type(ext) is not dict:
        return None
    values = [ext.get(name) for name in ANSWER_FIELDS]
    if any(v is not None and type(v) is not str for v in values):
        return None
    return _new_tuple(Answer, (code, opaque, flag, remark, values[0], values[1], values[2],
                               values[3], values[4]))


#: The response bit of a frame's flag (``rmqha.protocol.command.FLAG_RESPONSE``).
_FLAG_RESPONSE = 0x1


def match_answers(data: bytes, pending: dict[int, Any], deadlines: dict[int, float],
                  max_frame_bytes: int, limit: int) -> tuple[int, int]:
    """Hand the answers at the start of ``data`` (a read whose first byte begins a frame)
    to the sends waiting for them: frame by frame, while a frame is whole and is the
    response to an opaque in ``pending`` with a header :func:`decode_send_answer` reads,
    pop that opaque from ``pending`` and ``deadlines`` and set its future's result to the
    answer's fields; at most ``limit`` frames.  Returns where the first frame not handed
    over starts and how many were.  What stops it (a frame not whole, a length outside
    ``[4, max_frame_bytes]``, a request, an unknown opaque, a header this does not read, a
    broken one) is left to the caller's general decoder, which reads it (or raises on it)
    as it would have."""
    pos = count = 0
    end = len(data)
    view = memoryview(data)
    while count < limit and end - pos >= 8:
        (total,) = _I32.unpack_from(data, pos)
        if not 4 <= total <= max_frame_bytes or end - pos - 4 < total:
            break
        try:
            answer = decode_send_answer(view[pos + 4:pos + 4 + total])
        except ProtocolError:
            break
        if answer is None or not answer.flag & _FLAG_RESPONSE:
            break
        fut = pending.pop(answer.opaque, None)
        if fut is None:
            break
        deadlines.pop(answer.opaque, None)
        if not fut.done():
            fut.set_result(answer)
        pos += 4 + total
        count += 1
    return pos, count


def _json_header(frame: bytes | bytearray | memoryview) -> dict[str, object] | None:
    """The JSON header of a frame as a dict; None for a binary header; ProtocolError for
    lengths that do not fit, a header that is not JSON or not an object."""
    if len(frame) < 4:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than its header length")
    (ori,) = _I32.unpack_from(frame, 0)
    header_length = ori & _HEADER_LENGTH_MASK
    if header_length > len(frame) - 4:
        raise ProtocolError(
            f"header length {header_length} exceeds the frame ({len(frame) - 4} bytes left)")
    if (ori >> 24) & 0xFF:
        return None
    try:
        header = orjson.loads(bytes(frame[4:4 + header_length]))
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from exc
    if type(header) is not dict:
        raise ProtocolError("header JSON is not an object")
    return header


_ENTRY_HEAD = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length
_PROPS_LENGTH = struct.Struct(">h")
#: The fixed bytes of a batch entry: its head and its properties length.
ENTRY_FIXED = 22


def encode_plain_batch(bodies: Sequence[bytes], uids: Sequence[str], head: str, tail: str,
                       start: int, max_bytes: int) -> tuple[bytes, int]:
    """One SEND_BATCH_MESSAGE body of plain messages: ``bodies[start:end]``, each with flag
    0 and properties ``head + uid + tail`` (RocketMQ's batch entry: TOTALSIZE MAGIC BODYCRC
    FLAG BODYLEN body PROPLEN properties), and ``end``.  Entries are taken while the
    producer's count of the chunk (``22 + len(body) + 4 * len(properties)`` each, the
    properties counted in characters) stays within ``max_bytes``; the first always is."""
    if not 0 <= start < len(bodies) or len(uids) != len(bodies):
        raise ValueError(f"start {start} outside {len(bodies)} bodies with {len(uids)} ids")
    parts: list[bytes] = []
    size = 0
    end = start
    while end < len(bodies):
        props = f"{head}{uids[end]}{tail}"
        body = bodies[end]
        if type(body) is not bytes:
            raise TypeError(f"batch body {end} is {type(body).__name__}, not bytes")
        item = ENTRY_FIXED + len(body) + 4 * len(props)
        if end > start and size + item > max_bytes:
            break
        encoded = props.encode()
        if len(encoded) > 32767:
            raise ProtocolError(f"properties of {len(encoded)} bytes exceed 32767")
        parts += (_ENTRY_HEAD.pack(ENTRY_FIXED + len(body) + len(encoded), 0, 0, 0, len(body)),
                  body, _PROPS_LENGTH.pack(len(encoded)), encoded)
        size += item
        end += 1
    return b"".join(parts), end
