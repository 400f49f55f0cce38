"""Pure twin of the broker's plain-send frames: recognise them in a read, answer them.

Same API, results and bytes as the compiled ``rmqha._core.send_frames``.

:func:`scan` splits a buffer of remoting frames (``total_length:int32`` then the frame, see
:mod:`rmqha.protocol.command`) in one call.  A frame that is a *plain send* comes back as a
:data:`SendFrame` tuple, parsed straight from its bytes (no command object, no header
dict); every other frame is handed to ``decode_other(frame)`` (the ordinary codec, which
raises for a malformed one) and its result is put in its place, so the list keeps the
frames' order.

A plain send (:func:`parse_send`) is a two-way request (flag has neither the response nor
the one-way bit) of code SEND_MESSAGE (10, V1 field names), SEND_MESSAGE_V2 (310, letters)
or SEND_BATCH_MESSAGE (320, letters) with:

- a header in JSON (serialize type 0) or RocketMQ's binary layout (type 1); the JSON one an
  object of the keys ``code``, ``language``, ``version``, ``opaque``, ``flag``,
  ``remark`` (null or empty), ``serializeTypeCurrentRPC`` and ``extFields`` (an object of
  string or integer values, after ``code``), each at most once, integers without fraction or exponent of at
  most 18 digits, strings strict UTF-8 without lone surrogates; the binary one without a
  remark;
- a topic, integer fields that are empty or ``-?[0-9]{1,18}``, no transaction bits in
  sysFlag (``0xC``), each known field at most once (unknown ones are ignored, as the
  header parse ignores them);
- for 10 and 310 the batch field absent, empty, ``false`` or ``0`` (no batch); for 320
  (a batch whatever it says) one of those or ``true``, ``1``, and no compression bit in
  sysFlag (``0x1``: the body would need inflating first);
- properties containing none of ``refuse`` (the caller's: what asks for a delay or marks a
  committed transaction);
- an opaque that fits an int32.

Anything else (a batch, a transaction, a delay, a header that would need the ordinary
parser's judgement) is not plain: the broker's Python path takes it, with its own checks
and answers.  Being conservative is the point: a frame this module takes must mean exactly
what the ordinary parse would have made of it.

:data:`SendFrame` = ``(code, opaque, serialize_type, topic, queue_id, sys_flag,
born_timestamp, flag, properties, reconsume_times, body, head)``: ``queue_id`` is -1 when
absent or empty (the other integers 0), ``properties`` the UTF-8 bytes of the properties
string, ``head`` the frame's first bytes up to its body (``serialize_type << 24 |
header_length`` and the header), so that ``head + body`` is the frame again for the
ordinary decoder when a check refuses the send.

With ``signed`` (a broker checking RocketMQ ACL 1.0 signatures) the last three are
``access_key`` (the ``AccessKey`` field, str), ``signature`` (the ``Signature`` field's
UTF-8 bytes) and ``signed``: the bytes RocketMQ's server signs before the body (which
follows them in the signed content and is hashed where it is, never copied behind them),
what :func:`rmqha.security.signature.signed_fields` makes of the decoded command (the
values of every extFields entry but ``Signature`` in the keys' order, and
``_UNIQUE_KEY_QUERY`` left out for a frame of version <= 400).  Each is None when the field is
absent (``signed`` when either is) or when the header is unusual for signing: a key not
ASCII, a JSON key with an escape, a key given twice, more than :data:`MAX_SIGNED_FIELDS`
entries.  Without ``signed`` all three are None.

:func:`encode_send_ok` writes a send's SUCCESS answer frame, byte for byte what the codec
makes of ``RemotingCommand.reply(SUCCESS, None, {msgId, queueId, queueOffset, putStatus,
commitLogOffset})`` stamped for the request (language PYTHON, response flag).
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from rmqha.errors import ProtocolError

SEND_MESSAGE = 10
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
#: sysFlag's compression bit.
COMPRESSED = 0x1
#: sysFlag's transaction type bits (prepared 0x4, commit 0x8, rollback 0xC).
TRANSACTION_BITS = 0xC
#: The answer's language: rmqha's (``PYTHON``, code 3 in RocketMQ's LanguageCode).
LANGUAGE = "PYTHON"
LANGUAGE_CODE = 3

SendFrame = tuple[int, int, int, str, int, int, int, int, bytes, int, bytes, bytes,
                  str | None, bytes | None, bytes | None]

#: The extFields entries a header may have and still be signed on the lane.
MAX_SIGNED_FIELDS = 64
ACCESS_KEY = b"AccessKey"
SIGNATURE = b"Signature"
UNIQUE_KEY_QUERY = b"_UNIQUE_KEY_QUERY"
#: Frames of a version up to this (V4_9_3) are signed without ``_UNIQUE_KEY_QUERY``.
V4_9_3 = 400
_UNSIGNED = (None, None, None)

#: Field number of each known extFields key, per code: topic, queue id, sys flag, born
#: timestamp, flag, properties, reconsume times, batch, max reconsume times, producer group.
F_TOPIC, F_QUEUE, F_SYSFLAG, F_BORN, F_FLAG, F_PROPS, F_RECONSUME, F_BATCH, F_MAXRT, F_GROUP = (
    range(10))
V1_FIELDS = {b"topic": F_TOPIC, b"queueId": F_QUEUE, b"sysFlag": F_SYSFLAG,
             b"bornTimestamp": F_BORN, b"flag": F_FLAG, b"properties": F_PROPS,
             b"reconsumeTimes": F_RECONSUME, b"batch": F_BATCH,
             b"maxReconsumeTimes": F_MAXRT, b"producerGroup": F_GROUP}
V2_FIELDS = {b"b": F_TOPIC, b"e": F_QUEUE, b"f": F_SYSFLAG, b"g": F_BORN, b"h": F_FLAG,
             b"i": F_PROPS, b"j": F_RECONSUME, b"m": F_BATCH, b"l": F_MAXRT, b"a": F_GROUP}
#: Top-level JSON header keys: code, language, version, opaque, flag, remark, extFields,
#: serializeTypeCurrentRPC.
_TOP = {b"code": 0, b"language": 1, b"version": 2, b"opaque": 3, b"flag": 4, b"remark": 5,
        b"extFields": 6, b"serializeTypeCurrentRPC": 7}
_WS = b" \t\n\r"
_ESC = {0x22: b'"', 0x5C: b"\\", 0x2F: b"/", 0x62: b"\b", 0x66: b"\f", 0x6E: b"\n",
        0x72: b"\r", 0x74: b"\t"}
_MAX_DIGITS = 18
_BIN_FIXED = struct.Struct(">hbhii")


class _NotPlain(Exception):
    """The frame is not a plain send (internal: parse_send answers None)."""


def scan(buf: bytes | bytearray | memoryview, max_frame_bytes: int,
         decode_other: Callable[[memoryview], Any],
         refuse: tuple[bytes, ...], signed: bool = False) -> tuple[list[Any], int]:
    """The whole frames at the start of ``buf``: (items in order, bytes they took).

    A length below 4 or above ``max_frame_bytes`` raises ProtocolError (the codec's
    message); what ``decode_other`` raises propagates."""
    items: list[Any] = []
    pos = 0
    n = len(buf)
    with memoryview(buf) as view:
        while n - pos >= 4:
            total = int.from_bytes(view[pos:pos + 4], "big", signed=True)
            if total < 4 or total > max_frame_bytes:
                raise ProtocolError(f"frame length {total} outside [4, {max_frame_bytes}]")
            if n - pos - 4 < total:
                break
            frame = view[pos + 4:pos + 4 + total]
            item = parse_send(frame, refuse, signed)
            items.append(decode_other(frame) if item is None else item)
            frame.release()
            pos += 4 + total
    return items, pos


def parse_send(frame: bytes | bytearray | memoryview,
               refuse: tuple[bytes, ...], signed: bool = False) -> SendFrame | None:
    """The plain send in one frame (without its total length), or None."""
    raw = bytes(frame)
    try:
        return _parse(raw, refuse, signed)
    except _NotPlain:
        return None


def _parse(raw: bytes, refuse: tuple[bytes, ...], signed: bool) -> SendFrame:
    if len(raw) < 4:
        raise _NotPlain
    ori = int.from_bytes(raw[:4], "big")
    st, hlen = ori >> 24, ori & 0xFFFFFF
    if hlen > len(raw) - 4:
        raise _NotPlain
    header = raw[4:4 + hlen]
    if st == 0:
        code, opaque, flag, version, ext, usual = _json_header(header)
    elif st == 1:
        code, opaque, flag, version, ext, usual = _binary_header(header)
    else:
        raise _NotPlain
    if flag & 0x3 or not -(1 << 31) <= opaque < (1 << 31):
        raise _NotPlain
    fields = _fields(code, ext)
    topic = fields[F_TOPIC]
    if topic is None or not topic:
        raise _NotPlain
    batch = fields[F_BATCH]
    if batch not in (None, b"", b"false", b"0") and (
            code != SEND_BATCH_MESSAGE or batch not in (b"true", b"1")):
        raise _NotPlain
    maxrt = fields[F_MAXRT]
    if maxrt:
        _int_of(maxrt, 0)
    sys_flag = _int_of(fields[F_SYSFLAG], 0)
    if sys_flag & TRANSACTION_BITS or (code == SEND_BATCH_MESSAGE and sys_flag & COMPRESSED):
        raise _NotPlain
    props = fields[F_PROPS] or b""
    for bad in refuse:
        if bad in props:
            raise _NotPlain
    body = raw[4 + hlen:]
    signing = _signing(ext, version) if signed and usual else _UNSIGNED
    return (code, opaque, st, topic.decode(), _int_of(fields[F_QUEUE], -1), sys_flag,
            _int_of(fields[F_BORN], 0), _int_of(fields[F_FLAG], 0), props,
            _int_of(fields[F_RECONSUME], 0), body, raw[:4 + hlen], *signing)


def _signing(ext: list[tuple[bytes, bytes]],
             version: int) -> tuple[str | None, bytes | None, bytes | None]:
    """(access key, signature, signed fields) of a header whose keys are all usual."""
    if len(ext) > MAX_SIGNED_FIELDS:
        return _UNSIGNED
    values = dict(ext)
    if len(values) != len(ext):
        return _UNSIGNED  # a key given twice
    # ASCII keys: byte order is Java's String order.
    left_out = (SIGNATURE, UNIQUE_KEY_QUERY) if version <= V4_9_3 else (SIGNATURE,)
    access_key, signature = values.get(ACCESS_KEY), values.get(SIGNATURE)
    content = None
    if access_key is not None and signature is not None:
        content = b"".join([values[k] for k in sorted(values) if k not in left_out])
    return (None if access_key is None else access_key.decode()), signature, content


def _fields(code: int, ext: list[tuple[bytes, bytes]]) -> list[bytes | None]:
    """The known fields' values (UTF-8 bytes) by field number; a repeated one is not plain."""
    if code == SEND_MESSAGE:
        names = V1_FIELDS
    elif code in (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE):
        names = V2_FIELDS
    else:
        raise _NotPlain
    out: list[bytes | None] = [None] * 10
    for key, value in ext:
        f = names.get(key)
        if f is None:
            continue
        if out[f] is not None:
            raise _NotPlain
        out[f] = value
    return out


