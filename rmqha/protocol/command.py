"""RocketMQ remoting commands: :class:`RemotingCommand` and its codec (JSON and binary headers).

Wire format (all integers big-endian), byte-compatible with RocketMQ's ``RemotingCommand``::

    total_length:int32              = 4 + header_length + body_length
    serialize_type << 24 | header_length:int32
    header                          (serialize type 0: JSON, 1: RocketMQ's binary layout)
    body (opaque bytes; JSON in every protocol rmqha speaks)

The JSON header is ``{"code","language","version","opaque","flag","remark","extFields"}``,
encoded and decoded with orjson (compiled; the header codec is on every request's path,
and the stdlib ``json`` cost 10-20 us a frame where orjson costs 1-2).  The binary header
(``RocketMQSerializable``): code int16, language code int8, version int16, opaque int32,
flag int32, remark (int32 length + UTF-8, 0 = none), extFields (int32 length, then per
entry int16 key length + key, int32 value length + value).  A request is answered in the
serialize type it came in.

``flag`` bit 0 marks a response, bit 1 a one-way request.  Responses echo the request's
``opaque``; that is the only thing that matches them, so replies may come out of order.

This module owns the codec only (:func:`encode`, :func:`decode`, :class:`FrameDecoder`);
connections, servers and clients that carry the frames are in :mod:`rmqha.net`.  Every
length is checked against ``max_frame_bytes`` before anything is allocated.
"""
from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rmqha import _core
from rmqha._core._protocols import SendFrame as SendFrame
from rmqha.errors import ProtocolError, RemoteCommandError
from rmqha.protocol.codes import ResponseCode, code_name
from rmqha.protocol.version import ADVERTISED

#: RocketMQ's default ``com.rocketmq.remoting.frameMaxLength``.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
LANGUAGE = "PYTHON"  # a member of RocketMQ's LanguageCode enum
#: RocketMQ's LanguageCode enum: name <-> the byte the binary header carries.
LANGUAGE_CODES: dict[str, int] = {
    "JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5, "RUBY": 6,
    "OTHER": 7, "HTTP": 8, "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12, "NODE_JS": 13,
}
_LANGUAGE_NAMES = {code: name for name, code in LANGUAGE_CODES.items()}
#: RocketMQ ``MQVersion.Version`` ordinal sent in ``version`` (V5_1_4, see
#: :mod:`rmqha.protocol.version`); Java servers only use it to pick compatibility paths, none of
#: which matter for the codes we send.
VERSION = int(ADVERTISED)

_LEN = struct.Struct(">ii")
#: The fixed part of a binary header: code, language, version, opaque, flag.
_BIN_FIXED = struct.Struct(">hbhii")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_OPAQUE_MASK = 0x7FFFFFFF
_send_frames = _core.load("send_frames")
_send_codec = _core.load("send_codec")
#: ``match_send_answers(data, pending, deadlines, max_frame_bytes, limit) -> (pos, count)``:
#: the answers at the start of a read handed to the futures of the sends waiting for them,
#: in one compiled call (``rmqha._core.send_codec_py.match_answers``; a connection's
#: ``send_frame``).
match_send_answers = _send_codec.match_answers
_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """A process-wide request id in RocketMQ's range (a non-negative int32).  No lock:
    ``next()`` on an ``itertools.count`` is atomic under the GIL."""
    return next(_opaque_counter) & _OPAQUE_MASK


