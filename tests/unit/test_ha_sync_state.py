"""The master's SyncStateSet bookkeeping: applied set, in-flight union, caught-up ageing."""
from __future__ import annotations

from rmqha.ha import offsets as ha_offsets
from rmqha.ha.sync_state import SyncStateSet


def test_master_always_member_and_older_epochs_ignored() -> None:
    s = SyncStateSet(1, [2], epoch=3, now_ms=0)
    assert s.local == {1, 2} and s.epoch == 3
    assert s.apply([2, 3], 4, now_ms=10)  # the master is added back
    assert s.local == {1, 2, 3}
    assert not s.apply([2], 2, now_ms=20)
    assert s.local == {1, 2, 3} and s.epoch == 4


def test_union_and_replica_count_while_in_flight() -> None:
    s = SyncStateSet(1, [2, 3], epoch=1, now_ms=0)
    s.begin_proposal([1, 4])
    assert s.in_flight
    assert s.members() == {1, 2, 3, 4}  # #5663: old and new both count
    assert s.replica_count() == 3  # max(|old|, |new|)
    s.abort_proposal()
    assert s.members() == {1, 2, 3} and not s.in_flight
    s.begin_proposal([1, 2])
    s.apply([1, 2], 2, now_ms=5)  # the answer clears the flag
    assert s.members() == {1, 2} and s.proposed is None


def test_lagging_members_never_include_master_and_age_from_join() -> None:
    s = SyncStateSet(1, [2, 3], epoch=1, now_ms=1000)
    shrink = ha_offsets.should_shrink
    assert s.lagging_members(1500, 1000, shrink) == set()
    s.mark_caught_up(2, 1900)
    s.mark_caught_up(2, 1200)  # never goes back
    assert s.caught_up_ms(2) == 1900
    assert s.lagging_members(2500, 1000, shrink) == {3}  # #7219: 1 is never shrunk
    s.apply([1, 2, 4], 2, now_ms=2600)  # a new member gets the full grace period
    s.mark_caught_up(2, 2600)
    assert s.lagging_members(3000, 1000, shrink) == set()
    assert s.lagging_members(3601, 1000, shrink) == {2, 4}


def test_prune_forgets_departed_ids_only() -> None:
    s = SyncStateSet(1, [2, 3], epoch=1, now_ms=0)
    s.mark_caught_up(5, 10)  # a connected non-member catching up
    s.apply([1, 2], 2, now_ms=20)
    s.prune(connected=[5])
    assert s.caught_up_ms(3) is None  # RocketMQ never cleaned this table
    assert s.caught_up_ms(2) is not None and s.caught_up_ms(5) == 10
