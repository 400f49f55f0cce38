"""Negative controls for every chaos checker: synthetic evidence that must make it fire.

Each test starts from :func:`clean`, the evidence of a small run that passes every
checker (the master b0 of epoch 1 killed at t=2.5, b1 master of epoch 2 from t=3), and
changes one thing a broken cluster (or a broken harness) would: the checker for it must
report a problem, and the clean evidence must not.  These run in ``make test``; the chaos
scenarios themselves feed the same checkers real evidence.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import harness as h
import judge as j
import pytest
from judge import BrokerSample, ControllerSample, Outcome, OutcomeStatus, ProbeAck, Read, StoredRecord

from rmqha.errors import RemotingTimeoutError, SendError
from rmqha.protocol.codes import ResponseCode

BROKERS = ["b0", "b1", "b2"]
PIDS = {"b0": 10, "b1": 11, "b2": 12}
IDS = {"b0": 1, "b1": 2, "b2": 3}
FAULT_AT = 2.5
SIZE = 100


def _role(broker: str, t: float) -> tuple[str, int, bool] | None:
    """(role, epoch, accepting) of a broker at t in the clean history; None: dead."""
    if broker == "b0":
        return ("master", 1, True) if t < FAULT_AT else None
    if broker == "b1" and t >= 3.0:
        return ("master", 2, True)
    return ("slave", 2 if t >= 3.0 else 1, False)


def _samples(max_offset: int = 10_000) -> list[BrokerSample]:
    out = []
    for b in BROKERS:
        for k in range(2, 25):
            t0 = k * 0.25
            state = _role(b, t0)
            if state is not None:
                out.append(BrokerSample(b, PIDS[b], t0, t0 + 0.01, *state, max_offset))
    return out


def _controller() -> list[ControllerSample]:
    return [ControllerSample(t0 := k * 0.25, t0 + 0.01, 1 if t0 < 2.75 else 2, 1 if t0 < 2.75 else 2, (1, 2, 3))
            for k in range(2, 25)]


def _probes() -> list[ProbeAck]:
    early = [ProbeAck("b0", 10, t, t + 0.02) for t in (0.6, 1.1, 1.6, 2.1)]
    late = [ProbeAck("b1", 11, t, t + 0.02) for t in (3.1, 3.6, 4.1, 5.1)]
    return early + late


def _monitor(samples: list[BrokerSample]) -> j.MonitorLog:
    log = j.MonitorLog(ok=Counter(s.broker for s in samples))
    log.ok["controller"] = 23
    return log


def clean() -> j.Evidence:
    values = [f"p0-{i:07d}" for i in range(4)]
    final = [StoredRecord(v, 0, i, i * SIZE, SIZE) for i, v in enumerate(values)]
    samples = _samples()
    return j.Evidence(
        "synthetic", need=2, brokers=list(BROKERS),
        outcomes=[Outcome(v, OutcomeStatus.ACKED, 1, 1.0 + i, 1.1 + i, i * SIZE, "h:0" if i < 2 else "h:1")
                  for i, v in enumerate(values)],
        addresses={f"h:{i}": b for i, b in enumerate(BROKERS)},
        reads=[Read(r.value, r.queue_id, r.queue_offset) for r in final],
        broker_samples=samples, controller_samples=_controller(), probe_acks=_probes(),
        monitor=_monitor(samples), ids_before=dict(IDS), ids_after=dict(IDS),
        logs={b: list(final) for b in BROKERS}, raw={b: b"r" * 4 * SIZE for b in BROKERS},
        fault_at=FAULT_AT, expect_failover=True, faulted_master=1)


def problems(ev: j.Evidence) -> list[str]:
    return j.judge(ev).problems


def fires(ev: j.Evidence, needle: str) -> j.Report:
    report = j.judge(ev)
    assert any(needle in p for p in report.problems), report.problems
    return report


def test_the_clean_evidence_passes_every_checker() -> None:
    report = j.judge(clean())
    assert report.problems == []
    assert (report.acked, report.lost, report.uncovered, report.ack_overlap_s) == (4, 0, 0, 0.0)
    assert report.new_master_ack_s == pytest.approx(3.12 - FAULT_AT)


# --- loss, phantoms, definite failures, duplicates, divergence ----------------------------


def test_an_acknowledged_value_missing_from_the_final_log_is_lost() -> None:
    ev = clean()
    ev.logs = {b: rows[:2] + rows[3:] for b, rows in ev.logs.items()}
    assert fires(ev, "acknowledged values lost").lost == 1


def test_a_stored_value_never_sent_is_a_phantom() -> None:
    ev = clean()
    ev.logs["b0"] = [*ev.logs["b0"], StoredRecord("ghost", 0, 4, 400, SIZE)]
    assert fires(ev, "stored values never sent").phantoms == 1


def test_a_definite_failure_that_is_stored_fires() -> None:
    ev = clean()
    ev.outcomes.append(Outcome("refused", OutcomeStatus.FAILED, 1, 5.0, 5.1))
    ev.logs["b0"] = [*ev.logs["b0"], StoredRecord("refused", 0, 4, 400, SIZE)]
    fires(ev, "stored though their send definitely failed")


def test_a_duplicate_not_explained_by_a_retry_fires() -> None:
    ev = clean()
    dup = dataclasses.replace(ev.logs["b0"][1], queue_offset=4, offset=400)
    ev.logs["b0"] = [*ev.logs["b0"], dup]
    assert fires(ev, "stored twice though sent once and acked").bad_duplicates == 1
    # The same duplicate of a retried send is what a retry may leave: no problem.
    ev.outcomes[1].attempts = 2
    ev.reads.append(Read(dup.value, 0, 4))
    assert problems(ev) == []


def test_a_duplicate_of_a_retried_send_fires_with_idempotent_producers() -> None:
    """The negative control of the duplicate count: a retried send stored twice passes as
    a retry's leftover without idempotence, and is a problem with it."""
    ev = clean()
    ev.idempotent = True
    assert problems(ev) == []  # nothing stored twice: clean
    dup = dataclasses.replace(ev.logs["b0"][1], queue_offset=4, offset=400)
    ev.logs["b0"] = [*ev.logs["b0"], dup]
    ev.outcomes[1].attempts = 2
    ev.reads.append(Read(dup.value, 0, 4))
    assert fires(ev, "stored twice though the producers were idempotent").duplicates == 1


