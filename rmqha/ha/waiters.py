"""The sends waiting for their copies on the HA master (RocketMQ's GroupTransferService).

:class:`AckWaiters` keeps one heap per number of copies asked for (``None``: every
SyncStateSet member), ordered by offset, so the check after an ack looks at the lowest
waiter of each heap only.  A waiter is a future (:meth:`AckWaiters.wait`, for a task) or an
:class:`AckCallback` (:meth:`AckWaiters.call_when`, for a caller without a task), answered
in the loop turn that handles the deciding ack.  Whether a waiter's copies exist is the
caller's rule (:class:`rmqha.ha.confirm.ConfirmRule`); this module keeps the order, the
timeouts and the answers.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from typing import Union

# The master side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.master")

#: (offset, need) -> whether those copies exist now.
Reached = Callable[[int, Union[int, None]], bool]


class AckCallback:
    """A waiter of :meth:`AckWaiters.call_when`: it sits in the heaps beside the futures of
    :meth:`AckWaiters.wait` and answers to the same two calls."""

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


Waiter = Union["asyncio.Future[bool]", AckCallback]


class AckWaiters:
    """Sends waiting for copies of an offset, answered True when they exist, False at their
    timeout or when the master stops."""

    __slots__ = ("_heaps", "_seq")

    def __init__(self) -> None:
        self._heaps: dict[int | None, list[tuple[int, int, Waiter]]] = {}
        self._seq = 0

    def _add(self, offset: int, need: int | None, waiter: Waiter) -> None:
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(need, []), (offset, self._seq, waiter))

    async def wait(self, offset: int, need: int | None, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._add(offset, need, fut)
        timer = loop.call_later(timeout, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()

    def call_when(self, loop: asyncio.AbstractEventLoop, offset: int, need: int | None,
                  done: Callable[[bool], None], timeout: float) -> None:
        waiter = AckCallback(done)
        self._add(offset, need, waiter)
        waiter.timer = loop.call_later(timeout, waiter.set_result, False)

    def check(self, reached: Reached) -> None:
        """Answer every waiter whose copies exist now (lowest offsets first)."""
        for need, heap in self._heaps.items():
            while heap:
                offset, _, waiter = heap[0]
                if waiter.done():
                    heapq.heappop(heap)
                    continue
                if not reached(offset, need):
                    break
                heapq.heappop(heap)
                waiter.set_result(True)  # an AckCallback answers its send right here

    def fail_all(self) -> None:
        """The master stops: every waiter answers False."""
        for heap in self._heaps.values():
            for _, _, waiter in heap:
                if not waiter.done():
                    waiter.set_result(False)
        self._heaps.clear()


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
