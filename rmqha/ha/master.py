"""The master side of HA replication (:class:`HAMaster`): serve slaves, confirm, track the set.

One :class:`HAMaster` listens on the broker's HA port and serves every slave that passes the
handshake, in either dialect (told apart by the connection's first four bytes).  Per slave
it runs two tasks on the loop: a reader (handshake, epoch exchange, acks, housekeeping) and
a writer that pushes the log from the slave's offset in blocks cut by
:func:`rmqha.ha.offsets.limit_batch`, each labelled with its own epoch and epoch start, with
the bytes sent straight from the commitlog: header + mmap memoryviews through one sendmsg,
or with ``ha_transfer_sendfile`` large blocks through ``sendfile`` (the kernel hands
page-cache pages to the socket, no copy on this side; but then the slave copies from
memory no CPU cache has seen, and on loopback with two cores catch-up was measured ~15%
slower, so it is off by default).  A slave that reports an offset below this log's min
offset (retention removed the bytes) gets its first block at the min offset, which tells
it to drop its log and start over there.
The writer is woken by the commitlog's append listener, never by polling.
One link per slave id counts: a new link for an id closes the one it replaces as soon as
its hello is accepted (even one still handshaking), and a link that ends removes only
itself, so acks, waiters and caught-up times always follow the live link.

The master also owns the confirm offset (min ack over the SyncStateSet, counting itself
with its max offset; a member without a live link freezes it, RocketMQ #6662), waits for
acks on behalf of producers, and proposes SyncStateSet changes through the broker's async
``alter_sync_state_set(new_ids) -> (ids, epoch)`` callback: expand when a slave's ack
reaches the confirm offset and the current epoch's start, shrink when a member has not been
caught up for ``ha_max_time_slave_not_catchup_ms``.  While a proposal is in flight the
union of the old and the new set counts (#5663).  Async learners never join.  Expansions
add one member per proposal, the one refused longest ago first: the controller refuses a
whole proposal if one new member is not alive in its view (an old master cut off from the
controllers that rejoined as a slave), and that one must not keep the others out.

Labels are computed from the live epoch map for every block, so a new epoch appended while
slaves are connected is picked up at once (RocketMQ #9689 kept a stale epoch per link).
"""
from __future__ import annotations

import asyncio
import heapq
import inspect
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from enum import Enum
from typing import Any

from rmqha.ha import offsets as hao
from rmqha.errors import ProtocolError, ReplicationError, RmqhaError, StoreError
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import (
    Ack,
    EpochQuery,
    MasterCodec,
    RefuseReason,
    SlaveHello,
    TruncateConfirm,
    master_codec,
)
from rmqha.ha.link import HAVE_SENDFILE, FileRange, Link, LinkClosed, LinkTimeout, Waker, tune_socket
from rmqha.ha.sync_state import SyncStateSet

log = logging.getLogger(__name__)

AlterCallback = Callable[[list[int]], Awaitable[tuple[Iterable[int], int]]]
#: How many (master max, time) transfer checkpoints a link keeps for caught-up times.
_CHECKPOINTS = 256
#: Blocks at least this large are sent with sendfile: below it, the copy a sendmsg makes
#: costs less than a second syscall per block.
_SENDFILE_MIN_BYTES = 64 << 10
#: Live traffic up to this size goes out from the append's loop turn (_push); more is
#: catch-up, which the writer task sends in windows.
_PUSH_MAX_BYTES = 256 << 10


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class LinkState(str, Enum):
    """Where one slave link is (the HAConnectionState names)."""

    HANDSHAKE = "HANDSHAKE"
    TRANSFER = "TRANSFER"
    SUSPEND = "SUSPEND"  # caught up, only heartbeats flow
    SHUTDOWN = "SHUTDOWN"


class _SlaveLink:
    """Master-side state of one connected slave."""

    def __init__(self, link: Link, codec: MasterCodec, hello: SlaveHello) -> None:
        self.link = link
        self.codec = codec
        self.broker_id = hello.broker_id
        self.address = hello.address or link.peer
        self.learner = hello.async_learner
        self.sync_from_last_file = hello.sync_from_last_file
        self.state = LinkState.HANDSHAKE
        #: Last offset the slave acknowledged (-1 until it reported one).
        self.ack = -1
        #: Where the transfer started and how far blocks have been handed to the socket.
        self.transfer_from = -1
        self.sent = -1
        self.connected_ms = _now_ms()
        self.last_read_ms = self.connected_ms
        #: (master max offset, time) at sends: an ack >= max means caught up as of that time.
        self.checkpoints: deque[tuple[int, int]] = deque(maxlen=_CHECKPOINTS)
        self.waker: Waker | None = None
        self.writer: asyncio.Task[None] | None = None
        #: Whether the writer waits for new data (then _push may send for it).
        self.parked = False
        #: What _push left for the writer to send (the socket took only part).
        self.unsent: list[memoryview] = []
        self.last_send = time.monotonic()
        self.close_reason = ""


