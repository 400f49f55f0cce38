"""The master lease rule: the broker's lease, its config check, and the controller's guard.

The lease is judged on clocks the tests drive by hand; the real-process check (a master
partitioned from the controllers) is the chaos scenario ``partition-master-from-controllers``.
"""
from __future__ import annotations

import asyncio
import random

import pytest

from rmqha.broker.config import BrokerConfig
from rmqha.broker.replicas_manager import ReplicasManager, Role
from rmqha.broker.master_lease import (
    MAX_CLOCK_RATE_ERROR, STALE_LEADER_WINDOW_MS, LeaseGrant, MasterLease, lease_ms_for,
    min_margin_ms,
)
from rmqha.controller.client import HeartbeatAnswer
from rmqha.controller.heartbeat import BrokerHeartbeatManager
from rmqha.controller.logic import ControllerLogic
from rmqha.controller.state import ReplicasState
from rmqha.errors import ConfigError

ME = 2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lease(lease_s: float = 1.0) -> tuple[MasterLease, Clock]:
    clock = Clock()
    return MasterLease(lease_s, clock=clock), clock


def test_lease_runs_from_the_send_time_not_the_answer():
    lease, clock = _lease(1.0)
    assert not lease.holds(3)  # no answer yet: a new master waits for its first lease
    sent = clock.now
    clock.now += 0.4  # the answer is slow
    assert lease.on_answer(LeaseGrant(True, ME, 3), sent, ME)
    assert lease.holds(3)
    assert lease.remaining_s(3) == pytest.approx(0.6)
    clock.now = sent + 0.999
    assert lease.holds(3)
    clock.now = sent + 1.0
    assert not lease.holds(3)  # expired exactly lease_s after the send


def test_only_a_leader_answer_naming_this_master_at_its_epoch_renews():
    lease, clock = _lease(1.0)
    assert not lease.on_answer(LeaseGrant(False, ME, 3), clock.now, ME)  # a follower
    assert not lease.holds(3)
    assert lease.on_answer(LeaseGrant(True, ME, 3), clock.now, ME)
    assert not lease.holds(2) and not lease.holds(4)  # bound to the epoch it was granted for
    # An answer from before the election we took part in says nothing.
    assert not lease.on_answer(LeaseGrant(True, ME, 2), clock.now + 0.5, ME)
    assert lease.holds(3)


def test_answers_overtaking_each_other_keep_the_newest_send_time():
    lease, clock = _lease(1.0)
    first, second = clock.now, clock.now + 0.2
    assert lease.on_answer(LeaseGrant(True, ME, 3), second, ME)
    assert not lease.on_answer(LeaseGrant(True, ME, 3), first, ME)  # older heartbeat, later answer
    clock.now = first + 1.1
    assert lease.holds(3)  # still counted from the newer send
    clock.now = second + 1.0
    assert not lease.holds(3)


def test_an_answer_naming_another_master_revokes_at_once():
    lease, clock = _lease(1.0)
    lease.on_answer(LeaseGrant(True, ME, 3), clock.now, ME)
    assert lease.holds(3)
    assert not lease.on_answer(LeaseGrant(True, 5, 4), clock.now, ME)  # elected elsewhere
    assert not lease.holds(3)
    assert lease.revocations == 1
    # Being master again (a later epoch) needs a fresh grant for that epoch.
    assert lease.on_answer(LeaseGrant(True, ME, 5), clock.now, ME)
    assert lease.holds(5) and not lease.holds(3)


def test_an_answer_naming_another_master_at_an_older_epoch_is_ignored():
    lease, clock = _lease(1.0)
    lease.on_answer(LeaseGrant(True, ME, 3), clock.now, ME)
    lease.on_answer(LeaseGrant(True, 5, 2), clock.now, ME)  # stale record of an older epoch
    assert lease.holds(3)


def test_disabled_lease_always_holds():
    lease = MasterLease(0, enabled=False)
    assert lease.holds(7)
    with pytest.raises(ValueError):
        MasterLease(0)


def test_timing_rule_the_lease_ends_before_any_controller_can_elect():
    """Worst case for every heartbeat timeout: the broker's clock runs slow and the
    controller's fast by MAX_CLOCK_RATE_ERROR, the heartbeat is received the instant it
    is sent, and a controller leader cut off from its quorum granted it as late as it
    could: the lease still ends before the earliest election."""
    rng = random.Random(13)
    for timeout_ms in [3000, 5000, 10000, 30000, *(rng.randrange(2000, 120000) for _ in range(200))]:
        margin = min_margin_ms(timeout_ms)
        lease_ms = lease_ms_for(timeout_ms, margin, 0)
        if lease_ms <= 0:
            continue
        rho = MAX_CLOCK_RATE_ERROR
        lease_real = lease_ms / (1 - rho)          # broker clock slow: its lease lasts longer
        earliest_election = timeout_ms / (1 + rho)  # controller clock fast: judges earlier
        # A stale leader's grant may come STALE_LEADER_WINDOW_MS after the new leader
        # started, whose guard counts from its own start.
        assert STALE_LEADER_WINDOW_MS + lease_real < earliest_election, timeout_ms


