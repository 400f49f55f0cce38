"""The HA slave's compiled receive lane, seen from the asyncio side (:class:`LaneRunner`).

While a plaintext framed link carries live traffic, the slave's receive → check → append →
ack runs in :class:`rmqha._core.slave_lane.SlaveLane` on a thread of its own that holds no
GIL (``ha_slave_compiled_lane``, on by default where the extension is built).  The asyncio
side keeps what is not a block: role changes, epochs, truncation, the disk-full back-off,
metrics and errors.  It hears of the lane's progress through an eventfd (one wake-up
pending at most: under load one covers many blocks), and then makes the appended bytes
part of the log's bookkeeping (:meth:`rmqha.store.CommitLog.lane_adopt`: max offset, queue
offsets, listeners, flusher), learns the confirm offset and moves the status counters.

Thread model and ownership, for one run (from a pause of the stream until a hand-back):

* the socket stays the link's; the lane reads and writes it, never closes it;
* the receive buffer (:class:`rmqha.ha.link.RecvBuffer`) and the active segment's mapping
  are lent to the lane (held through the buffer protocol: neither can be resized or closed
  under it) and given back by :meth:`LaneRunner.finish`;
* the log's tail is the lane's (:meth:`rmqha.store.CommitLog.lane_grant`): every other
  write, truncation or reset is refused until it is released;
* the link's MAC counters continue in C and are handed back (``FrameMac.lane_advance``).

Fencing: :meth:`LaneRunner.finish` stops the lane and joins its thread *before* anything
else happens to the session (``SlaveSession.close`` calls it before it closes the link, so
``HASlave.stop`` and ``set_master_address`` return only once no compiled code writes the
log), then adopts what the lane appended (every acked byte is the log's before a new role
starts), then returns the buffer and the tail.  A run ends by itself at anything unusual
(another frame, an epoch change, a block beyond the granted room, a frame larger than the
buffer): the frame is left at the front of the buffer and the Python path reads it, with
its checks and errors.  A failure the lane met is raised here as the Python path raises it.

TLS links keep the Python path (TLS records in C are a later step), as do the ``rocketmq``
dialect, ``ha_slave_flush_before_ack`` (an ack waits for an fsync), a full disk and epoch
entries still being written.  ``RMQHA_NO_EXTENSIONS=1`` turns the lane off with the twins.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import os
import threading
from types import ModuleType
from typing import Any

from rmqha import _core
from rmqha._core.records_py import ScanStop
from rmqha.errors import AuthenticationError, CorruptRecordError, DiskFullError
from rmqha.ha.config import HAConfig
from rmqha.ha.disk_full import DiskFullWatch
from rmqha.ha.frame_mac import FrameMac, LaneMacState
from rmqha.ha.link import Link, LinkClosed, LinkTimeout, RecvBuffer
from rmqha.ha.slave_epochs import EpochWriter
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress, SlaveState

log = logging.getLogger("rmqha.ha.slave")


def _load() -> ModuleType | None:
    if _core.NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module("rmqha._core.slave_lane")
    except ImportError:  # built without OpenSSL's headers: the Python path serves
        log.info("the HA slave's compiled lane is not built (no OpenSSL headers): the Python path serves")
        return None


_impl: Any = _load()


def lane_available() -> bool:
    """Whether the compiled lane is built and allowed (``RMQHA_NO_EXTENSIONS`` unset)."""
    return _impl is not None


@dataclasses.dataclass
class LaneEnd:
    """How a run ended, for the receive loop: whether it ran at all, the offset last
    acked, and the part of an ack the socket did not take (to send first)."""

    ran: bool
    acked: int
    unsent: bytes = b""


class LaneRunner:
    """Runs one session's compiled lane whenever the receive loop lends it the link."""

    def __init__(self, link: Link, mac: FrameMac | None, commitlog: Any, *, config: HAConfig,
                 epochs: EpochWriter, confirm: ConfirmTracker, progress: SlaveProgress, disk: DiskFullWatch,
                 master: str) -> None:
        assert _impl is not None
        self.link = link
        self.mac = mac
        self.commitlog = commitlog
        self.config = config
        self.epochs = epochs
        self.confirm = confirm
        self.progress = progress
        self.disk = disk
        self.master = master
        self._lane = _impl.SlaveLane()
        self._thread: threading.Thread | None = None
        self._rb: RecvBuffer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Counters of the current run already reported (the lane's count from 0 per run).
        self._seen_blocks = 0
        self._seen_in = 0
        self._seen_out = 0
        #: Whether the run took a block (the session's first block is no longer ahead).
        self.took_blocks = False
        #: Set when the lane could not start: the Python path serves the rest of the session.
        self._disabled = False
        #: The MAC's state when the run started (None: no MAC).
        self._mac_start: LaneMacState | None = None

    def usable(self) -> bool:
        """Whether a run may start now (else the Python path serves this pause)."""
        return (not self._disabled and not self.link.closed and not self.disk.active and not self.epochs.pending
                and self.epochs.last_entry() is not None
                and (self.mac is None or not self.mac.failed))

    async def run(self, rb: RecvBuffer, acked: int) -> LaneEnd:
        """Lend the lane the link, ``rb`` and the log's tail until it stops; raises what
        the Python path raises for the same failure, returns on a hand-back."""
        last = self.epochs.last_entry()
        assert last is not None
        try:
            grant = self.commitlog.lane_grant()
        except DiskFullError:
            return LaneEnd(False, acked)  # the Python path meets the full disk itself
        lane = self._lane
        cfg = self.config
        try:
            lane.arm(self.link.fd, rb.buf, rb.start, rb.end, grant.mapping, grant.fd, grant.base,
                     self.commitlog.segment_bytes, grant.limit, grant.warm, grant.max_offset, grant.whole_offset,
                     last[0], last[1], cfg.max_frame_bytes, cfg.ha_send_heartbeat_interval_ms,
                     cfg.ha_housekeeping_interval_ms, int(self.progress.last_read * 1e9),
                     int(self.progress.last_write * 1e9), acked)
            self._mac_start = self.mac.lane_state() if self.mac is not None else None
            if self._mac_start is not None:
                lane.set_mac(*dataclasses.astuple(self._mac_start))
        except ValueError as exc:
            # A state the lane does not take (never expected): the Python path serves.
            lane.disarm()
            self.commitlog.lane_release()
            log.warning("HA slave: the compiled lane cannot start (%s); the Python path serves this session",
                        exc)
            self._disabled = True
            return LaneEnd(False, acked)
        except BaseException:
            lane.disarm()
            self.commitlog.lane_release()
            raise
        self.commitlog.lane_watch(lane.progress)
        self._rb = rb
        self._seen_blocks = self._seen_in = self._seen_out = 0
        loop = self._loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        loop.add_reader(lane.event_fd, self._on_event, done)
        thread = self._thread = threading.Thread(target=self._main, args=(loop, done), name="ha-slave-lane",
                                                 daemon=True)
        thread.start()
        try:
            await done
        finally:
            self.finish()
        return self._outcome()

    def _main(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[int]) -> None:
        """The lane's thread: the compiled loop, then the asyncio side is told."""
        outcome: int | BaseException
        try:
            outcome = self._lane.run()
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting task, which raises it
            outcome = exc
        try:
            loop.call_soon_threadsafe(_resolve, done, outcome)
        except RuntimeError:  # the loop is closed: finish() joined this thread already
            pass

    def _on_event(self, done: asyncio.Future[int]) -> None:
        """The lane has progress to report (in the loop's thread)."""
        self._lane.take_event()
        try:
            self._adopt()
        except Exception as exc:  # noqa: BLE001 - the run ends, and its task raises it
            self._lane.stop()
            if not done.done():
                done.set_exception(exc)

    def _adopt(self) -> None:
        """Make what the lane appended the log's, learn the confirm offset, count."""
        lane = self._lane
        whole, end = lane.progress()
        limit, warm = self.commitlog.lane_adopt(end, whole)
        lane.set_room(limit, warm)
        learnt = lane.learnt
        if learnt >= 0:
            self.confirm.learn(learnt)
        p = self.progress
        blocks = lane.blocks + lane.heartbeats  # heartbeats included, as callback_blocks
        if blocks != self._seen_blocks:
            p.lane_blocks += blocks - self._seen_blocks
            self._seen_blocks = blocks
        if lane.blocks:
            self.took_blocks = True
        if blocks:
            p.state = SlaveState.SUSPEND if lane.suspended else SlaveState.TRANSFER
        if lane.last_read_ns:
            p.last_read = lane.last_read_ns / 1e9
        if lane.last_write_ns:
            p.last_write = lane.last_write_ns / 1e9
        bytes_in, bytes_out = lane.bytes_in, lane.bytes_out
        self.link.bytes_in += bytes_in - self._seen_in
        self.link.bytes_out += bytes_out - self._seen_out
        self._seen_in, self._seen_out = bytes_in, bytes_out
        self.confirm.tell()

    def finish(self) -> None:
        """Stop the lane and join its thread, adopt what it appended, give back the buffer,
        the tail and the MAC counters (idempotent; the fencing point of a role change)."""
        thread = self._thread
        if thread is None:
            return
        lane = self._lane
        lane.stop()
        thread.join()
        self._thread = None
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(lane.event_fd)
        try:
            self._adopt()
        finally:
            start, end = lane.disarm()
            rb = self._rb
            if rb is not None:
                rb.start, rb.end, rb.filled = start, end, False
            self.commitlog.lane_release()
            start = self._mac_start
            if self.mac is not None and start is not None:
                self.mac.lane_advance(lane.frames_in - start.in_seq, lane.blocks_in - start.block_count,
                                      lane.frames_out - start.out_seq)
                self._mac_start = None
            self.progress.lane_runs += 1

    def _outcome(self) -> LaneEnd:
        """The run's end as the receive loop takes it: a hand-back, or the failure raised."""
        lane = self._lane
        why = lane.why
        acked = lane.acked
        if why == _impl.SEND:
            return LaneEnd(True, acked, lane.unsent)
        if why in (_impl.STOPPED, _impl.OTHER, _impl.ROOM, _impl.BIG):
            return LaneEnd(True, acked)
        housekeeping = self.config.ha_housekeeping_interval_ms / 1000
        if why == _impl.TIMEOUT:
            raise LinkTimeout(f"master {self.master} silent for {housekeeping:.1f}s")
        if why == _impl.CLOSED:
            raise LinkClosed(f"peer {self.link.peer} closed the link")
        if why == _impl.CORRUPT:
            block, at, stop = lane.bad
            raise CorruptRecordError(f"replicated block at {block}: invalid record at {at} "
                                     f"({ScanStop(stop).name}); nothing written")
        if why == _impl.AUTH:
            raise AuthenticationError(f"frame #{lane.frames_in} failed authentication (altered, dropped, "
                                      "reordered or replayed); close the link")
        err = lane.err
        raise OSError(err, os.strerror(err))


def _resolve(done: asyncio.Future[int], outcome: int | BaseException) -> None:
    if done.done():
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
