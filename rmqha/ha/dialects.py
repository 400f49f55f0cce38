"""The two HA wire dialects seen through one small interface each for master and slave.

:mod:`rmqha.ha.frames` owns the byte layouts; this module maps its frame types onto the few
events the replication logic needs, so :mod:`rmqha.ha.master` and :mod:`rmqha.ha.slave`
are written once for both dialects:

* slave -> master: :class:`SlaveHello`, :class:`EpochQuery`, :class:`TruncateConfirm`,
  :class:`Ack` (in the ``rocketmq`` dialect the first report after the handshake plays
  the part of CONFIRM_TRUNCATE);
* master -> slave: :class:`MasterHello`, :class:`EpochList`, :class:`Block`.

On an authenticated plaintext link (framed only) the codec seals what it encodes and checks
the tag of every frame it decodes (:meth:`_Codec.authenticate`, :mod:`rmqha.ha.frame_mac`);
block headers are left to their sender, whose tag follows the block's data.  An
authenticated TLS link is framed too, its frames bare (:mod:`rmqha.ha.auth`).

Refusals: the ``framed`` dialect carries a reason code (:class:`RefuseReason`, sent as
HANDSHAKE_MASTER check_result); the ``rocketmq`` dialect has no field for it, so the
master logs the reason and closes.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from rmqha.errors import ProtocolError
from rmqha.ha import frames as _frames
from rmqha.ha.auth import Proof
from rmqha.ha.frame_mac import FrameMac, FrameUnsealer
from rmqha.security.identity import Identity

fr: Any = _frames
M2S = fr.Direction.MASTER_TO_SLAVE
S2M = fr.Direction.SLAVE_TO_MASTER


class RefuseReason(IntEnum):
    """HANDSHAKE_MASTER check_result codes (0 accepts; values 1-4 are rmqha.ha.frames.CheckResult)."""

    ACCEPTED = 0
    PROTOCOL_NOT_SUPPORTED = 1
    IDENTITY_MISMATCH = 2  # not of this group / id unknown to the controller
    NOT_MASTER = 3
    REFUSED = 4
    SEGMENT_SIZE_MISMATCH = 5
    STALE_MASTER_EPOCH = 6  # the slave holds a newer epoch than this master
    SAME_BROKER_ID = 7  # the "slave" claims the master's own id


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- events ----------------------------------------------------------------------------------


@dataclass(slots=True)
class SlaveHello:
    broker_id: int
    sync_from_last_file: bool
    async_learner: bool
    segment_bytes: int | None  # None: the dialect does not carry it
    address: str
    epoch: int | None  # the slave's last epoch, when the dialect carries it


@dataclass(slots=True)
class EpochQuery:
    pass


@dataclass(slots=True)
class TruncateConfirm:
    offset: int


@dataclass(slots=True)
class Ack:
    offset: int
    epoch: int | None


@dataclass(slots=True)
class MasterHello:
    result: int
    max_offset: int
    last_epoch: int
    #: rocketmq sends the (epoch, start) pairs in the handshake; framed leaves this None.
    pairs: tuple[tuple[int, int], ...] | None


@dataclass(slots=True)
class EpochList:
    entries: tuple[tuple[int, int, int], ...]


@dataclass(slots=True)
class Block:
    epoch: int
    epoch_start: int
    offset: int
    confirm: int
    data: Any  # memoryview/bytes; empty = heartbeat


class _Codec(ABC):
    """Decoding shared by both ends: frames of the peer's direction mapped to events.

    A subclass names its decoder and ``_EVENTS`` (frame type -> event builder); a frame
    type missing from the table is one the peer must not send.
    """

    name = ""
    epoch_exchange = False
    #: Words for the error: what the dialect calls a frame, and who may send the ones read.
    _unit = "frame"
    _sender = ""
    _EVENTS: dict[type, Any] = {}

    def __init__(self, max_frame_bytes: int, decoder: Any) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._dec = decoder
        #: The link's frame MAC once authenticated (None: frames travel bare).
        self.mac: FrameMac | None = None
        #: Who the peer proved to be with the cluster secret (None: not authenticated).
        self.peer: Identity | None = None
        self._unsealer: FrameUnsealer | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame the decoder (or the tag checker) holds."""
        return int(self._dec.buffered) + (self._unsealer.buffered if self._unsealer is not None else 0)

    def authenticate(self, proof: Proof) -> None:
        """The link is authenticated: with a MAC, from now on seal every frame encoded and
        check every frame decoded (without, over TLS, frames stay bare)."""
        if self.name != "framed":
            raise ProtocolError(f"the {self.name} dialect cannot carry authenticated frames")
        self.peer = proof.peer
        self.mac = proof.mac
        if proof.mac is not None:
            self._unsealer = FrameUnsealer(proof.mac, self.max_frame_bytes)

    def _seal(self, frame: bytes) -> bytes:
        return frame if self.mac is None else self.mac.seal(frame)

    def take_unparsed(self) -> bytes:
        """Bytes of an incomplete sealed frame held back, handed over to another reader."""
        return self._unsealer.take_buffered() if self._unsealer is not None else b""

    def feed(self, chunk: bytes) -> list[Any]:
        out: list[Any] = []
        events = self._EVENTS
        for f in self._decode(chunk):
            build = events.get(type(f))
            if build is None:  # for framed the decoder's direction check makes this unreachable
                raise ProtocolError(f"{self._unit} {type(f).__name__} is not sent by a {self._sender}")
            out.append(build(f))
        return out

    def _decode(self, chunk: bytes) -> list[Any]:
        if self._unsealer is None:
            return self._dec.feed(chunk)
        decoded: list[Any] = []
        for frame in self._unsealer.feed(chunk):
            decoded.extend(self._dec.feed(frame))
        return decoded