def test_a_replica_that_diverges_fires() -> None:
    ev = clean()
    ev.raw["b1"] = b"r" * SIZE + b"X" + b"r" * (SIZE - 1)
    fires(ev, "b1's log is not a prefix of the longest replica")


# --- the tailing consumer ----------------------------------------------------------------


def test_a_read_later_truncated_and_re_read_at_the_same_offset_fires() -> None:
    """The reads were once a dict keyed by (queue, offset): the re-read overwrote the read
    of the truncated record.  Every read is judged now."""
    ev = clean()
    ev.reads.insert(1, Read("p9-truncated", 0, 1))
    fires(ev, "tailing group read 1 records the final log does not hold there")


def test_a_skipped_offset_fires() -> None:
    ev = clean()
    del ev.reads[2]
    fires(ev, "tailing group skipped 1 stored records (e.g. queue 0 offset 2)")


def test_a_tail_that_read_nothing_fires() -> None:
    ev = clean()
    ev.reads = []
    fires(ev, "the tailing group read nothing")


def test_a_tail_that_failed_fires() -> None:
    ev = clean()
    ev.tail_errors.append("the tailing consumer failed: boom")
    fires(ev, "the tailing consumer failed: boom")


# --- masters, epochs and writers ---------------------------------------------------------


def test_two_brokers_claiming_master_in_one_epoch_fire() -> None:
    ev = clean()
    ev.broker_samples.append(BrokerSample("b2", 12, 1.3, 1.31, "master", 1, False, 10_000))
    fires(ev, "brokers ['b0', 'b2'] all claimed master at epoch 1")


