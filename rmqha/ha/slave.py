"""The slave side of HA replication (:class:`HASlave`): connect, truncate, receive, ack.

One :class:`HASlave` keeps this broker's commitlog a byte-for-byte prefix of its master's.
It walks these connection states (RocketMQ's ``HAConnectionState``):

* READY: the store is recovered and the master's HA address known; connect (with backoff);
* HANDSHAKE: introduce itself (group id, segment size, flags, last epoch), get the master's
  epoch entries, find the consistent point, cut the commitlog and the epoch map there
  (flushed, so a crash after the cut cannot bring the tail back, RocketMQ #10666), tell the
  master where to send from;
* TRANSFER: append every block at exactly the log's max offset (anything else closes the
  link; large blocks are received straight into the commitlog's mapping and validated
  before they count), record a new epoch entry when a block's epoch changes (written off
  the transfer path; acks wait for it), ack the max offset, keep the master's confirm
  offset; SUSPEND once caught up (heartbeats only).  Live traffic (one small block at a
  time, each on the critical path of an acknowledged send) is applied and acked by a
  reader callback in the loop turn that finds it, not by the session's task, which takes
  the link back for catch-up and for whatever needs awaiting.  In the ``rocketmq``
  dialect the chunk that ends an epoch may come labelled with the next epoch (RocketMQ's
  master switches before building the header): exactly that is accepted.  A first block
  beyond this log's end, at a segment start, means retention on the master removed what
  followed it: the log is dropped (bytes logged) and restarts there;
* SHUTDOWN after :meth:`HASlave.stop`.

Every bad frame closes the link with a logged reason, and nothing of it becomes part of
the log: headers are checked before a byte is stored, records before max_offset moves (a
body already received into the mapping is zeroed again).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time
from collections.abc import Callable
from concurrent.futures import CancelledError as JobCancelled
from concurrent.futures import Future, ThreadPoolExecutor
from enum import Enum
from typing import Any

from rmqha.errors import EpochError, ProtocolError, ReplicationError, StoreError
from rmqha.failpoints import Failpoint, hit
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import Block, EpochList, FramedSlave, MasterHello, RefuseReason, SlaveCodec, fr, slave_codec
from rmqha.ha.link import Link, LinkClosed, LinkTimeout, RecvBuffer, connect

log = logging.getLogger(__name__)

#: During bulk catch-up the slave acks at least this often (in bytes received).
_ACK_EVERY_BYTES = 8 << 20
#: Reads in a row without a suspension before the receive loop lets other tasks run.
_TURNS_BEFORE_YIELD = 16
#: Receive buffer of the framed transfer path (grows for a frame larger than this).
_RECV_BUFFER_BYTES = 4 << 20
#: A block at least this large that is not wholly buffered yet is received straight into
#: the commitlog's mapping (smaller ones, the live-traffic case, go through the buffer).
_DIRECT_MIN_BYTES = 64 << 10
#: What a direct receive may read beyond its block: the next header and a little of its
#: body (copied from the buffer into the log, so kept small).
_DIRECT_OVERFLOW_BYTES = 4 << 10
#: While receiving a block straight into the log, wake up for at least this much of it.
_DIRECT_WAKE_BYTES = 256 << 10
_PEEK = struct.Struct(">ii")  # length and type of a framed frame, to bound it before it is read
#: The block's start offset inside a TRANSFER_DATA header (length, type, timestamp, epoch, ...).
_BLOCK_OFFSET = struct.Struct(">q")
_BLOCK_OFFSET_AT = 24
_TRANSFER_DATA = int(fr.FrameType.TRANSFER_DATA)


class SlaveState(str, Enum):
    """HAConnectionState of the slave's link."""

    READY = "READY"
    HANDSHAKE = "HANDSHAKE"
    TRANSFER = "TRANSFER"
    SUSPEND = "SUSPEND"
    SHUTDOWN = "SHUTDOWN"


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ReplicationError(f"master HA address {address!r} is not host:port")
    return host or "127.0.0.1", int(port)