def test_config_derives_the_lease_and_refuses_unsafe_ones():
    cfg = BrokerConfig(controller_addr=["127.0.0.1:9878"])
    cfg.validate()
    assert cfg.master_lease_ms_in_force == 10000 - 2000
    quick = BrokerConfig(controller_addr=["127.0.0.1:9878"], controller_heartbeat_timeout_ms=3000,
                         broker_heartbeat_interval_ms=200)
    quick.validate()
    assert quick.master_lease_ms_in_force == 1000  # the default margin; the test timers use 1600
    bad = [
        ({"master_lease_ms": 8001}, "must be at most controller_heartbeat_timeout_ms 10000"),
        ({"master_lease_margin_ms": 1000}, "below the safe minimum"),
        ({"master_lease_ms": -1}, "must be 0 (derived) or positive"),
        ({"controller_heartbeat_timeout_ms": 2500}, "must be longer than broker_heartbeat_interval_ms"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            BrokerConfig(controller_addr=["127.0.0.1:9878"], **overrides).validate()
    # Off: RocketMQ's behaviour, no lease constraints on the timers.
    BrokerConfig(controller_addr=["127.0.0.1:9878"], master_lease_enable=False,
                 controller_heartbeat_timeout_ms=1000).validate()


class FakeConn:
    def __init__(self) -> None:
        self.attributes: dict = {}
        self._callbacks = []

    def add_close_callback(self, fn) -> None:
        self._callbacks.append(fn)

    def close(self) -> None:
        for fn in self._callbacks:
            fn(self)


def _controller(timeout_s: float = 3.0):
    clock = Clock()
    hb = BrokerHeartbeatManager(new_leader_wait_s=0.5, clock=clock, default_timeout_s=timeout_s)
    state = ReplicasState()
    logic = ControllerLogic(state, hb)
    for i in (1, 2):
        assert state.apply(logic.apply_broker_id({
            "clusterName": "c", "brokerName": "b", "appliedBrokerId": str(i),
            "registerCheckCode": f"h:{i};{i}"}).event)["ok"]
        hb.on_heartbeat("c", "b", i, f"h:{i}", timeout_ms=int(timeout_s * 1000))
    assert state.apply(logic.elect_master({"clusterName": "c", "brokerName": "b",
                                           "brokerId": "1"}).event)["ok"]
    assert state.apply(logic.alter_sync_state_set(
        {"brokerName": "b", "masterBrokerId": "1", "masterEpoch": "1"},
        {"syncStateSet": [1, 2], "syncStateSetEpoch": 1}).event)["ok"]
    return clock, hb, state, logic


def test_a_new_leader_waits_a_heartbeat_timeout_before_judging_a_silent_master():
    clock, hb, state, logic = _controller(3.0)
    hb.on_leader()
    clock.now += 1.0
    # The master went silent long ago (as this node saw it), but the old leader may have
    # renewed its lease until just before this node took over.
    hb.remove_group("b", [1])
    hb.on_heartbeat("c", "b", 2, "h:2", timeout_ms=3000)
    assert hb.lease_guard_remaining("b", 1) == pytest.approx(2.0)
    assert logic.groups_needing_election() == []
    d = logic.elect_master({"clusterName": "c", "brokerName": "b", "brokerId": "2"})
    assert d.event is None  # MASTER_STILL_EXIST: not elected behind a live lease
    clock.now += 2.0
    hb.on_heartbeat("c", "b", 2, "h:2", timeout_ms=3000)
    assert hb.lease_guard_remaining("b", 1) == 0
    assert logic.groups_needing_election() == ["b"]


def test_a_master_that_asked_for_a_longer_timeout_gets_a_longer_guard():
    clock, hb, _, _ = _controller(3.0)
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=8000)
    hb.on_leader()
    assert hb.lease_guard_remaining("b", 1) == pytest.approx(8.0)


def test_a_close_seen_as_leader_ends_the_guard_one_seen_before_does_not():
    clock, hb, _, logic = _controller(3.0)
    before = FakeConn()
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=3000, conn=before)
    before.close()  # seen as a follower: maybe only this node's link failed
    hb.on_leader()
    assert hb.lease_guard_remaining("b", 1) == pytest.approx(3.0)
    conn = FakeConn()
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=3000, conn=conn)
    conn.close()  # seen as leader: the process died
    assert hb.lease_guard_remaining("b", 1) == 0
    assert hb.judge_wait("b", 1) == pytest.approx(0.5)  # only the fresh-heartbeat grace
    clock.now += 0.5
    assert logic.groups_needing_election() == ["b"]
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=3000)  # it was alive after all
    assert logic.groups_needing_election() == []