class _LinkTable:
    """The newest link of each slave id: the only one whose ack offset, copies and
    caught-up time count.  A link claims its id as soon as its hello is accepted, so a
    link still handshaking is replaced like an established one, and a link that ends
    releases only itself, never a newer link of its id."""

    def __init__(self) -> None:
        self._by_id: dict[int, _SlaveLink] = {}

    def claim(self, sl: _SlaveLink) -> _SlaveLink | None:
        """Hold ``sl`` for its id; returns the link it replaces (the caller closes it)."""
        old = self._by_id.get(sl.broker_id)
        self._by_id[sl.broker_id] = sl
        return old if old is not sl else None

    def release(self, sl: _SlaveLink) -> None:
        if self._by_id.get(sl.broker_id) is sl:
            del self._by_id[sl.broker_id]

    def holds(self, sl: _SlaveLink) -> bool:
        return self._by_id.get(sl.broker_id) is sl

    def get(self, broker_id: int) -> _SlaveLink | None:
        return self._by_id.get(broker_id)

    def keys(self) -> Iterable[int]:
        return self._by_id.keys()

    def values(self) -> Iterable[_SlaveLink]:
        return self._by_id.values()

    def __len__(self) -> int:
        return len(self._by_id)


class _AckCallback:
    """A waiter of :meth:`HAMaster.when_acks`: it sits in the waiter heaps beside the
    futures of :meth:`HAMaster.wait_for_acks` and answers to the same two calls."""

    __slots__ = ("_done", "_fired", "timer")

    def __init__(self, done: Callable[[bool], None]) -> None:
        self._done = done
        self._fired = False
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self._fired

    def set_result(self, ok: bool) -> None:
        if self._fired:
            return
        self._fired = True
        if self.timer is not None:
            self.timer.cancel()
        try:
            self._done(ok)
        except Exception:  # one send's answer must not stop the other waiters
            log.exception("an acknowledgement callback failed")