def test_the_controller_naming_two_masters_in_one_epoch_fires() -> None:
    ev = clean()
    ev.controller_samples.append(ControllerSample(1.3, 1.31, 3, 1, (1, 2, 3)))
    fires(ev, "controller named masters [1, 3] at epoch 1")


def test_an_older_master_accepting_writes_after_a_newer_one_fires() -> None:
    ev = clean()
    ev.broker_samples.append(BrokerSample("b0", 10, 3.4, 3.41, "master", 1, True, 10_000))
    assert fires(ev, "samples found a broker accepting writes in an older epoch").two_writer_samples == 1


def test_two_writers_seen_by_the_probes_fire() -> None:
    """b0 still acknowledges as master of epoch 1 (its samples bracket the acks) after b1,
    master of epoch 2, acknowledged a probe: judged from the probes' own times."""
    ev = clean()
    ev.broker_samples += [BrokerSample("b0", 10, t, t + 0.01, "master", 1, False, 10_000)
                          for t in (2.5, 2.75, 3.0, 3.25, 3.5)]
    ev.probe_acks.append(ProbeAck("b0", 10, 3.3, 3.32))
    report = fires(ev, "two brokers acknowledged writes at once")
    assert report.ack_overlap_s == pytest.approx(3.3 - 3.12)


def test_an_ack_whose_epoch_is_not_bracketed_by_samples_is_not_judged() -> None:
    """Soundness: a probe ack from a process no sample brackets (b0 after its last sample)
    has no known epoch, so it cannot make two writers."""
    ev = clean()
    ev.probe_acks.append(ProbeAck("b0", 10, 3.3, 3.32))
    assert problems(ev) == []


# --- copies at acknowledgement time -------------------------------------------------------


def _behind_at_the_last_ack(ev: j.Evidence, *, b2_pid: int = 12, b2_caught_up: bool = False,
                            acker_cut: bool = False) -> j.Evidence:
    """b1 (master of epoch 2) acknowledges the record at 300..400; b0, restarted as a slave
    at 3.5, and b2 answer right after the ack that their logs end at 300 (b2: at 400 when
    caught up; as another process when restarted; b1 too with ``acker_cut``)."""
    last = ev.outcomes[-1]
    assert (last.offset, last.sent_at, last.done_at, last.store) == (300, 4.0, 4.1, "h:1")
    ev.broker_samples += [BrokerSample("b0", 20, t0 := 3.5 + k * 0.25, t0 + 0.01, "slave", 2, False, 10_000)
                          for k in range(10)]
    late = ("b0", "b1", "b2") if acker_cut else ("b0", "b2")
    rows = []
    for s in ev.broker_samples:
        if 4.1 <= s.t0 < 4.4 and s.broker in late:
            caught = s.broker == "b2" and b2_caught_up
            pid = b2_pid if s.broker == "b2" else s.pid
            s = dataclasses.replace(s, max_offset=400 if caught else 300, pid=pid)
        rows.append(s)
    ev.broker_samples = rows
    ev.monitor = _monitor(rows)
    return ev


def test_an_ack_not_covered_by_in_sync_copies_at_ack_time_fires() -> None:
    report = fires(_behind_at_the_last_ack(clean()), "held by fewer than 2 replicas when acknowledged")
    assert report.uncovered == 1
    assert "b0, b2 behind it at the ack" in " ".join(report.problems)


def test_an_ack_with_a_replica_caught_up_at_its_next_sample_is_covered() -> None:
    assert problems(_behind_at_the_last_ack(clean(), b2_caught_up=True)) == []


def test_a_replica_restarted_across_the_ack_is_not_proven_behind() -> None:
    """Soundness: a new process's log end says nothing about what the old one held."""
    assert problems(_behind_at_the_last_ack(clean(), b2_pid=99)) == []