# --- master side -----------------------------------------------------------------------------


class MasterCodec(_Codec):
    """What a master reads from and writes to one slave, in one dialect."""

    #: Whether the slave sends QUERY_EPOCH / CONFIRM_TRUNCATE (framed) or gets the epochs in
    #: the handshake and answers with its first report (rocketmq).
    epoch_exchange = False
    _sender = "slave"

    @abstractmethod
    def hello(self, result: int, max_offset: int, last_epoch: int, pairs: list[tuple[int, int]]) -> bytes | None:
        """Encode this message in the dialect."""

    @abstractmethod
    def epochs(self, entries: list[tuple[int, int, int]], epoch: int) -> bytes:
        """Encode this message in the dialect."""

    @abstractmethod
    def block_header(self, epoch: int, epoch_start: int, offset: int, confirm: int, size: int) -> bytes:
        """Encode this message in the dialect."""


class FramedMaster(MasterCodec):
    name = "framed"
    epoch_exchange = True

    _EVENTS = {
        fr.TransferAck: lambda f: Ack(f.slave_max_offset, f.epoch),
        fr.HandshakeSlave: lambda f: SlaveHello(f.broker_id, f.sync_from_last_file, f.async_learner,
                                                f.segment_bytes, f.address, f.epoch),
        fr.QueryEpoch: lambda f: EpochQuery(),
        fr.ConfirmTruncate: lambda f: TruncateConfirm(f.offset),
    }

    def __init__(self, max_frame_bytes: int) -> None:
        super().__init__(max_frame_bytes, fr.FramedDecoder(S2M, max_frame_bytes))
        self._pack = fr.pack_transfer_header

    def hello(self, result: int, max_offset: int, last_epoch: int, pairs: list[tuple[int, int]]) -> bytes:
        return self._seal(fr.framed.encode(
            fr.HandshakeMaster(int(result), max_offset, last_epoch, _now_ms(), last_epoch)
        ))

    def epochs(self, entries: list[tuple[int, int, int]], epoch: int) -> bytes:
        return self._seal(fr.framed.encode(fr.ReturnEpoch(tuple(entries), _now_ms(), epoch)))

    def block_header(self, epoch: int, epoch_start: int, offset: int, confirm: int, size: int) -> bytes:
        return self._pack(offset, epoch_start, confirm, size, epoch, _now_ms())


class RocketMQMaster(MasterCodec):
    name = "rocketmq"
    epoch_exchange = False

    _unit = "message"
    _EVENTS = {
        fr.RmqSlaveAck: lambda f: Ack(f.max_offset, None),
        fr.RmqSlaveHandshake: lambda f: SlaveHello(f.broker_id, f.sync_from_last_file, f.async_learner,
                                                   None, "", None),
    }

    def __init__(self, max_frame_bytes: int) -> None:
        super().__init__(max_frame_bytes, fr.RocketMQDecoder(S2M, max_frame_bytes))
        self._pack = fr.pack_rocketmq_transfer_header

    def hello(self, result: int, max_offset: int, last_epoch: int, pairs: list[tuple[int, int]]) -> bytes | None:
        if result != RefuseReason.ACCEPTED:
            return None  # no field for a reason: the master logs it and closes
        return fr.rocketmq.encode(fr.RmqMasterHandshake(max_offset, last_epoch, tuple(pairs), 1))

    def epochs(self, entries: list[tuple[int, int, int]], epoch: int) -> bytes:
        raise ProtocolError("the rocketmq dialect has no epoch query")

    def block_header(self, epoch: int, epoch_start: int, offset: int, confirm: int, size: int) -> bytes:
        return self._pack(offset, epoch, epoch_start, confirm, size)


