"""RocketMQ remoting frames: the RPC codec, an asyncio server and client, a blocking client.

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

This module owns the codec (:func:`encode`, :class:`FrameDecoder`), the per-connection
machinery (:class:`Connection`: frames decoded as they arrive, dispatch, request/response matching in both
directions), :class:`RemotingServer`, :class:`RemotingClient` and
:class:`BlockingRemotingClient`.  Every length from the network is checked against the
connection's ``max_frame_bytes`` before anything is allocated; a malformed frame closes
that one connection with a logged reason.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from typing import Any, Union

import orjson

from rmqha import event_loop
from rmqha.codes import ResponseCode, code_name
from rmqha.errors import (
    ProtocolError,
    RemoteCommandError,
    RemotingError,
    RemotingTimeoutError,
    RmqhaError,
)
from rmqha.mq_version import ADVERTISED

log = logging.getLogger(__name__)

#: RocketMQ's default ``com.rocketmq.remoting.frameMaxLength``.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: A server drops a peer that sends part of a frame and then nothing for this long (a
#: stalled or malicious client must not hold a connection and its buffer forever).
DEFAULT_FRAME_READ_TIMEOUT_S = 30.0

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
#: :mod:`rmqha.mq_version`); Java servers only use it to pick compatibility paths, none of
#: which matter for the codes we send.
VERSION = int(ADVERTISED)

_LEN = struct.Struct(">ii")
#: The fixed part of a binary header: code, language, version, opaque, flag.
_BIN_FIXED = struct.Struct(">hbhii")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_OPAQUE_MASK = 0x7FFFFFFF
_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """A process-wide request id in RocketMQ's range (a non-negative int32).  No lock:
    ``next()`` on an ``itertools.count`` is atomic under the GIL."""
    return next(_opaque_counter) & _OPAQUE_MASK


def ext_value(value: Any) -> str:
    """How a header field travels in ``extFields``: always a string (Java's rendering)."""
    if isinstance(value, bool):
        return "true" if value else "false"
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
    if serialize_type == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(bytes(raw))
        cmd.body = bytes(frame[4 + header_length :])
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
        None if remark is None else str(remark), ext, bytes(frame[4 + header_length :]))


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
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        self._buf += data
        out: list[RemotingCommand] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (total,) = struct.unpack_from(">i", buf, pos)
            if total < 4 or total > self.max_frame_bytes:
                raise ProtocolError(
                    f"frame length {total} outside [4, {self.max_frame_bytes}]"
                )
            if len(buf) - pos - 4 < total:
                break
            out.append(decode_frame(memoryview(buf)[pos + 4 : pos + 4 + total]))
            pos += 4 + total
        if pos:
            del buf[:pos]
        return out


# --- connections -------------------------------------------------------------------------

Handler = Callable[[RemotingCommand, "Connection"], Awaitable[Union[RemotingCommand, None]]]

#: Bytes queued in a connection's transport above which a sender waits for the kernel.
_WRITE_HIGH_WATER = 1 << 20


class _Expired(Exception):
    """A request's timer fired before its response came (becomes RemotingTimeoutError)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


def not_supported(cmd: RemotingCommand) -> RemotingCommand:
    """RocketMQ's answer to an unknown request code (the connection stays open)."""
    return cmd.response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
    )


#: ``handler(cmd, conn) -> bool``: takes the request in the loop turn that decoded it (True:
#: it answers with :meth:`Connection.answer`, now or from a later callback) or leaves it to
#: the code's ordinary task-based handler (False).
ImmediateHandler = Callable[[RemotingCommand, "Connection"], bool]


