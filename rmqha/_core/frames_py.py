"""Pure-Python twin of the HA wire frames (a hot path; ARCHITECTURE.md lists them).

This module owns both HA dialects' byte layouts, single-frame encode/decode, the incremental
decoders and the batch helpers for TRANSFER_DATA headers.  The frame dataclasses and enums
are :mod:`rmqha._core.frame_types`'s, named here too (the compiled twin ``rmqha._core.frames``
imports them from here, so both twins return equal objects; only TRANSFER_DATA has a
compiled type of its own there, which compares equal to the dataclass and which both twins
encode).  All integers are big-endian.

``framed`` (default; rmqha's own: one envelope for every frame type)::

    length:int32 | type:int32 | timestamp_ms:int64 | epoch:int64 | payload   (length = 24 + payload)
    1 HANDSHAKE_SLAVE  flags:int32 (bit0 sync_from_last_file, bit1 async_learner),
                       broker_id:int64, segment_bytes:int64, address_len:int32, address UTF-8
    2 HANDSHAKE_MASTER check_result:int32, master_max_offset:int64, master_last_epoch:int32
    3 QUERY_EPOCH      (empty)
    4 RETURN_EPOCH     count:int32, count x (epoch:int32, start_offset:int64, end_offset:int64)
    5 CONFIRM_TRUNCATE offset:int64
    6 TRANSFER_DATA    block_start_offset:int64, epoch_start_offset:int64, confirm_offset:int64, data
    7 TRANSFER_ACK     slave_max_offset:int64

``rocketmq`` (RocketMQ 5 AutoSwitch HA, byte-compatible)::

    slave handshake   16 B  state=1:int32, sync_from_last_file:int16, async_learner:int16, broker_id:int64
    slave ack         12 B  state=2:int32, max_offset:int64
    master handshake  20 B  state=1:int32, body_size:int32, max_offset:int64, last_epoch:int32
                            + body_size/12 x (epoch:int32, start_offset:int64)
    master transfer   36 B  state=2:int32, body_size:int32, offset:int64, epoch:int32,
                            epoch_start_offset:int64, confirm_offset:int64 + body

Encoding TRANSFER_DATA / a master transfer returns the header only: the caller sends the
header and a memoryview of the log together (scatter/gather), so log data is never copied.
Decoded data is a memoryview slice of the caller's buffer when that buffer is immutable
``bytes`` (no copy) and a ``bytes`` copy otherwise (a reused receive buffer would change
under the view).  A decoder never allocates from a length above ``max_frame_bytes``.
"""
from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from array import array
from typing import Any

from rmqha._core.frame_types import (
    DEFAULT_MAX_FRAME_BYTES as DEFAULT_MAX_FRAME_BYTES,
)
from rmqha._core.frame_types import (
    HEADER_SIZE as HEADER_SIZE,
)
from rmqha._core.frame_types import (
    INT32_MAX as INT32_MAX,
)
from rmqha._core.frame_types import (
    INT64_MAX as INT64_MAX,
)
from rmqha._core.frame_types import (
    MASTER_TO_SLAVE_TYPES as MASTER_TO_SLAVE_TYPES,
)
from rmqha._core.frame_types import (
    RETURN_EPOCH_ENTRY_SIZE as RETURN_EPOCH_ENTRY_SIZE,
)
from rmqha._core.frame_types import (
    RMQ_EPOCH_ENTRY_SIZE as RMQ_EPOCH_ENTRY_SIZE,
)
from rmqha._core.frame_types import (
    RMQ_MASTER_HANDSHAKE_SIZE as RMQ_MASTER_HANDSHAKE_SIZE,
)
from rmqha._core.frame_types import (
    RMQ_MASTER_TRANSFER_SIZE as RMQ_MASTER_TRANSFER_SIZE,
)
from rmqha._core.frame_types import (
    RMQ_SLAVE_ACK_SIZE as RMQ_SLAVE_ACK_SIZE,
)
from rmqha._core.frame_types import (
    RMQ_SLAVE_HANDSHAKE_SIZE as RMQ_SLAVE_HANDSHAKE_SIZE,
)
from rmqha._core.frame_types import (
    SLAVE_TO_MASTER_TYPES as SLAVE_TO_MASTER_TYPES,
)
from rmqha._core.frame_types import (
    TRANSFER_HEADER_SIZE as TRANSFER_HEADER_SIZE,
)
from rmqha._core.frame_types import (  # re-exported: both twins' API names them
    CheckResult as CheckResult,
)
from rmqha._core.frame_types import (
    ConfirmTruncate as ConfirmTruncate,
)
from rmqha._core.frame_types import (
    ConnectionState as ConnectionState,
)
from rmqha._core.frame_types import (
    Dialect as Dialect,
)
from rmqha._core.frame_types import (
    Direction as Direction,
)
from rmqha._core.frame_types import (
    FramedFrame as FramedFrame,
)
from rmqha._core.frame_types import (
    FrameType as FrameType,
)
from rmqha._core.frame_types import (
    HandshakeMaster as HandshakeMaster,
)
from rmqha._core.frame_types import (
    HandshakeSlave as HandshakeSlave,
)
from rmqha._core.frame_types import (
    QueryEpoch as QueryEpoch,
)
from rmqha._core.frame_types import (
    ReturnEpoch as ReturnEpoch,
)
from rmqha._core.frame_types import (
    RmqMasterHandshake as RmqMasterHandshake,
)
from rmqha._core.frame_types import (
    RmqMasterTransfer as RmqMasterTransfer,
)
from rmqha._core.frame_types import (
    RmqSlaveAck as RmqSlaveAck,
)
from rmqha._core.frame_types import (
    RmqSlaveHandshake as RmqSlaveHandshake,
)
from rmqha._core.frame_types import (
    RocketMQFrame as RocketMQFrame,
)
from rmqha._core.frame_types import (
    TransferAck as TransferAck,
)
from rmqha._core.frame_types import (
    TransferData as TransferData,
)
from rmqha.errors import ProtocolError

