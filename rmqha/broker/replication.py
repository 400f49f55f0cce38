"""The messaging layer's view of replication, read from whichever HA side the broker runs.

The broker hands its messaging layer this object (the ``Replication`` protocol of
:mod:`rmqha.messaging.context`) rather than itself: the messaging layer learns the facts
the send verdict needs (lease, SyncStateSet size, whether copies are in) and the confirm
offset consumers may read up to, and nothing of the broker's roles or wiring.  It reads the
broker's parts each time (they change with every role change), through
:class:`ReplicationSource`, so this module does not import the broker.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from rmqha.broker.config import BrokerConfig
from rmqha.broker.confirm_checkpoint import ConfirmCheckpoint
from rmqha.broker.replicas_manager import ReplicasManager
from rmqha.ha import HAMaster, HASlave


class ReplicationSource(Protocol):
    """The broker's parts :class:`Replication` reads (set and cleared by role changes)."""

    config: BrokerConfig
    commitlog: Any
    replicas: ReplicasManager | None
    ha_master: HAMaster | None
    ha_slave: HASlave | None


class Replication:
    """What the messaging layer needs of replication, read from whichever HA side is running.

    It reports facts and judges nothing: whether a write is admitted or acknowledged is
    :func:`rmqha.messaging.verdict.verdict` of them.  Master: the HA master's
    (:class:`rmqha.ha.sync_service.SyncService`, asked directly) SyncStateSet, copies and
    confirm offset; the lease.  Slave: the HASlave's
    confirm offset (what the master confirmed, capped at the local log).  Neither (fenced,
    or stepping down between the two): the last confirm offset either side reported,
    never the log's max offset: records past it may still be cut by a truncation, and a
    consumer must never read what a truncation can remove.
    """

    def __init__(self, broker: ReplicationSource) -> None:
        self._broker = broker
        self.checkpoint: ConfirmCheckpoint | None = None
        #: master epoch -> [first, last] ``time.monotonic()`` of an acknowledgement this
        #: broker gave as master (the newest few epochs): when it acknowledged writes.
        self.ack_windows: dict[int, list[float]] = {}

    def holds_master_lease(self) -> bool:
        """Master with a live lease from the controller (rmqha.broker.master_lease)."""
        replicas = self._broker.replicas
        return replicas is not None and replicas.accepts_writes

    def awaiting_first_lease(self) -> bool:
        replicas = self._broker.replicas
        return replicas is not None and replicas.awaiting_first_lease

    async def wait_for_first_lease(self) -> None:
        """Bounded by one heartbeat answer's timeout: the first lease comes with it or not soon."""
        replicas = self._broker.replicas
        if replicas is not None:
            await replicas.wait_for_first_lease(self._broker.config.send_heartbeat_timeout_ms / 1000)

    def push_now(self) -> None:
        master = self._broker.ha_master
        if master is not None:
            master.sync.push_now()

    def defer_push(self) -> None:
        master = self._broker.ha_master
        if master is not None:
            master.sync.defer_push()

    def sync_state_set_size(self) -> int:
        master = self._broker.ha_master
        if master is None:
            return 1
        return int(master.sync.sync_state.replica_count())

    async def wait_for_copies(self, end_offset: int, timeout_s: float) -> bool:
        master = self._broker.ha_master
        if master is None:
            # Not master (or stepping down): no copies are counted from here.
            return False
        return await master.sync.wait_for_copies(end_offset, timeout_s)

    def when_copies(self, end_offset: int, timeout_s: float,
                    done: Callable[[bool], None]) -> None:
        """:meth:`wait_for_copies` for a caller without a task: ``done(held)`` runs once,
        called by the HA master's waiter itself."""
        master = self._broker.ha_master
        if master is None:
            done(False)
            return
        master.sync.when_copies(end_offset, timeout_s, done)

    def copies_held(self, end_offset: int) -> bool:
        master = self._broker.ha_master
        return master is not None and master.sync.copies_held(end_offset)

    def acknowledged(self) -> None:
        """A write was answered PUT_OK: note when, under the master epoch (``ack_windows``)."""
        replicas = self._broker.replicas
        epoch = replicas.master_epoch if replicas is not None else 0
        now = time.monotonic()
        window = self.ack_windows.get(epoch)
        if window is None:
            self.ack_windows[epoch] = [now, now]
            for old in sorted(self.ack_windows)[:-4]:
                del self.ack_windows[old]
        else:
            window[1] = now

    def learned(self, offset: int) -> None:
        if self.checkpoint is not None:
            self.checkpoint.learned(int(offset))

    def confirm_offset(self) -> int:
        b = self._broker
        if b.ha_master is not None:
            confirm = int(b.ha_master.confirm_offset)
        elif b.ha_slave is not None:
            confirm = int(b.ha_slave.confirm_offset)
        else:
            return min(self.checkpoint.offset if self.checkpoint is not None else 0,
                       int(b.commitlog.max_offset) if b.commitlog is not None else 0)
        self.learned(confirm)
        return confirm
