"""The HA master's and slave's rules without sockets: confirm offset and copies, SyncStateSet
proposals, ack waiters, the one-link-per-id table, and the slave's cut to the master's epochs."""
from __future__ import annotations

import asyncio

import pytest

from rmqha.ha.config import HAConfig
from rmqha.ha.confirm import ConfirmRule, copies_needed, needs_no_wait
from rmqha.ha.link_table import LinkTable
from rmqha.ha.proposals import Candidate, desired_set
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress
from rmqha.ha.sync_state import SyncStateSet
from rmqha.ha.truncation import Truncator
from rmqha.ha.waiters import AckWaiters
from rmqha.testing.ha import fill, replica_stores


class Acks(dict):
    """Member -> ack offset of its live link (missing: no link)."""

    def ack_of(self, broker_id: int) -> int:
        return self.get(broker_id, -1)


def _rule(members: list[int], acks: dict[int, int], floor: int = 1) -> tuple[ConfirmRule, SyncStateSet]:
    s = SyncStateSet(1, members, epoch=1, now_ms=0)
    return ConfirmRule(1, s, Acks(acks), floor), s


# --- confirm offset and copies ----------------------------------------------------------------


def test_confirm_is_the_min_ack_capped_at_the_masters_max() -> None:
    rule, _ = _rule([1, 2, 3], {2: 500, 3: 300})
    assert rule.next_confirm(1000, 0) == 300
    rule, _ = _rule([1, 2], {2: 500})
    assert rule.next_confirm(400, 0) == 400


def test_a_member_without_a_link_or_report_freezes_the_confirm_offset() -> None:
    rule, _ = _rule([1, 2, 3], {2: 500})
    assert rule.next_confirm(1000, 120) == 120
    rule, _ = _rule([1, 2], {2: -1})
    assert rule.next_confirm(1000, 120) == 120
    rule, _ = _rule([1, 2], {2: 0})  # an empty slave's real ack
    assert rule.next_confirm(1000, 0) == 0


def test_the_proposed_set_counts_while_in_flight() -> None:
    rule, s = _rule([1, 2], {2: 800, 3: 200})
    assert rule.next_confirm(1000, 0) == 800
    s.begin_proposal([1, 2, 3])
    assert rule.next_confirm(1000, 0) == 200  # #5663: the union counts
    assert rule.copies_of(500, 1000) == 2


def test_copies_and_reached_with_the_min_in_sync_floor() -> None:
    rule, _ = _rule([1, 2, 3], {2: 800, 3: 200}, floor=3)
    assert rule.copies_of(200, 1000) == 3
    assert rule.copies_of(500, 1000) == 2
    assert rule.copies_of(1001, 1000) == 0  # beyond the master's own log
    assert rule.reached(200, None, 1000)
    assert not rule.reached(500, None, 1000)
    assert not rule.reached(500, 2, 1000)  # two asked for, the floor says three
    assert rule.reached(200, 2, 1000)


def test_every_member_needed_but_set_shrank_below_the_floor() -> None:
    rule, _ = _rule([1], {}, floor=2)
    assert not rule.reached(10, None, 1000)  # the lone master is one copy of two
    rule, _ = _rule([1], {}, floor=1)
    assert rule.reached(10, None, 1000)


def test_ack_policy_as_a_need() -> None:
    assert copies_needed(HAConfig(all_ack_in_sync_state_set=True)) is None
    assert copies_needed(HAConfig(in_sync_replicas=1, min_in_sync_replicas=2)) == 2
    assert needs_no_wait(copies_needed(HAConfig(in_sync_replicas=1)))
    assert not needs_no_wait(None)


# --- proposals ----------------------------------------------------------------------------------


def test_lagging_member_leaves_and_caught_up_slave_joins() -> None:
    s = SyncStateSet(1, [2], epoch=1, now_ms=0)
    s.mark_caught_up(2, 0)
    cands = [Candidate(3, 1000, False)]
    assert desired_set(s, 20_000, 15_000, cands, {}, confirm=1000, epoch_start=0) == {1, 3}
    assert desired_set(s, 1_000, 15_000, cands, {}, confirm=1000, epoch_start=0) == {1, 2, 3}


def test_expansion_one_member_at_a_time_refused_longest_ago_first() -> None:
    s = SyncStateSet(1, [], epoch=1, now_ms=0)
    cands = [Candidate(2, 1000, False), Candidate(3, 1000, False), Candidate(4, 1000, False)]
    assert desired_set(s, 0, 15_000, cands, {}, 1000, 0) == {1, 2}
    assert desired_set(s, 0, 15_000, cands, {2: 50, 3: 10}, 1000, 0) == {1, 4}  # never refused first
    assert desired_set(s, 0, 15_000, cands[:2], {2: 50, 3: 10}, 1000, 0) == {1, 3}


