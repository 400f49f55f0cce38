"""The sends waiting for their copies on the HA master (RocketMQ's GroupTransferService).

:class:`AckWaiters` keeps one queue per number of copies asked for (``None``: every
SyncStateSet member), ordered by offset: the ``ack_table`` twin
(:mod:`rmqha._core.ack_table_py` has the rules), so the work an ack does here, from the
members' acks to the sends it answers, is one compiled call (:meth:`AckWaiters.settle`).
A waiter is a future (:meth:`AckWaiters.wait`, for a task) or a callable
(:meth:`AckWaiters.call_when`, for a caller without a task), answered in the loop turn
that handles the deciding ack.  Timeouts take one loop timer per table, armed at the
earliest deadline, not one per send.  Whether a waiter's copies exist is the rule of
:class:`rmqha.ha.confirm.ConfirmRule` (its reach point, ``ack_table.reach_point``); this
module keeps the order, the timeouts and the answers.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from rmqha import _core
from rmqha._core._protocols import AckTableTwin

# The master side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.master")

_impl: AckTableTwin = _core.load("ack_table")
reach_point = _impl.reach_point


def _callback_failed(exc: BaseException) -> None:
    log.error("an acknowledgement callback failed", exc_info=exc)


class AckWaiters:
    """Sends waiting for copies of an offset, answered True when they exist, False at their
    timeout or when the master stops."""

    __slots__ = ("_queues", "_impl", "_loop", "_timer", "_timer_at")

    def __init__(self, implementation: AckTableTwin | None = None) -> None:
        """``implementation``: a named twin (tests and benchmarks); the one in use by default."""
        self._impl = implementation or _impl
        self._queues: dict[int | None, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _add(self, loop: asyncio.AbstractEventLoop, offset: int, need: int | None,
             done: Callable[[bool], Any], timeout: float) -> None:
        queue = self._queues.get(need)
        if queue is None:
            queue = self._queues[need] = self._impl.WaiterQueue()
        deadline = loop.time() + timeout
        queue.add(offset, deadline, done)
        if deadline < self._timer_at:
            self._arm(loop, deadline)

    async def wait(self, offset: int, need: int | None, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._add(loop, offset, need, partial(_resolve, fut), timeout)
        return await fut

    def call_when(self, loop: asyncio.AbstractEventLoop, offset: int, need: int | None,
                  done: Callable[[bool], None], timeout: float) -> None:
        """``done(ok)`` once: True in the turn the copies exist, False after ``timeout``."""
        self._add(loop, offset, need, done, timeout)

    def settle(self, acks: Sequence[int], floor: int, max_offset: int) -> int:
        """Answer every waiter whose copies exist, given the other members' ``acks``
        (``ConfirmRule.member_acks``); how many were answered."""
        if not self._queues:
            return 0
        return int(self._impl.settle(self._queues, acks, floor, max_offset, _callback_failed))

    def fail_all(self) -> None:
        """The master stops: every waiter answers False."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queues = list(self._queues.values())
        self._queues.clear()
        for queue in queues:
            queue.fail_all(_callback_failed)

    # --- timeouts ----------------------------------------------------------------------------

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._loop = loop
        self._timer_at = at
        self._timer = loop.call_at(at, self._expire)

    def _expire(self) -> None:
        """The earliest deadline passed: answer False whatever is due, re-arm for the next."""
        due = self._timer_at
        self._timer = None
        self._timer_at = float("inf")
        loop = self._loop
        assert loop is not None
        # The loop may run a timer up to its clock resolution early: it is due all the same.
        now = max(loop.time(), due)
        for queue in list(self._queues.values()):
            queue.expire(now, _callback_failed)
        nxt = min((q.next_deadline() for q in self._queues.values()), default=float("inf"))
        if nxt != float("inf"):
            self._arm(loop, nxt)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