def _int_of(value: bytes | None, default: int) -> int:
    """An integer field: empty or absent is ``default``, else ``-?[0-9]{1,18}``."""
    if not value:
        return default
    digits = value[1:] if value[:1] == b"-" else value
    if not digits or len(digits) > _MAX_DIGITS or not digits.isdigit():
        raise _NotPlain
    return int(value)


# --- the binary header --------------------------------------------------------------------


def _binary_header(h: bytes) -> tuple[int, int, int, int, list[tuple[bytes, bytes]], bool]:
    """Code, opaque, flag, version, the extFields entries and whether their keys are all
    ASCII."""
    n = len(h)
    if n < _BIN_FIXED.size + 8:
        raise _NotPlain
    code, _language, version, opaque, flag = _BIN_FIXED.unpack_from(h, 0)
    pos = _BIN_FIXED.size
    if int.from_bytes(h[pos:pos + 4], "big", signed=True) != 0:
        raise _NotPlain  # a remark: no send carries one
    pos += 4
    ext_len = int.from_bytes(h[pos:pos + 4], "big", signed=True)
    pos += 4
    if ext_len < 0 or ext_len > n - pos:
        raise _NotPlain
    end = pos + ext_len
    ext = []
    while pos < end:
        key, pos = _bin_item(h, pos, 2)
        value, pos = _bin_item(h, pos, 4)
        if pos > end:
            raise _NotPlain
        if key and value:  # an empty key or value reads back as null: no entry
            ext.append((key, value))
    return code, opaque, flag, version, ext, all(k.isascii() for k, _ in ext)


