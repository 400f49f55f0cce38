"""The HA master's waiting sends and their release by acks, pure-Python twin of ``ack_table.pyx``.

A send waits for copies of its end offset; the rule of :class:`rmqha.ha.confirm.ConfirmRule`
says when they exist.  Copies of an offset only go down as the offset goes up, so for each
``need`` the rule has a *reach point*: the highest offset whose copies exist now (-1: none).
:func:`reach_point` computes it from the other SyncStateSet members' acks; a waiter is
released once its offset is at most the point of its ``need``.

* ``reach_point(acks, need, floor, max_offset)``: ``acks`` are the other members' acks
  (-1: no live link, or no report yet), ``need`` the copies asked for (None: every member;
  the master counts as one), ``floor`` is ``min_in_sync_replicas``: never fewer copies.
  ``reached(offset, need)`` of the rule holds exactly when ``0 <= offset <= point``.
* :class:`WaiterQueue`: the waiters of one ``need``, ordered by offset (sends arrive in log
  order, so an add is an append), each with its deadline and a ``done(ok)`` callable;
  :meth:`WaiterQueue.release` answers True up to a point, :meth:`WaiterQueue.expire` False
  past a deadline, :meth:`WaiterQueue.fail_all` False to all.  A waiter is answered once,
  taken out before its callable runs (a callable may add waiters); a callable that raises
  goes to ``on_error(exc)`` and the others still run.
* ``settle(queues, acks, floor, max_offset, on_error)``: after an ack, every queue of the
  ``{need: WaiterQueue}`` mapping released up to its point, in one call; the count released.

No timers here: the owner keeps one per table, armed at :meth:`WaiterQueue.next_deadline`.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: No waiter has a deadline (``next_deadline`` of an empty queue).
NO_DEADLINE = float("inf")

Done = Callable[[bool], Any]
OnError = Callable[[BaseException], Any]


def reach_point(acks: Sequence[int], need: int | None, floor: int, max_offset: int) -> int:
    """The highest offset with the copies ``need`` asks for (and at least ``floor``), -1
    when no offset has them (see the module docstring)."""
    n = len(acks)
    if need is None:
        if floor > 1 and n + 1 < floor:
            return -1
        point = min(acks) if n else max_offset
    else:
        # Copies of an offset: the master plus each member whose ack reaches it.
        others = max(need, floor) - 1
        if others <= 0:
            point = max_offset
        elif others > n:
            return -1
        else:
            point = sorted(acks, reverse=True)[others - 1]
    if point < 0:
        return -1
    return point if point < max_offset else max_offset


class WaiterQueue:
    """The waiters of one ``need``, lowest offset first (see the module docstring)."""

    __slots__ = ("_offsets", "_deadlines", "_dones")

    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._deadlines: list[float] = []
        self._dones: list[Done] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, offset: int, deadline: float, done: Done) -> None:
        """A waiter for ``offset``, answered False at ``deadline`` if not released before."""
        offsets = self._offsets
        i = len(offsets)
        if i and offsets[i - 1] > offset:
            i = bisect.bisect_right(offsets, offset)
        offsets.insert(i, offset)
        self._deadlines.insert(i, deadline)
        self._dones.insert(i, done)

    def next_deadline(self) -> float:
        """The earliest deadline of a waiter here (``NO_DEADLINE`` when empty)."""
        return min(self._deadlines) if self._deadlines else NO_DEADLINE

    def release(self, point: int, on_error: OnError) -> int:
        """Answer True every waiter whose offset is at most ``point``; how many."""
        if point < 0 or not self._offsets or self._offsets[0] > point:
            return 0
        k = bisect.bisect_right(self._offsets, point)
        dones = self._dones[:k]
        del self._offsets[:k], self._deadlines[:k], self._dones[:k]
        _answer(dones, True, on_error)
        return k

    def expire(self, now: float, on_error: OnError) -> int:
        """Answer False every waiter whose deadline is at most ``now``; how many."""
        keep = [i for i, d in enumerate(self._deadlines) if d > now]
        if len(keep) == len(self._deadlines):
            return 0
        dead = [d for i, d in enumerate(self._dones) if self._deadlines[i] <= now]
        self._offsets = [self._offsets[i] for i in keep]
        self._dones = [self._dones[i] for i in keep]
        self._deadlines = [self._deadlines[i] for i in keep]
        _answer(dead, False, on_error)
        return len(dead)

    def fail_all(self, on_error: OnError) -> int:
        """Answer False every waiter; how many."""
        dones = self._dones
        self._offsets, self._deadlines, self._dones = [], [], []
        _answer(dones, False, on_error)
        return len(dones)


def settle(queues: Mapping[int | None, WaiterQueue], acks: Sequence[int], floor: int,
           max_offset: int, on_error: OnError) -> int:
    """Release every queue up to its need's reach point; how many waiters were answered."""
    released = 0
    for need, queue in list(queues.items()):
        if len(queue):
            released += queue.release(reach_point(acks, need, floor, max_offset), on_error)
    return released


def _answer(dones: list[Done], ok: bool, on_error: OnError) -> None:
    for done in dones:
        try:
            done(ok)
        except Exception as exc:  # one send's answer must not stop the others
            on_error(exc)

