"""Both halves of the HA handshake, in one place: what each side says before the transfer.

Master (:class:`MasterHandshake`), for one accepted connection:

1. :meth:`~MasterHandshake.introduce`: the first four bytes tell the dialect; read the
   slave's hello and judge it (its id is not the master's own, the controller knows it as
   a replica of this group, same segment size, no newer epoch than the master's); a
   refusal is answered (framed: with its reason) and logged, and ends the connection;
2. the owner claims the slave's id for this link (:class:`rmqha.ha.link_table.LinkTable`);
3. :meth:`~MasterHandshake.agree`: accept, then the epoch exchange (framed: QUERY_EPOCH,
   RETURN_EPOCH, CONFIRM_TRUNCATE; rocketmq: the epochs ride in the hello and the slave's
   first report confirms), giving the offset the slave holds;
4. :meth:`~MasterHandshake.transfer_start`: where the transfer starts (an empty slave:
   the master's min offset or its last segment's start; a slave behind the min offset:
   the min offset, which tells it to drop its log).

Slave (:class:`SlaveHandshake`): hello, the master's answer (a refusal, or a master with
an older epoch than this slave's, ends the session), the master's epoch entries; then,
once the session cut its log at the consistent point, the confirm of where it holds.

Authentication of HA links (:mod:`rmqha.ha.auth`) goes in front of both: on the master
between the accept and :meth:`MasterHandshake.introduce` (:meth:`rmqha.ha.acceptor.Acceptor.serve`),
on the slave between the connect and :meth:`SlaveHandshake.introduce`
(:meth:`rmqha.ha.slave_session.SlaveSession.run`); each gets the :class:`Link` before any
frame of the handshake is read or written, and on an authenticated plaintext link the
codecs seal and check every frame of the handshake too.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rmqha.errors import ProtocolError, ReplicationError
from rmqha.ha.auth import Proof
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import (
    Ack,
    EpochList,
    EpochQuery,
    FramedMaster,
    MasterCodec,
    MasterHello,
    RefuseReason,
    SlaveCodec,
    SlaveHello,
    TruncateConfirm,
    master_codec,
)
from rmqha.ha.link import Link
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.protocol.request_auth import RefusalLog
from rmqha.store.epoch_map import EpochMap

# The master half logs under the master side's one name (operators filter on it).
log = logging.getLogger("rmqha.ha.master")

#: Whether the controller knows a broker id as a replica of this group (may be awaitable).
KnownReplica = Callable[[int], "bool | Awaitable[bool]"]


async def _read(link: Link, codec: Any, pending: list[Any], timeout: float) -> Any:
    """The next frame, from ``pending`` or the link."""
    while not pending:
        pending.extend(codec.feed(await link.recv(timeout)))
    return pending.pop(0)


# --- master half ---------------------------------------------------------------------------------


@dataclass
class Introduction:
    """An accepted slave hello: the dialect, what the slave said, the master's answer,
    and frames that came behind the hello."""

    codec: MasterCodec
    hello: SlaveHello
    reply: bytes | None
    pending: list[Any] = field(default_factory=list)


class MasterHandshake:
    """The master's half, for every connection to one master."""

    def __init__(self, commitlog: ReplicatedLog, epoch_map: EpochMap, config: HAConfig, *, group: str, broker_id: int,
                 is_known_replica: KnownReplica | None) -> None:
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.config = config
        self.group = group
        self.broker_id = broker_id
        self._is_known = is_known_replica
        self._timeout = config.ha_housekeeping_interval_ms / 1000
        #: Refused hellos, logged at most once per reason per period.
        self.refusals = RefusalLog(log)

    @property
    def timeout(self) -> float:
        """How long the master waits for each message of a slave's handshake."""
        return self._timeout

    async def introduce(self, link: Link, head: bytes = b"", proof: Proof | None = None) -> Introduction | None:
        """Read and judge the slave's hello; None when refused (answered and logged).
        ``head``: bytes of the hello read already; ``proof``: the link authenticated (then
        the dialect is framed, every frame sealed unless over TLS)."""
        if proof is None:
            while len(head) < 4:
                head += await link.recv(self._timeout)
        codec = self._codec(head, proof)
        pending: list[Any] = list(codec.feed(head))
        hello = await _read(link, codec, pending, self._timeout)
        if not isinstance(hello, SlaveHello):
            raise ProtocolError(f"expected a slave handshake first, got {type(hello).__name__}")
        reason, why = await self._judge(hello)
        max_offset = self.commitlog.max_offset
        self.epoch_map.set_max_offset(max_offset)
        reply = codec.hello(reason, max_offset, self.epoch_map.last_epoch(), self.epoch_map.pairs())
        if reason != RefuseReason.ACCEPTED:
            self.refusals.warn((reason, why), "refusing HA slave %d from %s (%s): %s", hello.broker_id, link.peer,
                               codec.name, why)
            if reply is not None:
                await link.send([reply], self._timeout)
            return None
        return Introduction(codec, hello, reply, pending)

    def _codec(self, head: bytes, proof: Proof | None) -> MasterCodec:
        """The dialect of the link: framed (and sealed, in plaintext) once authenticated,
        else told by the hello's first four bytes."""
        if proof is None:
            return master_codec(head[:4], self.config.max_frame_bytes)
        codec = FramedMaster(self.config.max_frame_bytes)
        codec.authenticate(proof)
        return codec

    async def agree(self, link: Link, intro: Introduction) -> int:
        """Accept the slave and exchange epochs; the offset the slave says it holds."""
        codec, pending, timeout = intro.codec, intro.pending, self._timeout
        await link.send([intro.reply], timeout)
        if not codec.epoch_exchange:
            report = await _read(link, codec, pending, timeout)
            if not isinstance(report, Ack):
                raise ProtocolError(f"expected the slave's first report, got {type(report).__name__}")
            return report.offset
        query = await _read(link, codec, pending, timeout)
        if not isinstance(query, EpochQuery):
            raise ProtocolError(f"expected QUERY_EPOCH, got {type(query).__name__}")
        entries = self._entries(self.commitlog.max_offset)
        await link.send([codec.epochs(entries, self.epoch_map.last_epoch())], timeout)
        confirm = await _read(link, codec, pending, timeout)
        if not isinstance(confirm, TruncateConfirm):
            raise ProtocolError(f"expected CONFIRM_TRUNCATE, got {type(confirm).__name__}")
        return confirm.offset

    async def _judge(self, hello: SlaveHello) -> tuple[int, str]:
        if hello.broker_id == self.broker_id:
            return RefuseReason.SAME_BROKER_ID, f"slave claims the master's own id {hello.broker_id}"
        known = True
        if self._is_known is not None:
            res = self._is_known(hello.broker_id)
            known = bool(await res) if inspect.isawaitable(res) else bool(res)
        if not known:
            return RefuseReason.IDENTITY_MISMATCH, (
                f"broker id {hello.broker_id} is not a replica of group {self.group} known to the controller"
            )
        seg = self.commitlog.segment_bytes
        if hello.segment_bytes is not None and hello.segment_bytes != seg:
            return RefuseReason.SEGMENT_SIZE_MISMATCH, (
                f"slave segment size {hello.segment_bytes} differs from the master's {seg}"
            )
        last = self.epoch_map.last_epoch()
        if hello.epoch is not None and hello.epoch > last:
            return RefuseReason.STALE_MASTER_EPOCH, (
                f"slave holds epoch {hello.epoch}, newer than this master's {last}"
            )
        return RefuseReason.ACCEPTED, ""

    def _entries(self, max_offset: int) -> list[tuple[int, int, int]]:
        entries = self.epoch_map.entries()
        if entries:
            e, s, _ = entries[-1]
            entries[-1] = (e, s, max(max_offset, s))
        return entries

    def transfer_start(self, hello: SlaveHello, offset: int) -> int:
        """Where the transfer to a slave that holds ``offset`` starts."""
        cl = self.commitlog
        min_offset = cl.min_offset
        max_offset = cl.max_offset
        if offset == 0:
            # An empty slave: the master's first byte, or its last segment's first byte.
            if hello.sync_from_last_file:
                return max(max_offset - max_offset % cl.segment_bytes, min_offset)
            return min_offset
        if offset > max_offset:
            raise ReplicationError(
                f"slave {hello.broker_id} reports offset {offset} beyond the master's max offset {max_offset}"
            )
        if offset < min_offset:
            # The bytes in between are gone here (retention): the slave cannot continue its
            # log.  Its first block then starts beyond its end, at this segment-aligned
            # offset, which tells it to drop its log and start over there (a slave accepts
            # that jump only as the first block of a session).
            log.warning(
                "HA slave %d reports offset %d below this master's min offset %d: sending from %d; "
                "the slave drops its log", hello.broker_id, offset, min_offset, min_offset
            )
            return min_offset
        return offset