def _bin_item(h: bytes, pos: int, width: int) -> tuple[bytes, int]:
    n = len(h)
    if pos + width > n:
        raise _NotPlain
    length = int.from_bytes(h[pos:pos + width], "big", signed=True)
    pos += width
    if length < 0 or pos + length > n:
        raise _NotPlain
    item = h[pos:pos + length]
    _utf8(item)
    return item, pos + length


def _utf8(b: bytes) -> None:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        raise _NotPlain from None


# --- the JSON header ----------------------------------------------------------------------


def _json_header(h: bytes) -> tuple[int, int, int, int, list[tuple[bytes, bytes]], bool]:
    """Code, opaque, flag, version, the extFields entries and whether their keys are all
    ASCII without escapes."""
    vals: dict[int, Any] = {}
    ext: list[tuple[bytes, bytes]] = []
    usual = [True]
    p = _object_start(h, 0)
    while True:
        p, key = _key(h, p)
        k = _TOP.get(key)
        if k is None or k in vals:
            raise _NotPlain
        if k in (0, 2, 3, 4):
            p, vals[k] = _json_int(h, p)
        elif k == 5:
            if h[p:p + 2] == b'""':
                p += 2  # the C++ client's empty remark (a request's remark is never read)
            elif h[p:p + 4] == b"null":
                p += 4
            else:
                raise _NotPlain
            vals[k] = None
        elif k == 6:
            if 0 not in vals:
                raise _NotPlain  # extFields before the code: which names it uses is unknown
            p = _ext_object(h, p, ext, usual)
            vals[k] = True
        else:
            p, vals[k] = _json_str(h, p)
        p, more = _after_value(h, p)
        if not more:
            break
    if _skip(h, p) != len(h) or 0 not in vals:
        raise _NotPlain
    return vals[0], vals.get(3, 0), vals.get(4, 0), vals.get(2, 0), ext, usual[0]


