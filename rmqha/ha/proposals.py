"""Which SyncStateSet the HA master should propose next, without I/O (:func:`desired_set`).

* shrink: an applied member (never the master, #7219) not caught up for
  ``ha_max_time_slave_not_catchup_ms`` leaves (:meth:`SyncStateSet.lagging_members`);
* expand: a connected slave that is no async learner, has reported an offset, and whose
  ack reaches both the confirm offset and the current epoch's start joins
  (:func:`rmqha.ha.offsets.should_expand`);
* one new member per proposal, the one the controller refused longest ago (never refused:
  first) first: the controller refuses a whole proposal if one new member is not alive in
  its view (an old master cut off from the controllers that rejoined as a slave), and that
  one must not keep the others out.

The proposing itself (one AlterSyncStateSet in flight, the answers) is
:mod:`rmqha.ha.set_changes`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rmqha.ha import offsets as hao
from rmqha.ha.sync_state import SyncStateSet


@dataclass(frozen=True, slots=True)
class Candidate:
    """A connected slave as the proposal rules see it."""

    broker_id: int
    ack: int  # -1: not reported yet
    learner: bool


def can_expand(ack: int, confirm: int, epoch_start: int) -> bool:
    return bool(hao.should_expand(ack, confirm, epoch_start))


def desired_set(
    sync_state: SyncStateSet,
    now_ms: int,
    max_lag_ms: int,
    candidates: Iterable[Candidate],
    refused_at: Mapping[int, int],
    confirm: int,
    epoch_start: int,
) -> frozenset[int]:
    """The set to propose: the applied one, minus lagging members, plus at most one slave."""
    desired = set(sync_state.local)
    desired -= sync_state.lagging_members(now_ms, max_lag_ms, hao.should_shrink)
    for c in sorted(candidates, key=lambda x: (refused_at.get(x.broker_id, -1), x.broker_id)):
        if c.learner or c.broker_id in desired or c.ack < 0:
            continue
        if can_expand(c.ack, confirm, epoch_start):
            desired.add(c.broker_id)
            break
    desired.add(sync_state.self_id)
    return frozenset(desired)