_HDR = struct.Struct(">iiqq")
_HS_SLAVE = struct.Struct(">iqqi")
_HS_MASTER = struct.Struct(">iqi")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_EPOCH20 = struct.Struct(">iqq")
_TD = struct.Struct(">iiqqqqq")
_TD_PAYLOAD = struct.Struct(">qqq")
_RMQ_HS_SLAVE = struct.Struct(">ihhq")
_RMQ_ACK = struct.Struct(">iq")
_RMQ_HS_MASTER = struct.Struct(">iiqi")
_RMQ_ENTRY = struct.Struct(">iq")
_RMQ_TRANSFER = struct.Struct(">iiqiqq")

# --- helpers -----------------------------------------------------------------------------------


def _err(what: str, where: str) -> ProtocolError:
    return ProtocolError(f"{where}: {what}")


def _data_of(buf: Any, start: int, end: int, owned: bool = False) -> Any:
    """Zero-copy slice of an immutable (or decoder-owned) buffer, a bytes copy of a mutable one."""
    if owned or type(buf) is bytes:
        return memoryview(buf)[start:end]
    return bytes(memoryview(buf)[start:end])


def _check_i64(value: int, name: str, lo: int, where: str) -> int:
    v = int(value)
    if v < lo or v > INT64_MAX:
        raise _err(f"{name} {v} is outside {lo}..{INT64_MAX}", where)
    return v


def _check_i32(value: int, name: str, lo: int, where: str) -> int:
    v = int(value)
    if v < lo or v > INT32_MAX:
        raise _err(f"{name} {v} is outside {lo}..{INT32_MAX}", where)
    return v


def _check_max(max_frame_bytes: int) -> int:
    m = int(max_frame_bytes)
    if m < RMQ_MASTER_TRANSFER_SIZE or m > INT32_MAX:
        raise ValueError(f"max_frame_bytes {m} is outside {RMQ_MASTER_TRANSFER_SIZE}..{INT32_MAX}")
    return m


def detect_dialect(first4: Any) -> str:
    """"framed" or "rocketmq" from a connection's first four bytes (framed length >= 24, state 1)."""
    if len(first4) < 4:
        raise ProtocolError(f"dialect detection needs 4 bytes, got {len(first4)}")
    (v,) = _I32.unpack_from(first4, 0)
    if v == ConnectionState.HANDSHAKE:
        return Dialect.ROCKETMQ.value
    if v >= HEADER_SIZE:
        return Dialect.FRAMED.value
    raise ProtocolError(
        f"first int32 {v} of the connection is neither a framed length (>= {HEADER_SIZE}) "
        f"nor the rocketmq HANDSHAKE state 1"
    )


# --- framed: encode ----------------------------------------------------------------------------


def pack_transfer_header(
    block_start_offset: int,
    epoch_start_offset: int,
    confirm_offset: int,
    data_len: int,
    epoch: int,
    timestamp_ms: int = 0,
) -> bytes:
    """The 48-byte TRANSFER_DATA header of a block of ``data_len`` bytes (data not included)."""
    where = "TRANSFER_DATA encode"
    if data_len < 0 or data_len > INT32_MAX - TRANSFER_HEADER_SIZE:
        raise _err(f"data length {data_len} does not fit an int32 frame length", where)
    if block_start_offset < 0 or epoch_start_offset < 0 or confirm_offset < 0:
        raise _err(
            f"negative offset (block {block_start_offset}, epoch start {epoch_start_offset}, "
            f"confirm {confirm_offset})",
            where,
        )
    try:
        return _TD.pack(
            TRANSFER_HEADER_SIZE + data_len, 6, timestamp_ms, epoch,
            block_start_offset, epoch_start_offset, confirm_offset,
        )
    except struct.error as exc:
        raise _err(f"field out of range: {exc}", where) from None


def unpack_transfer_header(buf: Any, pos: int = 0) -> tuple[int, int, int, int, int, int]:
    """(block_start, epoch_start, confirm, data_len, epoch, timestamp_ms) of a header at ``pos``."""
    if pos < 0 or len(buf) - pos < TRANSFER_HEADER_SIZE:
        raise ProtocolError(
            f"TRANSFER_DATA header at byte {pos}: needs {TRANSFER_HEADER_SIZE} bytes, "
            f"{max(len(buf) - pos, 0)} available"
        )
    length, ftype, ts, epoch, block, estart, confirm = _TD.unpack_from(buf, pos)
    _check_transfer_fields(length, ftype, block, estart, confirm, f"TRANSFER_DATA header at byte {pos}")
    return block, estart, confirm, length - TRANSFER_HEADER_SIZE, epoch, ts


