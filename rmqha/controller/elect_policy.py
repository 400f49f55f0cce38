"""Which broker becomes master: RocketMQ's DefaultElectPolicy, without its quirks.

Candidates are the live SyncStateSet members; when none is alive and unclean elections
are enabled, any live registered replica.  The old master wins if it is a live candidate
(and no other broker is designated).  A designated broker (admin ``electMaster``) wins
only if it is a candidate of the tier being tried.  Otherwise candidates are ranked by the
epoch of their last heartbeat (higher first), then max offset (higher first), then
election priority (lower first), then broker id (lower first) - a total order, unlike
upstream's overflowing ``(int)`` offset comparison.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class CandidateInfo:
    """What the last heartbeat said about a broker (RocketMQ's defaults when unknown)."""

    broker_id: int
    epoch: int = -1
    max_offset: int = -1
    priority: int = 2**31 - 1


def rank_key(info: CandidateInfo) -> tuple[int, int, int, int]:
    return (-info.epoch, -info.max_offset, info.priority, info.broker_id)


def _try_elect(
    brokers: Iterable[int],
    alive: Callable[[int], bool],
    info: Callable[[int], CandidateInfo],
    old_master: int | None,
    designated: int | None,
) -> int | None:
    live = sorted({b for b in brokers if alive(b)})
    if not live:
        return None
    if old_master is not None and old_master in live and designated in (None, old_master):
        return old_master
    if designated is not None:
        return designated if designated in live else None
    return min((info(b) for b in live), key=rank_key).broker_id


def elect(
    sync_state_set: Iterable[int],
    all_replicas: Iterable[int] | None,
    alive: Callable[[int], bool],
    info: Callable[[int], CandidateInfo],
    old_master: int | None = None,
    designated: int | None = None,
) -> int | None:
    """The new master's id, or None when there is no acceptable candidate.

    ``all_replicas`` is given only when unclean elections are enabled.
    """
    chosen = _try_elect(sync_state_set, alive, info, old_master, designated)
    if chosen is None and all_replicas is not None:
        chosen = _try_elect(all_replicas, alive, info, old_master, designated)
    return chosen
