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

    def next_confirm(self, max_offset: int, previous: int) -> int:
        """The confirm offset the acks allow (``previous`` while frozen); the caller keeps
        the larger of it and ``previous``."""
        acks: list[int] = []
        ack_of = self._acks.ack_of
        for member in self._set.members():
            if member == self.self_id:
                continue
            ack = ack_of(member)
            if ack < 0:
                return previous  # #6662: a member we cannot hear from may lack anything
            acks.append(ack)
        return int(hao.confirm_offset(max_offset, acks, previous))

    def copies_of(self, offset: int, max_offset: int) -> int:
        """SyncStateSet members (the master included) that hold ``offset``."""
        if offset > max_offset:
            return 0
        count = 1
        ack_of = self._acks.ack_of
        for member in self._set.members():
            if member != self.self_id and ack_of(member) >= offset:
                count += 1
        return count

    def reached(self, offset: int, need: int | None, max_offset: int) -> bool:
        """Whether ``need`` copies (None: every member) of ``offset`` exist, and at least
        ``min_in_sync_replicas``."""
        if offset > max_offset:
            return False
        if need is not None:
            return self.copies_of(offset, max_offset) >= max(need, self._floor)
        ack_of = self._acks.ack_of
        for member in self._set.members():
            if member != self.self_id and ack_of(member) < offset:
                return False
        return self._floor <= 1 or self.copies_of(offset, max_offset) >= self._floor