def test_the_acknowledging_broker_is_never_counted_behind() -> None:
    """Soundness where the group broke: b1 acknowledged the record, then cut it (all three
    end at 300 right after): b1 held it when it acknowledged it."""
    ev = _behind_at_the_last_ack(clean(), acker_cut=True)
    ev.need = 1
    assert j.judge(ev).uncovered == 0
    ev.outcomes[-1].store = None  # who acknowledged unknown: all three count as behind
    assert j.judge(ev).uncovered == 1


def test_a_lost_ack_is_judged_at_its_offset() -> None:
    """The record is gone from the final log (lost), yet its ack is still judged: holding
    it took more than its offset's bytes, which b1 and b2 did not have."""
    ev = _behind_at_the_last_ack(clean())
    ev.logs = {b: rows[:3] for b, rows in ev.logs.items()}
    ev.reads = ev.reads[:3]
    report = j.judge(ev)
    assert report.lost == 1 and report.uncovered == 1, report.problems


# --- the monitor, progress, ids, threads --------------------------------------------------


def test_a_missing_status_key_is_malformed_not_a_default() -> None:
    status = {"role": "master", "master_epoch": 3, "acceptingWrites": True, "maxOffset": 10}
    with pytest.raises(j.MalformedStatus, match="b0's status has no 'masterEpoch'"):
        j.parse_broker_status("b0", 10, 0.0, 0.1, status)
    with pytest.raises(j.MalformedStatus, match="'acceptingWrites' is 'yes', not bool"):
        j.parse_broker_status("b0", 10, 0.0, 0.1, {**status, "masterEpoch": 3, "acceptingWrites": "yes"})
    with pytest.raises(j.MalformedStatus, match="controller's status has no 'syncStateSet'"):
        j.parse_replica_info(0.0, 0.1, {"masterBrokerId": "1", "masterEpoch": "2"}, {"syncStateSetEpoch": 1})
    sample = j.parse_replica_info(0.0, 0.1, {"masterEpoch": "2"}, {"syncStateSet": [3, 1]})
    assert (sample.master_id, sample.epoch, sample.sync_state_set) == (None, 2, (1, 3))


def test_a_malformed_answer_in_the_run_fires() -> None:
    ev = clean()
    ev.monitor.malformed.append("b1's status has no 'masterEpoch'")
    fires(ev, "malformed status: b1's status has no 'masterEpoch'")


def test_a_source_never_sampled_fires() -> None:
    ev = clean()
    ev.monitor.ok["controller"] = 0
    ev.monitor.errors["controller"] = 40
    fires(ev, "no successful status sample of controller (40 failed)")


class _FakeResponse:
    code = ResponseCode.SUCCESS
    remark = None

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def json_body(self) -> dict[str, Any]:
        return self.body


class _FakeBroker:
    name, address, pid, alive = "b0", "127.0.0.1:1", 10, True


def test_the_sampler_records_a_renamed_key_as_malformed(tmp_path: Path) -> None:
    """The harness's own sampler, on an answer whose epoch key was renamed: recorded as
    malformed (a problem), not sampled with a default epoch."""
    run = h.ChaosRun(tmp_path, "sampler")

    class Cluster:
        def request(self, *_: Any, **__: Any) -> _FakeResponse:
            run._stop.set()  # one sample is enough
            return _FakeResponse({"role": "master", "epoch": 3, "acceptingWrites": True, "maxOffset": 1})

    run.cluster = Cluster()  # type: ignore[assignment]
    run._sample_broker(_FakeBroker())  # type: ignore[arg-type]
    assert run.ev.broker_samples == [] and run.ev.monitor.ok["b0"] == 0
    assert run.ev.monitor.malformed == ["b0's status has no 'masterEpoch' "
                                        "(keys: ['acceptingWrites', 'epoch', 'maxOffset', 'role'])"]


def test_no_failover_where_the_fault_moves_the_master_fires() -> None:
    ev = clean()
    ev.controller_samples = [dataclasses.replace(c, master_id=1, epoch=1) for c in ev.controller_samples]
    fires(ev, "no failover: the controller never named a master other than 1 in an epoch after 1")
    ev.expect_failover = False
    assert problems(ev) == []