def _check_transfer_fields(length: int, ftype: int, block: int, estart: int, confirm: int, where: str) -> None:
    if ftype != 6:
        raise _err(f"type {ftype} is not TRANSFER_DATA (6)", where)
    if length < TRANSFER_HEADER_SIZE:
        raise _err(f"length {length} is below the {TRANSFER_HEADER_SIZE}-byte TRANSFER_DATA header", where)
    if block < 0 or estart < 0 or confirm < 0:
        raise _err(f"negative offset (block {block}, epoch start {estart}, confirm {confirm})", where)


def _column(values: Any, n: int | None, name: str) -> Any:
    mv = memoryview(values)
    if mv.format not in ("q", "l", "<q", "=q") or mv.itemsize != 8 or mv.ndim != 1:
        raise ValueError(f"{name} must be a 1-d buffer of int64 (array('q') or numpy int64)")
    if n is not None and len(mv) != n:
        raise ValueError(f"{name} has {len(mv)} items, expected {n}")
    return mv


def pack_transfer_headers(
    block_starts: Any, epoch_starts: Any, confirm_offsets: Any, data_lens: Any, epochs: Any, timestamps: Any
) -> bytes:
    """Back-to-back 48-byte TRANSFER_DATA headers; each argument an int64 buffer of equal length."""
    bs = _column(block_starts, None, "block_starts")
    n = len(bs)
    es = _column(epoch_starts, n, "epoch_starts")
    co = _column(confirm_offsets, n, "confirm_offsets")
    dl = _column(data_lens, n, "data_lens")
    ep = _column(epochs, n, "epochs")
    ts = _column(timestamps, n, "timestamps")
    out = bytearray(n * TRANSFER_HEADER_SIZE)
    pack_into = _TD.pack_into
    for i in range(n):
        d = dl[i]
        where = f"TRANSFER_DATA header {i} encode"
        if d < 0 or d > INT32_MAX - TRANSFER_HEADER_SIZE:
            raise _err(f"data length {d} does not fit an int32 frame length", where)
        if bs[i] < 0 or es[i] < 0 or co[i] < 0:
            raise _err(f"negative offset (block {bs[i]}, epoch start {es[i]}, confirm {co[i]})", where)
        pack_into(out, i * TRANSFER_HEADER_SIZE, TRANSFER_HEADER_SIZE + d, 6, ts[i], ep[i], bs[i], es[i], co[i])
    return bytes(out)


def unpack_transfer_headers(buf: Any) -> tuple[array, array, array, array, array, array]:
    """Columns (block_starts, epoch_starts, confirms, data_lens, epochs, timestamps) of back-to-back headers."""
    mv = memoryview(buf).cast("B")
    if len(mv) % TRANSFER_HEADER_SIZE:
        raise ProtocolError(
            f"TRANSFER_DATA headers: {len(mv)} bytes is not a multiple of {TRANSFER_HEADER_SIZE}"
        )
    cols = tuple(array("q") for _ in range(6))
    bs, es, co, dl, ep, ts = cols
    for i, (length, ftype, t, e, b, s, c) in enumerate(_TD.iter_unpack(mv)):
        _check_transfer_fields(length, ftype, b, s, c, f"TRANSFER_DATA header {i} at byte {i * TRANSFER_HEADER_SIZE}")
        bs.append(b)
        es.append(s)
        co.append(c)
        dl.append(length - TRANSFER_HEADER_SIZE)
        ep.append(e)
        ts.append(t)
    return cols  # type: ignore[return-value]