class HASlave:
    """Replicates the master at ``master_ha_address`` into ``commitlog`` and ``epoch_map``."""

    def __init__(
        self,
        commitlog: Any,
        epoch_map: Any,
        *,
        group: str,
        broker_id: int,
        master_ha_address: str,
        config: HAConfig | None = None,
        async_learner: bool = False,
        protocol: str | None = None,
        on_confirm: Callable[[int], Any] | None = None,
        on_truncate: Callable[[int], Any] | None = None,
        address: str = "",
    ) -> None:
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.group = group
        self.broker_id = int(broker_id)
        self.config = config or HAConfig()
        self.async_learner = async_learner
        self.protocol = protocol or self.config.ha_protocol
        slave_codec(self.protocol, self.config.max_frame_bytes)  # validates the name now
        self.address = address
        self._master = master_ha_address
        self._on_confirm = on_confirm
        self._on_truncate = on_truncate
        self._state = SlaveState.READY
        self._confirm = 0
        #: The confirm offset on_confirm was last told of: it hears of an advance only after
        #: the ack that follows the block (the ack is what a waiting send needs; what the
        #: broker does with a confirm offset is not).
        self._confirm_told = 0
        self._task: asyncio.Task[None] | None = None
        self._link: Link | None = None
        self._stopped = False
        self._kick: asyncio.Event | None = None
        #: Statistics for status() and tests.
        self.sessions = 0
        self.last_error = ""
        self.last_truncate: int | None = None
        self.bytes_dropped = 0
        #: Blocks received straight into the commitlog's mapping (framed dialect, large blocks).
        self.direct_receives = 0
        #: Blocks (heartbeats included) applied by the transfer's reader callback (:meth:`_live`)
        #: and by its task; how often the callback handed the link back to the task.
        self.callback_blocks = 0
        self.task_blocks = 0
        self.handbacks = 0
        self.master_max_offset = -1
        self._last_read = 0.0
        self._last_write = 0.0
        #: The offset of the last ack handed to the link in this session.
        self._acked = 0
        #: What the socket did not take of an ack the reader callback sent (the task sends it).
        self._unsent_ack: list[memoryview] = []
        self._transferring = False
        #: No data block applied yet in this session (the only time a jump is accepted).
        self._first_block = False
        #: Epoch entries being written by the worker, in order: ((epoch, start), future).
        self._epoch_jobs: list[tuple[tuple[int, int], Future[None]]] = []
        self._epoch_writer: ThreadPoolExecutor | None = None
        self._epoch_failed: BaseException | None = None
        #: The master's (epoch, start) entries from this session's handshake.
        self._master_pairs: list[tuple[int, int]] = []

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._kick = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopped = True
        if self._link is not None:
            self._link.close()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._task = None
        self._settle_epochs_now()
        if self._epoch_writer is not None:
            self._epoch_writer.shutdown(wait=True)
            self._epoch_writer = None
        self._state = SlaveState.SHUTDOWN
        log.info("HA slave %d stopped", self.broker_id)

    # --- public state ------------------------------------------------------------------------

    @property
    def state(self) -> SlaveState:
        return self._state

    @property
    def confirm_offset(self) -> int:
        """The master's confirm offset, never above this log's max offset."""
        return min(self._confirm, self.commitlog.max_offset)

    @property
    def master_ha_address(self) -> str:
        return self._master

    def set_master_address(self, address: str) -> None:
        """Follow a (new) master: the current link is closed and the next one goes there."""
        if address == self._master:
            return
        self._master = address
        if self._link is not None:
            self._link.close()
        if self._kick is not None:
            self._kick.set()

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "role": "slave",
            "group": self.group,
            "broker_id": self.broker_id,
            "master_address": self._master,
            "protocol": self.protocol,
            "async_learner": self.async_learner,
            "state": self._state.value,
            "max_offset": self.commitlog.max_offset,
            "confirm_offset": self.confirm_offset,
            "master_max_offset": self.master_max_offset,
            "epoch": self.epoch_map.last_epoch(),
            "sessions": self.sessions,
            "last_error": self.last_error,
            "last_truncate": self.last_truncate,
            "last_read_ms_ago": int((now - self._last_read) * 1000) if self._last_read else None,
            "last_write_ms_ago": int((now - self._last_write) * 1000) if self._last_write else None,
            "bytes_received": self._link.bytes_in if self._link is not None else 0,
        }

    # --- connection loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        cfg = self.config
        backoff = cfg.ha_reconnect_min_ms
        while not self._stopped:
            self._state = SlaveState.READY
            self._transferring = False
            start_max = self.commitlog.max_offset
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (LinkClosed, LinkTimeout, ProtocolError, ReplicationError, EpochError, StoreError,
                    OSError, asyncio.TimeoutError) as exc:
                if not self._stopped:
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    level = logging.INFO if isinstance(exc, (LinkClosed, ConnectionRefusedError)) else logging.WARNING
                    log.log(level, "HA link to %s closed: %s", self._master, self.last_error)
            finally:
                if self._link is not None:
                    self._link.close()
                    self._link = None
                self._settle_epochs_now()
                # What the last blocks confirmed, whether or not their ack got out.
                self._tell_confirm()
            if self._stopped:
                break
            if self._transferring or self.commitlog.max_offset != start_max:
                backoff = cfg.ha_reconnect_min_ms  # the link worked: retry soon
            self._state = SlaveState.READY
            assert self._kick is not None
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), backoff / 1000)
            except asyncio.TimeoutError:
                pass
            backoff = min(backoff * 2, cfg.ha_reconnect_max_ms)

    async def _next(self, link: Link, codec: SlaveCodec, pending: list[Any], timeout: float) -> Any:
        while not pending:
            pending.extend(codec.feed(await link.recv(timeout)))
            self._last_read = time.monotonic()
        return pending.pop(0)

    async def _session(self) -> None:
        cfg = self.config
        cl = self.commitlog
        em = self.epoch_map
        timeout = cfg.ha_housekeeping_interval_ms / 1000
        host, port = _split_address(self._master)
        sock = await connect(host, port, cfg.ha_connect_timeout_ms / 1000)
        link = self._link = Link(sock)
        codec = slave_codec(self.protocol, cfg.max_frame_bytes)
        self.sessions += 1
        self._state = SlaveState.HANDSHAKE
        await self._send(link, codec.hello(self.broker_id, cl.segment_bytes, self.address,
                                           cfg.sync_from_last_file, self.async_learner, em.last_epoch()))
        pending: list[Any] = []
        hello = await self._next(link, codec, pending, timeout)
        if not isinstance(hello, MasterHello):
            raise ProtocolError(f"expected the master handshake, got {type(hello).__name__}")
        if hello.result != RefuseReason.ACCEPTED:
            try:
                name = RefuseReason(hello.result).name
            except ValueError:
                name = f"code {hello.result}"
            raise ReplicationError(f"master {self._master} refused this slave: {name}")
        if hello.last_epoch < em.last_epoch():
            raise ReplicationError(
                f"master {self._master} is at epoch {hello.last_epoch}, older than this slave's "
                f"{em.last_epoch()}: not following a stale master"
            )
        self.master_max_offset = hello.max_offset
        if codec.epoch_exchange:
            await self._send(link, codec.query_epoch(em.last_epoch()))
            answer = await self._next(link, codec, pending, timeout)
            if not isinstance(answer, EpochList):
                raise ProtocolError(f"expected RETURN_EPOCH, got {type(answer).__name__}")
            entries = list(answer.entries)
        else:
            pairs = hello.pairs or ()
            entries = [
                (e, s, pairs[i + 1][1] if i + 1 < len(pairs) else hello.max_offset)
                for i, (e, s) in enumerate(pairs)
            ]
        _check_entries(entries, hello.max_offset)
        self._master_pairs = [(e, s) for e, s, _ in entries]
        offset = self._truncate(entries)
        await self._send(link, codec.confirm(offset, em.last_epoch()))
        self._state = SlaveState.TRANSFER
        self._transferring = True
        self._first_block = True
        log.info("HA slave %d following %s (%s) from offset %d, master max %d",
                 self.broker_id, self._master, codec.name, offset, hello.max_offset)
        await self._transfer(link, codec, pending)

    async def _send(self, link: Link, *buffers: bytes | memoryview) -> None:
        await link.send(buffers, self.config.ha_housekeeping_interval_ms / 1000)
        self._last_write = time.monotonic()

    # --- truncation ------------------------------------------------------------------------------

    def _truncate(self, remote: list[tuple[int, int, int]]) -> int:
        """Cut this log at the consistent point with ``remote``; the offset to receive from."""
        cl = self.commitlog
        em = self.epoch_map
        local_max = cl.max_offset
        local_min = cl.min_offset
        if local_max <= local_min:
            if len(em):
                em.clear()  # entries describing no bytes would only confuse the next check
            self._lower_confirm(local_max)
            # 0 = "empty": the master picks its min offset or its last segment's start.
            return 0 if local_max == 0 else local_max
        if len(em) == 0:
            # Data but no epochs (RocketMQ skipped truncation here): nothing proves
            # any byte matches the master, so nothing is in common.
            point = -1
        else:
            em.set_max_offset(local_max)
            point = em.find_consistent_point(remote)
            em.set_max_offset(None)
        if point < 0 or point < local_min:
            dropped = local_max - local_min
            log.warning("HA slave %d shares no history with master %s: dropping its whole log "
                        "(%d bytes, offsets %d..%d)", self.broker_id, self._master, dropped, local_min, local_max)
            start = self._drop_log()
            self.bytes_dropped += dropped
            self._after_truncate(start)
            return start
        if point < local_max:
            log.warning("HA slave %d truncating at %d: dropping %d bytes the master %s does not have "
                        "(local max %d)", self.broker_id, point, local_max - point, self._master, local_max)
            cl.truncate(point)
            hit(Failpoint.AFTER_TRUNCATE)
            em.truncate_suffix(point)
            cl.flush()
            self.bytes_dropped += local_max - point
            self._after_truncate(point)
        else:
            # Epochs that start at the cut hold no data; drop those the master does not
            # have (same epoch, same start) so the master's next epoch can be recorded.
            shared = {(e, s) for e, s, _ in remote}
            last = em.last_entry()
            while last is not None and last[1] >= point and (last[0], last[1]) not in shared:
                em.truncate_suffix_by_epoch(last[0])
                last = em.last_entry()
        return point

    def _drop_log(self, start: int = 0) -> int:
        """Empty the log (and the epoch map), to start over at ``start`` (segment-aligned;
        0 = "empty": the master then picks where); returns where the empty log starts."""
        cl = self.commitlog
        self.epoch_map.clear()
        cl.truncate(cl.min_offset)
        reset = getattr(cl, "reset", None)
        if reset is not None and cl.max_offset != start:
            reset(start)
        cl.flush()
        return cl.max_offset

    def _after_truncate(self, offset: int) -> None:
        self.last_truncate = offset
        self._lower_confirm(offset)
        if self._on_truncate is not None:
            self._on_truncate(offset)

    def _lower_confirm(self, offset: int) -> None:
        if self._confirm > offset:
            self._confirm = offset
        if self._confirm_told > offset:
            self._confirm_told = offset

    def _tell_confirm(self) -> None:
        """Give on_confirm the confirm offset the blocks applied so far carried, if it
        advanced since it was last told."""
        confirm = self._confirm
        if confirm > self._confirm_told:
            self._confirm_told = confirm
            if self._on_confirm is not None:
                self._on_confirm(confirm)

    # --- transfer --------------------------------------------------------------------------------

    async def _transfer_framed(self, link: Link, codec: SlaveCodec, pending: list[Any]) -> None:
        """TRANSFER in the framed dialect, parsed in place.

        Blocks wholly in the receive buffer (small ones: live traffic) go to the commitlog
        with ``append_data`` (validated in the buffer, one pwrite); a large block still
        arriving is received straight into the commitlog's mapping (:meth:`_receive_direct`),
        the bulk catch-up case: one copy, kernel to page cache.

        Once the stream pauses, a reader callback takes over (:meth:`_live`): live traffic
        is one small block at a time, each on the critical path of an acknowledged send,
        and the callback applies and acks it in the loop turn that finds it readable,
        where this task would cost a future, a timer, a wake-up and two failed reads per
        block.  The callback hands the link back for whatever needs awaiting or is
        unusual; this task then carries on from what the callback left in the buffer."""
        cfg = self.config
        cl = self.commitlog
        heartbeat = cfg.ha_send_heartbeat_interval_ms / 1000
        housekeeping = cfg.ha_housekeeping_interval_ms / 1000
        header = fr.TRANSFER_HEADER_SIZE
        rb = RecvBuffer(_RECV_BUFFER_BYTES)
        # A flush before every ack needs awaiting: the callback would hand back every block.
        step = None if cfg.ha_slave_flush_before_ack else functools.partial(self._live_step, link, codec, rb)
        # Nothing acked yet this session: the first pause tells the master where this log
        # ends at once, so a caught-up slave rejoins the SyncStateSet now rather than at
        # its first heartbeat (a new master whose min_in_sync_replicas needs it
        # acknowledges nothing until then).
        self._acked = -1
        self._unsent_ack = []
        if pending:
            self._apply(pending)
            self.task_blocks += len(pending)
            pending.clear()
        self._last_read = time.monotonic()
        limit: int | None = None
        turns = 0
        # Bytes a direct receive read past its block, not parsed yet: they may hold whole
        # frames, which must not wait for more data to arrive.
        unparsed = False
        while True:
            # What is queued already, without waiting: during bulk catch-up the socket
            # always has more, and acks wait (every _ACK_EVERY_BYTES) so that neither side
            # spends a syscall and a wake-up per read on them.  After a block received
            # straight into the log, read little: the next one most likely goes there too.
            got = rb.try_fill(link, limit) > 0 or unparsed
            unparsed = False
            now = time.monotonic()
            if not got:
                # The stream paused: tell the master where this log ends before waiting
                # (live traffic is acked at once; that is what moves the confirm offset).
                mx = cl.max_offset
                if mx != self._acked:
                    await self._ack(link, codec, mx)
                    now = time.monotonic()
                self._tell_confirm()
                wait = min(heartbeat - (now - self._last_write), housekeeping - (now - self._last_read))
                if wait > 0:
                    if step is not None:
                        # Handed back: what the callback left in the buffer is this task's.
                        got = await self._live(link, step, heartbeat, housekeeping)
                    else:
                        try:
                            await rb.fill(link, wait)
                            got = True
                        except LinkTimeout:
                            pass
                    if got:
                        turns = 0
                now = time.monotonic()
            if got:
                self._last_read = now
                blocks, partial = self._take_blocks(rb)
                if blocks:
                    limit = None
                    self.task_blocks += len(blocks)
                need = partial
                if partial - header >= _DIRECT_MIN_BYTES:
                    # A large block needs only its header buffered: once it is, and the
                    # pages it lands on are warm, the rest goes straight into the log.
                    need = header
                    if rb.pending >= header and self._warm_target(rb, partial - header):
                        self._apply_views(blocks)
                        await self._receive_direct(link, rb, housekeeping)
                        self.task_blocks += 1
                        unparsed = rb.pending > 0
                        rb.filled = True  # bulk catch-up: acks wait (_ACK_EVERY_BYTES)
                        limit = _DIRECT_OVERFLOW_BYTES
                        blocks = []
                        need = 0  # acks and other tasks get their turn between blocks
                self._apply_views(blocks)
                if need:
                    # Only now: moving the partial frame overwrites the blocks just applied.
                    rb.make_room(need)
            elif now - self._last_read >= housekeeping:
                raise LinkTimeout(f"master {self._master} silent for {housekeeping:.1f}s")
            mx = cl.max_offset
            # A read that left room drained the socket: live traffic, whose ack is what a
            # waiting send needs, so it goes now rather than after another loop turn.
            # The heartbeat interval bounds the silence either way (the master's housekeeping).
            acked = self._acked
            if (mx != acked and (got and not rb.filled or mx - acked >= _ACK_EVERY_BYTES)
                    or now - self._last_write >= heartbeat):
                await self._ack(link, codec, mx)
            self._tell_confirm()
            # recv and send do not suspend while data flows: let other tasks run.
            turns += 1
            if rb.filled or turns >= _TURNS_BEFORE_YIELD:
                turns = 0
                await asyncio.sleep(0)

    async def _live(self, link: Link, step: Callable[[], bool], heartbeat: float, housekeeping: float) -> bool:
        """Let ``step`` handle the link from a reader callback, in each loop turn that finds
        data queued.  Returns True once ``step`` hands the link back (it returned False),
        False when a heartbeat or the housekeeping timeout is due (the caller sends or
        raises it); what ``step`` raises is raised here, as if this task had read the frame.

        One future per call, not per block: in live traffic this task sleeps while the
        callback works, and wakes only for a heartbeat or to take the link back."""

        def on_readable() -> None:
            try:
                if step():
                    return
            except Exception as exc:  # noqa: BLE001 - whatever it is, the task raises it
                link.unwatch()
                if not ended.done():
                    ended.set_exception(exc)
                return
            link.unwatch()
            self.handbacks += 1
            if not ended.done():
                ended.set_result(None)

        ended = link.watch(on_readable)
        try:
            while True:
                now = time.monotonic()
                # The callback moves both marks: sleep on until one is really due.
                wait = min(heartbeat - (now - self._last_write), housekeeping - (now - self._last_read))
                if wait <= 0:
                    return False
                done, _ = await asyncio.wait((ended,), timeout=wait)
                if done:
                    ended.result()
                    break
        finally:
            link.unwatch()
            if not ended.done():
                ended.cancel()  # a later close of the link then has nobody to tell
            elif not ended.cancelled():
                ended.exception()  # retrieved: raised above, or nothing
        if self._unsent_ack:
            rest, self._unsent_ack = self._unsent_ack, []
            await self._send(link, *rest)
        return True

    def _live_step(self, link: Link, codec: SlaveCodec, rb: RecvBuffer) -> bool:
        """The reader callback of :meth:`_live` (framed dialect): read what is queued, apply
        the whole blocks, ack.  False hands the link back to the task: a large block on its
        way (received straight into the log), a read that filled the buffer (catch-up),
        an ack that needs awaiting or did not fit the socket.  Every error is raised before
        anything of the frame is stored, as on the task's path (the same code)."""
        if rb.try_fill(link) == 0:
            return True  # readiness without data; the level-triggered loop calls again
        self._last_read = time.monotonic()
        blocks, partial = self._take_blocks(rb)
        if blocks:
            self._apply_views(blocks)
            self.callback_blocks += len(blocks)
        if rb.filled or partial - fr.TRANSFER_HEADER_SIZE >= _DIRECT_MIN_BYTES:
            return False
        if partial:
            rb.make_room(partial)  # a small block in pieces: the rest comes in a later turn
        return self._try_ack(link, codec)

    def _live_step_stream(self, link: Link, codec: SlaveCodec) -> bool:
        """The reader callback of :meth:`_live` for the decoding path (the rocketmq dialect):
        what is queued goes through the codec, the blocks to the log, then the ack.  False
        hands the link back as :meth:`_live_step` does (a full read: catch-up)."""
        chunk = link.try_recv()
        if not chunk:
            return True  # readiness without data; the level-triggered loop calls again
        self._last_read = time.monotonic()
        blocks = codec.feed(chunk)
        if blocks:
            self._apply(blocks)
            self.callback_blocks += len(blocks)
        if len(chunk) >= link.recv_bytes:
            return False
        return self._try_ack(link, codec)

    def _try_ack(self, link: Link, codec: SlaveCodec) -> bool:
        """Ack this log's max offset, if it moved, without waiting, then tell on_confirm;
        False when the task must do it or finish it: an epoch entry still being written
        (acks wait for it), a flush before the ack, or a socket that took only part (the
        rest is in ``_unsent_ack``, and nothing else may be sent before it)."""
        cl = self.commitlog
        mx = cl.max_offset
        if mx != self._acked:
            if self._epoch_jobs or (self.config.ha_slave_flush_before_ack and cl.flushed_offset < mx):
                return False
            rest = link.try_send([self._ack_frame(codec, mx)])
            self._acked = mx
            if rest:
                self._unsent_ack = rest
                return False
            self._last_write = time.monotonic()
        self._tell_confirm()
        return True

    def _take_blocks(self, rb: RecvBuffer) -> tuple[list[Block], int]:
        """The whole TRANSFER_DATA frames at the front of ``rb``, consumed from it, as blocks
        whose data are views of the buffer (apply them, then release the views: the
        buffer cannot move or grow while they exist), and the length of the incomplete
        frame left at the front (0: none, or too little of it to know).  Any other frame,
        or a length out of bounds, is a ProtocolError before any block is applied."""
        header = fr.TRANSFER_HEADER_SIZE
        max_frame = self.config.max_frame_bytes
        unpack = fr.unpack_transfer_header
        blocks: list[Block] = []
        while rb.pending >= 8:
            length, ftype = _PEEK.unpack_from(rb.buf, rb.start)
            if ftype != _TRANSFER_DATA:
                raise ProtocolError(f"frame type {ftype} where only TRANSFER_DATA (6) may come")
            if length < header or length > max_frame:
                raise ProtocolError(
                    f"TRANSFER_DATA length {length} is outside {header}..{max_frame} (max_frame_bytes)"
                )
            if rb.pending < length:
                return blocks, length
            block, estart, confirm, size, epoch, _ = unpack(rb.buf, rb.start)
            body = rb.start + header
            blocks.append(Block(epoch, estart, block, confirm, rb.view[body : body + size]))
            rb.consume(length)
        return blocks, 0

    def _warm_target(self, rb: RecvBuffer, size: int) -> bool:
        """Whether the block whose header is at the front of ``rb`` lands on log pages that
        are in memory already.  Receiving into pages not faulted in yet (the commitlog's
        warm-up is behind) costs a fault and a zero-fill per page; the buffer path and
        one pwrite then cost less."""
        offset = _BLOCK_OFFSET.unpack_from(rb.buf, rb.start + _BLOCK_OFFSET_AT)[0]
        warm = getattr(self.commitlog, "tail_is_warm", None)
        return warm is None or warm(offset, size)

    async def _receive_direct(self, link: Link, rb: RecvBuffer, timeout: float) -> None:
        """Receive the block whose header (and maybe some body) is buffered in ``rb``
        straight into the commitlog's mapping, then validate and commit it.

        The header is checked before a byte is stored.  The kernel copies the body from
        the socket into the (prefaulted) segment pages, the one copy on this side; bytes
        after the body (the next header, at most _DIRECT_OVERFLOW_BYTES) land in ``rb``.
        A bad record is zeroed by the commitlog, a link lost mid-block zeroes what came.
        """
        cl = self.commitlog
        header = fr.TRANSFER_HEADER_SIZE
        self.direct_receives += 1
        offset, estart, confirm, size, epoch, _ = fr.unpack_transfer_header(rb.buf, rb.start)
        b = Block(epoch, estart, offset, confirm, None)
        new_epoch = self._check_block(b, size)
        view = cl.receive_view(offset, size)
        have = rb.pending - header
        start = rb.start + header
        view[:have] = rb.view[start : start + have]
        rb.consume(rb.pending)
        overflow = rb.view[:_DIRECT_OVERFLOW_BYTES]
        committed = False
        lowat = 1
        try:
            while have < size:
                n = link.try_recvmsg_into([view[have:], overflow])
                if n == 0:
                    # Wake up once a good part of the rest is queued, not for every
                    # segment: each wake-up costs more Python than copying 100 KiB.
                    want = min(size - have, _DIRECT_WAKE_BYTES)
                    if want != lowat:
                        lowat = link.set_rcvlowat(want)
                    try:
                        await link.wait_readable(timeout)
                    except LinkTimeout:
                        raise LinkTimeout(f"master {self._master} silent for {timeout:.1f}s "
                                          f"in the middle of a block") from None
                    continue
                took = min(n, size - have)
                have += took
                rb.end = n - took
            self._last_read = time.monotonic()
            # Flushing before the ack is _ack's business (ha_slave_flush_before_ack).
            cl.commit_received(offset, size, wait_flush=False)
            committed = True
        finally:
            if lowat != 1:
                link.set_rcvlowat(1)
            overflow.release()
            view.release()
            if not committed and have:
                cl.discard_received(offset, have)
        self._block_done(b, size, new_epoch)

    async def _transfer(self, link: Link, codec: SlaveCodec, pending: list[Any]) -> None:
        if isinstance(codec, FramedSlave) and codec.buffered == 0:
            await self._transfer_framed(link, codec, pending)
            return
        cfg = self.config
        cl = self.commitlog
        heartbeat = cfg.ha_send_heartbeat_interval_ms / 1000
        housekeeping = cfg.ha_housekeeping_interval_ms / 1000
        # As on the framed path: live traffic is read, applied and acked by a reader
        # callback (:meth:`_live`) while the last read drained the socket.
        step = None if cfg.ha_slave_flush_before_ack else functools.partial(self._live_step_stream, link, codec)
        self._acked = -1  # as on the framed path: the first pause acks at once
        self._unsent_ack = []
        if pending:
            self._apply(pending)
            self.task_blocks += len(pending)
            pending.clear()
        self._last_read = time.monotonic()
        drained = True
        while True:
            now = time.monotonic()
            wait = min(heartbeat - (now - self._last_write), housekeeping - (now - self._last_read))
            chunk = b""
            if wait > 0:
                if step is not None and drained:
                    # Handed back (catch-up, or an ack to await): read here until it drains.
                    drained = not await self._live(link, step, heartbeat, housekeeping)
                else:
                    try:
                        chunk = await link.recv(wait)
                    except LinkTimeout:
                        pass
            now = time.monotonic()
            if chunk:
                self._last_read = now
                drained = len(chunk) < link.recv_bytes
                blocks = codec.feed(chunk)
                if blocks:
                    self._apply(blocks)
                    self.task_blocks += len(blocks)
            elif now - self._last_read >= housekeeping:
                raise LinkTimeout(f"master {self._master} silent for {housekeeping:.1f}s")
            mx = cl.max_offset
            # A full read means more is already queued (bulk catch-up): ack every few MiB
            # instead of every read; otherwise (live traffic) ack at once for the confirm offset.
            acked = self._acked
            behind = len(chunk) >= link.recv_bytes and mx - acked < _ACK_EVERY_BYTES
            if (mx != acked and not behind) or now - self._last_write >= heartbeat:
                await self._ack(link, codec, mx)
            self._tell_confirm()
            # recv() and send() do not suspend while data flows: let other tasks run.
            await asyncio.sleep(0)

    def _apply(self, blocks: list[Any]) -> None:
        cl = self.commitlog
        for b in blocks:
            if type(b) is not Block:
                raise ProtocolError(f"unexpected {type(b).__name__} during transfer")
            size = len(b.data)
            new_epoch = self._check_block(b, size)
            if size:
                # Data first: the commitlog validates the records and undoes a bad block, and
                # an epoch entry missing after a crash only makes the next handshake cut
                # back to the previous epoch's end (safe), never the reverse.
                cl.append_data(b.offset, b.data, wait_flush=False)
            self._block_done(b, size, new_epoch)

    def _apply_views(self, blocks: list[Block]) -> None:
        """:meth:`_apply` blocks whose data are views of the receive buffer, then release
        those views so the buffer can be reused."""
        if blocks:
            self._apply(blocks)
            for b in blocks:
                b.data.release()

    def _check_block(self, b: Block, size: int) -> bool:
        """Refuse (ProtocolError) a block that cannot continue this log, before any of it
        is stored; start an empty log where the block says when allowed.  True when the
        block opens a new epoch."""
        cl = self.commitlog
        seg_bytes = cl.segment_bytes
        mx = cl.max_offset
        last_epoch = self._last_epoch()
        if size == 0 and b.offset == -1:
            pass  # a RocketMQ master with an empty log heartbeats at -1
        else:
            if b.offset != mx:
                if self._may_restart(b, size):
                    self._restart_at(b.offset)
                    mx = cl.max_offset
                    last_epoch = self._last_epoch()
                elif not self._may_rebase(b.offset, size):
                    raise ProtocolError(
                        f"block at offset {b.offset} ({size} bytes) does not start at this "
                        f"slave's max offset {mx}"
                    )
            if b.epoch < last_epoch:
                raise ProtocolError(f"block epoch {b.epoch} is older than this slave's epoch {last_epoch}")
            if b.epoch_start > b.offset and not self._ends_epoch_early_label(b, size, last_epoch):
                raise ProtocolError(f"block at {b.offset} claims its epoch {b.epoch} starts later, at {b.epoch_start}")
        if not size:
            return self._announces_epoch(b, mx, last_epoch)
        end = b.offset + size
        seg_end = b.offset - b.offset % seg_bytes + seg_bytes
        if end > seg_end:
            raise ProtocolError(f"block {b.offset}..{end} crosses the segment end {seg_end}")
        last = self._last_entry()
        new_epoch = b.epoch > last_epoch
        if new_epoch:
            if last is not None and b.epoch_start < last[1]:
                raise ProtocolError(
                    f"block epoch {b.epoch} starts at {b.epoch_start}, before the last epoch's start {last[1]}"
                )
        elif last is not None and last[1] != b.epoch_start:
            raise ProtocolError(
                f"block epoch {b.epoch} starts at {b.epoch_start} but this slave has it at {last[1]}"
            )
        if b.offset != mx:
            self._rebase(b.offset)
        return new_epoch

    def _block_done(self, b: Block, size: int, new_epoch: bool) -> None:
        """After a block's data is in the log: its epoch entry, the state, the confirm offset."""
        cl = self.commitlog
        if size:
            self._first_block = False
            if new_epoch:
                if b.epoch_start > b.offset:
                    self._persist_unlabelled_epoch(b)
                self._persist_epoch(b.epoch, b.epoch_start)
            self._state = SlaveState.TRANSFER
        else:
            if new_epoch:
                self._persist_epoch(b.epoch, b.epoch_start)
            if b.offset == cl.max_offset:
                self._state = SlaveState.SUSPEND
        confirm = min(b.confirm, cl.max_offset)
        if confirm > self._confirm:
            self._confirm = confirm  # on_confirm hears of it after the ack (_tell_confirm)

    # --- RocketMQ's early epoch label ----------------------------------------------------------
    # RocketMQ's master (AutoSwitchHAConnection.transferToSlave) cuts a batch at the end of
    # the epoch it is sending, switches to the next epoch, and only then builds the header:
    # the last chunk of epoch N arrives labelled with epoch N+1 and N+1's start offset (where
    # the chunk ends), and a batch that ended exactly at N's end is followed by an empty
    # chunk labelled N+1.  RocketMQ's slave records an entry whenever the label changes.

    def _ends_epoch_early_label(self, b: Block, size: int, last_epoch: int) -> bool:
        """The chunk ending epoch N, labelled N+1: rocketmq dialect, data that end exactly
        where the labelled (newer) epoch starts.  Nothing looser."""
        return (self.protocol == "rocketmq" and size > 0 and b.offset + size == b.epoch_start
                and b.epoch > last_epoch)

    def _announces_epoch(self, b: Block, max_offset: int, last_epoch: int) -> bool:
        """An empty rocketmq chunk opening a newer epoch exactly at this log's end (True:
        record it now, as RocketMQ's slave does; the chunks that follow carry its data)."""
        if self.protocol != "rocketmq" or b.epoch <= last_epoch:
            return False
        last = self._last_entry()
        return b.offset == b.epoch_start == max_offset and (last is None or last[1] <= max_offset)

    def _persist_unlabelled_epoch(self, b: Block) -> None:
        """The early-labelled chunk carries data of an epoch this slave may never have seen a
        label of (a session that starts at that epoch's start, and the whole epoch fits in
        one chunk): take it from the master's handshake, the epoch just before the labelled
        one, when it is newer than this log's last and starts within what this log holds."""
        pairs = self._master_pairs
        for i in range(1, len(pairs)):
            epoch, start = pairs[i - 1]
            if pairs[i] == (b.epoch, b.epoch_start):
                last = self._last_entry()
                if epoch > self._last_epoch() and start <= b.offset and (last is None or start >= last[1]):
                    log.info("HA slave %d: epoch %d (from %d) learnt from the master's handshake",
                             self.broker_id, epoch, start)
                    self._persist_epoch(epoch, start)
                return

    # --- epoch entries learnt from blocks ------------------------------------------------------

    def _persist_epoch(self, epoch: int, start: int) -> None:
        """Record a new epoch entry without stalling the transfer on its fsync (several ms
        here): a worker thread writes it, in order, and every ack first waits for it
        (:meth:`_ack`), so no offset is acknowledged under an epoch not yet on disk."""
        if self._epoch_writer is None:
            self._epoch_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ha-epoch")
        self._epoch_jobs.append(((epoch, start), self._epoch_writer.submit(self._append_epoch, epoch, start)))

    def _append_epoch(self, epoch: int, start: int) -> None:
        # Runs on the worker: after a failed entry none of the later ones may be written.
        if self._epoch_failed is not None:
            raise self._epoch_failed
        try:
            self.epoch_map.append(epoch, start)
        except BaseException as exc:
            self._epoch_failed = exc
            raise

    def _last_entry(self) -> tuple[int, int] | None:
        if self._epoch_jobs:
            return self._epoch_jobs[-1][0]
        last = self.epoch_map.last_entry()
        return None if last is None else (last[0], last[1])

    def _last_epoch(self) -> int:
        if self._epoch_jobs:
            return self._epoch_jobs[-1][0][0]
        return self.epoch_map.last_epoch()

    async def _settle_epochs(self) -> None:
        """Wait until the epoch entries handed to the worker are written (or raise why not)."""
        while self._epoch_jobs:
            _, fut = self._epoch_jobs[0]
            await asyncio.wrap_future(fut)
            self._epoch_jobs.pop(0)

    def _settle_epochs_now(self) -> None:
        """Blocking variant, for the end of a session (the next one reads the epoch map)."""
        jobs, self._epoch_jobs = self._epoch_jobs, []
        for entry, fut in jobs:
            try:
                fut.result()
            except (EpochError, StoreError, OSError) as exc:
                log.warning("HA slave %d could not record an epoch entry: %s", self.broker_id, exc)
            except JobCancelled:
                # The session stopped while the entry still waited for the worker (awaiting
                # it was cancelled, and that cancels a job not yet started): never written,
                # as after a failed write; the next session starts from the epoch map.
                log.info("HA slave %d: epoch entry %s not written (session stopped)",
                         self.broker_id, entry)
        self._epoch_failed = None

    async def _ack(self, link: Link, codec: SlaveCodec, offset: int) -> None:
        await self._settle_epochs()
        cl = self.commitlog
        if self.config.ha_slave_flush_before_ack and cl.flushed_offset < offset:
            # fsync off the loop (the link keeps receiving); acks wait for it.  In sync
            # mode the flusher was asked already (group commit); async: flush now.
            if cl.flush_mode == "sync":
                await asyncio.wrap_future(cl.flush_future(offset))
            else:
                await asyncio.get_running_loop().run_in_executor(None, cl.flush)
        await self._send(link, self._ack_frame(codec, offset))
        self._acked = offset

    def _ack_frame(self, codec: SlaveCodec, offset: int) -> bytes:
        return codec.ack(offset, self.epoch_map.last_epoch())

    def _may_restart(self, b: Block, size: int) -> bool:
        """The master's log starts beyond this slave's end (retention deleted the bytes in
        between): it says so by starting the session's first block there, at a segment
        start above this log's max offset, in an epoch not older than this log's last."""
        cl = self.commitlog
        return (
            self._first_block
            and 0 < size <= cl.segment_bytes
            and b.offset > cl.max_offset > cl.min_offset
            and b.offset % cl.segment_bytes == 0
            and b.epoch_start <= b.offset
            and b.epoch >= self.epoch_map.last_epoch()
        )

    def _restart_at(self, offset: int) -> None:
        cl = self.commitlog
        local_min, local_max = cl.min_offset, cl.max_offset
        dropped = local_max - local_min
        log.warning(
            "HA slave %d: master %s starts its log at %d, beyond this log's end %d (retention "
            "removed the bytes in between): dropping the whole log (%d bytes, offsets %d..%d) "
            "and restarting at %d", self.broker_id, self._master, offset, local_max, dropped,
            local_min, local_max, offset,
        )
        self._drop_log(offset)
        self.bytes_dropped += dropped
        self._after_truncate(local_min)

    def _may_rebase(self, offset: int, size: int) -> bool:
        """An empty log may start where the master says (its min offset or last segment)."""
        cl = self.commitlog
        return size > 0 and cl.max_offset <= cl.min_offset and offset % cl.segment_bytes == 0

    def _rebase(self, offset: int) -> None:
        cl = self.commitlog
        reset = getattr(cl, "reset", None)
        if reset is None:
            raise ReplicationError(f"this commitlog cannot start an empty log at {offset}")
        reset(offset)
        log.info("HA slave %d starts its empty log at the master's offset %d", self.broker_id, offset)


def _check_entries(entries: list[tuple[int, int, int]], master_max: int) -> None:
    """The master's epoch entries must be ordered (else a bad frame); the last end may have
    grown past the handshake's max offset while the exchange ran."""
    prev_epoch = -1
    prev_start = -1
    for e, s, end in entries:
        if e <= prev_epoch or s < prev_start or end < s:
            raise ProtocolError(f"master epoch entries are not ordered: {entries[:8]!r}")
        prev_epoch, prev_start = e, s