# --- slave half ----------------------------------------------------------------------------------


@dataclass
class Identity:
    """What a slave says of itself in its hello."""

    broker_id: int
    address: str
    sync_from_last_file: bool
    async_learner: bool


class SlaveHandshake:
    """The slave's half, on one link: ``on_read`` / ``on_write`` are told of every read and
    write (the session's housekeeping clocks)."""

    def __init__(self, link: Link, codec: SlaveCodec, master: str, timeout: float,
                 on_read: Callable[[], None], on_write: Callable[[], None]) -> None:
        self.link = link
        self.codec = codec
        self.master = master
        self._timeout = timeout
        self._on_read = on_read
        self._on_write = on_write
        #: Frames that came behind the handshake's (the first blocks, maybe).
        self.pending: list[Any] = []

    async def introduce(self, me: Identity, segment_bytes: int,
                        epoch: int) -> tuple[MasterHello, list[tuple[int, int, int]]]:
        """Say hello; the master's answer and its epoch entries (epoch, start, end)."""
        codec = self.codec
        await self._send(codec.hello(me.broker_id, segment_bytes, me.address, me.sync_from_last_file,
                                     me.async_learner, epoch))
        hello = await self._next()
        if not isinstance(hello, MasterHello):
            raise ProtocolError(f"expected the master handshake, got {type(hello).__name__}")
        self._check_answer(hello, epoch)
        if codec.epoch_exchange:
            await self._send(codec.query_epoch(epoch))
            answer = await self._next()
            if not isinstance(answer, EpochList):
                raise ProtocolError(f"expected RETURN_EPOCH, got {type(answer).__name__}")
            entries = list(answer.entries)
        else:
            pairs = hello.pairs or ()
            entries = [
                (e, s, pairs[i + 1][1] if i + 1 < len(pairs) else hello.max_offset)
                for i, (e, s) in enumerate(pairs)
            ]
        check_entries(entries, hello.max_offset)
        return hello, entries

    def _check_answer(self, hello: MasterHello, epoch: int) -> None:
        if hello.result != RefuseReason.ACCEPTED:
            try:
                name = RefuseReason(hello.result).name
            except ValueError:
                name = f"code {hello.result}"
            raise ReplicationError(f"master {self.master} refused this slave: {name}")
        if hello.last_epoch < epoch:
            raise ReplicationError(
                f"master {self.master} is at epoch {hello.last_epoch}, older than this slave's "
                f"{epoch}: not following a stale master"
            )

    async def confirm(self, offset: int, epoch: int) -> None:
        """Tell the master where this log holds (after the cut): the transfer starts."""
        await self._send(self.codec.confirm(offset, epoch))

    async def _send(self, frame: bytes) -> None:
        await self.link.send([frame], self._timeout)
        self._on_write()

    async def _next(self) -> Any:
        while not self.pending:
            self.pending.extend(self.codec.feed(await self.link.recv(self._timeout)))
            self._on_read()
        return self.pending.pop(0)


def check_entries(entries: list[tuple[int, int, int]], master_max: int) -> None:
    """The master's epoch entries must be ordered (else a bad frame); the last end may have
    grown past the handshake's max offset while the exchange ran."""
    prev_epoch = -1
    prev_start = -1
    for e, s, end in entries:
        if e <= prev_epoch or s < prev_start or end < s:
            raise ProtocolError(f"master epoch entries are not ordered: {entries[:8]!r}")
        prev_epoch, prev_start = e, s