@pytest.mark.parametrize("cand, confirm, epoch_start", [
    (Candidate(2, 1000, True), 1000, 0),  # an async learner never joins
    (Candidate(2, -1, False), 0, 0),  # not reported yet
    (Candidate(2, 900, False), 1000, 0),  # behind the confirm offset
    (Candidate(2, 1000, False), 1000, 1200),  # before the current epoch's start
])
def test_who_never_joins(cand: Candidate, confirm: int, epoch_start: int) -> None:
    s = SyncStateSet(1, [], epoch=1, now_ms=0)
    assert desired_set(s, 0, 15_000, [cand], {}, confirm, epoch_start) == {1}


# --- waiters --------------------------------------------------------------------------------------


def test_waiters_answer_lowest_offsets_first_time_out_and_fail_on_stop() -> None:
    async def run() -> None:
        w = AckWaiters()
        answers: list[tuple[int, bool]] = []
        loop = asyncio.get_running_loop()
        for offset in (300, 100, 200):
            w.call_when(loop, offset, 2, lambda ok, o=offset: answers.append((o, ok)), 5)
        late = asyncio.ensure_future(w.wait(50, None, 0.05))
        stopped = asyncio.ensure_future(w.wait(10, 3, 5))
        await asyncio.sleep(0)
        # Members 2 and 3 ack 200 and 0: two copies up to 200, every member only 0.
        w.settle([200, 0], 1, 1000)
        assert answers == [(100, True), (200, True)]
        assert await late is False  # its timeout
        w.fail_all()
        assert answers[-1] == (300, False)
        assert await stopped is False

    asyncio.run(run())


def test_a_failing_callback_does_not_stop_the_other_waiters() -> None:
    async def run() -> None:
        w = AckWaiters()
        got: list[bool] = []
        loop = asyncio.get_running_loop()

        def boom(ok: bool) -> None:
            raise RuntimeError("the send's answer failed")

        w.call_when(loop, 1, None, boom, 5)
        w.call_when(loop, 2, None, got.append, 5)
        w.settle([5], 1, 10)
        assert got == [True] and len(w) == 0

    asyncio.run(run())


# --- one link per slave id ----------------------------------------------------------------------


class _Conn:
    def __init__(self, broker_id: int, ack: int = -1) -> None:
        self.broker_id = broker_id
        self.ack = ack


def test_link_table_holds_the_newest_link_and_an_old_one_releases_only_itself() -> None:
    t: LinkTable[_Conn] = LinkTable()
    a, b = _Conn(2, 100), _Conn(2, 50)
    assert t.claim(a) is None
    assert t.claim(b) is a  # the caller closes a
    assert t.ack_of(2) == 50 and t.holds(b) and not t.holds(a)
    t.release(a)  # the replaced link ends later: b stays
    assert t.get(2) is b
    t.release(b)
    assert t.ack_of(2) == -1 and len(t) == 0


# --- the slave's cut -------------------------------------------------------------------------


def test_cut_to_the_masters_epochs_drops_the_divergent_tail_and_lowers_the_confirm(tmp_path) -> None:
    with replica_stores(tmp_path, 1 << 20, "s") as [(cl, em)]:
        em.append(1, 0)
        shared = fill(cl, 50_000)
        em.append(2, shared)  # an epoch the master never had
        dropped = fill(cl, 30_000, seed=1) - shared
        cuts: list[int] = []
        progress = SlaveProgress()
        confirm = ConfirmTracker(None)
        confirm.learn(cl.max_offset)
        t = Truncator(cl, em, 2, progress, confirm, cuts.append)
        assert t.to_consistent_point([(1, 0, shared), (3, shared, shared + 10)], "m:1") == shared
        assert cl.max_offset == shared and em.pairs() == [(1, 0)]
        assert cuts == [shared] and confirm.confirm == shared
        assert progress.bytes_dropped == dropped


def test_data_without_epochs_shares_nothing_with_the_master(tmp_path) -> None:
    with replica_stores(tmp_path, 1 << 20, "s") as [(cl, em)]:
        fill(cl, 20_000)
        t = Truncator(cl, em, 2, SlaveProgress(), ConfirmTracker(None), None)
        assert t.to_consistent_point([(1, 0, 100_000)], "m:1") == 0
        assert cl.max_offset == 0