def _skip(h: bytes, p: int) -> int:
    while p < len(h) and h[p] in _WS:
        p += 1
    return p


def _object_start(h: bytes, p: int) -> int:
    """Past ``{`` and to the first key's quote; an empty object is not plain."""
    p = _skip(h, p)
    if h[p:p + 1] != b"{":
        raise _NotPlain
    return _skip(h, p + 1)


def _key(h: bytes, p: int) -> tuple[int, bytes]:
    p, key = _json_str(h, p)
    p = _skip(h, p)
    if h[p:p + 1] != b":":
        raise _NotPlain
    return _skip(h, p + 1), key


def _after_value(h: bytes, p: int) -> tuple[int, bool]:
    """Past a value's ``,`` (True, at the next key) or ``}`` (False)."""
    p = _skip(h, p)
    c = h[p:p + 1]
    if c == b",":
        return _skip(h, p + 1), True
    if c == b"}":
        return p + 1, False
    raise _NotPlain


def _ext_object(h: bytes, p: int, ext: list[tuple[bytes, bytes]], usual: list[bool]) -> int:
    """Past the extFields object, its entries in ``ext``; ``usual[0]`` False when a key is
    not ASCII or has an escape."""
    p = _object_start(h, p)
    while True:
        start = p
        p, key = _key(h, p)
        if usual[0] and (b"\\" in h[start:p] or not key.isascii()):
            usual[0] = False
        if h[p:p + 1] == b'"':
            p, value = _json_str(h, p)
        else:
            start = p
            p, _ = _json_int(h, p)
            value = h[start:p]
        ext.append((key, value))
        p, more = _after_value(h, p)
        if not more:
            return p


def _json_int(h: bytes, p: int) -> tuple[int, int]:
    """A JSON integer (no fraction, no exponent, at most 18 digits)."""
    start = p
    if h[p:p + 1] == b"-":
        p += 1
    d = p
    while p < len(h) and 0x30 <= h[p] <= 0x39:
        p += 1
    if p == d or p - d > _MAX_DIGITS or (h[d] == 0x30 and (p - d > 1 or d > start)):
        raise _NotPlain  # no digits, too many, a leading zero, or -0 (read back as "0")
    if p < len(h) and h[p] in b".eE":
        raise _NotPlain
    return p, int(h[start:p])


