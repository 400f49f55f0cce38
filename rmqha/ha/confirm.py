"""The HA master's confirm rule and copy count, without I/O (:class:`ConfirmRule`).

A SyncStateSet member's copy is what its live link acknowledged, as an :class:`AckSource`
reports it (-1: no live link, or no report yet on it).  The master holds every byte up to
its max offset and counts as one copy.

* confirm offset: the minimum ack over the members, the master counting with its max
  offset; a member at -1 freezes it at its previous value (RocketMQ #6662)
  (:func:`rmqha.ha.offsets.confirm_offset`); the master only ever moves it forward;
* copies of an offset: the master plus each member whose ack reaches it;
* whether a waiting send has its copies: ``need`` copies (None: every member), and never
  fewer than ``min_in_sync_replicas``: a set that shrank while a send waited does not lower
  the number of copies the user asked for;
* :func:`copies_needed`: the broker's ack policy as a ``need``.

While a SyncStateSet change is in flight the members are the union of the applied and the
proposed set (:meth:`rmqha.ha.sync_state.SyncStateSet.members`, #5663).
"""
from __future__ import annotations

from typing import Protocol

from rmqha.ha import offsets as hao
from rmqha.ha.config import HAConfig
from rmqha.ha.sync_state import SyncStateSet
from rmqha.ha.waiters import reach_point


class AckSource(Protocol):
    def ack_of(self, broker_id: int) -> int:
        """The member's acknowledged offset on its live link, -1 without one."""


def copies_needed(config: HAConfig) -> int | None:
    """The ack policy: every member (None) with ``all_ack_in_sync_state_set``, else
    ``in_sync_replicas`` copies (the master counts as one; 0 or 1 needs no wait); either
    way at least ``min_in_sync_replicas`` copies (:meth:`ConfirmRule.reached`)."""
    if config.all_ack_in_sync_state_set:
        return None
    return max(config.in_sync_replicas, config.min_in_sync_replicas)


def needs_no_wait(need: int | None) -> bool:
    return need is not None and need <= 1


class ConfirmRule:
    """The rules above over one master's SyncStateSet and its members' acks."""

    __slots__ = ("self_id", "_set", "_acks", "_floor")

    def __init__(self, self_id: int, sync_state: SyncStateSet, acks: AckSource,
                 min_in_sync_replicas: int) -> None:
        self.self_id = self_id
        self._set = sync_state
        self._acks = acks
        self._floor = min_in_sync_replicas

    @property
    def floor(self) -> int:
        """``min_in_sync_replicas``: never fewer copies than this."""
        return self._floor

    def member_acks(self) -> list[int]:
        """The other members' acks (-1: no live link, or no report yet), in one list: what
        an ack's settling (waiters, then the confirm offset) reads once."""
        ack_of = self._acks.ack_of
        me = self.self_id
        return [ack_of(m) for m in self._set.members() if m != me]

    def next_confirm(self, max_offset: int, previous: int, acks: list[int] | None = None) -> int:
        """The confirm offset the acks allow (``previous`` while frozen: #6662, a member we
        cannot hear from may lack anything); the caller keeps the larger of it and
        ``previous``.  ``acks``: :meth:`member_acks`, when the caller has them already."""
        return int(hao.confirm_offset(max_offset, self.member_acks() if acks is None else acks, previous))

    def copies_of(self, offset: int, max_offset: int) -> int:
        """SyncStateSet members (the master included) that hold ``offset``."""
        if offset > max_offset:
            return 0
        return 1 + sum(1 for a in self.member_acks() if a >= offset)

    def reached(self, offset: int, need: int | None, max_offset: int) -> bool:
        """Whether ``need`` copies (None: every member) of ``offset`` exist, and at least
        ``min_in_sync_replicas``: ``offset`` is at most the reach point of ``need``
        (copies only go down as the offset goes up; ``ack_table.reach_point``)."""
        return 0 <= offset <= reach_point(self.member_acks(), need, self._floor, max_offset)