def ext_value(value: Any) -> str:
    """How a header field travels in ``extFields``: always a string (Java's rendering).
    Bytes are refused: ``str()`` would send their repr (``b'...'``), which the peer takes
    as the value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"a header field is {type(value).__name__}; decode it to str first")
    return str(value)


@dataclass
class RemotingCommand:
    """One frame: a request, a one-way request or a response."""

    code: int
    language: str = LANGUAGE
    version: int = VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: How the header travels: SERIALIZE_JSON or SERIALIZE_ROCKETMQ (binary).
    serialize_type: int = SERIALIZE_JSON

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, Any] | None = None,
        body: bytes | str | Any = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        """A new request with a fresh opaque; ``None`` header values are left out and
        a non-bytes body is encoded as JSON."""
        return cls(
            code=int(code),
            opaque=next_opaque(),
            flag=FLAG_ONEWAY if oneway else 0,
            ext_fields=_ext(ext_fields),
            body=_body(body),
        )

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext_fields: Mapping[str, Any] | None = None,
        body: bytes | str | Any = b"",
    ) -> RemotingCommand:
        """The response to this request (same opaque, response flag set, same serialize
        type)."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=_ext(ext_fields),
            body=_body(body),
            serialize_type=self.serialize_type,
        )

    def reply(self, code: int, remark: str | None, ext_fields: dict[str, str]) -> RemotingCommand:
        """:meth:`response` with header fields that are all strings already (taken as they
        are, not copied) and no body: the answer every send gets."""
        return RemotingCommand(code, LANGUAGE, VERSION, self.opaque, FLAG_RESPONSE, remark,
                               ext_fields, b"", self.serialize_type)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def json_body(self) -> Any:
        """The body decoded as JSON (``None`` when empty); ProtocolError if it is not JSON."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProtocolError(f"body of code {self.code} is not JSON: {exc}") from exc

    def check_success(self, request_code: int | None = None) -> RemotingCommand:
        """Return self if it is SUCCESS, else raise RemoteCommandError with code and remark."""
        if self.code != ResponseCode.SUCCESS:
            raise RemoteCommandError(self.code, self.remark, request_code)
        return self

    def describe(self) -> str:
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        return f"{kind} {code_name(self.code, response=self.is_response)} opaque={self.opaque}"


def _ext(fields: Mapping[str, Any] | None) -> dict[str, str]:
    if not fields:
        return {}
    # Most callers pass strings already: convert only what is not one.
    return {k if type(k) is str else str(k): v if type(v) is str else ext_value(v)
            for k, v in fields.items() if v is not None}


def _body(body: bytes | str | Any) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    if body is None:
        return b""
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


# --- codec -------------------------------------------------------------------------------


def encode(cmd: RemotingCommand) -> bytes:
    """The full frame of a command, ready for the socket."""
    if cmd.serialize_type == SERIALIZE_ROCKETMQ:
        header_bytes = encode_binary_header(cmd)
    else:
        header: dict[str, Any] = {
            "code": int(cmd.code),
            "language": cmd.language,
            "version": int(cmd.version),
            "opaque": int(cmd.opaque),
            "flag": int(cmd.flag),
            # RocketMQ's C++ client dereferences extFields in some replies: always an object.
            "extFields": cmd.ext_fields,
        }
        if cmd.remark is not None:
            header["remark"] = cmd.remark
        try:
            header_bytes = orjson.dumps(header)
        except TypeError as exc:  # a non-str in extFields, a lone surrogate in a remark
            raise ProtocolError(f"cannot encode the header of {cmd.describe()}: {exc}") from exc
    body = cmd.body
    return b"".join(
        (_LEN.pack(4 + len(header_bytes) + len(body),
                   (cmd.serialize_type << 24) | len(header_bytes)),
         header_bytes, body)
    )


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    """RocketMQ's binary header (serialize type 1) of a command."""
    parts = [_BIN_FIXED.pack(int(cmd.code), LANGUAGE_CODES.get(cmd.language, LANGUAGE_CODES["OTHER"]),
                             int(cmd.version), int(cmd.opaque), int(cmd.flag))]
    if cmd.remark:
        remark = cmd.remark.encode("utf-8")
        parts += (_I32.pack(len(remark)), remark)
    else:
        parts.append(_I32.pack(0))
    ext: list[bytes] = []
    for k, v in cmd.ext_fields.items():
        kb, vb = k.encode("utf-8"), v.encode("utf-8")
        if len(kb) > 0x7FFF:
            raise ProtocolError(f"extFields key of {len(kb)} bytes does not fit the binary header")
        ext += (_I16.pack(len(kb)), kb, _I32.pack(len(vb)), vb)
    ext_bytes = b"".join(ext)
    parts += (_I32.pack(len(ext_bytes)), ext_bytes)
    return b"".join(parts)


def _decode_header(raw: bytes | memoryview) -> dict[str, Any]:
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError("header JSON is not an object")
    return header