class HAMaster:
    """Serves the commitlog to slaves on the HA port and keeps the confirm offset.

    Call everything on the event loop the master was started on; the commitlog may be
    appended from any thread (the append listener hops onto the loop).
    """

    def __init__(
        self,
        commitlog: Any,
        epoch_map: Any,
        *,
        group: str,
        broker_id: int,
        config: HAConfig | None = None,
        is_known_replica: Callable[[int], bool | Awaitable[bool]] | None = None,
        alter_sync_state_set: AlterCallback | None = None,
        on_confirm: Callable[[int], Any] | None = None,
        sync_state_set: Iterable[int] = (),
        sync_state_set_epoch: int = 0,
        confirm_offset: int | None = None,
    ) -> None:
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.group = group
        self.broker_id = int(broker_id)
        self.config = config or HAConfig()
        self._is_known = is_known_replica
        self._alter = alter_sync_state_set
        self._on_confirm = on_confirm
        self._set = SyncStateSet(self.broker_id, sync_state_set, sync_state_set_epoch, _now_ms())
        max_offset = commitlog.max_offset
        if confirm_offset is None:
            # Data before the current epoch was settled by the election that started it.
            last = epoch_map.last_entry()
            confirm_offset = last[1] if last is not None else max_offset
        self._confirm = max(min(int(confirm_offset), max_offset), 0)
        self._links = _LinkTable()
        self._all: set[_SlaveLink] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiters: dict[int | None, list[tuple[int, int, asyncio.Future[bool] | _AckCallback]]] = {}
        self._waiter_seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake_pending = False
        self._server: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._check_task: asyncio.Task[None] | None = None
        self._alter_task: asyncio.Task[None] | None = None
        self._alter_again = False
        self._stopped = False
        self.address = ""
        #: member -> when (ms) the controller last refused adding it.
        self._refused_at: dict[int, int] = {}

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 picks a free port); returns the bound port."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._server = sock
        bound = sock.getsockname()[1]
        self.address = f"{host}:{bound}"
        self.commitlog.add_append_listener(self._on_append)
        self._accept_task = asyncio.ensure_future(self._accept_loop())
        self._check_task = asyncio.ensure_future(self._check_loop())
        self._recompute_confirm()
        log.info("HA master %s listening on %s (group %s, set %s epoch %d)", self.broker_id,
                 self.address, self.group, sorted(self._set.local), self._set.epoch)
        return bound

    async def stop(self) -> None:
        """Close the port and every link; pending ack waits answer False."""
        if self._stopped:
            return
        self._stopped = True
        remove = getattr(self.commitlog, "remove_append_listener", None)
        if remove is not None:
            try:
                remove(self._on_append)
            except (ValueError, KeyError):
                pass
        if self._server is not None:
            self._server.close()
        tasks = [t for t in (self._accept_task, self._check_task, self._alter_task) if t is not None]
        for sl in list(self._all):
            sl.close_reason = sl.close_reason or "master stopping"
            sl.link.close()
        tasks.extend(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for waiters in self._waiters.values():
            for _, _, fut in waiters:
                if not fut.done():
                    fut.set_result(False)
        self._waiters.clear()
        log.info("HA master %s stopped", self.broker_id)

    # --- public state ------------------------------------------------------------------------

    @property
    def confirm_offset(self) -> int:
        if len(self._set.members()) == 1:
            self._recompute_confirm()
        return self._confirm

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The set the controller applied (the master always included)."""
        return self._set.local

    @property
    def sync_state_set_epoch(self) -> int:
        return self._set.epoch

    def sync_state_set_size(self) -> int:
        """Replicas counted for ``min_in_sync_replicas`` (max of old/new while a change is in flight)."""
        return self._set.replica_count()

    def set_sync_state_set(self, ids: Iterable[int], epoch: int) -> bool:
        """Adopt the controller's set (ignored if ``epoch`` is older than the one held)."""
        old = self._set.local
        if not self._set.apply(ids, epoch, _now_ms()):
            log.info("ignoring SyncStateSet %s epoch %d: holding epoch %d", sorted(ids), epoch, self._set.epoch)
            return False
        if self._set.local != old:
            log.info("SyncStateSet now %s (epoch %d)", sorted(self._set.local), epoch)
        self._recompute_confirm()
        self._check_waiters()
        return True

    def on_new_epoch(self, epoch: int, start: int) -> None:
        """The broker appended (or asks to append) epoch ``epoch`` starting at ``start``.

        Links need no reset: every block's label is read from the live epoch map, so the
        next block after ``start`` already travels under the new epoch (#9689).
        """
        if self.epoch_map.last_epoch() < epoch:
            self.epoch_map.append(epoch, start)
        for sl in self._links.values():
            if sl.waker is not None:
                sl.waker.wake()
        self._recompute_confirm()

    async def wait_for_acks(self, offset: int, need: int | None = None, timeout: float = 3.0) -> bool:
        """True once ``need`` replicas (None: every SyncStateSet member) hold ``offset``."""
        if self._acks_reached(offset, need):
            return True
        if self._stopped:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiter_seq += 1
        heapq.heappush(self._waiters.setdefault(need, []), (offset, self._waiter_seq, fut))
        timer = loop.call_later(timeout, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()

    def when_acks(self, offset: int, need: int | None, done: Callable[[bool], None],
                  timeout: float) -> None:
        """:meth:`wait_for_acks` for a caller without a task: ``done(ok)`` runs once, in the
        loop turn that handles the deciding ack (or at once, or after ``timeout``)."""
        if self._acks_reached(offset, need):
            done(True)
            return
        if self._stopped:
            done(False)
            return
        assert self._loop is not None
        waiter = _AckCallback(done)
        self._waiter_seq += 1
        heapq.heappush(self._waiters.setdefault(need, []), (offset, self._waiter_seq, waiter))
        waiter.timer = self._loop.call_later(timeout, waiter.set_result, False)

    def _copies_needed(self) -> int | None:
        """The broker's ack policy: every member (None) with ``all_ack_in_sync_state_set``,
        else ``in_sync_replicas`` copies (the master counts as one; 0 or 1 needs no wait);
        in both cases at least ``min_in_sync_replicas`` copies (see :meth:`_acks_reached`)."""
        if self.config.all_ack_in_sync_state_set:
            return None
        return max(self.config.in_sync_replicas, self.config.min_in_sync_replicas)

    async def wait_for_replicas(self, offset: int, timeout: float) -> bool:
        """True once the ack policy (:meth:`_copies_needed`) holds for ``offset``."""
        need = self._copies_needed()
        if need is not None and need <= 1:
            return True
        return await self.wait_for_acks(offset, need, timeout)

    def replicas_hold(self, offset: int) -> bool:
        """Whether the ack policy (:meth:`_copies_needed`) holds for ``offset`` now."""
        need = self._copies_needed()
        return (need is not None and need <= 1) or self._acks_reached(offset, need)

    def when_replicas(self, offset: int, timeout: float, done: Callable[[bool], None]) -> None:
        """:meth:`wait_for_replicas` with a callback (see :meth:`when_acks`)."""
        need = self._copies_needed()
        if need is not None and need <= 1:
            done(True)
            return
        self.when_acks(offset, need, done, timeout)

    def status(self) -> dict[str, Any]:
        """Everything ``ha-status`` shows for a master."""
        now = _now_ms()
        max_offset = self.commitlog.max_offset
        slaves = []
        for sl in sorted(self._all, key=lambda s: s.broker_id):
            caught = self._set.caught_up_ms(sl.broker_id)
            ack = sl.ack
            slaves.append({
                "broker_id": sl.broker_id,
                "address": sl.address,
                "protocol": sl.codec.name,
                "state": sl.state.value,
                "async_learner": sl.learner,
                "ack_offset": ack,
                "lag_bytes": max(max_offset - ack, 0) if ack >= 0 else max_offset,
                "lag_ms": 0 if ack >= max_offset else (now - caught if caught is not None else None),
                "in_sync": sl.broker_id in self._set.local,
                "transfer_from": sl.transfer_from,
                "sent_offset": sl.sent,
                "bytes_sent": sl.link.bytes_out,
                "connected_ms": now - sl.connected_ms,
            })
        members = self._set.local
        return {
            "role": "master",
            "group": self.group,
            "broker_id": self.broker_id,
            "address": self.address,
            "epoch": self.epoch_map.last_epoch(),
            "max_offset": max_offset,
            "confirm_offset": self.confirm_offset,
            "sync_state_set": sorted(members),
            "sync_state_set_epoch": self._set.epoch,
            "proposed_sync_state_set": sorted(self._set.proposed) if self._set.proposed is not None else None,
            "slave_num": len(self._all),
            "in_sync_slave_num": len(members) - 1,
            "slaves": slaves,
        }

    # --- append listener ---------------------------------------------------------------------

    def _on_append(self, new_max_offset: int) -> None:
        """Commitlog append listener (any thread): wake the writers once per loop turn."""
        if self._wake_pending or self._stopped or self._loop is None:
            return
        self._wake_pending = True
        try:
            if threading.get_ident() == self._loop_thread:
                self._loop.call_soon(self._wake_all)
            else:
                self._loop.call_soon_threadsafe(self._wake_all)
        except RuntimeError:  # loop closed under a late append
            self._wake_pending = False

    def push_now(self) -> None:
        """Send what was appended in this loop turn now rather than at the start of the
        next one: a send that is alone on its connection saves a turn of its round trip
        (concurrent sends leave it to the turn's end, so they share one push)."""
        if self._wake_pending:
            self._wake_all()

    def _wake_all(self) -> None:
        self._wake_pending = False
        max_offset = self.commitlog.max_offset
        for sl in list(self._links.values()):
            if sl.waker is None or (sl.sent >= max_offset and not sl.unsent):
                continue  # nothing new: a busy writer looks again after its send anyway
            if sl.parked and not sl.unsent and self._push(sl, max_offset):
                continue
            sl.waker.wake()
        if len(self._set.members()) == 1:
            self._recompute_confirm()
            self._check_waiters()

    # --- accept and handshake ----------------------------------------------------------------

    async def _accept_loop(self) -> None:
        assert self._server is not None and self._loop is not None
        while not self._stopped:
            try:
                conn, _ = await self._loop.sock_accept(self._server)
            except OSError as exc:
                if self._stopped:
                    return
                log.warning("HA accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            tune_socket(conn)
            task = asyncio.ensure_future(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        link = Link(conn)
        held: list[_SlaveLink] = []  # the link's state once the slave introduced itself
        reason = ""
        try:
            sl = await self._handshake(link, held)
            if sl is None:
                return
            await self._read_loop(sl)
        except LinkClosed as exc:
            reason = str(exc)
        except LinkTimeout as exc:
            reason = f"housekeeping: {exc}"
        except (ProtocolError, ReplicationError) as exc:
            reason = f"bad frame: {exc}"
            log.warning("closing HA link %s: %s", link.peer, reason)
        except (OSError, StoreError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("closing HA link %s: %s", link.peer, reason)
        finally:
            link.close()
            for sl in held:
                self._drop(sl, sl.close_reason or reason)

    async def _read_frames(self, link: Link, codec: MasterCodec, pending: list[Any], timeout: float) -> Any:
        while not pending:
            pending.extend(codec.feed(await link.recv(timeout)))
        return pending.pop(0)

    async def _handshake(self, link: Link, held: list[_SlaveLink]) -> _SlaveLink | None:
        cfg = self.config
        timeout = cfg.ha_housekeeping_interval_ms / 1000
        head = b""
        while len(head) < 4:
            head += await link.recv(timeout)
        codec = master_codec(head[:4], cfg.max_frame_bytes)
        pending: list[Any] = list(codec.feed(head))
        hello = await self._read_frames(link, codec, pending, timeout)
        if not isinstance(hello, SlaveHello):
            raise ProtocolError(f"expected a slave handshake first, got {type(hello).__name__}")
        reason, why = await self._check_hello(hello)
        max_offset = self.commitlog.max_offset
        self.epoch_map.set_max_offset(max_offset)
        last_epoch = self.epoch_map.last_epoch()
        reply = codec.hello(reason, max_offset, last_epoch, self.epoch_map.pairs())
        if reason != RefuseReason.ACCEPTED:
            log.warning("refusing HA slave %d from %s (%s): %s", hello.broker_id, link.peer, codec.name, why)
            if reply is not None:
                await link.send([reply], timeout)
            return None
        sl = _SlaveLink(link, codec, hello)
        held.append(sl)
        old = self._links.claim(sl)
        if old is not None:
            old.close_reason = "replaced by a new link from the same broker id"
            old.link.close()
            self._drop(old, old.close_reason)
        self._all.add(sl)
        await link.send([reply], timeout)
        if codec.epoch_exchange:
            query = await self._read_frames(link, codec, pending, timeout)
            if not isinstance(query, EpochQuery):
                raise ProtocolError(f"expected QUERY_EPOCH, got {type(query).__name__}")
            max_offset = self.commitlog.max_offset
            entries = self._entries(max_offset)
            await link.send([codec.epochs(entries, self.epoch_map.last_epoch())], timeout)
            confirm = await self._read_frames(link, codec, pending, timeout)
            if not isinstance(confirm, TruncateConfirm):
                raise ProtocolError(f"expected CONFIRM_TRUNCATE, got {type(confirm).__name__}")
            offset = confirm.offset
        else:
            report = await self._read_frames(link, codec, pending, timeout)
            if not isinstance(report, Ack):
                raise ProtocolError(f"expected the slave's first report, got {type(report).__name__}")
            offset = report.offset
        if not self._links.holds(sl):
            raise LinkClosed("replaced by a newer link from the same broker id during the handshake")
        start = self._transfer_start(sl, offset)
        sl.ack = offset
        sl.transfer_from = start
        sl.sent = start
        sl.state = LinkState.TRANSFER
        log.info("HA slave %d (%s, %s%s) connected from %s: reports %d, transfer from %d",
                 sl.broker_id, sl.address, codec.name, ", async learner" if sl.learner else "",
                 link.peer, offset, start)
        sl.waker = Waker()
        sl.writer = asyncio.ensure_future(self._write_loop(sl))
        self._tasks.add(sl.writer)
        sl.writer.add_done_callback(self._tasks.discard)
        sl.writer.add_done_callback(lambda t, s=sl: self._writer_done(s, t))
        if pending:
            self._handle_acks(sl, pending)
        self._recompute_confirm()
        return sl

    async def _check_hello(self, hello: SlaveHello) -> tuple[int, str]:
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

    def _transfer_start(self, sl: _SlaveLink, offset: int) -> int:
        cl = self.commitlog
        min_offset = cl.min_offset
        max_offset = cl.max_offset
        if offset == 0:
            # An empty slave: the master's first byte, or its last segment's first byte.
            if sl.sync_from_last_file:
                return max(max_offset - max_offset % cl.segment_bytes, min_offset)
            return min_offset
        if offset > max_offset:
            raise ReplicationError(
                f"slave {sl.broker_id} reports offset {offset} beyond the master's max offset {max_offset}"
            )
        if offset < min_offset:
            # The bytes in between are gone here (retention): the slave cannot continue its
            # log.  Its first block then starts beyond its end, at this segment-aligned
            # offset, which tells it to drop its log and start over there (a slave accepts
            # that jump only as the first block of a session).
            log.warning(
                "HA slave %d reports offset %d below this master's min offset %d: sending from %d; "
                "the slave drops its log", sl.broker_id, offset, min_offset, min_offset
            )
            return min_offset
        return offset

    # --- transfer ----------------------------------------------------------------------------

    def _blocks(self, nxt: int, max_offset: int, budget: int) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, epoch start, offset, size) of the blocks that carry ``nxt``..``max_offset``,
        at most ``budget`` bytes (at least one block); a block never crosses an epoch
        boundary or a segment end."""
        cl = self.commitlog
        em = self.epoch_map
        em.set_max_offset(max_offset)
        limit = hao.limit_batch
        batch = self.config.ha_transfer_batch_bytes
        total = 0
        while nxt < max_offset and total < budget:
            epoch, epoch_start, size = limit(em, nxt, max_offset - nxt, cl.segment_end(nxt), batch)
            if size <= 0:
                raise ReplicationError(f"no block can start at {nxt} (max offset {max_offset})")
            yield epoch, epoch_start, nxt, size
            nxt += size
            total += size

    def _mark_sent(self, sl: _SlaveLink, max_offset: int, nxt: int) -> None:
        sl.checkpoints.append((max_offset, _now_ms()))
        sl.state = LinkState.TRANSFER
        # Acks may arrive before the bytes have left: count the blocks as sent now.
        sl.sent = nxt
        sl.last_send = time.monotonic()

    def _push(self, sl: _SlaveLink, max_offset: int) -> bool:
        """Send new live traffic to a parked writer's slave right here, in the loop turn
        of the append, as mmap views in one sendmsg: waking the writer task instead costs
        two more loop turns per message, which is most of a one-at-a-time send's latency.
        False when the writer must take over (much to send, or the socket took only part)."""
        nxt = sl.sent
        if max_offset - nxt > _PUSH_MAX_BYTES:
            return False
        cl = self.commitlog
        codec = sl.codec
        confirm = self._confirm
        parts: list[Any] = []
        end = nxt
        for epoch, epoch_start, offset, size in self._blocks(nxt, max_offset, _PUSH_MAX_BYTES):
            parts.append(codec.block_header(epoch, epoch_start, offset, confirm, size))
            parts.append(cl.read(offset, size))
            end = offset + size
        self._mark_sent(sl, max_offset, end)
        try:
            sl.unsent = sl.link.try_send(parts)
        except (LinkClosed, OSError) as exc:
            # The link's reader sees the close and drops the slave.
            sl.close_reason = sl.close_reason or f"send failed: {exc}"
            sl.link.close()
            return True
        return not sl.unsent and end == max_offset

    async def _write_loop(self, sl: _SlaveLink) -> None:
        cfg = self.config
        cl = self.commitlog
        link = sl.link
        codec = sl.codec
        waker = sl.waker
        assert waker is not None
        window = cfg.ha_send_window_bytes
        heartbeat = cfg.ha_send_heartbeat_interval_ms / 1000
        send_timeout = cfg.ha_housekeeping_interval_ms / 1000
        sl.last_send = time.monotonic()
        # With ha_transfer_sendfile, large blocks go out with sendfile (no copy on this
        # side at all); otherwise, and for small blocks (live traffic) always, as mmap
        # views in one sendmsg.
        segment_fd = getattr(cl, "segment_fd", None) if HAVE_SENDFILE and cfg.ha_transfer_sendfile else None
        seg_bytes = cl.segment_bytes
        src_fd = -1
        src_base = -1
        stale_fds: list[int] = []
        try:
            while not link.closed:
                if sl.unsent:
                    # What _push handed the socket only in part.
                    unsent, sl.unsent = sl.unsent, []
                    await link.send(unsent, send_timeout)
                # _push moves sl.sent while this task is parked.
                nxt = sl.sent
                max_offset = cl.max_offset
                if nxt < max_offset:
                    confirm = self._confirm
                    parts: list[Any] = []
                    end = nxt
                    for epoch, epoch_start, offset, size in self._blocks(nxt, max_offset, window):
                        parts.append(codec.block_header(epoch, epoch_start, offset, confirm, size))
                        if segment_fd is not None and size >= _SENDFILE_MIN_BYTES:
                            base = offset - offset % seg_bytes
                            if base != src_base:
                                if src_fd >= 0:
                                    # Closed once this window is sent: its ranges use it.
                                    stale_fds.append(src_fd)
                                    src_fd = -1
                                src_fd = segment_fd(offset)
                                src_base = base
                            parts.append(FileRange(src_fd, offset - base, size))
                        else:
                            parts.append(cl.read(offset, size))
                        end = offset + size
                    self._mark_sent(sl, max_offset, end)
                    await link.send_parts(parts, send_timeout)
                    parts.clear()  # release the mmap views
                    while stale_fds:
                        os.close(stale_fds.pop())
                    sl.last_send = time.monotonic()
                    # A socket that keeps taking data never suspends send(): let others run.
                    await asyncio.sleep(0)
                    continue
                if nxt > max_offset:
                    raise ReplicationError(f"master log shrank below the transfer offset {nxt} (max {max_offset})")
                if sl.ack >= max_offset:
                    sl.state = LinkState.SUSPEND
                idle = time.monotonic() - sl.last_send
                if idle >= heartbeat:
                    await link.send([self._heartbeat(sl, nxt)], send_timeout)
                    sl.last_send = time.monotonic()
                    continue
                sl.parked = True
                try:
                    await waker.wait(heartbeat - idle)
                finally:
                    sl.parked = False
        finally:
            if src_fd >= 0:
                stale_fds.append(src_fd)
            for fd in stale_fds:
                os.close(fd)

    def _heartbeat(self, sl: _SlaveLink, nxt: int) -> bytes:
        last = self.epoch_map.last_entry()
        epoch, start = (last[0], last[1]) if last is not None else (0, 0)
        if start > nxt:
            # The slave sits before the newest epoch: label with the epoch it is in.
            entry = self.epoch_map.entry_for_offset(max(nxt - 1, 0))
            if entry is not None:
                epoch, start = entry[0], entry[1]
        return sl.codec.block_header(epoch, min(start, nxt), nxt, self._confirm, 0)

    def _writer_done(self, sl: _SlaveLink, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, (LinkClosed, LinkTimeout)):
            sl.close_reason = sl.close_reason or f"send failed: {exc}"
        else:
            sl.close_reason = sl.close_reason or f"transfer failed: {type(exc).__name__}: {exc}"
            log.warning("HA transfer to slave %d failed: %s", sl.broker_id, sl.close_reason)
        sl.link.close()

    # --- acks ----------------------------------------------------------------------------------

    async def _read_loop(self, sl: _SlaveLink) -> None:
        """Until the link fails; raises why.  Acks are handled by a reader callback in the
        loop turn that receives them (waking a task per ack costs a turn each, and an ack is
        what a waiting send needs next); this coroutine only watches for silence: a slave
        reports at least every heartbeat interval."""
        timeout = self.config.ha_housekeeping_interval_ms / 1000
        link = sl.link
        codec = sl.codec

        def on_readable() -> None:
            try:
                chunk = link.try_recv()
                if chunk:
                    sl.last_read_ms = _now_ms()
                    msgs = codec.feed(chunk)
                    if msgs:
                        self._handle_acks(sl, msgs)
            except Exception as exc:  # noqa: BLE001 - any failure ends the link, as it did when a task read it
                link.unwatch()
                if not ended.done():
                    ended.set_exception(exc)

        ended = link.watch(on_readable)
        try:
            while True:
                idle = (_now_ms() - sl.last_read_ms) / 1000
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

    def _handle_acks(self, sl: _SlaveLink, msgs: list[Any]) -> None:
        if not self._links.holds(sl):
            raise LinkClosed("replaced by a newer link from the same broker id")
        ack = sl.ack
        for m in msgs:
            if type(m) is not Ack:
                raise ProtocolError(f"unexpected {type(m).__name__} during transfer")
            if m.offset < ack:
                raise ProtocolError(f"ack {m.offset} goes back from {ack}")
            if m.offset > sl.sent:
                raise ProtocolError(f"ack {m.offset} is beyond what was sent ({sl.sent})")
            if m.epoch is not None and m.epoch > self.epoch_map.last_epoch():
                raise ProtocolError(f"ack carries epoch {m.epoch}, newer than the master's")
            ack = m.offset
        sl.ack = ack
        if not sl.learner:
            self._note_caught_up(sl, ack)
            if sl.broker_id not in self._set.local and self._should_expand(ack):
                self._schedule_alter()
        # Waiters first: their sends answer in the next step of the loop, before the
        # indexing the confirm offset's advance queues.
        self._check_waiters()
        if sl.broker_id in self._set.members():
            self._recompute_confirm()

    def _note_caught_up(self, sl: _SlaveLink, ack: int) -> None:
        now = _now_ms()
        if ack >= self.commitlog.max_offset:
            self._set.mark_caught_up(sl.broker_id, now)
            sl.checkpoints.clear()
            return
        at = None
        cps = sl.checkpoints
        while cps and cps[0][0] <= ack:
            at = cps.popleft()[1]
        if at is not None:
            self._set.mark_caught_up(sl.broker_id, at)

    # --- confirm offset and waiters ------------------------------------------------------------

    def _recompute_confirm(self) -> None:
        max_offset = self.commitlog.max_offset
        acks: list[int] = []
        frozen = False
        for member in self._set.members():
            if member == self.broker_id:
                continue
            sl = self._links.get(member)
            if sl is None or sl.ack < 0:
                frozen = True  # #6662: a member we cannot hear from may lack anything
                break
            acks.append(sl.ack)
        if frozen:
            return
        new = hao.confirm_offset(max_offset, acks, self._confirm)
        if new > self._confirm:
            self._confirm = new
            if self._on_confirm is not None:
                self._on_confirm(new)

    def copies_of(self, offset: int) -> int:
        """SyncStateSet members (this master included) that hold ``offset``."""
        if offset > self.commitlog.max_offset:
            return 0
        count = 1
        for member in self._set.members():
            if member == self.broker_id:
                continue
            sl = self._links.get(member)
            if sl is not None and sl.ack >= offset:
                count += 1
        return count

    def _acks_reached(self, offset: int, need: int | None) -> bool:
        """``need`` copies (None: every SyncStateSet member) and never fewer than
        ``min_in_sync_replicas``: a set that shrank while a send waited does not lower the
        number of copies the user asked for."""
        if offset > self.commitlog.max_offset:
            return False
        members = self._set.members()
        if need is None:
            for member in members:
                if member == self.broker_id:
                    continue
                sl = self._links.get(member)
                if sl is None or sl.ack < offset:
                    return False
            floor = self.config.min_in_sync_replicas
            return floor <= 1 or self.copies_of(offset) >= floor
        return self.copies_of(offset) >= max(need, self.config.min_in_sync_replicas)

    def _check_waiters(self) -> None:
        for need, heap in self._waiters.items():
            while heap:
                offset, _, fut = heap[0]
                if fut.done():
                    heapq.heappop(heap)
                    continue
                if not self._acks_reached(offset, need):
                    break
                heapq.heappop(heap)
                fut.set_result(True)  # an _AckCallback answers its send right here

    # --- SyncStateSet changes ------------------------------------------------------------------

    def _epoch_start(self) -> int:
        last = self.epoch_map.last_entry()
        return last[1] if last is not None else 0

    def _should_expand(self, ack: int) -> bool:
        return bool(hao.should_expand(ack, self._confirm, self._epoch_start()))

    def _desired_set(self) -> frozenset[int]:
        now = _now_ms()
        desired = set(self._set.local)
        for member in self._set.lagging_members(now, self.config.ha_max_time_slave_not_catchup_ms,
                                                hao.should_shrink):
            desired.discard(member)
        for sl in sorted(self._links.values(), key=lambda x: (self._refused_at.get(x.broker_id, -1), x.broker_id)):
            if sl.learner or sl.broker_id in desired or sl.ack < 0:
                continue
            if self._should_expand(sl.ack):
                desired.add(sl.broker_id)
                break  # one new member per proposal (see the module docstring)
        desired.add(self.broker_id)
        return frozenset(desired)

    def _schedule_alter(self) -> None:
        if self._alter is None or self._stopped:
            return
        if self._alter_task is not None and not self._alter_task.done():
            self._alter_again = True
            return
        self._alter_task = asyncio.ensure_future(self._alter_loop())

    async def _alter_loop(self) -> None:
        assert self._alter is not None
        # Expansions go one member at a time: a round may take a few proposals, but never
        # more than one per member plus a shrink (the periodic check does the rest).
        budget = len(self._links) + 2
        while not self._stopped and budget > 0:
            budget -= 1
            self._alter_again = False
            desired = self._desired_set()
            if desired == self._set.local:
                if self._alter_again:
                    continue
                return
            old = self._set.local
            self._set.begin_proposal(desired)
            log.info("proposing SyncStateSet %s (now %s, epoch %d)", sorted(desired), sorted(old), self._set.epoch)
            try:
                ids, epoch = await self._alter(sorted(desired))
            except asyncio.CancelledError:
                self._set.abort_proposal()
                raise
            except (RmqhaError, OSError, asyncio.TimeoutError) as exc:
                log.warning("AlterSyncStateSet %s failed: %s", sorted(desired), exc)
                self._set.abort_proposal()
                self._recompute_confirm()
                self._check_waiters()
                return  # the periodic check proposes again
            for member in desired - old - set(ids):
                self._refused_at[member] = _now_ms()
            self.set_sync_state_set(ids, epoch)
            if not self._alter_again and self._desired_set() in (desired, self._set.local):
                return

    async def check_sync_state_set(self) -> None:
        """Propose a shrink/expand if the set should change (also run periodically)."""
        self._set.prune(self._links.keys())
        if self._desired_set() != self._set.local:
            self._schedule_alter()

    async def _check_loop(self) -> None:
        period = self.config.check_sync_state_set_period_ms / 1000
        while not self._stopped:
            await asyncio.sleep(period)
            await self.check_sync_state_set()

    # --- link teardown -------------------------------------------------------------------------

    def _drop(self, sl: _SlaveLink, reason: str) -> None:
        if sl.state is LinkState.SHUTDOWN:
            return
        sl.state = LinkState.SHUTDOWN
        self._all.discard(sl)
        self._links.release(sl)
        if sl.writer is not None and not sl.writer.done():
            sl.writer.cancel()
        if not self._stopped:
            log.info("HA slave %d (%s) disconnected: %s", sl.broker_id, sl.link.peer, reason or "closed")


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
