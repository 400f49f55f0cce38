"""The HA frames' types, shared by both twins of ``frames`` (:mod:`rmqha._core.frames_py` and
the compiled ``rmqha._core.frames``, which both return these objects): the frame types,
connection states, directions, dialects and check results, the byte sizes of each layout,
and one dataclass per frame of each dialect. The layouts themselves, the codecs and the
decoders are :mod:`rmqha._core.frames_py`'s, which names all of these too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Union

# --- enums and sizes -------------------------------------------------------------------------


class FrameType(IntEnum):
    """Types of the ``framed`` dialect."""

    HANDSHAKE_SLAVE = 1
    HANDSHAKE_MASTER = 2
    QUERY_EPOCH = 3
    RETURN_EPOCH = 4
    CONFIRM_TRUNCATE = 5
    TRANSFER_DATA = 6
    TRANSFER_ACK = 7


class ConnectionState(IntEnum):
    """HAConnectionState; the ordinal is the ``state`` int of the rocketmq dialect."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


class Direction(IntEnum):
    """Which side sends the frames a decoder reads."""

    MASTER_TO_SLAVE = 1
    SLAVE_TO_MASTER = 2


class Dialect(str, Enum):
    FRAMED = "framed"
    ROCKETMQ = "rocketmq"


class CheckResult(IntEnum):
    """check_result of HANDSHAKE_MASTER: 0 accepts, anything else names the refusal."""

    ACCEPTED = 0
    PROTOCOL_NOT_SUPPORTED = 1
    IDENTITY_MISMATCH = 2
    NOT_MASTER = 3
    REFUSED = 4


HEADER_SIZE = 24
TRANSFER_HEADER_SIZE = 48
RETURN_EPOCH_ENTRY_SIZE = 20
RMQ_SLAVE_HANDSHAKE_SIZE = 16
RMQ_SLAVE_ACK_SIZE = 12
RMQ_MASTER_HANDSHAKE_SIZE = 20
RMQ_MASTER_TRANSFER_SIZE = 36
RMQ_EPOCH_ENTRY_SIZE = 12
#: Default bound of one frame (header included); a larger announced length is an error.
DEFAULT_MAX_FRAME_BYTES = 16 << 20

MASTER_TO_SLAVE_TYPES = frozenset({2, 4, 6})
SLAVE_TO_MASTER_TYPES = frozenset({1, 3, 5, 7})

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1

# --- frame dataclasses -------------------------------------------------------------------------
# Envelope fields (timestamp_ms, epoch) come last with defaults so callers name payload fields.


@dataclass(slots=True)
class HandshakeSlave:
    broker_id: int
    segment_bytes: int
    address: str
    sync_from_last_file: bool = False
    async_learner: bool = False
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class HandshakeMaster:
    check_result: int
    master_max_offset: int
    master_last_epoch: int
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class QueryEpoch:
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class ReturnEpoch:
    entries: tuple[tuple[int, int, int], ...] = ()
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class ConfirmTruncate:
    offset: int
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class TransferData:
    """A block of the log; ``epoch`` (envelope) is the block's own epoch; empty data = heartbeat."""

    block_start_offset: int
    epoch_start_offset: int
    confirm_offset: int
    data: Any = b""
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class TransferAck:
    slave_max_offset: int
    timestamp_ms: int = 0
    epoch: int = 0


@dataclass(slots=True)
class RmqSlaveHandshake:
    broker_id: int
    sync_from_last_file: bool = False
    async_learner: bool = False


@dataclass(slots=True)
class RmqSlaveAck:
    max_offset: int


@dataclass(slots=True)
class RmqMasterHandshake:
    max_offset: int
    last_epoch: int
    entries: tuple[tuple[int, int], ...] = field(default=())
    state: int = ConnectionState.HANDSHAKE


@dataclass(slots=True)
class RmqMasterTransfer:
    offset: int
    epoch: int
    epoch_start_offset: int
    confirm_offset: int
    data: Any = b""


FramedFrame = Union[
    HandshakeSlave, HandshakeMaster, QueryEpoch, ReturnEpoch, ConfirmTruncate, TransferData, TransferAck
]
RocketMQFrame = Union[RmqSlaveHandshake, RmqSlaveAck, RmqMasterHandshake, RmqMasterTransfer]