def _json_str(h: bytes, p: int) -> tuple[int, bytes]:
    """A JSON string's UTF-8 bytes; control characters, lone or paired surrogate escapes
    and invalid UTF-8 are not plain."""
    if h[p:p + 1] != b'"':
        raise _NotPlain
    p += 1
    out = bytearray()
    n = len(h)
    while True:
        if p >= n:
            raise _NotPlain
        c = h[p]
        if c == 0x22:
            break
        if c < 0x20:
            raise _NotPlain
        if c != 0x5C:
            out.append(c)
            p += 1
            continue
        if p + 1 >= n:
            raise _NotPlain
        e = h[p + 1]
        if e == 0x75:
            hexa = h[p + 2:p + 6]
            if len(hexa) != 4 or any(x not in b"0123456789abcdefABCDEF" for x in hexa):
                raise _NotPlain
            cp = int(hexa, 16)
            if 0xD800 <= cp <= 0xDFFF:
                raise _NotPlain
            out += chr(cp).encode()
            p += 6
        elif e in _ESC:
            out += _ESC[e]
            p += 2
        else:
            raise _NotPlain
    value = bytes(out)
    _utf8(value)
    return p + 1, value


# --- the answer ---------------------------------------------------------------------------


def encode_send_ok(serialize_type: int, opaque: int, version: int, msg_id: str, queue_id: int,
                   queue_offset: int, status: str, commit_offset: int) -> bytes:
    """The SUCCESS answer frame of a send (see the module docstring); ``msg_id``,
    ``status`` ASCII."""
    fields = ((b"msgId", msg_id.encode("ascii")), (b"queueId", b"%d" % queue_id),
              (b"queueOffset", b"%d" % queue_offset), (b"putStatus", status.encode("ascii")),
              (b"commitLogOffset", b"%d" % commit_offset))
    if serialize_type == 1:
        ext = b"".join(len(k).to_bytes(2, "big") + k + len(v).to_bytes(4, "big") + v
                       for k, v in fields)
        header = (_BIN_FIXED.pack(0, LANGUAGE_CODE, version, opaque, 1) + b"\0\0\0\0"
                  + len(ext).to_bytes(4, "big") + ext)
    elif serialize_type == 0:
        ext = b",".join(b'"%s":"%s"' % (k, v) for k, v in fields)
        header = (b'{"code":0,"language":"%s","version":%d,"opaque":%d,"flag":1,'
                  b'"extFields":{%s}}' % (LANGUAGE.encode(), version, opaque, ext))
    else:
        raise ProtocolError(f"serialize type {serialize_type} not supported (JSON=0, ROCKETMQ=1)")
    return (len(header) + 4).to_bytes(4, "big") + (
        (serialize_type << 24) | len(header)).to_bytes(4, "big") + header


def encode_send_oks(sends: list[SendFrame], start: int, stop: int, version: int,
                    msg_id_prefix: str, queue_ids: Sequence[int], queue_offsets: Sequence[int],
                    offsets: Sequence[int], status: str) -> bytes:
    """The SUCCESS answers of ``sends[start:stop]`` as one bytes: :func:`encode_send_ok`
    of each send i (its serialize type and opaque) with message id ``msg_id_prefix`` +
    ``offsets[i]`` as 16 hex digits, ``queue_ids[i]``, ``queue_offsets[i]``, ``status``
    and commit offset ``offsets[i]`` (arrays: array('i'), array('q'), array('q'))."""
    if len(msg_id_prefix) > 64 or len(status) > 64:
        raise ProtocolError("a message id prefix or put status of over 64 bytes")
    if start < 0 or start > stop or stop > len(sends):
        raise ProtocolError(f"answers {start}..{stop} outside {len(sends)} sends")
    if min(len(queue_ids), len(queue_offsets), len(offsets)) < stop:
        raise ProtocolError(f"queue ids, queue offsets and offsets must hold {stop} values")
    return b"".join([
        encode_send_ok(sends[i][2], sends[i][1], version, f"{msg_id_prefix}{offsets[i]:016X}",
                       queue_ids[i], queue_offsets[i], status, offsets[i])
        for i in range(start, stop)])