class Dispatcher:
    """Request code -> handler, with an optional fallback handler for other codes.

    A code may also have an immediate handler (:meth:`register_immediate`), tried first
    without a task: a one-at-a-time request then costs no task creation and no task steps,
    which on the send path is a good part of the broker's time per message."""

    def __init__(self, fallback: Handler | Mapping[int, Handler] | None = None) -> None:
        self._handlers: dict[int, Handler] = {}
        self._fallback: Handler | None = None
        self.immediate: dict[int, ImmediateHandler] = {}
        if isinstance(fallback, Mapping):
            for code, fn in fallback.items():
                self.register(code, fn)
        else:
            self._fallback = fallback

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[int(code)] = handler

    def register_immediate(self, code: int, handler: ImmediateHandler) -> None:
        self.immediate[int(code)] = handler

    async def __call__(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        handler = self._handlers.get(cmd.code, self._fallback)
        if handler is None:
            return not_supported(cmd)
        return await handler(cmd, conn)


#: Commands of one read dispatched in one loop turn; the rest wait for the next turns.
#: A read of 100-200 pipelined sends dispatched at once held the answers to the first
#: behind the storing of the last (their acks are read only after it), so client and
#: master took turns instead of working side by side: 256 sends in flight left half of
#: two CPUs idle.  32 a turn: about 1.2x the throughput (16 costs more turns than it saves).
DISPATCH_BUDGET = 32


class Connection(asyncio.Protocol):
    """One TCP connection speaking remoting frames, in either direction.

    It is the transport's protocol: frames are decoded in the loop turn that reads them
    (a reader task would cost one more turn per read, and a one-at-a-time send pays every
    turn on both sides).  Incoming requests go to the dispatcher, each as its own task, so
    a slow handler never blocks replies to other requests on the same connection, as
    RocketMQ's clients require; incoming responses complete the matching pending request
    right there.
    """

    def __init__(
        self,
        dispatcher: Dispatcher | None,
        max_frame_bytes: int,
        name: str = "",
        frame_read_timeout: float | None = None,
        on_made: Callable[[Connection], None] | None = None,
    ) -> None:
        #: A peer that stops in the middle of a frame for this long is dropped (None: never).
        #: Between frames a connection may idle as long as it likes.
        self._frame_read_timeout = frame_read_timeout
        self._stall_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self._dispatcher = dispatcher
        self._decoder = FrameDecoder(max_frame_bytes)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        #: opaque -> loop time its request times out (see request()).
        self._deadlines: dict[int, float] = {}
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Requests an immediate handler took and has not answered yet.
        self._immediate = 0
        self._close_callbacks: list[Callable[[Connection], None]] = []
        self._closed = self._loop.create_future()
        #: Set when the transport is gone (connection_lost), for close() to wait on.
        self._lost = self._loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        #: Frames gathered for one write at the end of the loop turn (see send()).
        self._cork: list[bytes] | None = None
        #: Callbacks to run once the commands being dispatched together are all
        #: dispatched (None outside a dispatch; see at_end_of_dispatch()).
        self._end_of_dispatch: list[Callable[[], None]] | None = None
        #: Commands of a read beyond DISPATCH_BUDGET, dispatched in later loop turns.
        self._backlog: deque[RemotingCommand] = deque()
        self._drain_scheduled = False
        self._reading_paused = False
        self._on_made = on_made
        self._given_name = name
        self.peer = "?"
        self.name = name or self.peer
        self.close_reason: str | None = None
        #: Free-form per-connection state for handlers (e.g. which broker this is).
        self.attributes: dict[str, Any] = {}

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._transport is transport:
            return  # attached already (see RemotingClient.connection)
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        # Pause (and make senders wait) only past our own high-water mark.
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.name = self._given_name or self.peer
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        if self._closed.done():
            return
        try:
            commands = self._decoder.feed(data)
        except ProtocolError as exc:
            reason = f"malformed frame: {exc}"
            log.warning("closing connection %s: %s", self.name, reason)
            self._mark_closed(reason)
            return
        if self._backlog or len(commands) > DISPATCH_BUDGET:
            self._backlog.extend(commands)
            if not self._drain_scheduled:
                self._dispatch_some()
        elif commands:
            self._dispatch(commands)
        if self._frame_read_timeout is not None and self._decoder.buffered:
            self._last_data = self._loop.time()
            if self._stall_timer is None:
                self._stall_timer = self._loop.call_at(
                    self._last_data + self._frame_read_timeout, self._check_stall)

    def _dispatch(self, commands: list[RemotingCommand]) -> None:
        """Dispatch commands that arrived together, then what they asked to run after."""
        self._end_of_dispatch = []
        try:
            for cmd in commands:
                self._on_command(cmd)
        finally:
            self._run_end_of_dispatch()

    def _dispatch_some(self) -> None:
        """The next DISPATCH_BUDGET commands of the backlog; the rest in a later turn, with
        reading paused until the backlog is gone (it never holds more than one read)."""
        self._drain_scheduled = False
        backlog = self._backlog
        if self._closed.done():
            backlog.clear()
            return
        chunk = [backlog.popleft() for _ in range(min(DISPATCH_BUDGET, len(backlog)))]
        if backlog:
            self._drain_scheduled = True
            self._loop.call_soon(self._dispatch_some)
            self._pause_reading(True)
        else:
            self._pause_reading(False)
        self._dispatch(chunk)

    def _pause_reading(self, pause: bool) -> None:
        if pause == self._reading_paused or self._transport is None:
            return
        self._reading_paused = pause
        try:
            if pause:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()
        except (RuntimeError, AttributeError):  # closing, or a transport that cannot
            pass

    def at_end_of_dispatch(self, cb: Callable[[], None]) -> None:
        """Run ``cb()`` once the commands dispatched with the one being handled have all
        been dispatched (an immediate handler runs inside that dispatch): what requests
        arriving together share, such as one wait for their replicas, is done once for
        all of them.  Commands arrive together when one read brought them, at most
        ``DISPATCH_BUDGET`` of them.  Outside a dispatch it runs at once."""
        if self._end_of_dispatch is None:
            cb()
        else:
            self._end_of_dispatch.append(cb)

    def _run_end_of_dispatch(self) -> None:
        callbacks, self._end_of_dispatch = self._end_of_dispatch, None
        for cb in callbacks or ():
            try:
                cb()
            except Exception:  # one broken callback must not keep the others from running
                log.exception("end-of-dispatch callback of %s failed", self.name)

    def eof_received(self) -> bool:
        self._mark_closed("peer closed")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._mark_closed("peer closed" if exc is None else f"read failed: {exc}")
        if not self._lost.done():
            self._lost.set_result(None)
        self._wake_drain_waiters()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain_waiters()

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _check_stall(self) -> None:
        """Drop a peer stalled inside a frame; one timer per stall, moved on by new data."""
        self._stall_timer = None
        if self._closed.done() or not self._decoder.buffered or self._frame_read_timeout is None:
            return
        due = self._last_data + self._frame_read_timeout
        if self._loop.time() < due:
            self._stall_timer = self._loop.call_at(due, self._check_stall)
            return
        reason = (f"stalled inside a frame: {self._decoder.buffered} bytes of it "
                  f"received, nothing more for {self._frame_read_timeout:g}s")
        log.warning("closing connection %s: %s", self.name, reason)
        self._mark_closed(reason)

    # --- the connection ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.done()

    @property
    def in_flight(self) -> int:
        """Requests from the peer being handled now (this one included, in a handler)."""
        return len(self._tasks) + self._immediate

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def add_close_callback(self, cb: Callable[[Connection], None]) -> None:
        """cb(connection) runs once when the connection closes (at once if already closed)."""
        if self.closed:
            cb(self)
        else:
            self._close_callbacks.append(cb)

    async def send(self, cmd: RemotingCommand) -> None:
        self._queue_frame(cmd, len(self._tasks) + self._immediate > 1)
        # Wait for the kernel only while the transport is paused (its buffer is past our
        # high-water mark), not after every frame.
        if self._write_paused:
            fut: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(fut)
            await fut
            if self.closed:
                raise RemotingError(f"connection {self.name} closed while sending ({self.close_reason})")

    def _queue_frame(self, cmd: RemotingCommand, others: bool) -> None:
        """Queue one frame whole (frames never interleave, so no lock): at once, or with the
        other frames of this loop turn when ``others`` (more answers in flight here) or
        more requests of ours are pending: one syscall and one wake-up of the peer for all
        of them, instead of one per frame."""
        if self.closed:
            raise RemotingError(f"connection {self.name} is closed ({self.close_reason})")
        data = encode(cmd)
        if self._cork is not None:
            self._cork.append(data)
        elif others or len(self._pending) > 1:
            self._cork = [data]
            self._loop.call_soon(self._uncork)
        else:
            self._write(data)

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        """Answer a request an immediate handler took (see :class:`Dispatcher`); never
        waits: what the transport cannot take yet stays in its buffer."""
        self._immediate -= 1
        if request.is_oneway or self.closed:
            return
        self._stamp(request, response)
        try:
            self._queue_frame(response, len(self._tasks) + self._immediate > 0)
        except RemotingError as exc:
            log.debug("could not answer %s: %s", request.describe(), exc)

    @staticmethod
    def _stamp(request: RemotingCommand, response: RemotingCommand) -> None:
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = request.serialize_type  # answer in the type asked in

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        try:
            self._transport.write(data)
        except (ConnectionError, OSError, RuntimeError) as exc:
            self._mark_closed(f"write failed: {exc}")
            raise RemotingError(f"connection {self.name}: write failed: {exc}") from exc

    def _uncork(self) -> None:
        chunks, self._cork = self._cork, None
        if not chunks or self.closed:
            return
        try:
            self._write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except RemotingError as exc:
            # The senders returned already; the close fails what still waits on this link.
            log.debug("%s", exc)

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for the response with the same opaque."""
        if cmd.is_oneway or cmd.is_response:
            raise ValueError("request() needs a two-way request command")
        loop = self._loop
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        opaque = cmd.opaque
        deadline = loop.time() + timeout
        self._pending[opaque] = fut
        self._deadlines[opaque] = deadline
        # One timer per connection, at the earliest deadline (not one per request: with
        # hundreds in flight their heap operations cost more than the requests).
        if self._timer is None or deadline < self._timer_at:
            self._arm_timer(deadline)
        try:
            await self.send(cmd)
            return await fut
        except _Expired:
            raise RemotingTimeoutError(
                f"no response from {self.name} to {cmd.describe()} within {timeout:.3f}s"
            ) from None
        finally:
            self._pending.pop(opaque, None)
            self._deadlines.pop(opaque, None)
            if fut.done() and not fut.cancelled():
                # A failed send closes the connection, which fails this future too; the
                # send's own error is what was raised, so mark this one as seen.
                fut.exception()

    def _arm_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._expire_due)

    def _expire_due(self) -> None:
        """Fail every request past its deadline; re-arm for the next one."""
        self._timer = None
        now = self._loop.time()
        earliest: float | None = None
        for opaque, deadline in self._deadlines.items():
            if deadline <= now:
                fut = self._pending.get(opaque)
                if fut is not None:
                    _expire(fut)
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._arm_timer(earliest)

    async def oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= FLAG_ONEWAY
        await self.send(cmd)

    async def close(self, reason: str = "closed locally", timeout: float = 5.0) -> None:
        self._uncork()  # what was sent goes out before the close
        self._mark_closed(reason)
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), timeout)
        except asyncio.TimeoutError:
            # A graceful close waits for queued bytes to leave, and a peer that reads
            # nothing would hold the caller (a producer closing a timed-out link) forever.
            if self._transport is not None:
                self._transport.abort()

    def _mark_closed(self, reason: str) -> None:
        if self._closed.done():
            return
        self.close_reason = reason
        self._closed.set_result(None)
        if self._transport is not None:
            self._transport.close()
        elif not self._lost.done():
            self._lost.set_result(None)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RemotingError(f"connection {self.name} closed: {reason}"))
        self._pending.clear()
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # a broken callback must not stop the others
                log.exception("close callback of %s failed", self.name)

    def _on_command(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            fut = self._pending.get(cmd.opaque)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            else:
                log.debug("%s: dropping response with unknown opaque %d", self.name, cmd.opaque)
            return
        if self._dispatcher is not None:
            now = self._dispatcher.immediate.get(cmd.code)
            if now is not None and self._take_now(now, cmd):
                return
        task = self._loop.create_task(self._handle(cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take_now(self, handler: ImmediateHandler, cmd: RemotingCommand) -> bool:
        self._immediate += 1
        try:
            taken = handler(cmd, self)
        except RemoteCommandError as exc:
            self.answer(cmd, cmd.response(exc.code, exc.remark))
            return True
        except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the link
            log.exception("immediate handler for %s from %s failed", cmd.describe(), self.name)
            self.answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"))
            return True
        if not taken:
            self._immediate -= 1
        return taken

    async def _handle(self, cmd: RemotingCommand) -> None:
        if self._dispatcher is None:
            response: RemotingCommand | None = not_supported(cmd)
        else:
            try:
                response = await self._dispatcher(cmd, self)
            except RemoteCommandError as exc:
                response = cmd.response(exc.code, exc.remark)
            except RmqhaError as exc:
                response = cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the link
                log.exception("handler for %s from %s failed", cmd.describe(), self.name)
                response = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if cmd.is_oneway or response is None or self.closed:
            return
        self._stamp(cmd, response)
        try:
            await self.send(response)
        except RemotingError as exc:
            log.debug("could not answer %s: %s", cmd.describe(), exc)


# --- server ------------------------------------------------------------------------------


class RemotingServer:
    """An asyncio TCP server of remoting frames.

    ``handler`` is either one callable ``handler(cmd, conn) -> awaitable response|None``
    used for every code not registered with :meth:`register`, or a mapping code ->
    handler; without a handler for a code the answer is REQUEST_CODE_NOT_SUPPORTED.
    ``conn`` (a :class:`Connection`) can also send requests and one-ways back to the peer.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        handler: Handler | Mapping[int, Handler] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        frame_read_timeout: float | None = DEFAULT_FRAME_READ_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.frame_read_timeout = frame_read_timeout
        self.dispatcher = Dispatcher(handler)
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._connect_callbacks: list[Callable[[Connection], None]] = []

    def register(self, code: int, handler: Handler) -> None:
        self.dispatcher.register(code, handler)

    def register_immediate(self, code: int, handler: ImmediateHandler) -> None:
        self.dispatcher.register_immediate(code, handler)

    def on_connect(self, cb: Callable[[Connection], None]) -> None:
        self._connect_callbacks.append(cb)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self.dispatcher, self.max_frame_bytes,
                               frame_read_timeout=self.frame_read_timeout, on_made=self._accept),
            self.host, self.port)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            await conn.close("server stopping")
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _accept(self, conn: Connection) -> None:
        self.connections.add(conn)
        conn.add_close_callback(self.connections.discard)
        for cb in self._connect_callbacks:
            cb(conn)


