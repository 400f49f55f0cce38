"""Proposing SyncStateSet changes to the controller (:class:`SetChanges`), one at a time.

The HA master proposes through the broker's async ``alter_sync_state_set(new_ids) ->
(ids, epoch)`` callback (the controller's AlterSyncStateSet) and applies the answer.  One
proposal is in flight at a time; while it is, the union of the old and the new set counts
(:class:`rmqha.ha.sync_state.SyncStateSet`, #5663).  Which set to propose is
:func:`rmqha.ha.proposals.desired_set`; this module remembers when the controller refused
a member (the next expansion tries the one refused longest ago first), retries within a
round while the wanted set keeps changing, and leaves the rest to the periodic check.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from rmqha.errors import RmqhaError
from rmqha.ha.connection import now_ms
from rmqha.ha.sync_state import SyncStateSet

# The master side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.master")

AlterCallback = Callable[[list[int]], Awaitable[tuple[Iterable[int], int]]]


class SetChanges:
    """The master's AlterSyncStateSet proposals.

    ``desired(refused_at)`` is the set to propose now; ``apply(ids, epoch)`` adopts the
    controller's answer; ``failed()`` runs after a proposal that got no answer (the
    applied set alone counts again); ``rounds()`` bounds the proposals of one round."""

    def __init__(self, sync_state: SyncStateSet, alter: AlterCallback | None, *,
                 desired: Callable[[Mapping[int, int]], frozenset[int]],
                 apply: Callable[[Iterable[int], int], bool], failed: Callable[[], None],
                 rounds: Callable[[], int]) -> None:
        self._set = sync_state
        self._alter = alter
        self._desired = desired
        self._apply = apply
        self._failed = failed
        self._rounds = rounds
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._stopped = False
        #: member -> when (ms) the controller last refused adding it.
        self.refused_at: dict[int, int] = {}

    def wanted(self) -> frozenset[int]:
        return self._desired(self.refused_at)

    def schedule(self) -> None:
        """Propose now, or once the proposal in flight is answered."""
        if self._alter is None or self._stopped:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.ensure_future(self._propose())

    def stop(self) -> asyncio.Task[None] | None:
        """No more proposals; the one in flight (returned, to await) is cancelled."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
        return self._task

    async def _propose(self) -> None:
        # Expansions go one member at a time: a round may take a few proposals, but never
        # more than one per member plus a shrink (the periodic check does the rest).
        budget = self._rounds()
        while not self._stopped and budget > 0:
            budget -= 1
            self._again = False
            desired = self.wanted()
            if desired == self._set.local:
                return
            if not await self._propose_one(desired):
                return
            if not self._again and self.wanted() in (desired, self._set.local):
                return

    async def _propose_one(self, desired: frozenset[int]) -> bool:
        """One AlterSyncStateSet; False when it got no answer."""
        assert self._alter is not None
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
            self._failed()
            return False  # the periodic check proposes again
        for member in desired - old - set(ids):
            self.refused_at[member] = now_ms()
        self._apply(ids, epoch)
        return True
