"""The receive path of an HA slave's session (:class:`Receiver`): blocks in, appended, acked.

TRANSFER: every block goes to :class:`rmqha.ha.appender.BlockAppender` (checked, appended
at exactly the log's max offset, its epoch entry, the confirm offset it carries), then this
log's max offset is acked; SUSPEND once caught up (heartbeats only).  During bulk
catch-up acks go every ``_ACK_EVERY_BYTES``; live traffic is acked at once, since that ack
is what moves the master's confirm offset and answers a waiting send.

Live traffic (one small block at a time, each on the critical path of an acknowledged send)
is applied and acked by a reader callback in the loop turn that finds it (:meth:`Receiver._live`),
not by the session's task, which takes the link back for catch-up and for whatever needs
awaiting.  In the framed dialect frames are parsed in place in a receive buffer and large
blocks are received straight into the commitlog's mapping (:meth:`Receiver._receive_direct`,
validated before they count); the rocketmq dialect goes through its decoder.  The usual
read, whole blocks that continue the log in its last epoch, is taken with one compiled
call (``frames.scan_transfer_run``), their tags checked together, one append for all; any
other frame in the buffer sends the whole read the general way (a checked Block each).

On an authenticated plaintext link every frame is followed by its tag (:mod:`rmqha.ha.frame_mac`),
checked before anything of the frame is used: in the receive buffer for buffered blocks,
and for a block received straight into the log after its last byte and its tag arrived,
before it is committed (a bad tag zeroes what came, as a bad record does).

On a plaintext framed link the pauses are served by the compiled lane instead, where it is
built and ``ha_slave_compiled_lane`` is on (:mod:`rmqha.ha.slave_lane`: a native thread
without the GIL receives, checks, appends and acks; this task takes the link back for
whatever is unusual, from the frame the lane left at the buffer's front).

Every ack first waits for the epoch entries the blocks opened
(:class:`rmqha.ha.slave_epochs.EpochWriter`) and, with ``ha_slave_flush_before_ack``, for
the data's fsync.  The master's silence for ``ha_housekeeping_interval_ms`` ends the
session (LinkTimeout); an idle slave acks every ``ha_send_heartbeat_interval_ms``.
"""
from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections.abc import Callable
from typing import Any

from rmqha.errors import ProtocolError
from rmqha.ha.appender import BlockAppender
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import Block, FramedSlave, SlaveCodec, fr
from rmqha.ha.frame_mac import TAG
from rmqha.ha.link import Link, LinkTimeout, RecvBuffer
from rmqha.ha.slave_epochs import EpochWriter
from rmqha.ha.slave_lane import LaneRunner, lane_available
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress

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
_scan_run = fr.scan_transfer_run
_RUN_OTHER = fr.RUN_OTHER