def _decode_binary_header(raw: bytes) -> RemotingCommand:
    """A command (without body) from RocketMQ's binary header; ProtocolError naming what
    does not fit."""
    n = len(raw)
    if n < _BIN_FIXED.size + 8:
        raise ProtocolError(f"binary header of {n} bytes is shorter than its fixed part")
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(raw, 0)
    pos = _BIN_FIXED.size

    def take(width: struct.Struct, what: str) -> str | None:
        nonlocal pos
        if pos + width.size > n:
            raise ProtocolError(f"binary header ends inside the length of {what}")
        (length,) = width.unpack_from(raw, pos)
        pos += width.size
        if length < 0 or pos + length > n:
            raise ProtocolError(f"{what} of {length} bytes exceeds the binary header "
                                f"({n - pos} bytes left)")
        if length == 0:
            return None  # Java reads an empty string back as null
        try:
            text = raw[pos : pos + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} is not UTF-8: {exc}") from exc
        pos += length
        return text

    remark = take(_I32, "remark")
    if pos + 4 > n:
        raise ProtocolError("binary header ends before the extFields length")
    (ext_length,) = _I32.unpack_from(raw, pos)
    pos += 4
    if ext_length < 0 or ext_length > n - pos:
        raise ProtocolError(f"extFields of {ext_length} bytes exceed the binary header "
                            f"({n - pos} bytes left)")
    end = pos + ext_length
    ext: dict[str, str] = {}
    while pos < end:
        key = take(_I16, "an extFields key")
        value = take(_I32, f"the extFields value of {key!r}")
        if pos > end:
            raise ProtocolError("an extFields entry runs past the extFields length")
        if key is not None and value is not None:
            ext[key] = value
    return RemotingCommand(code=code, language=_LANGUAGE_NAMES.get(language, "OTHER"),
                           version=version, opaque=opaque, flag=flag, remark=remark,
                           ext_fields=ext, serialize_type=SERIALIZE_ROCKETMQ)