# --- client ------------------------------------------------------------------------------


def split_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RemotingError(f"bad address {addr!r}; expected host:port")
    return host, int(port)


class RemotingClient:
    """Client of one address: one reused connection, reconnected on demand.

    ``handler`` (optional) answers requests the server sends over this connection.
    """

    def __init__(
        self,
        addr: str,
        *,
        connect_timeout: float = 3.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        handler: Handler | Mapping[int, Handler] | None = None,
    ) -> None:
        self.addr = addr
        self.host, self.port = split_address(addr)
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self._dispatcher = Dispatcher(handler) if handler is not None else None
        self._conn: Connection | None = None
        self._connect_lock: asyncio.Lock | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def connection(self) -> Connection:
        """The live connection, opening a new one if needed."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
            loop = asyncio.get_running_loop()
            try:
                transport, conn = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: Connection(self._dispatcher, self.max_frame_bytes, name=self.addr),
                        self.host, self.port),
                    self.connect_timeout,
                )
            except asyncio.TimeoutError:
                raise RemotingTimeoutError(f"connect to {self.addr} timed out") from None
            except OSError as exc:
                raise RemotingError(f"cannot connect to {self.addr}: {exc}") from exc
            # Some loops (uvloop) call connection_made a turn after create_connection
            # returns; the connection must be usable now.
            conn.connection_made(transport)
            self._conn = conn
            return conn

    async def request(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self.connection()
        return await conn.request(cmd, timeout)

    async def oneway(self, cmd: RemotingCommand) -> None:
        conn = await self.connection()
        await conn.oneway(cmd)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class EventLoopThread:
    """A private asyncio loop on a daemon thread, for blocking callers (CLI, tests)."""

    def __init__(self, name: str = "rmqha-loop") -> None:
        self.loop = event_loop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        fut: ConcurrentFuture[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return fut.result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class BlockingRemotingClient:
    """Blocking façade over :class:`RemotingClient` (its loop runs on a private thread)."""

    def __init__(self, addr: str, *, connect_timeout: float = 3.0) -> None:
        self._loop = EventLoopThread(f"rmqha-remoting-{addr}")
        self._client = RemotingClient(addr, connect_timeout=connect_timeout)
        self.addr = addr

    def request(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        return self._loop.run(self._client.request(cmd, timeout))

    def oneway(self, cmd: RemotingCommand) -> None:
        self._loop.run(self._client.oneway(cmd))

    def close(self) -> None:
        try:
            self._loop.run(self._client.close(), timeout=5)
        finally:
            self._loop.stop()

    def __enter__(self) -> BlockingRemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