def master_codec(first4: bytes, max_frame_bytes: int) -> MasterCodec:
    """The codec for a connection whose first four bytes are ``first4`` (ProtocolError if neither)."""
    dialect = fr.detect_dialect(first4)
    if dialect is fr.Dialect.ROCKETMQ:
        return RocketMQMaster(max_frame_bytes)
    return FramedMaster(max_frame_bytes)


# --- slave side ------------------------------------------------------------------------------


class SlaveCodec(_Codec):
    """What a slave writes to and reads from its master, in one dialect."""

    _sender = "master"

    @abstractmethod
    def hello(self, broker_id: int, segment_bytes: int, address: str, sync_from_last_file: bool,
              async_learner: bool, epoch: int) -> bytes:
        """Encode this message in the dialect."""

    @abstractmethod
    def query_epoch(self, epoch: int) -> bytes:
        """Encode this message in the dialect."""

    @abstractmethod
    def confirm(self, offset: int, epoch: int) -> bytes:
        """Encode this message in the dialect."""

    @abstractmethod
    def ack(self, offset: int, epoch: int) -> bytes:
        """Encode this message in the dialect."""


class FramedSlave(SlaveCodec):
    name = "framed"
    epoch_exchange = True

    _EVENTS = {
        fr.TransferData: lambda f: Block(f.epoch, f.epoch_start_offset, f.block_start_offset, f.confirm_offset,
                                         f.data),
        fr.HandshakeMaster: lambda f: MasterHello(f.check_result, f.master_max_offset, f.master_last_epoch, None),
        fr.ReturnEpoch: lambda f: EpochList(tuple(f.entries)),
    }

    def __init__(self, max_frame_bytes: int) -> None:
        super().__init__(max_frame_bytes, fr.FramedDecoder(M2S, max_frame_bytes))

    def hello(self, broker_id: int, segment_bytes: int, address: str, sync_from_last_file: bool,
              async_learner: bool, epoch: int) -> bytes:
        return self._seal(fr.framed.encode(fr.HandshakeSlave(
            broker_id, segment_bytes, address, sync_from_last_file, async_learner, _now_ms(), epoch
        )))

    def query_epoch(self, epoch: int) -> bytes:
        return self._seal(fr.framed.encode(fr.QueryEpoch(_now_ms(), epoch)))

    def confirm(self, offset: int, epoch: int) -> bytes:
        return self._seal(fr.framed.encode(fr.ConfirmTruncate(offset, _now_ms(), epoch)))

    def ack(self, offset: int, epoch: int) -> bytes:
        return self._seal(fr.pack_transfer_ack(offset, _now_ms(), epoch))


class RocketMQSlave(SlaveCodec):
    name = "rocketmq"
    epoch_exchange = False

    _unit = "message"
    _EVENTS = {
        fr.RmqMasterTransfer: lambda f: Block(f.epoch, f.epoch_start_offset, f.offset, f.confirm_offset, f.data),
        fr.RmqMasterHandshake: lambda f: MasterHello(RefuseReason.ACCEPTED, f.max_offset, f.last_epoch,
                                                     tuple(f.entries)),
    }

    def __init__(self, max_frame_bytes: int) -> None:
        super().__init__(max_frame_bytes, fr.RocketMQDecoder(M2S, max_frame_bytes))

    def hello(self, broker_id: int, segment_bytes: int, address: str, sync_from_last_file: bool,
              async_learner: bool, epoch: int) -> bytes:
        return fr.rocketmq.encode(fr.RmqSlaveHandshake(broker_id, sync_from_last_file, async_learner))

    def query_epoch(self, epoch: int) -> bytes:
        raise ProtocolError("the rocketmq dialect has no epoch query")

    def confirm(self, offset: int, epoch: int) -> bytes:
        return fr.rocketmq.encode(fr.RmqSlaveAck(offset))

    def ack(self, offset: int, epoch: int) -> bytes:
        return fr.rocketmq.encode(fr.RmqSlaveAck(offset))


def slave_codec(protocol: str, max_frame_bytes: int) -> SlaveCodec:
    if protocol == "rocketmq":
        return RocketMQSlave(max_frame_bytes)
    if protocol == "framed":
        return FramedSlave(max_frame_bytes)
    raise ProtocolError(f"unknown HA protocol {protocol!r}")