def _int_field(header: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = header.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None and default is not None:
            return default
        raise ProtocolError(f"header field {name!r} must be an integer, got {value!r}")
    return value


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """Decode one frame *without* its leading total_length field."""
    return _decode(frame, None)


def _decode(frame: bytes | memoryview, body: bytes | None) -> RemotingCommand:
    """:func:`decode_frame`; with ``body`` the frame's body is that (made already, from
    parts of several reads) and ``frame`` needs to hold only the frame's header."""
    if len(frame) < 4:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than its header length")
    (ori,) = _I32.unpack_from(frame, 0)
    serialize_type = (ori >> 24) & 0xFF
    header_length = ori & 0xFFFFFF
    if header_length > len(frame) - 4:
        raise ProtocolError(
            f"header length {header_length} exceeds the frame ({len(frame) - 4} bytes left)"
        )
    raw = frame[4 : 4 + header_length]
    if body is None:
        body = bytes(frame[4 + header_length :])
    if serialize_type == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(bytes(raw))
        cmd.body = body
        return cmd
    if serialize_type != SERIALIZE_JSON:
        raise ProtocolError(
            f"serialize type {serialize_type} not supported (JSON=0, ROCKETMQ=1)")
    header = _decode_header(raw)
    ext = header.get("extFields") or {}
    if not isinstance(ext, dict):
        raise ProtocolError("header field 'extFields' must be an object")
    for v in ext.values():
        if type(v) is not str:
            # C++ clients send some header values as JSON numbers; keep them as strings
            # like Java.
            ext = {str(k): ext_value(v) for k, v in ext.items() if v is not None}
            break
    remark = header.get("remark")
    language = header.get("language", "")
    code = header.get("code")
    version = header.get("version", 0)
    opaque = header.get("opaque", 0)
    flag = header.get("flag", 0)
    if not (type(code) is int and type(version) is int and type(opaque) is int
            and type(flag) is int):
        code = _int_field(header, "code")
        version = _int_field(header, "version", 0)
        opaque = _int_field(header, "opaque", 0)
        flag = _int_field(header, "flag", 0)
    return RemotingCommand(  # positional: every frame makes one
        code, language if type(language) is str else str(language), version, opaque, flag,
        None if remark is None else str(remark), ext, body)


def decode(data: bytes | memoryview) -> RemotingCommand:
    """Decode exactly one complete frame (with its total_length)."""
    if len(data) < 4:
        raise ProtocolError("frame shorter than its length field")
    (total,) = struct.unpack_from(">i", data, 0)
    if total != len(data) - 4:
        raise ProtocolError(f"total length {total} does not match {len(data) - 4} bytes")
    return decode_frame(memoryview(data)[4:])


class FrameDecoder:
    """Incremental decoder: feed arbitrary chunks, get whole commands.

    A length below 4 or above ``max_frame_bytes`` raises ProtocolError before anything is
    buffered for that frame; after an error the decoder must be discarded.

    Each frame's bytes are copied once, into its body: a frame whole in one read is read
    through a view of that read; one spanning reads is held as views of them until it
    is complete, then its body is joined from them (a consumer's pull answers span
    reads; copying them into a buffer first was a sixth of its CPU).

    With ``plain_sends`` (a broker's client port) a read is split in one compiled call
    (:mod:`rmqha._core.send_frames`): a plain send comes out as its parsed
    :data:`~rmqha._core._protocols.SendFrame` tuple instead of a command (``plain_sends``
    is what its properties must not contain), every other frame as a command, in order.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 plain_sends: tuple[bytes, ...] | None = None, *, signed: bool = False) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()  # feed_sends' buffer
        self._plain_sends = plain_sends
        #: The first bytes of a length field a read ended inside.
        self._stub = b""
        #: Views of the frame begun in earlier reads (without its length), the bytes it
        #: still needs (0: none begun) and the bytes of it held (its length's included).
        self._parts: list[memoryview] = []
        self._need = 0
        self._held = 0
        #: Opaques of requests whose response frames come back undecoded, as
        #: :class:`RawAnswer` (a connection's ``request_frame``; empty: none).
        self.raw_answers: Container[int] = ()
        #: Plain sends carry their ACL signing material (``send_frames`` ``signed``).
        self._signed = signed

    def feed_sends(self, data: bytes) -> list[RemotingCommand | SendFrame]:
        """:meth:`feed` with the plain sends parsed (see above); :meth:`feed` without
        ``plain_sends``."""
        if self._plain_sends is None:
            return list(self.feed(data))
        buf = self._buf
        buf += data
        items, pos = _send_frames.scan(buf, self.max_frame_bytes, decode_frame,
                                       self._plain_sends or (), self._signed)
        if pos:
            del buf[:pos]
        return items

    @property
    def buffered(self) -> int:
        return len(self._buf) + len(self._stub) + self._held

    def feed(self, data: bytes) -> list[RemotingCommand]:
        return self._split(data, ())  # type: ignore[return-value]  # no RawAnswer without raw

    def feed_answers(self, data: bytes) -> list[RemotingCommand | RawAnswer]:
        """:meth:`feed`, with the responses to :attr:`raw_answers` as :class:`RawAnswer`."""
        return self._split(data, self.raw_answers)

    def _split(self, data: bytes, raw: Container[int]) -> list[RemotingCommand | RawAnswer]:
        if type(data) is not bytes:
            data = bytes(data)  # views of it are kept: it must not change
        elif not (self._stub or self._need) and len(data) >= 8:
            (total,) = _I32.unpack_from(data, 0)
            if total == len(data) - 4 and 4 <= total <= self.max_frame_bytes:
                frame = memoryview(data)[4:]  # nearly always: one frame, whole, in one read
                if not raw:
                    return [_decode(frame, None)]
                opaque = _raw_opaque(frame, raw)
                return [_decode(frame, None) if opaque is None else RawAnswer(opaque, data[4:])]
        out: list[RemotingCommand | RawAnswer] = []
        pos = self._carry_on(data, out, raw) if self._stub or self._need else 0
        n = len(data)
        if n - pos < 4:
            if pos < n:
                self._stub = data[pos:]
            return out
        view = memoryview(data)
        while n - pos >= 4:
            (total,) = _I32.unpack_from(data, pos)
            self._check_length(total)
            if n - pos - 4 < total:
                self._begin(view[pos + 4 :], total)
                return out
            frame = view[pos + 4 : pos + 4 + total]
            out.append(_read(frame, raw) if raw else _decode(frame, None))
            pos += 4 + total
        if pos < n:
            self._stub = data[pos:]
        return out

    def _check_length(self, total: int) -> None:
        if total < 4 or total > self.max_frame_bytes:
            raise ProtocolError(f"frame length {total} outside [4, {self.max_frame_bytes}]")

    def _begin(self, part: memoryview, total: int) -> None:
        self._parts = [part]
        self._held = 4 + len(part)
        self._need = total - len(part)

    def _carry_on(self, data: bytes, out: list[RemotingCommand | RawAnswer],
                  raw: Container[int]) -> int:
        """Carry the length or frame begun in earlier reads on with ``data``: where in
        ``data`` the next frame starts (``len(data)`` when it holds no more)."""
        pos = 0
        if self._stub:
            pos = 4 - len(self._stub)
            if len(data) < pos:
                self._stub += data
                return len(data)
            (total,) = _I32.unpack(self._stub + data[:pos])
            self._stub = b""
            self._check_length(total)
            self._parts, self._need, self._held = [], total, 4
        need, avail = self._need, len(data) - pos
        if avail < need:
            if avail:
                self._parts.append(memoryview(data)[pos:])
                self._held += avail
                self._need -= avail
            return len(data)
        parts = self._parts
        parts.append(memoryview(data)[pos : pos + need])
        self._parts, self._need, self._held = [], 0, 0
        out.append(_joined(parts, raw))
        return pos + need


class RawAnswer:
    """A response frame (without its length field) handed back undecoded, for the request
    with its opaque (see :attr:`FrameDecoder.raw_answers`)."""

    __slots__ = ("opaque", "frame")

    def __init__(self, opaque: int, frame: bytes) -> None:
        self.opaque = opaque
        self.frame = frame


def read_frame(frame: memoryview, raw: Container[int]) -> RemotingCommand | RawAnswer:
    """One frame (without its length field): a :class:`RawAnswer` if it is the response
    to one of the ``raw`` opaques, else decoded."""
    return _read(frame, raw) if raw else _decode(frame, None)


def _read(frame: memoryview | bytes, raw: Container[int]) -> RemotingCommand | RawAnswer:
    opaque = _raw_opaque(frame, raw)
    if opaque is None:
        return _decode(frame, None)
    return RawAnswer(opaque, frame if type(frame) is bytes else bytes(frame))


def _raw_opaque(head: memoryview | bytes, raw: Container[int]) -> int | None:
    """The opaque of a response frame (``head`` holds its header at least) if it is one of
    ``raw``; None otherwise.  The send codec reads a JSON header in one compiled call;
    what it does not read is decoded as a command (and a frame that is not one raises
    ProtocolError there, as it would have)."""
    try:
        answer = _send_codec.decode_send_answer(head)
    except ProtocolError:
        answer = None
    if answer is not None:
        flag, opaque = answer.flag, answer.opaque
    else:
        cmd = _decode(head, b"")
        flag, opaque = cmd.flag, cmd.opaque
    return opaque if flag & FLAG_RESPONSE and opaque in raw else None


def _joined(parts: list[memoryview], raw: Container[int]) -> RemotingCommand | RawAnswer:
    """The command of a frame held as parts: its body joined from them (its one copy)
    when the first part holds its whole header, the frame joined otherwise; the frame
    joined if it is a raw answer."""
    first = parts[0]
    if len(first) >= 4:
        (ori,) = _I32.unpack_from(first, 0)
        start = 4 + (ori & 0xFFFFFF)
        if start <= len(first):
            opaque = _raw_opaque(first, raw) if raw else None
            if opaque is not None:
                return RawAnswer(opaque, b"".join(parts))
            return _decode(first, b"".join([first[start:], *parts[1:]]))
    whole = b"".join(parts)
    return _read(whole, raw) if raw else _decode(whole, None)


def command_of(send: SendFrame) -> RemotingCommand:
    """The command a plain send's frame decodes to (its head and body are the frame)."""
    return decode_frame(send[11] + send[10])


def not_supported(cmd: RemotingCommand) -> RemotingCommand:
    """RocketMQ's answer to an unknown request code (the connection stays open)."""
    return cmd.response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
    )
