"""The HA master's set and confirm (:class:`SyncService`, RocketMQ's AutoSwitchHAService).

It owns which slave links count (:class:`rmqha.ha.link_table.LinkTable`: the newest per
id), the confirm offset (:class:`rmqha.ha.confirm.ConfirmRule`; ``on_confirm`` hears of
each advance), the SyncStateSet (:class:`rmqha.ha.sync_state.SyncStateSet`, changed through
:class:`rmqha.ha.set_changes.SetChanges`: expand when a slave's ack reaches the confirm
offset and the current epoch's start, shrink a member not caught up for
``ha_max_time_slave_not_catchup_ms``; async learners never join), and the sends waiting
for their copies (:class:`rmqha.ha.waiters.AckWaiters`, waited on with
:meth:`SyncService.when_copies` and its kin: whether copies exist is a fact this reports;
what a send is answered is :func:`rmqha.messaging.verdict.verdict`'s).  Each checked ack of a held link
(:meth:`SyncService.on_ack`) moves them, in that loop turn: caught-up time, expansion,
waiters, confirm offset.

It also wakes the links' writers when the commitlog grows (the append listener, from any
thread, once per loop turn), never by polling.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rmqha.ha.config import HAConfig
from rmqha.ha.confirm import ConfirmRule, copies_needed, needs_no_wait
from rmqha.ha.connection import SlaveConnection, now_ms
from rmqha.ha.handshake import Introduction
from rmqha.ha.link import Link, LinkClosed
from rmqha.ha.link_table import LinkTable
from rmqha.ha.proposals import Candidate, can_expand, desired_set
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.ha.set_changes import AlterCallback, SetChanges
from rmqha.ha.sync_state import SyncStateSet
from rmqha.ha.waiters import AckWaiters
from rmqha.store.epoch_map import EpochMap

# The master side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.master")


class SyncService:
    """Links, confirm offset, SyncStateSet and ack waiters of one master.  Call it on the
    master's event loop (:meth:`on_append` excepted)."""

    def __init__(self, commitlog: ReplicatedLog, epoch_map: EpochMap, config: HAConfig, broker_id: int, *,
                 alter: AlterCallback | None, on_confirm: Callable[[int], Any] | None,
                 sync_state_set: Iterable[int], sync_state_set_epoch: int, confirm_offset: int | None) -> None:
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.config = config
        self.broker_id = broker_id
        self._on_confirm = on_confirm
        self.sync_state = SyncStateSet(broker_id, sync_state_set, sync_state_set_epoch, now_ms())
        max_offset = commitlog.max_offset
        if confirm_offset is None:
            # Data before the current epoch was settled by the election that started it.
            last = epoch_map.last_entry()
            confirm_offset = last[1] if last is not None else max_offset
        self.confirm = max(min(int(confirm_offset), max_offset), 0)
        self.links: LinkTable[SlaveConnection] = LinkTable()
        #: Every open connection past its hello (the held ones and any not yet dropped).
        self.connections: set[SlaveConnection] = set()
        self.rule = ConfirmRule(broker_id, self.sync_state, self.links, config.min_in_sync_replicas)
        self.waiters = AckWaiters()
        self.changes = SetChanges(self.sync_state, alter, desired=self._desired, apply=self.apply_set,
                                  failed=self._after_failed_proposal, rounds=lambda: len(self.links) + 2)
        self._writers: set[asyncio.Task[None]] = set()
        self._check_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake_pending = False
        #: The loop callback an append scheduled (push_now makes it moot and cancels it).
        self._wake_handle: asyncio.Handle | None = None
        #: A caller on the loop said it calls push_now before its turn ends (defer_push).
        self._push_promised = False
        self.stopped = False

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.commitlog.add_append_listener(self.on_append)
        self._check_task = asyncio.ensure_future(self._check_loop())
        self.recompute_confirm()

    def stop(self) -> list[asyncio.Task[Any]]:
        """Stop proposing and waking, close every link; returns the tasks to await."""
        self.stopped = True
        remove = getattr(self.commitlog, "remove_append_listener", None)
        if remove is not None:
            try:
                remove(self.on_append)
            except (ValueError, KeyError):
                pass
        for conn in list(self.connections):
            conn.close("master stopping")
        tasks: list[asyncio.Task[Any]] = [t for t in (self._check_task, self.changes.stop()) if t is not None]
        return tasks + list(self._writers)

    # --- links ---------------------------------------------------------------------------------

    def admit(self, link: Link, intro: Introduction) -> SlaveConnection:
        """A connection whose hello was accepted claims its id; the link it replaces
        (established or still handshaking) is closed and dropped now."""
        conn = SlaveConnection(link, intro.codec, intro.hello, commitlog=self.commitlog,
                               epoch_map=self.epoch_map, config=self.config, confirm=lambda: self.confirm)
        old = self.links.claim(conn)
        if old is not None:
            old.close("replaced by a new link from the same broker id")
            self.drop(old, old.close_reason)
        self.connections.add(conn)
        return conn

    def start_transfer(self, conn: SlaveConnection, offset: int, start: int, pending: list[Any]) -> None:
        """The handshake agreed: the slave holds ``offset``, the transfer starts at ``start``."""
        if not self.links.holds(conn):
            raise LinkClosed("replaced by a newer link from the same broker id during the handshake")
        writer = conn.start_transfer(start, offset)
        self._writers.add(writer)
        writer.add_done_callback(self._writers.discard)
        log.info("HA slave %d (%s, %s%s) connected from %s: reports %d, transfer from %d",
                 conn.broker_id, conn.address, conn.codec.name, ", async learner" if conn.learner else "",
                 conn.link.peer, offset, start)
        if pending:
            self.on_ack(conn, conn.checked_ack(pending))
        self.recompute_confirm()

    def drop(self, conn: SlaveConnection, reason: str) -> None:
        """``conn`` ended: it no longer counts (a newer link of its id stays)."""
        if not conn.shut_down():
            return
        self.connections.discard(conn)
        self.links.release(conn)
        if not self.stopped:
            log.info("HA slave %d (%s) disconnected: %s", conn.broker_id, conn.link.peer, reason or "closed")

    def on_ack(self, conn: SlaveConnection, ack: int) -> None:
        """A checked ack of ``conn``: caught-up time, expansion, waiters, confirm offset."""
        if not self.links.holds(conn):
            raise LinkClosed("replaced by a newer link from the same broker id")
        conn.ack = ack
        if not conn.learner:
            at = conn.caught_up_at(ack, self.commitlog.max_offset, now_ms())
            if at is not None:
                self.sync_state.mark_caught_up(conn.broker_id, at)
            if conn.broker_id not in self.sync_state.local and self._can_expand(ack):
                self.changes.schedule()
        # One read of the members' acks settles both: waiters first (their sends answer
        # in the next step of the loop, before the indexing the confirm offset's advance
        # queues), then the confirm offset.
        acks = self.rule.member_acks()
        max_offset = self.commitlog.max_offset
        self.waiters.settle(acks, self.rule.floor, max_offset)
        if conn.broker_id in self.sync_state.members():
            self._confirm_to(self.rule.next_confirm(max_offset, self.confirm, acks))

    # --- confirm offset and waiters ------------------------------------------------------------

    def recompute_confirm(self) -> None:
        self._confirm_to(self.rule.next_confirm(self.commitlog.max_offset, self.confirm))

    def _confirm_to(self, new: int) -> None:
        if new > self.confirm:
            self.confirm = new
            if self._on_confirm is not None:
                self._on_confirm(new)

    def confirm_now(self) -> int:
        """The confirm offset (a lone master's follows its max offset at once)."""
        if len(self.sync_state.members()) == 1:
            self.recompute_confirm()
        return self.confirm

    def acks_reached(self, offset: int, need: int | None) -> bool:
        return self.rule.reached(offset, need, self.commitlog.max_offset)

    def copies_of(self, offset: int) -> int:
        """SyncStateSet members (this master included) that hold ``offset``."""
        return self.rule.copies_of(offset, self.commitlog.max_offset)

    # --- waiting for copies --------------------------------------------------------------------

    async def wait_for_acks(self, offset: int, need: int | None = None, timeout: float = 3.0) -> bool:
        """True once ``need`` replicas (None: every SyncStateSet member) hold ``offset``;
        False after ``timeout`` or when the master stops."""
        if self.acks_reached(offset, need):
            return True
        if self.stopped:
            return False
        return await self.waiters.wait(offset, need, timeout)

    def when_acks(self, offset: int, need: int | None, done: Callable[[bool], None],
                  timeout: float) -> None:
        """:meth:`wait_for_acks` for a caller without a task: ``done(ok)`` runs once, in the
        loop turn that handles the deciding ack (or at once, or after ``timeout``)."""
        if self.acks_reached(offset, need):
            done(True)
            return
        if self.stopped or self._loop is None:
            done(False)
            return
        self.waiters.call_when(self._loop, offset, need, done, timeout)

    async def wait_for_copies(self, offset: int, timeout: float) -> bool:
        """True once the ack policy (:func:`rmqha.ha.confirm.copies_needed`) holds for ``offset``."""
        need = copies_needed(self.config)
        if needs_no_wait(need):
            return True
        return await self.wait_for_acks(offset, need, timeout)

    def copies_held(self, offset: int) -> bool:
        """Whether the ack policy holds for ``offset`` now."""
        need = copies_needed(self.config)
        return needs_no_wait(need) or self.acks_reached(offset, need)

    def when_copies(self, offset: int, timeout: float, done: Callable[[bool], None]) -> None:
        """:meth:`wait_for_copies` with a callback (see :meth:`when_acks`)."""
        need = copies_needed(self.config)
        if needs_no_wait(need):
            done(True)
            return
        self.when_acks(offset, need, done, timeout)

    def check_waiters(self) -> None:
        self.waiters.settle(self.rule.member_acks(), self.rule.floor, self.commitlog.max_offset)

    # --- append listener -----------------------------------------------------------------------

    def on_append(self, new_max_offset: int) -> None:
        """Commitlog append listener (any thread): wake the writers once per loop turn."""
        if self._wake_pending or self.stopped or self._loop is None:
            return
        self._wake_pending = True
        try:
            if threading.get_ident() == self._loop_thread:
                if self._push_promised:
                    return  # push_now sends it this turn: nothing queued to cancel
                self._wake_handle = self._loop.call_soon(self.wake_all)
            else:
                self._wake_handle = self._loop.call_soon_threadsafe(self.wake_all)
        except RuntimeError:  # loop closed under a late append
            self._wake_pending = False

    def defer_push(self) -> None:
        """The caller (on the loop) appends next and calls :meth:`push_now` before its loop
        turn ends: its appends queue no wake.  A queued wake that push_now cancels still
        costs the next loop turn (the loop polls once more to skip it), a turn between a
        one-at-a-time send's append and its acks.  Other threads' appends queue as ever."""
        if threading.get_ident() == self._loop_thread:
            self._push_promised = True

    def push_now(self) -> None:
        """Send what was appended in this loop turn now rather than at the start of the
        next one: a send that is alone on its connection saves a turn of its round trip
        (concurrent sends leave it to the turn's end, so they share one push).  Ends a
        :meth:`defer_push`."""
        self._push_promised = False
        if self._wake_pending:
            # This wake covers every append so far: the one they scheduled would find
            # nothing to send (a loop callback and a walk of the links per message).
            handle = self._wake_handle
            if handle is not None:
                self._wake_handle = None
                handle.cancel()
            self.wake_all()

    def wake_all(self) -> None:
        self._wake_pending = False
        max_offset = self.commitlog.max_offset
        for conn in self.links.links():
            if conn.wants(max_offset) and not conn.push(max_offset):
                conn.wake()
        if len(self.sync_state.members()) == 1:
            self.recompute_confirm()
            self.check_waiters()

    # --- SyncStateSet --------------------------------------------------------------------------

    def apply_set(self, ids: Iterable[int], epoch: int) -> bool:
        """Adopt the controller's set (ignored if ``epoch`` is older than the one held)."""
        ids = list(ids)
        old = self.sync_state.local
        if not self.sync_state.apply(ids, epoch, now_ms()):
            log.info("ignoring SyncStateSet %s epoch %d: holding epoch %d", sorted(ids), epoch,
                     self.sync_state.epoch)
            return False
        if self.sync_state.local != old:
            log.info("SyncStateSet now %s (epoch %d)", sorted(self.sync_state.local), epoch)
        self.recompute_confirm()
        self.check_waiters()
        return True

    def on_new_epoch(self, epoch: int, start: int) -> None:
        if self.epoch_map.last_epoch() < epoch:
            self.epoch_map.append(epoch, start)
        for conn in self.links.links():
            conn.wake()
        self.recompute_confirm()

    def _epoch_start(self) -> int:
        last = self.epoch_map.last_entry()
        return last[1] if last is not None else 0

    def _can_expand(self, ack: int) -> bool:
        return can_expand(ack, self.confirm, self._epoch_start())

    def _desired(self, refused_at: Mapping[int, int]) -> frozenset[int]:
        candidates = [Candidate(c.broker_id, c.ack, c.learner) for c in self.links.links()]
        return desired_set(self.sync_state, now_ms(), self.config.ha_max_time_slave_not_catchup_ms,
                           candidates, refused_at, self.confirm, self._epoch_start())

    def _after_failed_proposal(self) -> None:
        self.recompute_confirm()
        self.check_waiters()

    async def check_sync_state_set(self) -> None:
        """Propose a shrink/expand if the set should change (also run periodically)."""
        self.sync_state.prune(self.links.ids())
        if self.changes.wanted() != self.sync_state.local:
            self.changes.schedule()

    async def _check_loop(self) -> None:
        period = self.config.check_sync_state_set_period_ms / 1000
        while not self.stopped:
            await asyncio.sleep(period)
            await self.check_sync_state_set()

    # --- status --------------------------------------------------------------------------------

    def slave_rows(self) -> list[dict[str, Any]]:
        now = now_ms()
        max_offset = self.commitlog.max_offset
        local = self.sync_state.local
        return [conn.status(now, max_offset, self.sync_state.caught_up_ms(conn.broker_id), conn.broker_id in local)
                for conn in sorted(self.connections, key=lambda c: c.broker_id)]
