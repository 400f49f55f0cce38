"""Controller pieces in-process: election ranking, state machine events, request rules."""
from __future__ import annotations

import pytest

from rmqha.protocol.codes import ResponseCode
from rmqha.controller.config import ControllerConfig
from rmqha.controller.elect_policy import CandidateInfo, elect
from rmqha.controller.heartbeat import BrokerHeartbeatManager
from rmqha.controller.logic import ControllerLogic
from rmqha.controller.state import ReplicasState
from rmqha.errors import ConfigError


def _info(table):
    return lambda b: table.get(b, CandidateInfo(b))


def test_rank_epoch_then_offset_then_priority_then_id():
    alive = lambda b: True  # noqa: E731
    t = {1: CandidateInfo(1, epoch=2, max_offset=10), 2: CandidateInfo(2, epoch=3, max_offset=1),
         3: CandidateInfo(3, epoch=3, max_offset=5)}
    assert elect([1, 2, 3], None, alive, _info(t)) == 3  # epoch 3 beats 2; then offset
    t[2] = CandidateInfo(2, epoch=3, max_offset=5, priority=1)
    t[3] = CandidateInfo(3, epoch=3, max_offset=5, priority=4)
    assert elect([1, 2, 3], None, alive, _info(t)) == 2  # equal offset: lower priority
    t[2] = CandidateInfo(2, epoch=3, max_offset=5, priority=4)
    assert elect([3, 2], None, alive, _info(t)) == 2  # full tie: lower id
    # Offsets differing by more than 2**31 (upstream's int cast overflowed).
    t = {1: CandidateInfo(1, 1, 1 << 40), 2: CandidateInfo(2, 1, 5)}
    assert elect([1, 2], None, alive, _info(t)) == 1


def test_candidates_old_master_designated_and_unclean():
    live = {2, 3}
    alive = lambda b: b in live  # noqa: E731
    info = _info({3: CandidateInfo(3, 1, 100), 2: CandidateInfo(2, 1, 50)})
    assert elect([1, 2, 3], None, alive, info, old_master=2) == 2  # a live old master stays
    assert elect([1, 2, 3], None, alive, info, old_master=1) == 3  # dead one: ranking
    assert elect([1, 2, 3], None, alive, info, designated=2) == 2
    assert elect([1, 2, 3], None, alive, info, designated=1) is None  # dead: no fallback
    assert elect([1], None, alive, info) is None  # nobody in the set is alive
    assert elect([1], [1, 2, 3], alive, info) == 3  # unclean: any live replica


def _logic():
    state = ReplicasState()
    hb = BrokerHeartbeatManager(new_leader_wait_s=0)
    return state, hb, ControllerLogic(state, hb)


def _commit(state, decision):
    assert decision.event is not None, decision
    assert state.apply(decision.event)["ok"]


def test_apply_broker_id_rules_and_next_id():
    state, hb, logic = _logic()
    ext = {"clusterName": "c", "brokerName": "b", "appliedBrokerId": "2", "registerCheckCode": "a:1;1"}
    d = logic.apply_broker_id(ext)
    assert d.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID and "next id is 1" in d.remark
    _commit(state, logic.apply_broker_id({**ext, "appliedBrokerId": "1"}))
    assert logic.get_next_broker_id({"brokerName": "b"}).ext_fields["nextBrokerId"] == "2"
    # The same code again is a retry: success without a new event.
    d = logic.apply_broker_id({**ext, "appliedBrokerId": "1"})
    assert d.code == 0 and d.event is None
    d = logic.apply_broker_id({**ext, "appliedBrokerId": "1", "registerCheckCode": "x:1;2"})
    assert d.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID and "next id is 2" in d.remark
    d = logic.apply_broker_id({**ext, "appliedBrokerId": "3", "registerCheckCode": "x:1;2"})
    assert d.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID


def test_stale_event_is_skipped_everywhere():
    state, hb, logic = _logic()
    ext = {"clusterName": "c", "brokerName": "b", "appliedBrokerId": "1", "registerCheckCode": "a:1;1"}
    first = logic.apply_broker_id(ext).event
    second = logic.apply_broker_id({**ext, "registerCheckCode": "b:1;2"}).event
    assert state.apply(first)["ok"]
    result = state.apply(second)  # validated against the same revision: refused
    assert not result["ok"] and "stale" in result["reason"]
    assert state.group("b").brokers[1].register_code == "a:1;1"