def encode_framed(frame: FramedFrame) -> bytes:
    """Bytes of one framed frame; for TransferData only the header (send the data after it)."""
    t = type(frame)
    if t is TransferData:
        return pack_transfer_header(
            frame.block_start_offset, frame.epoch_start_offset, frame.confirm_offset,
            len(frame.data), frame.epoch, frame.timestamp_ms,
        )
    where = f"{t.__name__} encode"
    try:
        if t is TransferAck:
            _check_i64(frame.slave_max_offset, "slave_max_offset", 0, where)
            return _HDR.pack(HEADER_SIZE + 8, 7, frame.timestamp_ms, frame.epoch) + _I64.pack(frame.slave_max_offset)
        if t is HandshakeSlave:
            addr = frame.address.encode("utf-8")
            _check_i64(frame.segment_bytes, "segment_bytes", 0, where)
            flags = (1 if frame.sync_from_last_file else 0) | (2 if frame.async_learner else 0)
            payload = _HS_SLAVE.pack(flags, frame.broker_id, frame.segment_bytes, len(addr)) + addr
            return _HDR.pack(HEADER_SIZE + len(payload), 1, frame.timestamp_ms, frame.epoch) + payload
        if t is HandshakeMaster:
            _check_i64(frame.master_max_offset, "master_max_offset", 0, where)
            payload = _HS_MASTER.pack(frame.check_result, frame.master_max_offset, frame.master_last_epoch)
            return _HDR.pack(HEADER_SIZE + 16, 2, frame.timestamp_ms, frame.epoch) + payload
        if t is QueryEpoch:
            return _HDR.pack(HEADER_SIZE, 3, frame.timestamp_ms, frame.epoch)
        if t is ReturnEpoch:
            n = len(frame.entries)
            if n > (INT32_MAX - HEADER_SIZE - 4) // RETURN_EPOCH_ENTRY_SIZE:
                raise _err(f"{n} epoch entries do not fit one frame", where)
            parts = [_HDR.pack(HEADER_SIZE + 4 + n * RETURN_EPOCH_ENTRY_SIZE, 4, frame.timestamp_ms, frame.epoch),
                     _I32.pack(n)]
            for e, s, end in frame.entries:
                _check_i64(s, "epoch start offset", 0, where)
                _check_i64(end, "epoch end offset", 0, where)
                parts.append(_EPOCH20.pack(e, s, end))
            return b"".join(parts)
        if t is ConfirmTruncate:
            _check_i64(frame.offset, "offset", 0, where)
            return _HDR.pack(HEADER_SIZE + 8, 5, frame.timestamp_ms, frame.epoch) + _I64.pack(frame.offset)
    except struct.error as exc:
        raise _err(f"field out of range: {exc}", where) from None
    if _is_transfer_data_type(t):
        return pack_transfer_header(
            frame.block_start_offset, frame.epoch_start_offset, frame.confirm_offset,
            len(frame.data), frame.epoch, frame.timestamp_ms,
        )
    raise ProtocolError(f"encode_framed: {t.__name__} is not a framed frame type")


def _is_transfer_data_type(t: type) -> bool:
    """The compiled twin's TransferData (same name and fields, in order) is encoded as ours."""
    return t.__name__ == "TransferData" and getattr(t, "__match_args__", None) == TransferData.__match_args__


# --- framed: decode ----------------------------------------------------------------------------


def _framed_payload(ftype: int, ts: int, epoch: int, buf: Any, p: int, end: int, where: str,
                    owned: bool = False) -> FramedFrame:
    """Decode the payload buf[p:end] of a frame whose header was already validated."""
    plen = end - p
    if ftype == 6:
        if plen < 24:
            raise _err(f"TRANSFER_DATA payload of {plen} bytes is shorter than its 24 bytes of fields", where)
        b, s, c = _TD_PAYLOAD.unpack_from(buf, p)
        if b < 0 or s < 0 or c < 0:
            raise _err(f"TRANSFER_DATA negative offset (block {b}, epoch start {s}, confirm {c})", where)
        return TransferData(b, s, c, _data_of(buf, p + 24, end, owned), ts, epoch)
    if ftype == 7 or ftype == 5:
        name = "TRANSFER_ACK" if ftype == 7 else "CONFIRM_TRUNCATE"
        if plen != 8:
            raise _err(f"{name} payload is {plen} bytes, expected 8", where)
        (o,) = _I64.unpack_from(buf, p)
        if o < 0:
            raise _err(f"{name} negative offset {o}", where)
        return TransferAck(o, ts, epoch) if ftype == 7 else ConfirmTruncate(o, ts, epoch)
    if ftype == 1:
        if plen < 24:
            raise _err(f"HANDSHAKE_SLAVE payload of {plen} bytes is shorter than its 24 bytes of fields", where)
        flags, broker_id, seg, alen = _HS_SLAVE.unpack_from(buf, p)
        if alen != plen - 24:
            raise _err(f"HANDSHAKE_SLAVE address length {alen} does not match the {plen - 24} bytes left", where)
        if flags & ~3:
            raise _err(f"HANDSHAKE_SLAVE unknown flag bits 0x{flags & ~3:x}", where)
        if seg < 0:
            raise _err(f"HANDSHAKE_SLAVE negative segment_bytes {seg}", where)
        try:
            addr = bytes(memoryview(buf)[p + 24 : end]).decode("utf-8")
        except UnicodeDecodeError:
            raise _err("HANDSHAKE_SLAVE address is not UTF-8", where) from None
        return HandshakeSlave(broker_id, seg, addr, bool(flags & 1), bool(flags & 2), ts, epoch)
    if ftype == 2:
        if plen != 16:
            raise _err(f"HANDSHAKE_MASTER payload is {plen} bytes, expected 16", where)
        res, mmax, last = _HS_MASTER.unpack_from(buf, p)
        if mmax < 0:
            raise _err(f"HANDSHAKE_MASTER negative master_max_offset {mmax}", where)
        return HandshakeMaster(res, mmax, last, ts, epoch)
    if ftype == 3:
        if plen != 0:
            raise _err(f"QUERY_EPOCH payload is {plen} bytes, expected 0", where)
        return QueryEpoch(ts, epoch)
    if ftype == 4:
        if plen < 4:
            raise _err(f"RETURN_EPOCH payload of {plen} bytes has no count", where)
        (n,) = _I32.unpack_from(buf, p)
        if n < 0 or n * RETURN_EPOCH_ENTRY_SIZE != plen - 4:
            raise _err(f"RETURN_EPOCH count {n} does not fit the {plen - 4} bytes of entries", where)
        entries = []
        q = p + 4
        for _ in range(n):
            e, s, en = _EPOCH20.unpack_from(buf, q)
            if s < 0 or en < 0:
                raise _err(f"RETURN_EPOCH entry at byte {q} has a negative offset ({s}, {en})", where)
            entries.append((e, s, en))
            q += RETURN_EPOCH_ENTRY_SIZE
        return ReturnEpoch(tuple(entries), ts, epoch)
    raise _err(f"unknown frame type {ftype}", where)