class Receiver:
    """One session's TRANSFER: reads blocks from ``link`` until it fails (raises why)."""

    def __init__(self, link: Link, codec: SlaveCodec, appender: BlockAppender, *, config: HAConfig,
                 epochs: EpochWriter, confirm: ConfirmTracker, progress: SlaveProgress) -> None:
        self.link = link
        self.codec = codec
        self.appender = appender
        self.commitlog = appender.commitlog
        self.config = config
        self.epochs = epochs
        self.confirm = confirm
        self.progress = progress
        self.master = appender.master
        #: The link's frame MAC (None: unauthenticated) and the bytes of tag after each frame.
        self._mac = codec.mac
        self._tag = TAG if codec.mac is not None else 0
        self._max_frame = config.max_frame_bytes
        self._segment_bytes = self.commitlog.segment_bytes
        #: The offset of the last ack handed to the link in this session.
        self._acked = 0
        #: What the socket did not take of an ack the reader callback sent (the task sends it).
        self._unsent_ack: list[memoryview] = []
        #: The epoch of the run :meth:`_apply_run` last took (its blocks' epoch, this log's last).
        self._run_epoch = -1
        #: The compiled lane that takes live traffic off this task (framed, plaintext; None: off).
        self._lane: LaneRunner | None = None

    def close_lane(self) -> None:
        """Stop the compiled lane and join its thread, what it appended adopted (the
        session's close calls this before the link closes: a role change's fence)."""
        if self._lane is not None:
            self._lane.finish()

    def _new_lane(self) -> LaneRunner | None:
        """The compiled lane, where it may serve this link (see :mod:`rmqha.ha.slave_lane`)."""
        cfg = self.config
        if (not cfg.ha_slave_compiled_lane or not lane_available() or self.link.tls
                or cfg.ha_slave_flush_before_ack or not hasattr(self.commitlog, "lane_grant")):
            return None
        return LaneRunner(self.link, self._mac, self.commitlog, config=cfg, epochs=self.epochs,
                          confirm=self.confirm, progress=self.progress, disk=self.appender.disk,
                          master=self.master)

    async def _send(self, *buffers: bytes | memoryview) -> None:
        await self.link.send(buffers, self.config.ha_housekeeping_interval_ms / 1000)
        self.progress.last_write = time.monotonic()

    async def run(self, pending: list[Any]) -> None:
        """Receive until the link fails (raises why); ``pending`` are blocks the handshake
        read already."""
        codec = self.codec
        if isinstance(codec, FramedSlave) and (codec.mac is not None or codec.buffered == 0):
            # An authenticated codec's decoder holds no partial frame: its tag checker
            # hands what it holds over to the receive buffer.
            await self._run_framed(pending, codec.take_unparsed())
        else:
            await self._run_stream(pending)

    async def _run_framed(self, pending: list[Any], unparsed_bytes: bytes = b"") -> None:
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
        link = self.link
        cfg = self.config
        cl = self.commitlog
        heartbeat = cfg.ha_send_heartbeat_interval_ms / 1000
        housekeeping = cfg.ha_housekeeping_interval_ms / 1000
        rb = RecvBuffer(_RECV_BUFFER_BYTES)
        if unparsed_bytes:
            rb.make_room(len(unparsed_bytes))
            rb.buf[0 : len(unparsed_bytes)] = unparsed_bytes
            rb.end = len(unparsed_bytes)
        # A flush before every ack needs awaiting: the callback would hand back every block.
        step = None if cfg.ha_slave_flush_before_ack else functools.partial(self._live_step, rb)
        self._lane = self._new_lane()
        # Nothing acked yet this session: the first pause tells the master where this log
        # ends at once, so a caught-up slave rejoins the SyncStateSet now rather than at
        # its first heartbeat (a new master whose min_in_sync_replicas needs it
        # acknowledges nothing until then).
        self._acked = -1
        self._unsent_ack = []
        if pending:
            self.appender.apply(pending)
            self.progress.task_blocks += len(pending)
            pending.clear()
        self.progress.last_read = time.monotonic()
        limit: int | None = None
        turns = 0
        # Bytes a direct receive read past its block (or the handshake's reader left), not
        # parsed yet: they may hold whole frames, which must not wait for more data to arrive.
        unparsed = rb.pending > 0
        while True:
            # What is queued already, without waiting: during bulk catch-up the socket
            # always has more, and acks wait (every _ACK_EVERY_BYTES) so that neither side
            # spends a syscall and a wake-up per read on them.  After a block received
            # straight into the log, read little: the next one most likely goes there too.
            got = rb.try_fill(link, limit) > 0 or unparsed
            unparsed = False
            if not got:
                got = await self._paused(rb, step, heartbeat, housekeeping)
                if got:
                    turns = 0
            now = time.monotonic()
            if got:
                self.progress.last_read = now
                limit, unparsed = await self._take_buffered(rb, limit, housekeeping)
            elif now - self.progress.last_read >= housekeeping:
                raise LinkTimeout(f"master {self.master} silent for {housekeeping:.1f}s")
            mx = cl.max_offset
            # A read that left room drained the socket: live traffic, whose ack is what a
            # waiting send needs, so it goes now rather than after another loop turn.
            # The heartbeat interval bounds the silence either way (the master's housekeeping).
            acked = self._acked
            if (mx != acked and (got and not rb.filled or mx - acked >= _ACK_EVERY_BYTES)
                    or now - self.progress.last_write >= heartbeat):
                await self._ack(mx)
            self.confirm.tell()
            # recv and send do not suspend while data flows: let other tasks run.
            turns += 1
            if rb.filled or turns >= _TURNS_BEFORE_YIELD:
                turns = 0
                await asyncio.sleep(0)

    async def _paused(self, rb: RecvBuffer, step: Callable[[], bool] | None, heartbeat: float,
                      housekeeping: float) -> bool:
        """The stream paused: tell the master where this log ends (live traffic is acked at
        once; that is what moves the confirm offset), then wait for more (True) until a
        heartbeat or the housekeeping timeout is due (False)."""
        mx = self.commitlog.max_offset
        if mx != self._acked:
            await self._ack(mx)
        self.confirm.tell()
        now = time.monotonic()
        wait = min(heartbeat - (now - self.progress.last_write), housekeeping - (now - self.progress.last_read))
        if wait <= 0:
            return False
        if step is not None:
            lane = self._lane
            if lane is not None and lane.usable():
                end = await lane.run(rb, self._acked)
                if end.ran:
                    # Handed back: what the lane left in the buffer is this task's.
                    self._acked = end.acked
                    if lane.took_blocks:
                        self.appender.first_block = False
                    if end.unsent:
                        await self._send(end.unsent)
                    return True
            # Handed back: what the callback left in the buffer is this task's.
            return await self._live(step, heartbeat, housekeeping)
        try:
            await rb.fill(self.link, wait)
        except LinkTimeout:
            return False
        return True

    async def _take_buffered(self, rb: RecvBuffer, limit: int | None,
                             housekeeping: float) -> tuple[int | None, bool]:
        """Apply the whole blocks in ``rb``, and receive a large block straight into the
        log once its header is in; the next read's limit and whether bytes a direct
        receive read past its block are left unparsed."""
        header = fr.TRANSFER_HEADER_SIZE
        unparsed = False
        applied, partial = self._apply_buffered(rb)
        if applied:
            limit = None
            self.progress.task_blocks += applied
        need = partial
        size = partial - header - self._tag
        if size >= _DIRECT_MIN_BYTES and rb.pending < header + size:
            # A large block needs only its header buffered: once it is, and the pages it
            # lands on are warm, the rest goes straight into the log (with its tag, if
            # it has one, behind it).
            need = header
            if rb.pending >= header and self._warm_target(rb, size):
                await self._receive_direct(rb, housekeeping)
                self.progress.task_blocks += 1
                unparsed = rb.pending > 0
                rb.filled = True  # bulk catch-up: acks wait (_ACK_EVERY_BYTES)
                limit = _DIRECT_OVERFLOW_BYTES
                need = 0  # acks and other tasks get their turn between blocks
        if need:
            # Only now: moving the partial frame overwrites the blocks just applied.
            rb.make_room(need)
        return limit, unparsed

    async def _live(self, step: Callable[[], bool], heartbeat: float, housekeeping: float) -> bool:
        """Let ``step`` handle the link from a reader callback, in each loop turn that finds
        data queued.  Returns True once ``step`` hands the link back (it returned False),
        False when a heartbeat or the housekeeping timeout is due (the caller sends or
        raises it); what ``step`` raises is raised here, as if this task had read the frame.

        One future per call, not per block: in live traffic this task sleeps while the
        callback works, and wakes only for a heartbeat or to take the link back."""
        link = self.link

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
            self.progress.handbacks += 1
            if not ended.done():
                ended.set_result(None)

        ended = link.watch(on_readable)
        try:
            while True:
                now = time.monotonic()
                # The callback moves both marks: sleep on until one is really due.
                wait = min(heartbeat - (now - self.progress.last_write), housekeeping - (now - self.progress.last_read))
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
            await self._send(*rest)
        return True

    def _live_step(self, rb: RecvBuffer) -> bool:
        """The reader callback of :meth:`_live` (framed dialect): read what is queued, apply
        the whole blocks, ack.  False hands the link back to the task: a large block on its
        way (received straight into the log), a read that filled the buffer (catch-up),
        an ack that needs awaiting or did not fit the socket.  Every error is raised before
        anything of the frame is stored, as on the task's path (the same code)."""
        if rb.try_fill(self.link) == 0:
            return True  # readiness without data; the level-triggered loop calls again
        self.progress.last_read = now = time.monotonic()
        # A lone block (live traffic) is a run of one: the compiled scan, its tag, one
        # append, the ack; only another frame takes the general path.
        run = self._apply_run(rb)
        if run is None:
            applied, partial = self._apply_general(rb)
            epoch = None
        else:
            applied, partial = run
            epoch = self._run_epoch  # what the ack says: this log's last epoch, known already
        self.progress.callback_blocks += applied
        if rb.filled or partial - fr.TRANSFER_HEADER_SIZE - self._tag >= _DIRECT_MIN_BYTES:
            return False
        if partial:
            rb.make_room(partial)  # a small block in pieces: the rest comes in a later turn
        if not self._try_ack(now, epoch):
            return False
        # The compiled lane could not start when this callback took the link (a log with
        # no epoch entry yet, a full disk): once it can, the task lends it the link.
        lane = self._lane
        return lane is None or partial != 0 or not lane.usable()

    def _live_step_stream(self) -> bool:
        """The reader callback of :meth:`_live` for the decoding path (the rocketmq dialect):
        what is queued goes through the codec, the blocks to the log, then the ack.  False
        hands the link back as :meth:`_live_step` does (a full read: catch-up)."""
        link = self.link
        codec = self.codec
        chunk = link.try_recv()
        if not chunk:
            return True  # readiness without data; the level-triggered loop calls again
        self.progress.last_read = time.monotonic()
        blocks = codec.feed(chunk)
        if blocks:
            self.appender.apply(blocks)
            self.progress.callback_blocks += len(blocks)
        if len(chunk) >= link.recv_bytes:
            return False
        return self._try_ack(time.monotonic())

    def _try_ack(self, now: float, epoch: int | None = None) -> bool:
        """Ack this log's max offset, if it moved, without waiting, then tell on_confirm;
        False when the task must do it or finish it: an epoch entry still being written
        (acks wait for it), a flush before the ack, or a socket that took only part (the
        rest is in ``_unsent_ack``, and nothing else may be sent before it).  ``now``: the
        time of the read this ack answers (a microsecond early is as good as now);
        ``epoch``: this log's last epoch when the caller knows it (None: looked up)."""
        link = self.link
        cl = self.commitlog
        mx = cl.max_offset
        if mx != self._acked:
            if self.epochs.pending or (self.config.ha_slave_flush_before_ack and cl.flushed_offset < mx):
                return False
            rest = link.try_send([self._ack_frame(mx, epoch)])
            self._acked = mx
            if rest:
                self._unsent_ack = rest
                return False
            self.progress.last_write = now
        self.confirm.tell()
        return True

    def _apply_buffered(self, rb: RecvBuffer) -> tuple[int, int]:
        """Apply the whole TRANSFER_DATA frames at the front of ``rb`` (consumed from it):
        the blocks applied, and the length of the incomplete frame left at the front, its
        tag included (0: none, or too little of it to know).  Errors as :meth:`_take_blocks`."""
        run = self._apply_run(rb)
        return self._apply_general(rb) if run is None else run

    def _apply_general(self, rb: RecvBuffer) -> tuple[int, int]:
        """:meth:`_apply_buffered` with a Block and a check each (what :meth:`_apply_run` leaves)."""
        blocks, partial = self._take_blocks(rb)
        self.appender.apply_views(blocks)
        return len(blocks), partial

    def _apply_run(self, rb: RecvBuffer) -> tuple[int, int] | None:
        """:meth:`_apply_buffered` for the usual read, with one compiled call for all its
        frames: blocks that continue this log in its last epoch, nothing to do but check
        their tags and append them (``frames.scan_transfer_run`` checks the rest).  None,
        with nothing taken, when the buffer holds any other frame (an epoch change, a
        heartbeat, a jump, something to refuse) or the disk is full: the general path
        reads it then, so what it refuses is refused as before, before anything of the
        buffer is used."""
        last = self.epochs.last_entry()
        if last is None or self.appender.disk.active:
            return None
        log_end = self.commitlog.max_offset
        stop, spans, consumed, need = _scan_run(rb.buf, rb.start, rb.end, self._max_frame, self._tag,
                                                log_end, last[0], last[1], self._segment_bytes)
        if stop == _RUN_OTHER:
            return None
        self._run_epoch = last[0]
        if spans:
            if self._mac is not None:
                self._mac.check_run(rb.view, spans)  # every tag before any block is used
            self.appender.append_run(rb.view, spans, log_end)
            rb.consume(consumed)
        return len(spans) // 3, need

    def _take_blocks(self, rb: RecvBuffer) -> tuple[list[Block], int]:
        """The whole TRANSFER_DATA frames at the front of ``rb``, consumed from it, as blocks
        whose data are views of the buffer (apply them, then release the views: the
        buffer cannot move or grow while they exist), and the length of the incomplete
        frame left at the front, its tag included (0: none, or too little of it to know).
        Any other frame, or a length out of bounds, is a ProtocolError, a bad tag an
        AuthenticationError, before any block is applied."""
        header = fr.TRANSFER_HEADER_SIZE
        max_frame = self.config.max_frame_bytes
        unpack = fr.unpack_transfer_header
        mac = self._mac
        tag = self._tag
        blocks: list[Block] = []
        while rb.pending >= 8:
            length, ftype = _PEEK.unpack_from(rb.buf, rb.start)
            if ftype != _TRANSFER_DATA:
                raise ProtocolError(f"frame type {ftype} where only TRANSFER_DATA (6) may come")
            if length < header or length > max_frame:
                raise ProtocolError(
                    f"TRANSFER_DATA length {length} is outside {header}..{max_frame} (max_frame_bytes)"
                )
            if rb.pending < length + tag:
                return blocks, length + tag
            block, estart, confirm, size, epoch, _ = unpack(rb.buf, rb.start)
            body = rb.start + header
            data = rb.view[body : body + size]
            if mac is not None:
                end = rb.start + length
                mac.check_block(rb.view[rb.start : body], data, rb.view[end : end + tag])
            blocks.append(Block(epoch, estart, block, confirm, data))
            rb.consume(length + tag)
        return blocks, 0

    def _warm_target(self, rb: RecvBuffer, size: int) -> bool:
        """Whether the block whose header is at the front of ``rb`` lands on log pages that
        are in memory already.  Receiving into pages not faulted in yet (the commitlog's
        warm-up is behind) costs a fault and a zero-fill per page; the buffer path and
        one pwrite then cost less."""
        offset = _BLOCK_OFFSET.unpack_from(rb.buf, rb.start + _BLOCK_OFFSET_AT)[0]
        warm = getattr(self.commitlog, "tail_is_warm", None)
        return warm is None or warm(offset, size)

    async def _receive_direct(self, rb: RecvBuffer, timeout: float) -> None:
        """Receive the block whose header (and maybe some body) is buffered in ``rb``
        straight into the commitlog's mapping, then validate and commit it.

        The header is checked before a byte is stored.  The kernel copies the body from
        the socket into the (prefaulted) segment pages, the one copy on this side; bytes
        after the body (the next header, at most _DIRECT_OVERFLOW_BYTES) land in ``rb``.
        A bad record is zeroed by the commitlog, a link lost mid-block zeroes what came,
        and so does a block whose tag (authenticated links) does not check.
        """
        link = self.link
        cl = self.commitlog
        header = fr.TRANSFER_HEADER_SIZE
        self.progress.direct_receives += 1
        offset, estart, confirm, size, epoch, _ = fr.unpack_transfer_header(rb.buf, rb.start)
        head = bytes(rb.view[rb.start : rb.start + header])  # the buffer is reused below
        b = Block(epoch, estart, offset, confirm, None)
        new_epoch = self.appender.check(b, size)
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
                        raise LinkTimeout(f"master {self.master} silent for {timeout:.1f}s "
                                          f"in the middle of a block") from None
                    continue
                took = min(n, size - have)
                have += took
                rb.end = n - took
            if self._mac is not None:
                if lowat != 1:
                    lowat = link.set_rcvlowat(1)  # a 16-byte tag must wake this task
                await self._check_direct_tag(rb, head, view, timeout)
            self.progress.last_read = time.monotonic()
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
        self.appender.done(b, size, new_epoch)

    async def _check_direct_tag(self, rb: RecvBuffer, head: bytes, data: memoryview, timeout: float) -> None:
        """Read the tag behind a block received into the log (into ``rb``, where the
        bytes after the block landed) and check it; AuthenticationError if it is wrong."""
        assert self._mac is not None
        while rb.pending < TAG:
            if rb.try_fill(self.link, _DIRECT_OVERFLOW_BYTES) == 0:
                try:
                    await self.link.wait_readable(timeout)
                except LinkTimeout:
                    raise LinkTimeout(f"master {self.master} silent for {timeout:.1f}s "
                                      "before the tag of a block") from None
        self._mac.check_block(head, data, rb.view[rb.start : rb.start + TAG])
        rb.consume(TAG)

    async def _run_stream(self, pending: list[Any]) -> None:
        """TRANSFER through the dialect's decoder (the rocketmq dialect)."""
        link = self.link
        codec = self.codec
        cfg = self.config
        cl = self.commitlog
        heartbeat = cfg.ha_send_heartbeat_interval_ms / 1000
        housekeeping = cfg.ha_housekeeping_interval_ms / 1000
        # As on the framed path: live traffic is read, applied and acked by a reader
        # callback (:meth:`_live`) while the last read drained the socket.
        step = None if cfg.ha_slave_flush_before_ack else self._live_step_stream
        self._acked = -1  # as on the framed path: the first pause acks at once
        self._unsent_ack = []
        if pending:
            self.appender.apply(pending)
            self.progress.task_blocks += len(pending)
            pending.clear()
        self.progress.last_read = time.monotonic()
        drained = True
        while True:
            now = time.monotonic()
            wait = min(heartbeat - (now - self.progress.last_write), housekeeping - (now - self.progress.last_read))
            chunk = b""
            if wait > 0:
                if step is not None and drained:
                    # Handed back (catch-up, or an ack to await): read here until it drains.
                    drained = not await self._live(step, heartbeat, housekeeping)
                else:
                    try:
                        chunk = await link.recv(wait)
                    except LinkTimeout:
                        pass
            now = time.monotonic()
            if chunk:
                self.progress.last_read = now
                drained = len(chunk) < link.recv_bytes
                blocks = codec.feed(chunk)
                if blocks:
                    self.appender.apply(blocks)
                    self.progress.task_blocks += len(blocks)
            elif now - self.progress.last_read >= housekeeping:
                raise LinkTimeout(f"master {self.master} silent for {housekeeping:.1f}s")
            mx = cl.max_offset
            # A full read means more is already queued (bulk catch-up): ack every few MiB
            # instead of every read; otherwise (live traffic) ack at once for the confirm offset.
            acked = self._acked
            behind = len(chunk) >= link.recv_bytes and mx - acked < _ACK_EVERY_BYTES
            if (mx != acked and not behind) or now - self.progress.last_write >= heartbeat:
                await self._ack(mx)
            self.confirm.tell()
            # recv() and send() do not suspend while data flows: let other tasks run.
            await asyncio.sleep(0)

    async def _ack(self, offset: int) -> None:
        await self.epochs.settle()
        cl = self.commitlog
        if self.config.ha_slave_flush_before_ack and cl.flushed_offset < offset:
            # fsync off the loop (the link keeps receiving); acks wait for it.  In sync
            # mode the flusher was asked already (group commit); async: flush now.
            if cl.flush_mode == "sync":
                await asyncio.wrap_future(cl.flush_future(offset))
            else:
                await asyncio.get_running_loop().run_in_executor(None, cl.flush)
        await self._send(self._ack_frame(offset))
        self._acked = offset

    def _ack_frame(self, offset: int, epoch: int | None = None) -> bytes:
        """The ack of ``offset`` under this log's last epoch (``epoch``, when the caller knows
        it: acks wait for the epoch entries being written, so it is the epoch map's)."""
        return self.codec.ack(offset, self.epochs.epoch_map.last_epoch() if epoch is None else epoch)

