"""A crash at every named point of the write path, under load, loses nothing acknowledged.

Each scenario arms one failpoint (:mod:`rmqha.failpoints`) on one broker of a chaos run:
the process ends at that exact step with ``os._exit`` (no cleanup, nothing flushed by
Python), the group fails over or carries on, the broker is restarted without the
failpoint, and the harness's checkers judge the history and the final stores.

- ``after_append``: the master dies with a send's records in its log, unflushed and
  unreplicated, never acknowledged;
- ``after_flush``: the master dies after an fsync, before its flushed checkpoint;
- ``during_epoch_map_write``: a slave dies with the new epoch checkpoint fsynced as a
  temp file, not yet renamed, while following a new master;
- ``after_truncate``: the old master, rejoining with a tail only it had, dies between
  cutting its log and cutting its epoch map;
- ``after_meta_written`` and the other identity points are covered by test_broker_ids.py.
"""
from __future__ import annotations

import pytest

import harness as h
from harness import chaos_reports  # noqa: F401  (the fixture that prints the table)
from rmqha.failpoints import ENV_VAR, FAILPOINT_EXIT_CODE


def _armed(point: str) -> dict[str, str]:
    return {ENV_VAR: point}


def _wait_crash(run: h.ChaosRun, broker, point: str) -> None:
    code = broker.wait_exit(30)
    assert code == FAILPOINT_EXIT_CODE, f"{broker.name} exited {code}, not at {point}"
    assert f"failpoint {point.split('@')[0]} hit" in broker.log_text()


def _master_dies_at(point: str):
    def fault(run: h.ChaosRun) -> None:
        m = run.brokers[0]
        run.mark_target(m)
        _wait_crash(run, m, point)
        run.mark_fault()  # failover time counts from the crash
        run.cluster.wait_for(lambda: (x := run.cluster.master_of(h.GROUP)) is not None and x is not m, 30,
                             what="a new master after the crash")
        run.run_load_for(1.0)
    return fault


def _slave_dies_in_epoch_write(run: h.ChaosRun) -> None:
    slave = run.brokers[1]
    m = run.master()
    run.mark_target(m)
    run.mark_fault()
    m.kill()  # a new epoch: the armed slave writes its checkpoint when it follows the new master
    run.cluster.wait_for(lambda: not slave.alive or (run.cluster.master_of(h.GROUP) is slave), 30,
                         what="the armed slave to reach its epoch write")
    if slave.alive:
        pytest.fail("the armed slave became master without writing an epoch as a slave")
    _wait_crash(run, slave, "during_epoch_map_write")
    run.run_load_for(1.0)


def _old_master_dies_after_truncate(run: h.ChaosRun) -> None:
    m = run.master()
    run.ha_proxies[m.name].cut("blackhole")
    # A tail only it has, which it must cut when it rejoins (the failpoint is on that cut).
    run.wait_for_unique_tail(m)
    m.kill()
    run.ha_proxies[m.name].restore()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(h.GROUP)) is not None and x is not m, 30,
                         what="a new master")
    m.start(env=_armed("after_truncate"))
    _wait_crash(run, m, "after_truncate")
    run.mark_fault()
    run.run_load_for(1.0)


#: (name, fault, environment per broker index, whether the fault moves the master after
#: it is marked: crash-after-truncate marks its fault once the new master is in place).
SCENARIOS = [
    ("crash-after-append", _master_dies_at("after_append@400"), {0: _armed("after_append@400")}, True),
    ("crash-after-flush", _master_dies_at("after_flush@40"), {0: _armed("after_flush@40")}, True),
    ("crash-during-epoch-map-write", _slave_dies_in_epoch_write, {1: _armed("during_epoch_map_write@2")}, True),
    ("crash-after-truncate", _old_master_dies_after_truncate, None, False),
]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,fault,env,failover", SCENARIOS, ids=[n for n, _, _, _ in SCENARIOS])
def test_crash_at_every_write_path_failpoint_loses_nothing(tmp_path, chaos_reports, name, fault, env, failover):
    report = h.run_scenario(tmp_path, name, fault, broker_env=env, warmup_s=0.5, failover=failover)
    chaos_reports.append(report)
    assert report.acked > 0, f"{name}: nothing was acknowledged"
    assert report.lost == 0 and not report.problems, f"{name}: {report.problems}"