def test_a_failover_before_the_fault_was_marked_still_counts() -> None:
    """A master crashed at a failpoint during the warm-up: the new master was in place
    before the fault was marked, and the check still sees the master move."""
    ev = clean()
    ev.fault_at = 3.6
    assert problems(ev) == []
    ev.faulted_master = 3  # a broker the controller never named master
    fires(ev, "the controller was never seen naming the faulted master 3")


def test_no_acknowledgement_after_the_fault_fires() -> None:
    ev = clean()
    ev.outcomes = [o for o in ev.outcomes if o.sent_at < FAULT_AT]
    ev.logs = {b: rows[:2] for b, rows in ev.logs.items()}
    ev.reads = ev.reads[:2]
    fires(ev, "no send begun after the fault was acknowledged")


def test_nothing_acknowledged_fires() -> None:
    ev = clean()
    for o in ev.outcomes:
        o.status = OutcomeStatus.UNKNOWN
    fires(ev, "nothing was acknowledged")


def test_changed_broker_ids_fire() -> None:
    ev = clean()
    ev.ids_after = {**IDS, "b2": 4}
    fires(ev, "broker ids changed")


def test_a_workload_thread_that_died_fires(tmp_path: Path) -> None:
    """The harness records what killed a workload thread, and the judge reports it."""
    run = h.ChaosRun(tmp_path, "threads")
    done = threading.Event()

    def producer() -> None:
        done.set()
        raise KeyError("an exception nobody expected")

    run._spawn(producer)
    done.wait(10)
    run.stop_load()
    assert len(run.ev.thread_errors) == 1 and "KeyError" in run.ev.thread_errors[0]
    ev = clean()
    ev.thread_errors = run.ev.thread_errors
    fires(ev, "a workload thread died: producer")


def test_only_a_refusal_before_storing_on_the_only_attempt_is_a_definite_failure() -> None:
    refused = SendError("send to chaos failed after 1 attempt(s): SERVICE_NOT_AVAILABLE fenced",
                        ResponseCode.SERVICE_NOT_AVAILABLE)
    assert h.error_outcome("v", refused, 1.0, 1.1).status is OutcomeStatus.FAILED
    retried = SendError("send to chaos failed after 3 attempt(s): TIMEOUT", None, "TIMEOUT")
    assert h.error_outcome("v", retried, 1.0, 1.1).status is OutcomeStatus.UNKNOWN
    assert h.error_outcome("v", retried, 1.0, 1.1).attempts == 3
    timed_out = RemotingTimeoutError("no answer in 2 s")
    assert h.error_outcome("v", timed_out, 1.0, 1.1).status is OutcomeStatus.UNKNOWN


# --- judges that must not pass on missing evidence ----------------------------------------


def test_a_tail_that_stalls_after_its_first_read_fires() -> None:
    ev = clean()
    ev.reads = ev.reads[:1]
    fires(ev, "the tailing group stalled: it read none of the 2 values acknowledged after the fault")


def test_a_stalled_tail_fires_in_a_run_without_a_fault_too() -> None:
    ev = clean()
    ev.fault_at, ev.expect_failover = None, False
    assert problems(ev) == []
    ev.reads = ev.reads[:2]
    fires(ev, "acknowledged in the second half of the run")


def test_a_run_with_no_probe_acknowledgement_fires() -> None:
    ev = clean()
    ev.probe_acks = []
    fires(ev, "no probe acknowledgement could be placed in a master's epoch")


def test_a_failover_check_with_no_faulted_master_fires() -> None:
    ev = clean()
    ev.faulted_master = None
    fires(ev, "the fault named no master it takes down")


def test_no_final_store_fires() -> None:
    ev = clean()
    ev.raw = {}
    fires(ev, "no final store was read")


def test_many_malformed_answers_are_summed_up() -> None:
    ev = clean()
    ev.monitor.malformed += [f"b1's status has no 'k{i}'" for i in range(5)]
    report = fires(ev, "... 5 malformed status answers in all")
    assert sum(p.startswith("malformed status: ") for p in report.problems) == 3