def test_elect_events_and_snapshot_roundtrip():
    state, hb, logic = _logic()
    for i in (1, 2):
        _commit(state, logic.apply_broker_id({"clusterName": "c", "brokerName": "b",
                                              "appliedBrokerId": str(i),
                                              "registerCheckCode": f"h:{i};{i}"}))
        hb.on_heartbeat("c", "b", i, f"h:{i}")
    _commit(state, logic.elect_master({"clusterName": "c", "brokerName": "b", "brokerId": "2"}))
    g = state.group("b")
    assert (g.master_id, g.master_epoch, g.sync_state_set, g.sync_state_set_epoch) == (2, 1, [2], 1)
    # The controller's "no candidate" event keeps the set and bumps the master epoch.
    assert state.apply({"type": "elect", "broker_name": "b", "new_master": None,
                        "expect_revision": state.revision})["ok"]
    g = state.group("b")
    assert (g.master_id, g.master_epoch, g.sync_state_set, g.sync_state_set_epoch) == (None, 2, [2], 1)
    copy = ReplicasState()
    copy.restore(state.snapshot())
    assert copy.digest() == state.digest() and copy.revision == state.revision


def test_clean_refuses_living_and_unknown():
    state, hb, logic = _logic()
    _commit(state, logic.apply_broker_id({"clusterName": "c", "brokerName": "b",
                                          "appliedBrokerId": "1", "registerCheckCode": "h:1;1"}))
    hb.on_heartbeat("c", "b", 1, "h:1")
    d = logic.clean_broker_data({"brokerName": "b"})
    assert d.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA and "alive" in d.remark
    d = logic.clean_broker_data({"brokerName": "nope"})
    assert d.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA and "not existed" in d.remark
    _commit(state, logic.clean_broker_data({"brokerName": "b", "isCleanLivingBroker": "true"}))
    assert state.group("b") is None


def test_heartbeat_offsets_never_go_back_within_an_epoch():
    clock = [0.0]
    hb = BrokerHeartbeatManager(new_leader_wait_s=0, clock=lambda: clock[0])
    hb.on_heartbeat("c", "b", 1, "a", epoch=2, max_offset=100, timeout_ms=1000)
    hb.on_heartbeat("c", "b", 1, "a", epoch=2, max_offset=50, timeout_ms=1000)
    assert hb.candidate("b", 1) == CandidateInfo(1, 2, 100)
    hb.on_heartbeat("c", "b", 1, "a", epoch=3, max_offset=10, timeout_ms=1000)
    assert hb.candidate("b", 1).epoch == 3
    dead = []
    hb.add_inactive_listener(lambda c, n, i: dead.append((n, i)))
    clock[0] = 1.5
    assert not hb.is_alive("b", 1)
    hb.scan()
    assert dead == [("b", 1)]


def test_controller_config_peers_and_errors():
    cfg = ControllerConfig(controller_peers="n0-127.0.0.1:9878;n1-127.0.0.1:9868",
                           controller_self_id="n1")
    cfg.validate()
    assert cfg.self_peer().raft_address == "127.0.0.1:10868"
    with pytest.raises(ConfigError, match="not among the peers"):
        ControllerConfig(controller_self_id="n9").validate()
    with pytest.raises(ConfigError, match="bad peer"):
        ControllerConfig(controller_peers="127.0.0.1:1").validate()


def test_overlay_sees_its_own_events_and_leaves_base_alone():
    state, hb, logic = _logic()
    _commit(state, logic.apply_broker_id({"clusterName": "c", "brokerName": "b",
                                          "appliedBrokerId": "1", "registerCheckCode": "h:1;1"}))
    scratch = state.overlay()
    over = ControllerLogic(scratch, hb)
    events = []
    for i in (2, 3):
        d = over.apply_broker_id({"clusterName": "c", "brokerName": "b",
                                  "appliedBrokerId": str(i), "registerCheckCode": f"h:{i};{i}"})
        assert d.code == 0
        assert scratch.apply(d.event)["ok"]
        events.append(d.event)
    d = over.clean_broker_data({"brokerName": "b", "isCleanLivingBroker": "true"})
    assert scratch.apply(d.event)["ok"] and scratch.group("b") is None
    assert state.group("b").next_id == 2  # base untouched
    result = state.apply({"type": "batch", "events": events})
    assert [r["ok"] for r in result["results"]] == [True, True]
    assert sorted(state.group("b").brokers) == [1, 2, 3]
