"""One slave's link on the HA master (:class:`SlaveConnection`): its transfer and its acks.

Per slave the master runs a writer task that pushes the log from the slave's offset in
blocks cut by :func:`rmqha.ha.offsets.limit_batch` (:func:`blocks`), each labelled with its
own epoch and epoch start, with the bytes sent straight from the commitlog: header + mmap
memoryviews through one sendmsg, or with ``ha_transfer_sendfile`` large blocks through
``sendfile`` (the kernel hands page-cache pages to the socket, no copy on this side; but
then the slave copies from memory no CPU cache has seen, and on loopback with two cores
catch-up was measured ~15% slower, so it is off by default).  Live traffic goes out from
the append's own loop turn (:meth:`SlaveConnection.push`), and an idle link carries a
heartbeat (an empty block) every ``ha_send_heartbeat_interval_ms``.

Acks are read by a reader callback in the loop turn that receives them
(:meth:`SlaveConnection.read_acks`), checked (never backwards, never beyond what was sent,
never under an epoch newer than the master's) and handed to the owner's ``on_ack``: what
they mean for the confirm offset and the SyncStateSet is :mod:`rmqha.ha.sync_service`'s job.

On an authenticated plaintext link every block is followed by its tag
(:mod:`rmqha.ha.frame_mac`: the GMAC of the block's bytes is taken from the same mmap view
the block is sent from, or read through one for a ``sendfile`` range), heartbeats too; the
slave's acks are checked by the codec.  Over TLS there are no tags (:mod:`rmqha.ha.auth`).

Labels are computed from the live epoch map for every block, so a new epoch appended while
slaves are connected is picked up at once (RocketMQ #9689 kept a stale epoch per link).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

from rmqha.errors import ProtocolError, ReplicationError
from rmqha.ha import frames as fr
from rmqha.ha import offsets as hao
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import Ack, MasterCodec, SlaveHello
from rmqha.ha.frame_mac import TAG
from rmqha.ha.link import FileRange, Link, LinkClosed, LinkTimeout, Waker
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.store.epoch_map import EpochMap

# The master side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.master")

#: How many (master max, time) transfer checkpoints a link keeps for caught-up times.
_CHECKPOINTS = 256
#: Blocks at least this large are sent with sendfile: below it, the copy a sendmsg makes
#: costs less than a second syscall per block.
_SENDFILE_MIN_BYTES = 64 << 10
#: Live traffic up to this size goes out from the append's loop turn (push); more is
#: catch-up, which the writer task sends in windows.
PUSH_MAX_BYTES = 256 << 10
_scan_acks = fr.scan_transfer_acks
#: A framed TRANSFER_ACK: the 24-byte envelope and the offset.
_ACK_BYTES = fr.HEADER_SIZE + 8


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class LinkState(str, Enum):
    """Where one slave link is (the HAConnectionState names)."""

    HANDSHAKE = "HANDSHAKE"
    TRANSFER = "TRANSFER"
    SUSPEND = "SUSPEND"  # caught up, only heartbeats flow
    SHUTDOWN = "SHUTDOWN"


def blocks(commitlog: ReplicatedLog, epoch_map: EpochMap, batch: int, nxt: int, max_offset: int,
           budget: int) -> Iterator[tuple[int, int, int, int]]:
    """(epoch, epoch start, offset, size) of the blocks that carry ``nxt``..``max_offset``,
    at most ``budget`` bytes (at least one block); a block never crosses an epoch boundary
    or a segment end."""
    epoch_map.set_max_offset(max_offset)
    limit = hao.limit_batch
    total = 0
    while nxt < max_offset and total < budget:
        epoch, epoch_start, size = limit(epoch_map, nxt, max_offset - nxt, commitlog.segment_end(nxt), batch)
        if size <= 0:
            raise ReplicationError(f"no block can start at {nxt} (max offset {max_offset})")
        yield epoch, epoch_start, nxt, size
        nxt += size
        total += size


class _SegmentFiles:
    """Open segment files for a writer's sendfile parts.  A window's ranges use the fd
    they were cut from, so an fd replaced mid-window is closed only once it is sent."""

    def __init__(self, open_segment: Callable[[int], int], segment_bytes: int) -> None:
        self._open = open_segment
        self._segment_bytes = segment_bytes
        self._fd = -1
        self._base = -1
        self._stale: list[int] = []

    def range(self, offset: int, size: int) -> FileRange:
        base = offset - offset % self._segment_bytes
        if base != self._base:
            if self._fd >= 0:
                self._stale.append(self._fd)
                self._fd = -1
            self._fd = self._open(offset)
            self._base = base
        return FileRange(self._fd, offset - base, size)

    def window_sent(self) -> None:
        while self._stale:
            os.close(self._stale.pop())

    def close(self) -> None:
        if self._fd >= 0:
            self._stale.append(self._fd)
            self._fd = -1
        self.window_sent()


class SlaveConnection:
    """The master's side of one slave link, from an accepted hello until it closes.

    ``confirm`` gives the master's confirm offset (every block carries it); ``on_ack`` is
    called with each batch of checked acks, in the loop turn that read them."""

    def __init__(self, link: Link, codec: MasterCodec, hello: SlaveHello, *, commitlog: ReplicatedLog,
                 epoch_map: EpochMap, config: HAConfig, confirm: Callable[[], int]) -> None:
        self.link = link
        self.codec = codec
        self.broker_id = hello.broker_id
        self.address = hello.address or link.peer
        self.learner = hello.async_learner
        self.sync_from_last_file = hello.sync_from_last_file
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.config = config
        self._confirm = confirm
        self.state = LinkState.HANDSHAKE
        #: Last offset the slave acknowledged (-1 until it reported one).
        self.ack = -1
        #: Where the transfer started and how far blocks have been handed to the socket.
        self.transfer_from = -1
        self.sent = -1
        self.connected_ms = now_ms()
        self.last_read_ms = self.connected_ms
        #: (master max offset, time) at sends: an ack >= max means caught up as of that time.
        self.checkpoints: deque[tuple[int, int]] = deque(maxlen=_CHECKPOINTS)
        self.waker: Waker | None = None
        self.writer: asyncio.Task[None] | None = None
        #: Whether the writer waits for new data (then push may send for it).
        self.parked = False
        #: What push left for the writer to send (the socket took only part).
        self.unsent: list[memoryview] = []
        self.last_send = time.monotonic()
        self.close_reason = ""

    # --- lifecycle -----------------------------------------------------------------------------

    def start_transfer(self, start: int, ack: int) -> asyncio.Task[None]:
        """The handshake agreed on ``start``; the slave holds ``ack``: run the writer."""
        self.ack = ack
        self.transfer_from = start
        self.sent = start
        self.state = LinkState.TRANSFER
        self.waker = Waker()
        self.writer = asyncio.ensure_future(self._write_loop())
        self.writer.add_done_callback(self._writer_done)
        return self.writer

    def close(self, reason: str) -> None:
        """Close the link (the first reason given is the one reported)."""
        self.close_reason = self.close_reason or reason
        self.link.close()

    def shut_down(self) -> bool:
        """Mark the link ended and stop its writer; False if it was already."""
        if self.state is LinkState.SHUTDOWN:
            return False
        self.state = LinkState.SHUTDOWN
        if self.writer is not None and not self.writer.done():
            self.writer.cancel()
        return True

    def wake(self) -> None:
        if self.waker is not None:
            self.waker.wake()

    # --- transfer ------------------------------------------------------------------------------

    def _blocks(self, nxt: int, max_offset: int, budget: int) -> Iterator[tuple[int, int, int, int]]:
        return blocks(self.commitlog, self.epoch_map, self.config.ha_transfer_batch_bytes, nxt,
                      max_offset, budget)

    def _mark_sent(self, max_offset: int, nxt: int) -> None:
        self.checkpoints.append((max_offset, now_ms()))
        self.state = LinkState.TRANSFER
        # Acks may arrive before the bytes have left: count the blocks as sent now.
        self.sent = nxt
        self.last_send = time.monotonic()

    def wants(self, max_offset: int) -> bool:
        """Whether there is anything new to send this link (a busy writer looks again
        after its send anyway)."""
        return self.waker is not None and (self.sent < max_offset or bool(self.unsent))

    def push(self, max_offset: int) -> bool:
        """Send new live traffic to a parked writer's slave right here, in the loop turn
        of the append, as mmap views in one sendmsg: waking the writer task instead costs
        two more loop turns per message, which is most of a one-at-a-time send's latency.
        False when the writer must take over (much to send, or the socket took only part)."""
        nxt = self.sent
        if not self.parked or self.unsent or max_offset - nxt > PUSH_MAX_BYTES:
            return False
        cl = self.commitlog
        codec = self.codec
        confirm = self._confirm()
        parts: list[Any] = []
        end = nxt
        mac = codec.mac
        for epoch, epoch_start, offset, size in self._blocks(nxt, max_offset, PUSH_MAX_BYTES):
            header = codec.block_header(epoch, epoch_start, offset, confirm, size)
            data = cl.read(offset, size)
            parts.append(header)
            parts.append(data)
            if mac is not None:
                parts.append(mac.block_tag(header, data))
            end = offset + size
        self._mark_sent(max_offset, end)
        try:
            self.unsent = self.link.try_send(parts)
        except (LinkClosed, OSError) as exc:
            # The link's reader sees the close and drops the slave.
            self.close(f"send failed: {exc}")
            return True
        return not self.unsent and end == max_offset

    async def _write_loop(self) -> None:
        """Until the link fails: windows of blocks while the slave is behind, else a
        heartbeat when one is due, else park until an append wakes it."""
        cfg = self.config
        cl = self.commitlog
        link = self.link
        send_timeout = cfg.ha_housekeeping_interval_ms / 1000
        self.last_send = time.monotonic()
        # With ha_transfer_sendfile, large blocks go out with sendfile (no copy on this
        # side at all); otherwise, and for small blocks (live traffic) always, as mmap
        # views in one sendmsg.
        segment_fd = getattr(cl, "segment_fd", None) if link.sends_files and cfg.ha_transfer_sendfile else None
        files = _SegmentFiles(segment_fd, cl.segment_bytes) if segment_fd is not None else None
        try:
            while not link.closed:
                if self.unsent:
                    # What push handed the socket only in part.
                    unsent, self.unsent = self.unsent, []
                    await link.send(unsent, send_timeout)
                # push moves self.sent while this task is parked.
                nxt = self.sent
                max_offset = cl.max_offset
                if nxt < max_offset:
                    await self._send_window(nxt, max_offset, files, send_timeout)
                elif nxt > max_offset:
                    raise ReplicationError(f"master log shrank below the transfer offset {nxt} (max {max_offset})")
                else:
                    await self._idle(nxt, max_offset, send_timeout)
        finally:
            if files is not None:
                files.close()

    async def _send_window(self, nxt: int, max_offset: int, files: _SegmentFiles | None,
                           send_timeout: float) -> None:
        """Send ``nxt``.. onwards, at most ``ha_send_window_bytes`` of blocks."""
        cl = self.commitlog
        codec = self.codec
        confirm = self._confirm()
        parts: list[Any] = []
        end = nxt
        mac = codec.mac
        for epoch, epoch_start, offset, size in self._blocks(nxt, max_offset, self.config.ha_send_window_bytes):
            header = codec.block_header(epoch, epoch_start, offset, confirm, size)
            parts.append(header)
            if files is not None and size >= _SENDFILE_MIN_BYTES:
                parts.append(files.range(offset, size))
                if mac is not None:
                    parts.append(mac.block_tag(header, cl.read(offset, size)))
            else:
                data = cl.read(offset, size)
                parts.append(data)
                if mac is not None:
                    parts.append(mac.block_tag(header, data))
            end = offset + size
        self._mark_sent(max_offset, end)
        await self.link.send_parts(parts, send_timeout)
        parts.clear()  # release the mmap views
        if files is not None:
            files.window_sent()
        self.last_send = time.monotonic()
        # A socket that keeps taking data never suspends send(): let others run.
        await asyncio.sleep(0)

    async def _idle(self, nxt: int, max_offset: int, send_timeout: float) -> None:
        """Caught up: a heartbeat if one is due, else wait for an append (or the next one)."""
        heartbeat = self.config.ha_send_heartbeat_interval_ms / 1000
        if self.ack >= max_offset:
            self.state = LinkState.SUSPEND
        idle = time.monotonic() - self.last_send
        if idle >= heartbeat:
            header = self._heartbeat(nxt)
            mac = self.codec.mac
            await self.link.send([header] if mac is None else [header, mac.block_tag(header, b"")], send_timeout)
            self.last_send = time.monotonic()
            return
        waker = self.waker
        assert waker is not None
        self.parked = True
        try:
            await waker.wait(heartbeat - idle)
        finally:
            self.parked = False

    def _heartbeat(self, nxt: int) -> bytes:
        last = self.epoch_map.last_entry()
        epoch, start = (last[0], last[1]) if last is not None else (0, 0)
        if start > nxt:
            # The slave sits before the newest epoch: label with the epoch it is in.
            entry = self.epoch_map.entry_for_offset(max(nxt - 1, 0))
            if entry is not None:
                epoch, start = entry[0], entry[1]
        return self.codec.block_header(epoch, min(start, nxt), nxt, self._confirm(), 0)

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, (LinkClosed, LinkTimeout)):
            self.close(f"send failed: {exc}")
        else:
            self.close_reason = self.close_reason or f"transfer failed: {type(exc).__name__}: {exc}"
            log.warning("HA transfer to slave %d failed: %s", self.broker_id, self.close_reason)
            self.link.close()

    # --- acks ----------------------------------------------------------------------------------

    async def read_acks(self, on_ack: Callable[[SlaveConnection, int], None]) -> None:
        """Until the link fails; raises why.  Acks are handled by a reader callback in the
        loop turn that receives them (waking a task per ack costs a turn each, and an ack is
        what a waiting send needs next); this coroutine only watches for silence: a slave
        reports at least every heartbeat interval."""
        timeout = self.config.ha_housekeeping_interval_ms / 1000
        link = self.link
        codec = self.codec

        def on_readable() -> None:
            try:
                chunk = link.try_recv()
                if chunk:
                    self.last_read_ms = now_ms()
                    ack = self.plain_acks(chunk)
                    if ack is None:
                        msgs = codec.feed(chunk)
                        if msgs:
                            ack = self.checked_ack(msgs)
                    if ack is not None:
                        on_ack(self, ack)
            except Exception as exc:  # noqa: BLE001 - any failure ends the link, as it did when a task read it
                link.unwatch()
                if not ended.done():
                    ended.set_exception(exc)

        ended = link.watch(on_readable)
        try:
            while True:
                idle = (now_ms() - self.last_read_ms) / 1000
                if idle >= timeout:
                    raise LinkTimeout(f"no data from {link.peer} in {timeout:.3f}s")
                done, _ = await asyncio.wait((ended,), timeout=timeout - idle)
                if done:
                    ended.result()
                    raise LinkClosed("link closed")
        finally:
            link.unwatch()
            if ended.done() and not ended.cancelled():
                ended.exception()  # retrieved: the caller reports why the link ended
            else:
                # Dropped for silence: the close that follows must not leave an exception
                # nobody retrieves ("Future exception was never retrieved").
                ended.cancel()

    def plain_acks(self, chunk: bytes) -> int | None:
        """The last offset of a read made only of whole framed acks that make sense (as
        :meth:`checked_ack` says), in one compiled call, their tags checked in order;
        None when the codec must read it (another frame or part of one, an ack to refuse,
        the rocketmq dialect), which then refuses what it must as it always did."""
        codec = self.codec
        if codec.name != "framed" or codec.buffered:
            return None
        mac = codec.mac
        count, ack = _scan_acks(chunk, 0 if mac is None else TAG, self.ack, self.sent, self.epoch_map.last_epoch())
        if count < 0:
            return None
        if mac is not None:
            mac.check_frames(chunk, count, _ACK_BYTES)
        return ack

    def checked_ack(self, msgs: list[Any]) -> int:
        """The last of ``msgs``, which must all be acks that make sense (ProtocolError)."""
        ack = self.ack
        for m in msgs:
            if type(m) is not Ack:
                raise ProtocolError(f"unexpected {type(m).__name__} during transfer")
            if m.offset < ack:
                raise ProtocolError(f"ack {m.offset} goes back from {ack}")
            if m.offset > self.sent:
                raise ProtocolError(f"ack {m.offset} is beyond what was sent ({self.sent})")
            if m.epoch is not None and m.epoch > self.epoch_map.last_epoch():
                raise ProtocolError(f"ack carries epoch {m.epoch}, newer than the master's")
            ack = m.offset
        return ack

    def caught_up_at(self, ack: int, max_offset: int, now: int) -> int | None:
        """Since when (ms) the slave had everything the master had, as ``ack`` proves
        (None: no new proof); the checkpoints it passed are consumed."""
        if ack >= max_offset:
            self.checkpoints.clear()
            return now
        at = None
        cps = self.checkpoints
        while cps and cps[0][0] <= ack:
            at = cps.popleft()[1]
        return at

    # --- status --------------------------------------------------------------------------------

    def _peer_name(self) -> str | None:
        """Who the slave proved to be: the secret's handshake, else its certificate."""
        peer = self.codec.peer or self.link.peer_identity
        return str(peer) if peer is not None else None

    def status(self, now: int, max_offset: int, caught_up_ms: int | None, in_sync: bool) -> dict[str, Any]:
        """This link's entry in ``ha-status``."""
        ack = self.ack
        return {
            "broker_id": self.broker_id,
            "address": self.address,
            "protocol": self.codec.name,
            # Who the slave proved to be (None: the link is not authenticated).
            "identity": self._peer_name(),
            "tls": self.link.tls,
            # Who the slave's TLS certificate names (None: no TLS).
            "certificate": str(cert) if (cert := self.link.peer_identity) is not None else None,
            "state": self.state.value,
            "async_learner": self.learner,
            "ack_offset": ack,
            "lag_bytes": max(max_offset - ack, 0) if ack >= 0 else max_offset,
            "lag_ms": 0 if ack >= max_offset else (now - caught_up_ms if caught_up_ms is not None else None),
            "in_sync": in_sync,
            "transfer_from": self.transfer_from,
            "sent_offset": self.sent,
            "bytes_sent": self.link.bytes_out,
            "connected_ms": now - self.connected_ms,
        }