def _check_framed_header(length: int, ftype: int, allowed: Any, max_frame_bytes: int, where: str) -> None:
    if length < HEADER_SIZE:
        raise _err(f"frame length {length} is below the {HEADER_SIZE}-byte header", where)
    if length > max_frame_bytes:
        raise _err(f"frame length {length} exceeds max_frame_bytes {max_frame_bytes}", where)
    if ftype < 1 or ftype > 7:
        raise _err(f"unknown frame type {ftype}", where)
    if allowed is not None and ftype not in allowed:
        raise _err(f"frame type {FrameType(ftype).name} is not sent in this direction", where)


def _allowed(direction: Any) -> Any:
    if direction is None:
        return None
    d = Direction(direction)
    return MASTER_TO_SLAVE_TYPES if d is Direction.MASTER_TO_SLAVE else SLAVE_TO_MASTER_TYPES


def decode_framed(buf: Any, direction: Any = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> FramedFrame:
    """Decode exactly one whole framed frame held by ``buf``."""
    max_frame_bytes = _check_max(max_frame_bytes)
    n = len(buf)
    if n < HEADER_SIZE:
        raise ProtocolError(f"framed frame at byte 0: {n} bytes is shorter than the {HEADER_SIZE}-byte header")
    length, ftype, ts, epoch = _HDR.unpack_from(buf, 0)
    where = "framed frame at byte 0"
    _check_framed_header(length, ftype, _allowed(direction), max_frame_bytes, where)
    if length != n:
        raise _err(f"frame length {length} does not match the {n} bytes given", where)
    return _framed_payload(ftype, ts, epoch, buf, HEADER_SIZE, n, where)


# --- framed: the slave's receive run and its ack -------------------------------------------------

#: ``scan_transfer_run`` stops: every frame taken (or under 8 bytes left), an incomplete
#: frame after the run (``need`` says how much it takes), or a frame that is not plain
#: (nothing is taken: the caller's general path reads the buffer).
RUN_END = 0
RUN_PARTIAL = 1
RUN_OTHER = 2


def pack_transfer_ack(slave_max_offset: int, timestamp_ms: int, epoch: int) -> bytes:
    """The 32-byte TRANSFER_ACK frame: ``encode_framed(TransferAck(...))`` in one call."""
    where = "TransferAck encode"
    _check_i64(slave_max_offset, "slave_max_offset", 0, where)
    try:
        return _HDR.pack(HEADER_SIZE + 8, 7, timestamp_ms, epoch) + _I64.pack(slave_max_offset)
    except struct.error as exc:
        raise _err(f"field out of range: {exc}", where) from None


def scan_transfer_run(buf: Any, start: int, end: int, max_frame_bytes: int, tag_bytes: int, log_end: int,
                      epoch: int, epoch_start: int, segment_bytes: int) -> tuple[int, array[int], int, int]:
    """The run of *plain* TRANSFER_DATA frames at ``buf[start:end]``, for an HA slave that
    applies what one read brought in one call: (stop, spans, consumed, need).

    A frame is plain when it is whole (its ``tag_bytes`` tag too), of type TRANSFER_DATA
    with a length in 48..``max_frame_bytes``, carries data (not a heartbeat), starts where
    the one before it ends (the first at ``log_end``), under ``epoch`` and ``epoch_start``
    (not after its offset) and ends inside the segment it starts in: a block the slave's
    checks accept with nothing to do but append it.  ``spans`` holds per plain frame its
    data position in ``buf``, its data size and the confirm offset learnt once it is
    appended (the running maximum of each block's confirm offset capped at its end);
    ``consumed`` is their bytes with tags; ``need`` the length and tag of the incomplete
    frame after them (stop RUN_PARTIAL).  Stop RUN_OTHER: a frame that is not plain is
    whole, or its first 8 bytes name a type or length not allowed; then nothing is taken
    (empty spans) and the general path reads the buffer and refuses what it must."""
    _check_max(max_frame_bytes)
    if segment_bytes <= 0 or tag_bytes < 0 or log_end < 0 or start < 0 or end > len(buf) or start > end:
        raise ValueError(f"scan_transfer_run: bad arguments (buffer {start}..{end} of {len(buf)}, "
                         f"tag {tag_bytes}, segment {segment_bytes})")
    spans = array("q")
    pos = start
    at = log_end
    learnt = -1
    while end - pos >= 8:
        length, ftype = struct.unpack_from(">ii", buf, pos)
        if ftype != 6 or length < TRANSFER_HEADER_SIZE or length > max_frame_bytes:
            return RUN_OTHER, array("q"), 0, 0
        if end - pos < length + tag_bytes:
            return RUN_PARTIAL, spans, pos - start, length + tag_bytes
        _, _, _, e, block, estart, confirm = _TD.unpack_from(buf, pos)
        size = length - TRANSFER_HEADER_SIZE
        if (size == 0 or block != at or e != epoch or estart != epoch_start or estart > block
                or confirm < 0 or block + size > block - block % segment_bytes + segment_bytes):
            return RUN_OTHER, array("q"), 0, 0
        at = block + size
        learnt = max(learnt, min(confirm, at))
        spans.extend((pos + TRANSFER_HEADER_SIZE, size, learnt))
        pos += length + tag_bytes
    return RUN_END, spans, pos - start, 0


def scan_transfer_acks(buf: Any, tag_bytes: int, acked: int, sent: int, last_epoch: int) -> tuple[int, int]:
    """A read of an HA master made only of whole TRANSFER_ACK frames (each followed by its
    ``tag_bytes`` of tag) that all make sense, in one call: (count, last offset).  An ack
    makes sense when its offset is not below the one before it (the first: ``acked``)
    nor beyond ``sent``, and its epoch is not newer than ``last_epoch``.  Anything else
    (another frame, a length not 32, an incomplete frame, an ack that makes no sense)
    gives (-1, acked): the decoding path reads the bytes then, and refuses what it must."""
    if tag_bytes < 0:
        raise ValueError(f"scan_transfer_acks: negative tag length {tag_bytes}")
    step = HEADER_SIZE + 8 + tag_bytes
    n = len(buf)
    if n == 0 or n % step:
        return -1, acked
    last = acked
    for pos in range(0, n, step):
        length, ftype, _, epoch = _HDR.unpack_from(buf, pos)
        (offset,) = _I64.unpack_from(buf, pos + HEADER_SIZE)
        if (length != HEADER_SIZE + 8 or ftype != 7 or offset < 0 or offset < last or offset > sent
                or epoch > last_epoch):
            return -1, acked
        last = offset
    return n // step, last


# --- rocketmq: encode --------------------------------------------------------------------------


def pack_rocketmq_transfer_header(
    offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int, body_size: int
) -> bytes:
    """The 36-byte master transfer header of a body of ``body_size`` bytes (body not included)."""
    where = "rocketmq transfer encode"
    if body_size < 0 or body_size > INT32_MAX - RMQ_MASTER_TRANSFER_SIZE:
        raise _err(f"body size {body_size} does not fit an int32", where)
    lo = -1 if body_size == 0 else 0
    if offset < lo or epoch_start_offset < lo or confirm_offset < -1:
        raise _err(
            f"negative offset (offset {offset}, epoch start {epoch_start_offset}, confirm {confirm_offset})",
            where,
        )
    try:
        return _RMQ_TRANSFER.pack(2, body_size, offset, epoch, epoch_start_offset, confirm_offset)
    except struct.error as exc:
        raise _err(f"field out of range: {exc}", where) from None


def pack_rocketmq_transfer_headers(
    offsets: Any, epochs: Any, epoch_starts: Any, confirm_offsets: Any, body_sizes: Any
) -> bytes:
    """Back-to-back 36-byte master transfer headers; each argument an int64 buffer of equal length."""
    of = _column(offsets, None, "offsets")
    n = len(of)
    ep = _column(epochs, n, "epochs")
    es = _column(epoch_starts, n, "epoch_starts")
    co = _column(confirm_offsets, n, "confirm_offsets")
    bs = _column(body_sizes, n, "body_sizes")
    out = bytearray(n * RMQ_MASTER_TRANSFER_SIZE)
    pack_into = _RMQ_TRANSFER.pack_into
    for i in range(n):
        b = bs[i]
        where = f"rocketmq transfer header {i} encode"
        if b < 0 or b > INT32_MAX - RMQ_MASTER_TRANSFER_SIZE:
            raise _err(f"body size {b} does not fit an int32", where)
        lo = -1 if b == 0 else 0
        if of[i] < lo or es[i] < lo or co[i] < -1:
            raise _err(f"negative offset (offset {of[i]}, epoch start {es[i]}, confirm {co[i]})", where)
        if ep[i] < -(1 << 31) or ep[i] > INT32_MAX:
            raise _err(f"epoch {ep[i]} does not fit an int32", where)
        pack_into(out, i * RMQ_MASTER_TRANSFER_SIZE, 2, b, of[i], ep[i], es[i], co[i])
    return bytes(out)


def encode_rocketmq(frame: RocketMQFrame) -> bytes:
    """Bytes of one rocketmq-dialect message; for RmqMasterTransfer only the 36-byte header."""
    t = type(frame)
    if t is RmqMasterTransfer:
        return pack_rocketmq_transfer_header(
            frame.offset, frame.epoch, frame.epoch_start_offset, frame.confirm_offset, len(frame.data)
        )
    where = f"{t.__name__} encode"
    try:
        if t is RmqSlaveAck:
            _check_i64(frame.max_offset, "max_offset", 0, where)
            return _RMQ_ACK.pack(2, frame.max_offset)
        if t is RmqSlaveHandshake:
            return _RMQ_HS_SLAVE.pack(
                1, 1 if frame.sync_from_last_file else 0, 1 if frame.async_learner else 0, frame.broker_id
            )
        if t is RmqMasterHandshake:
            _check_i64(frame.max_offset, "max_offset", 0, where)
            state = int(frame.state)
            if state != 1:
                raise _err(f"master handshake state {state} is not HANDSHAKE (1)", where)
            n = len(frame.entries)
            if n > (INT32_MAX - RMQ_MASTER_HANDSHAKE_SIZE) // RMQ_EPOCH_ENTRY_SIZE:
                raise _err(f"{n} epoch entries do not fit one handshake", where)
            parts = [_RMQ_HS_MASTER.pack(state, n * RMQ_EPOCH_ENTRY_SIZE, frame.max_offset, frame.last_epoch)]
            for e, s in frame.entries:
                _check_i64(s, "epoch start offset", 0, where)
                parts.append(_RMQ_ENTRY.pack(e, s))
            return b"".join(parts)
    except struct.error as exc:
        raise _err(f"field out of range: {exc}", where) from None
    raise ProtocolError(f"encode_rocketmq: {t.__name__} is not a rocketmq frame type")


# --- rocketmq: decode --------------------------------------------------------------------------


def _rmq_need(state: int, buf: Any, pos: int, avail: int, direction: Direction, max_frame_bytes: int,
              where: str) -> int:
    """Total size of the message starting at pos once known, 0 if more bytes are needed."""
    if direction is Direction.SLAVE_TO_MASTER:
        if state == 1:
            return RMQ_SLAVE_HANDSHAKE_SIZE
        if state == 2:
            return RMQ_SLAVE_ACK_SIZE
        raise _err(f"slave state {state} is neither HANDSHAKE (1) nor TRANSFER (2)", where)
    if state == 1:
        hdr = RMQ_MASTER_HANDSHAKE_SIZE
    elif state == 2:
        hdr = RMQ_MASTER_TRANSFER_SIZE
    else:
        raise _err(f"master state {state} is neither HANDSHAKE (1) nor TRANSFER (2)", where)
    if avail < 8:
        return 0
    (body,) = _I32.unpack_from(buf, pos + 4)
    if body < 0 or body > max_frame_bytes - hdr:
        raise _err(f"body size {body} is outside 0..{max_frame_bytes - hdr} (max_frame_bytes {max_frame_bytes})",
                   where)
    if state == 1 and body % RMQ_EPOCH_ENTRY_SIZE:
        raise _err(f"handshake body size {body} is not a multiple of {RMQ_EPOCH_ENTRY_SIZE}", where)
    return hdr + body


def _rmq_message(state: int, buf: Any, p: int, end: int, direction: Direction, where: str,
                 owned: bool = False) -> RocketMQFrame:
    if direction is Direction.SLAVE_TO_MASTER:
        if state == 1:
            _, sync, learner, broker_id = _RMQ_HS_SLAVE.unpack_from(buf, p)
            if sync not in (0, 1) or learner not in (0, 1):
                raise _err(f"handshake flags ({sync}, {learner}) are not 0/1", where)
            return RmqSlaveHandshake(broker_id, sync == 1, learner == 1)
        _, off = _RMQ_ACK.unpack_from(buf, p)
        if off < 0:
            raise _err(f"ack negative max_offset {off}", where)
        return RmqSlaveAck(off)
    if state == 1:
        _, body, mmax, last = _RMQ_HS_MASTER.unpack_from(buf, p)
        if mmax < 0:
            raise _err(f"handshake negative max_offset {mmax}", where)
        entries = []
        for q in range(p + RMQ_MASTER_HANDSHAKE_SIZE, end, RMQ_EPOCH_ENTRY_SIZE):
            e, s = _RMQ_ENTRY.unpack_from(buf, q)
            if s < 0:
                raise _err(f"handshake epoch entry at byte {q} has negative start {s}", where)
            entries.append((e, s))
        return RmqMasterHandshake(mmax, last, tuple(entries), 1)
    _, body, off, epoch, estart, confirm = _RMQ_TRANSFER.unpack_from(buf, p)
    lo = -1 if body == 0 else 0  # RocketMQ heartbeats of an empty master carry -1
    if off < lo or estart < lo or confirm < -1:
        raise _err(f"transfer negative offset (offset {off}, epoch start {estart}, confirm {confirm})", where)
    return RmqMasterTransfer(off, epoch, estart, confirm, _data_of(buf, p + RMQ_MASTER_TRANSFER_SIZE, end, owned))


def decode_rocketmq(buf: Any, direction: Any, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> RocketMQFrame:
    """Decode exactly one whole rocketmq-dialect message sent in ``direction``."""
    max_frame_bytes = _check_max(max_frame_bytes)
    d = Direction(direction)
    n = len(buf)
    where = "rocketmq message at byte 0"
    if n < 4:
        raise _err(f"{n} bytes is shorter than the state field", where)
    (state,) = _I32.unpack_from(buf, 0)
    need = _rmq_need(state, buf, 0, n, d, max_frame_bytes, where)
    if need == 0 or need > n:
        raise _err(f"message needs {need or 8} bytes, {n} given", where)
    if need != n:
        raise _err(f"message is {need} bytes, {n} given", where)
    return _rmq_message(state, buf, 0, n, d, where)


# --- incremental decoders ----------------------------------------------------------------------


class _StreamDecoder(ABC):
    """Shared buffering: whole frames inside a chunk are parsed in place; a frame cut across
    chunks is assembled in a bytearray that never grows beyond the validated frame size."""

    _dialect = ""

    def __init__(self, direction: Any = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = _check_max(max_frame_bytes)
        self._pending = bytearray()
        self._need = 0  # size of the pending frame once its header is known
        self._offset = 0  # stream offset of the first byte not yet consumed into a frame
        self._failed: ProtocolError | None = None
        self._setup(direction)

    @abstractmethod
    def _setup(self, direction: Any) -> None:
        """Each dialect's decoder defines it."""

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._pending)

    @property
    def stream_offset(self) -> int:
        """Stream offset of the first byte of the frame being assembled."""
        return self._offset

    @abstractmethod
    def _size(self, buf: Any, pos: int, avail: int) -> int:
        """Each dialect's decoder defines it."""

    @abstractmethod
    def _frame(self, buf: Any, pos: int, size: int, owned: bool) -> Any:
        """Each dialect's decoder defines it."""

    def feed(self, chunk: Any) -> list[Any]:
        """Frames completed by ``chunk`` (any size, possibly empty), in stream order."""
        if self._failed is not None:
            raise ProtocolError(f"decoder stopped after an earlier error: {self._failed}")
        try:
            return self._feed(chunk)
        except ProtocolError as exc:
            self._failed = exc
            raise

    def _feed(self, chunk: Any) -> list[Any]:
        out: list[Any] = []
        n = len(chunk)
        pos = 0
        pending = self._pending
        while pending:
            # Complete the frame cut at the previous chunk boundary.
            if not self._need:
                self._need = self._size(pending, 0, len(pending))
                if not self._need:
                    take = min(n - pos, self._header_hint() - len(pending))
                    if take <= 0:
                        return out
                    pending += memoryview(chunk)[pos : pos + take]
                    pos += take
                    continue
            take = min(n - pos, self._need - len(pending))
            if take > 0:
                pending += memoryview(chunk)[pos : pos + take]
                pos += take
            if len(pending) < self._need:
                return out
            # Hand the assembled buffer to the frame (its data is a view of it) and start a
            # new one, so the frame's bytes are copied once, from the chunks into it.
            whole = pending
            self._pending = pending = bytearray()
            out.append(self._frame(whole, 0, self._need, True))
            self._offset += self._need
            self._need = 0
        while pos < n:
            size = self._size(chunk, pos, n - pos)
            if not size or size > n - pos:
                pending += memoryview(chunk)[pos:]
                self._need = size
                return out
            out.append(self._frame(chunk, pos, size, False))
            self._offset += size
            pos += size
        return out

    @abstractmethod
    def _header_hint(self) -> int:
        """Each dialect's decoder defines it."""


class FramedDecoder(_StreamDecoder):
    """Incremental decoder of the framed dialect; ``direction`` None accepts every type."""

    _dialect = "framed"

    def _setup(self, direction: Any) -> None:
        self.direction = None if direction is None else Direction(direction)
        self._types = _allowed(direction)

    def _header_hint(self) -> int:
        return HEADER_SIZE

    def _size(self, buf: Any, pos: int, avail: int) -> int:
        if avail < 8:
            return 0
        length, ftype = struct.unpack_from(">ii", buf, pos)
        where = f"framed frame at stream offset {self._offset}"
        _check_framed_header(length, ftype, self._types, self.max_frame_bytes, where)
        return length

    def _frame(self, buf: Any, pos: int, size: int, owned: bool) -> Any:
        _, ftype, ts, epoch = _HDR.unpack_from(buf, pos)
        return _framed_payload(ftype, ts, epoch, buf, pos + HEADER_SIZE, pos + size,
                               f"framed frame at stream offset {self._offset}", owned)


class RocketMQDecoder(_StreamDecoder):
    """Incremental decoder of the rocketmq dialect for one direction."""

    _dialect = "rocketmq"

    def _setup(self, direction: Any) -> None:
        if direction is None:
            raise ValueError("the rocketmq dialect needs a direction (its state 2 means ack or transfer)")
        self.direction = Direction(direction)

    def _header_hint(self) -> int:
        return 8

    def _size(self, buf: Any, pos: int, avail: int) -> int:
        if avail < 4:
            return 0
        (state,) = _I32.unpack_from(buf, pos)
        return _rmq_need(state, buf, pos, avail, self.direction, self.max_frame_bytes,
                         f"rocketmq message at stream offset {self._offset}")

    def _frame(self, buf: Any, pos: int, size: int, owned: bool) -> Any:
        (state,) = _I32.unpack_from(buf, pos)
        return _rmq_message(state, buf, pos, pos + size, self.direction,
                            f"rocketmq message at stream offset {self._offset}", owned)
