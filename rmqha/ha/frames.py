"""HA wire frames of both dialects (``rmqha.ha.frames``), backed by the selected twin.

This module owns the public face of the frames hot path: the frame dataclasses and enums, the two
dialect codecs :data:`framed` and :data:`rocketmq` (``encode``, ``encode_parts``, ``decode``,
``decoder``), dialect detection from a connection's first four bytes, and the single and
batched TRANSFER_DATA header helpers.  Byte layouts are documented in
``rmqha._core.frames_py``; the compiled twin ``rmqha._core.frames`` is used when it imports.

Sending a block without copying it::

    header = frames.framed.encode(frame)            # TransferData: header only
    sock.sendmsg([header, log_view])                # scatter/gather with the mmap view

Receiving::

    dec = frames.framed.decoder(frames.Direction.MASTER_TO_SLAVE, max_frame_bytes=...)
    for frame in dec.feed(sock.recv(1 << 16)):
        ...                                         # ProtocolError: close the connection
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rmqha import _core
from rmqha._core._protocols import FramesTwin
from rmqha._core.frames_py import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    RETURN_EPOCH_ENTRY_SIZE,
    RMQ_EPOCH_ENTRY_SIZE,
    RMQ_MASTER_HANDSHAKE_SIZE,
    RMQ_MASTER_TRANSFER_SIZE,
    RMQ_SLAVE_ACK_SIZE,
    RMQ_SLAVE_HANDSHAKE_SIZE,
    TRANSFER_HEADER_SIZE,
    CheckResult,
    ConfirmTruncate,
    ConnectionState,
    Dialect,
    Direction,
    FramedFrame,
    FrameType,
    HandshakeMaster,
    HandshakeSlave,
    QueryEpoch,
    ReturnEpoch,
    RmqMasterHandshake,
    RmqMasterTransfer,
    RmqSlaveAck,
    RmqSlaveHandshake,
    RocketMQFrame,
    TransferAck,
)

_impl: FramesTwin = _core.load("frames")

#: The TRANSFER_DATA frame type of the twin in use: the decoders return it, so
#: ``type(frame) is TransferData`` holds for decoded frames.  The compiled twin's type
#: behaves as the dataclass (fields, ``__match_args__``, equality with either, repr), and
#: both twins encode either.
TransferData = _impl.TransferData

pack_transfer_header = _impl.pack_transfer_header
unpack_transfer_header = _impl.unpack_transfer_header
pack_transfer_headers = _impl.pack_transfer_headers
unpack_transfer_headers = _impl.unpack_transfer_headers
pack_rocketmq_transfer_header = _impl.pack_rocketmq_transfer_header
pack_rocketmq_transfer_headers = _impl.pack_rocketmq_transfer_headers
scan_transfer_run = _impl.scan_transfer_run
scan_transfer_acks = _impl.scan_transfer_acks
pack_transfer_ack = _impl.pack_transfer_ack
#: What stopped ``scan_transfer_run`` (see ``rmqha._core.frames_py``).
RUN_END: int = _impl.RUN_END
RUN_PARTIAL: int = _impl.RUN_PARTIAL
RUN_OTHER: int = _impl.RUN_OTHER
FramedDecoder = _impl.FramedDecoder
RocketMQDecoder = _impl.RocketMQDecoder


def detect_dialect(first4: bytes) -> Dialect:
    """The dialect a connection speaks, from its first four bytes (ProtocolError if neither)."""
    return Dialect(_impl.detect_dialect(first4))


class DialectCodec:
    """encode/decode/decoder of one dialect, bound to a twin (default: the one in use).

    A codec bound to a named twin decodes TRANSFER_DATA to that twin's ``TransferData``
    (``rmqha._core.frames_py.TransferData`` for "python"); the two types compare equal.
    """

    def __init__(self, dialect: Dialect, implementation: str | None = None) -> None:
        mod = _impl if implementation is None else _core.load_twin("frames", implementation)
        self.dialect = dialect
        self._mod = mod
        # Both decoders are called (buf, direction, max_frame_bytes); only rocketmq's needs
        # the direction, so their signatures differ in its default.
        self._decode: Callable[[Any, Any, int], Any]
        if dialect is Dialect.FRAMED:
            self._encode = mod.encode_framed
            self._decode = mod.decode_framed
            self._decoder = mod.FramedDecoder
        else:
            self._encode = mod.encode_rocketmq
            self._decode = mod.decode_rocketmq
            self._decoder = mod.RocketMQDecoder

    def encode(self, frame: Any) -> bytes:
        """Bytes of ``frame``; for a data frame only its header (send the data right after)."""
        return self._encode(frame)

    def encode_parts(self, frame: Any) -> list[Any]:
        """Buffers to send in order, for ``socket.sendmsg``: [header] or [header, data]."""
        header = self._encode(frame)
        data = getattr(frame, "data", None)
        return [header, data] if data is not None and len(data) else [header]

    def decode(self, buf: Any, direction: Direction | None = None,
               max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
        """Decode one whole frame (the rocketmq dialect needs the direction)."""
        if self.dialect is Dialect.ROCKETMQ:
            if direction is None:
                raise ValueError("the rocketmq dialect needs a direction to decode")
            return self._decode(buf, direction, max_frame_bytes)
        return self._decode(buf, direction, max_frame_bytes)

    def decoder(self, direction: Direction | None = None,
                max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
        """A new incremental decoder: ``feed(chunk) -> list[frame]``."""
        return self._decoder(direction, max_frame_bytes)

    def __repr__(self) -> str:
        return f"DialectCodec({self.dialect.value!r}, {self._mod.__name__})"


#: The default dialect: rmqha's own framing (layouts in rmqha._core.frames_py).
framed = DialectCodec(Dialect.FRAMED)
#: RocketMQ 5 AutoSwitch HA, byte-compatible.
rocketmq = DialectCodec(Dialect.ROCKETMQ)


def codec(dialect: Dialect | str, implementation: str | None = None) -> DialectCodec:
    """The codec of a dialect by name, optionally bound to a named twin."""
    return DialectCodec(Dialect(dialect), implementation)


__all__ = [
    "CheckResult", "ConfirmTruncate", "ConnectionState", "DEFAULT_MAX_FRAME_BYTES", "Dialect",
    "DialectCodec", "Direction", "FrameType", "FramedDecoder", "FramedFrame", "HEADER_SIZE",
    "HandshakeMaster", "HandshakeSlave", "QueryEpoch", "RETURN_EPOCH_ENTRY_SIZE",
    "RMQ_EPOCH_ENTRY_SIZE", "RMQ_MASTER_HANDSHAKE_SIZE", "RMQ_MASTER_TRANSFER_SIZE",
    "RMQ_SLAVE_ACK_SIZE", "RMQ_SLAVE_HANDSHAKE_SIZE", "ReturnEpoch", "RmqMasterHandshake",
    "RmqMasterTransfer", "RmqSlaveAck", "RmqSlaveHandshake", "RocketMQDecoder", "RocketMQFrame",
    "TRANSFER_HEADER_SIZE", "TransferAck", "TransferData", "codec", "detect_dialect", "framed",
    "pack_rocketmq_transfer_header", "pack_rocketmq_transfer_headers", "pack_transfer_header", "pack_transfer_headers", "rocketmq",
    "unpack_transfer_header", "unpack_transfer_headers", "RUN_END", "RUN_PARTIAL", "RUN_OTHER",
    "scan_transfer_run", "scan_transfer_acks", "pack_transfer_ack",
]
