"""Types of the compiled twin ``rmqha._core.frames`` (frames.pyx); the API is frames_py's.

The frame dataclasses and enums are frames_py's own (the compiled twin imports them);
TRANSFER_DATA and the incremental decoders are extension types of this twin.  Checked
against :class:`rmqha._core._protocols.FramesTwin` by mypy.
"""
from array import array
from typing import Any, final

from typing_extensions import disjoint_base

from rmqha._core.frames_py import DEFAULT_MAX_FRAME_BYTES as DEFAULT_MAX_FRAME_BYTES
from rmqha._core.frames_py import HEADER_SIZE as HEADER_SIZE
from rmqha._core.frames_py import MASTER_TO_SLAVE_TYPES as MASTER_TO_SLAVE_TYPES
from rmqha._core.frames_py import RETURN_EPOCH_ENTRY_SIZE as RETURN_EPOCH_ENTRY_SIZE
from rmqha._core.frames_py import RMQ_EPOCH_ENTRY_SIZE as RMQ_EPOCH_ENTRY_SIZE
from rmqha._core.frames_py import RMQ_MASTER_HANDSHAKE_SIZE as RMQ_MASTER_HANDSHAKE_SIZE
from rmqha._core.frames_py import RMQ_MASTER_TRANSFER_SIZE as RMQ_MASTER_TRANSFER_SIZE
from rmqha._core.frames_py import RMQ_SLAVE_ACK_SIZE as RMQ_SLAVE_ACK_SIZE
from rmqha._core.frames_py import RMQ_SLAVE_HANDSHAKE_SIZE as RMQ_SLAVE_HANDSHAKE_SIZE
from rmqha._core.frames_py import SLAVE_TO_MASTER_TYPES as SLAVE_TO_MASTER_TYPES
from rmqha._core.frames_py import TRANSFER_HEADER_SIZE as TRANSFER_HEADER_SIZE
from rmqha._core.frames_py import CheckResult as CheckResult
from rmqha._core.frames_py import ConfirmTruncate as ConfirmTruncate
from rmqha._core.frames_py import ConnectionState as ConnectionState
from rmqha._core.frames_py import Dialect as Dialect
from rmqha._core.frames_py import Direction as Direction
from rmqha._core.frames_py import FrameType as FrameType
from rmqha._core.frames_py import HandshakeMaster as HandshakeMaster
from rmqha._core.frames_py import HandshakeSlave as HandshakeSlave
from rmqha._core.frames_py import QueryEpoch as QueryEpoch
from rmqha._core.frames_py import ReturnEpoch as ReturnEpoch
from rmqha._core.frames_py import RmqMasterHandshake as RmqMasterHandshake
from rmqha._core.frames_py import RmqMasterTransfer as RmqMasterTransfer
from rmqha._core.frames_py import RmqSlaveAck as RmqSlaveAck
from rmqha._core.frames_py import RmqSlaveHandshake as RmqSlaveHandshake
from rmqha._core.frames_py import TransferAck as TransferAck
from rmqha.errors import ProtocolError as ProtocolError

@final
class TransferData:
    """A block of the log; ``epoch`` (envelope) is the block's own epoch; empty data = heartbeat.

    Compares equal to ``frames_py.TransferData`` with the same fields."""

    __match_args__ = ("block_start_offset", "epoch_start_offset", "confirm_offset", "data", "timestamp_ms",
                      "epoch")

    block_start_offset: int
    epoch_start_offset: int
    confirm_offset: int
    data: Any
    timestamp_ms: int
    epoch: int
    def __init__(self, block_start_offset: int, epoch_start_offset: int, confirm_offset: int,
                 data: Any = ..., timestamp_ms: int = ..., epoch: int = ...) -> None: ...

@disjoint_base
class _StreamDecoder:
    @property
    def max_frame_bytes(self) -> int: ...
    @property
    def direction(self) -> Direction | None: ...
    def __init__(self, direction: Any = ..., max_frame_bytes: int = ...) -> None: ...
    @property
    def buffered(self) -> int: ...
    @property
    def stream_offset(self) -> int: ...
    def feed(self, chunk: Any) -> list[Any]: ...

class FramedDecoder(_StreamDecoder):
    """Incremental decoder of the framed dialect; ``direction`` None accepts every type."""

class RocketMQDecoder(_StreamDecoder):
    """Incremental decoder of the rocketmq dialect for one direction."""

def detect_dialect(first4: Any) -> str: ...
def pack_transfer_header(block_start_offset: int, epoch_start_offset: int, confirm_offset: int, data_len: int,
                         epoch: int, timestamp_ms: int = ...) -> bytes: ...
def unpack_transfer_header(buf: Any, pos: int = ...) -> tuple[int, int, int, int, int, int]: ...
def pack_transfer_headers(block_starts: Any, epoch_starts: Any, confirm_offsets: Any, data_lens: Any,
                          epochs: Any, timestamps: Any) -> bytes: ...
def unpack_transfer_headers(buf: Any) -> tuple[array[int], array[int], array[int], array[int], array[int],
                                               array[int]]: ...
def encode_framed(frame: Any) -> bytes: ...

RUN_END: int
RUN_PARTIAL: int
RUN_OTHER: int

def pack_transfer_ack(slave_max_offset: Any, timestamp_ms: Any, epoch: Any) -> bytes: ...
def scan_transfer_acks(buf: Any, tag_bytes: int, acked: int, sent: int, last_epoch: int) -> tuple[int, int]: ...
def scan_transfer_run(buf: Any, start: int, end: int, max_frame_bytes: Any, tag_bytes: int, log_end: int,
                      epoch: int, epoch_start: int, segment_bytes: int) -> tuple[int, array[int], int, int]: ...
def decode_framed(buf: Any, direction: Any = ..., max_frame_bytes: int = ...) -> Any: ...
def pack_rocketmq_transfer_header(offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int,
                                  body_size: int) -> bytes: ...
def pack_rocketmq_transfer_headers(offsets: Any, epochs: Any, epoch_starts: Any, confirm_offsets: Any,
                                   body_sizes: Any) -> bytes: ...
def encode_rocketmq(frame: Any) -> bytes: ...
def decode_rocketmq(buf: Any, direction: Any, max_frame_bytes: int = ...) -> Any: ...