def test_without_a_leader_change_the_timeout_alone_judges():
    clock, hb, _, logic = _controller(3.0)
    hb.on_leader()
    clock.now += 10.0  # long past the guard
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=3000)
    hb.on_heartbeat("c", "b", 2, "h:2", timeout_ms=3000)
    clock.now += 2.9
    hb.on_heartbeat("c", "b", 2, "h:2", timeout_ms=3000)
    assert logic.groups_needing_election() == []
    clock.now += 0.2  # 3.1 s after the master's last heartbeat
    assert logic.groups_needing_election() == ["b"]


def test_a_closed_connection_is_only_death_when_the_probe_says_gone():
    clock, hb, _, logic = _controller(3.0)
    hb.on_leader()
    clock.now += 5.0  # past the guard and the grace
    probed = []
    hb.close_probe = probed.append
    conn = FakeConn()
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=3000, conn=conn)
    hb.on_heartbeat("c", "b", 2, "h:2", timeout_ms=3000)
    seen = hb.info("b", 1).last_update
    conn.close()  # a reset link, or a death: not known yet
    assert [i.broker_id for i in probed] == [1]
    assert hb.is_alive("b", 1) and logic.groups_needing_election() == []
    # It heartbeated again while the probe ran: the probe's verdict is stale.
    clock.now += 0.1
    hb.on_heartbeat("c", "b", 1, "h:1", timeout_ms=3000)
    hb.confirm_gone(probed[0], seen)
    assert hb.is_alive("b", 1)
    # A verdict about the current heartbeat: gone, at once.
    hb.confirm_gone(hb.info("b", 1), hb.info("b", 1).last_update)
    assert not hb.is_alive("b", 1)
    assert logic.groups_needing_election() == ["b"]


# --- a new master's first lease: writes wait for it, a lapsed lease is not waited for --------


class SlowLeader:
    """A controller client whose leader answers a heartbeat only when the test says so."""

    def __init__(self) -> None:
        self.addresses = ["127.0.0.1:1"]
        self.answers: asyncio.Queue[HeartbeatAnswer] = asyncio.Queue()

    async def heartbeat_to(self, addr: str, *args: object, **kwargs: object) -> HeartbeatAnswer:
        return await self.answers.get()


class Listener:
    def heartbeat_status(self) -> tuple[int, int, int]:
        return 2, 0, 0


def _new_master(tmp_path, epoch: int) -> tuple[ReplicasManager, SlowLeader]:  # noqa: ANN001
    controller = SlowLeader()
    cfg = BrokerConfig(controller_addr=controller.addresses, store_dir=str(tmp_path))
    rm = ReplicasManager(cfg, controller, Listener())  # type: ignore[arg-type]
    rm.status.broker_id, rm.status.role, rm.status.master_epoch = 1, Role.MASTER, epoch
    return rm, controller


def test_a_write_waits_for_the_new_masters_first_lease_then_is_taken(tmp_path):
    async def scenario() -> None:
        rm, leader = _new_master(tmp_path, epoch=2)
        assert rm.awaiting_first_lease and not rm.accepts_writes
        held = asyncio.ensure_future(rm.wait_for_first_lease(5.0))
        rm._send_heartbeats()  # what taking the role does
        for _ in range(10):  # let the heartbeat go out and the write reach its wait
            await asyncio.sleep(0)
        assert not held.done()  # no answer yet: the write is held, not refused
        await leader.answers.put(HeartbeatAnswer("127.0.0.1:1", True, 1, 2))
        await asyncio.wait_for(held, 1.0)
        assert rm.accepts_writes and not rm.awaiting_first_lease
    asyncio.run(scenario())


def test_no_first_lease_within_the_bound_and_a_lapsed_lease_are_refused_not_waited_for(tmp_path):
    async def scenario() -> None:
        rm, leader = _new_master(tmp_path, epoch=2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await rm.wait_for_first_lease(0.2)  # the leader never answers
        assert loop.time() - started >= 0.2 and not rm.accepts_writes
        # Granted, then lapsed at the same epoch: not a new master any more, no wait.
        clock = Clock()
        rm.lease = MasterLease(1.0, clock=clock)
        rm.lease.on_answer(LeaseGrant(True, 1, 2), clock(), 1)
        assert rm.accepts_writes
        clock.now += 1.5
        assert rm.lease_fenced and not rm.awaiting_first_lease
        started = loop.time()
        await rm.wait_for_first_lease(5.0)
        assert loop.time() - started < 0.5
    asyncio.run(scenario())
