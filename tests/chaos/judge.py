"""What a chaos run records, and the pure functions that judge it.

The harness (:mod:`harness`) runs a cluster under load and a fault and records what an
outside observer can see: each send's outcome as its client saw it (when it was sent and
answered, and for a SEND_OK the commitlog offset it names), every record the tailing
consumer read, what every broker and the controller reported at each sample (with the
client-side times of the request and of the answer), every probe acknowledgement (its send
and receive times) and, after the run, the final stores.  Nothing here talks to a process:
each checker is a function of recorded :class:`Evidence`, so each one is also fed synthetic
evidence that must make it fire (tests/chaos/test_judge.py, the negative controls).

All times are this test process's ``time.monotonic()``; no broker's clock is trusted.
"""
from __future__ import annotations

import bisect
import enum
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class OutcomeStatus(enum.Enum):
    #: SEND_OK: the record must survive.
    ACKED = "acked"
    #: Stored or not, nobody knows (a timeout, an unconfirmed status, retried refusals).
    UNKNOWN = "unknown"
    #: Definitely not stored: refused before storing, on the send's only attempt.
    FAILED = "failed"


@dataclass
class Outcome:
    value: str
    status: OutcomeStatus
    attempts: int = 1
    sent_at: float = 0.0
    done_at: float = 0.0
    #: The commitlog offset a SEND_OK names (its offsetMsgId), else None.
    offset: int | None = None
    #: The store host a SEND_OK names (its offsetMsgId): the acknowledging broker's address.
    store: str | None = None


@dataclass(frozen=True)
class Read:
    """One record the tailing consumer was handed (every read is kept, re-reads too)."""

    value: str
    queue_id: int
    queue_offset: int


@dataclass(frozen=True)
class StoredRecord:
    """One record of the checked topic in a final store."""

    value: str
    queue_id: int
    queue_offset: int
    offset: int
    size: int


@dataclass(frozen=True)
class BrokerSample:
    """What one broker process answered to GET_BROKER_HA_STATUS; the answer describes an
    instant between ``t0`` (request sent) and ``t1`` (answer received)."""

    broker: str
    pid: int
    t0: float
    t1: float
    role: str
    epoch: int
    accepting: bool
    max_offset: int


@dataclass(frozen=True)
class ControllerSample:
    """The controller leader's GET_REPLICA_INFO of the group, between ``t0`` and ``t1``."""

    t0: float
    t1: float
    master_id: int | None
    epoch: int
    sync_state_set: tuple[int, ...]


@dataclass(frozen=True)
class ProbeAck:
    """A probe sent straight to one broker process and answered SEND_OK: the broker
    acknowledged at some instant between ``sent_at`` and ``acked_at``."""

    broker: str
    pid: int
    sent_at: float
    acked_at: float


@dataclass
class MonitorLog:
    """How sampling went, per source (a broker's name or "controller")."""

    ok: Counter[str] = field(default_factory=Counter)
    #: Transport failures (a frozen, dead or cut process): expected during faults, counted.
    errors: Counter[str] = field(default_factory=Counter)
    #: Answers that lack a key or hold the wrong type: never expected, each one a problem.
    malformed: list[str] = field(default_factory=list)


class MalformedStatus(ValueError):
    """A status answer lacks a key the checkers read, or holds the wrong type there."""


@dataclass
class Evidence:
    scenario: str
    #: min_in_sync_replicas of the run: copies an acknowledged record must have had.
    need: int
    brokers: list[str]
    #: Every address a broker had (a broker restarted on a new port has two) -> its name.
    addresses: dict[str, str] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    tail_errors: list[str] = field(default_factory=list)
    broker_samples: list[BrokerSample] = field(default_factory=list)
    controller_samples: list[ControllerSample] = field(default_factory=list)
    probe_acks: list[ProbeAck] = field(default_factory=list)
    monitor: MonitorLog = field(default_factory=MonitorLog)
    #: Tracebacks of workload threads that died of an exception nobody expected.
    thread_errors: list[str] = field(default_factory=list)
    ids_before: dict[str, int | None] = field(default_factory=dict)
    ids_after: dict[str, int | None] = field(default_factory=dict)
    #: broker -> its final store's records of the checked topic, in log order.
    logs: dict[str, list[StoredRecord]] = field(default_factory=dict)
    #: broker -> its final commitlog bytes.
    raw: dict[str, bytes] = field(default_factory=dict)
    #: When the (last) fault took effect, None without one.
    fault_at: float | None = None
    #: The fault moves the master: a newer epoch with another master must follow it.
    expect_failover: bool = False
    #: Broker id of the master the fault took down (set by the fault).
    faulted_master: int | None = None
    #: The producers were idempotent: then no value may be stored twice, retried or not.
    idempotent: bool = False


@dataclass
class Report:
    scenario: str
    sent: int = 0
    acked: int = 0
    unknown: int = 0
    failed: int = 0
    lost: int = 0
    duplicates: int = 0
    bad_duplicates: int = 0
    phantoms: int = 0
    #: Acknowledged records that fewer than min_in_sync_replicas replicas held at ack time.
    uncovered: int = 0
    failover_s: float | None = None
    #: From the fault to the first acknowledgement by a master of a newer epoch.
    new_master_ack_s: float | None = None
    #: Longest time two brokers both acknowledged writes (0 = never at once).
    ack_overlap_s: float = 0.0
    #: Samples of a broker accepting writes in an older epoch after another had in a newer.
    two_writer_samples: int = 0
    samples: int = 0
    sample_errors: int = 0
    problems: list[str] = field(default_factory=list)
    evidence: Evidence | None = field(default=None, repr=False, compare=False)

    def row(self) -> str:
        fo = "-" if self.failover_s is None else f"{self.failover_s:.2f}"
        nm = "-" if self.new_master_ack_s is None else f"{self.new_master_ack_s:.2f}"
        return (f"| {self.scenario} | {self.sent} | {self.acked} | {self.unknown} | {self.lost} | "
                f"{self.duplicates} | {fo} | {nm} | {self.ack_overlap_s:.3f} / {self.two_writer_samples} | "
                f"{self.samples} / {self.sample_errors} | "
                f"{'ok' if not self.problems else '; '.join(self.problems)} |")


TABLE_HEAD = ("| scenario | sent | acked | unknown | lost | duplicates | failover s | new master ack s "
              "| two ackers s / samples | status samples / errors | checks |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")


# --- parsing answers strictly (a renamed key must not read as a default) -----------------


def _key(answer: Mapping[str, Any], key: str, kind: type, source: str) -> Any:
    if key not in answer:
        raise MalformedStatus(f"{source}'s status has no {key!r} (keys: {sorted(answer)})")
    value = answer[key]
    if kind is int and isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)  # remoting ext fields are strings
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedStatus(f"{source}'s status {key!r} is {value!r}, not {kind.__name__}")
    return value


def parse_broker_status(broker: str, pid: int, t0: float, t1: float, status: Any) -> BrokerSample:
    """A sample from a GET_BROKER_HA_STATUS body; MalformedStatus if a key is missing."""
    if not isinstance(status, Mapping):
        raise MalformedStatus(f"{broker}'s status is {type(status).__name__}, not a JSON object")
    return BrokerSample(broker, pid, t0, t1, _key(status, "role", str, broker),
                        _key(status, "masterEpoch", int, broker),
                        _key(status, "acceptingWrites", bool, broker),
                        _key(status, "maxOffset", int, broker))


def parse_replica_info(t0: float, t1: float, ext: Mapping[str, Any], body: Any) -> ControllerSample:
    """A sample from GET_REPLICA_INFO (ext fields and JSON body); no master is an absent or
    empty masterBrokerId, anything else missing is MalformedStatus."""
    epoch = _key(ext, "masterEpoch", int, "controller")
    master = ext.get("masterBrokerId")
    master_id = None if master in (None, "", "null") else _key(ext, "masterBrokerId", int, "controller")
    if not isinstance(body, Mapping):
        raise MalformedStatus(f"controller's replica info body is {body!r}, not a JSON object")
    members = _key(body, "syncStateSet", list, "controller")
    return ControllerSample(t0, t1, master_id, epoch, tuple(sorted(int(m) for m in members)))


# --- the checkers: each a function of evidence, returning the problems it found ----------


def longest_log(logs: Mapping[str, list[StoredRecord]]) -> list[StoredRecord]:
    return max(logs.values(), key=len) if logs else []


def check_prefix(raw: Mapping[str, bytes]) -> list[str]:
    """Every replica's bytes are a prefix of the longest replica's."""
    if not raw:
        return ["no final store was read"]
    longest = max(raw.values(), key=len)
    return [f"{name}'s log is not a prefix of the longest replica"
            for name, data in raw.items() if longest[:len(data)] != data]


def check_loss(outcomes: Iterable[Outcome], final: list[StoredRecord]) -> list[str]:
    """Acknowledged values missing from the final log (one problem per value)."""
    stored = {rec.value for rec in final}
    return [o.value for o in outcomes if o.status is OutcomeStatus.ACKED and o.value not in stored]


def check_stored_values(outcomes: list[Outcome], final: list[StoredRecord], report: Report) -> list[str]:
    """Nothing stored that was never sent or that definitely failed; a value stored twice
    only if its send was retried or its outcome is unknown."""
    sent = {o.value: o for o in outcomes}
    counts = Counter(rec.value for rec in final)
    problems = []
    report.phantoms = sum(1 for v in counts if v not in sent)
    report.duplicates = sum(n - 1 for n in counts.values() if n > 1)
    report.bad_duplicates = sum(1 for v, n in counts.items() if n > 1 and v in sent
                                and sent[v].status is OutcomeStatus.ACKED and sent[v].attempts == 1)
    stored_failures = [v for v in counts if v in sent and sent[v].status is OutcomeStatus.FAILED]
    if report.phantoms:
        problems.append(f"{report.phantoms} stored values never sent")
    if report.bad_duplicates:
        problems.append(f"{report.bad_duplicates} values stored twice though sent once and acked")
    if stored_failures:
        problems.append(f"{len(stored_failures)} values stored though their send definitely failed "
                        f"(e.g. {stored_failures[0]})")
    return problems


def check_no_duplicates(report: Report, idempotent: bool) -> list[str]:
    """With idempotent producers a retried send is answered with its original's result,
    so nothing is stored twice (``report.duplicates``, from :func:`check_stored_values`,
    counts every extra copy in the final log, retried or not)."""
    if idempotent and report.duplicates:
        return [f"{report.duplicates} values stored twice though the producers were idempotent"]
    return []


def check_tail(reads: list[Read], tail_errors: list[str], final: list[StoredRecord],
               outcomes: Iterable[Outcome] = (), fault_at: float | None = None) -> list[str]:
    """Every read holds what the final log holds at that queue offset (a read of a record
    later truncated does not), none of the final log's records below the furthest read
    offset of a queue was skipped, and the tail kept reading: it read a value whose send
    began after the fault (or, with no fault, in the second half of the sends), so a tail
    that stalled after its first reads cannot pass on the evidence it left."""
    problems = list(tail_errors[:1])
    if not reads:
        return [*problems, "the tailing group read nothing"]
    problems += _check_tail_kept_up(reads, list(outcomes), fault_at)
    at = {(rec.queue_id, rec.queue_offset): rec.value for rec in final}
    wrong = [x for x in reads if at.get((x.queue_id, x.queue_offset)) != x.value]
    if wrong:
        problems.append(f"tailing group read {len(wrong)} records the final log does not hold there "
                        f"(e.g. {wrong[0].value!r} at queue {wrong[0].queue_id} offset {wrong[0].queue_offset})")
    furthest: dict[int, int] = defaultdict(lambda: -1)
    for x in reads:
        furthest[x.queue_id] = max(furthest[x.queue_id], x.queue_offset)
    seen = {(x.queue_id, x.queue_offset) for x in reads}
    skipped = sorted(k for k in at if k[1] <= furthest[k[0]] and k not in seen)
    if skipped:
        problems.append(f"tailing group skipped {len(skipped)} stored records "
                        f"(e.g. queue {skipped[0][0]} offset {skipped[0][1]})")
    return problems


def _check_tail_kept_up(reads: list[Read], outcomes: list[Outcome], fault_at: float | None) -> list[str]:
    acked = [o for o in outcomes if o.status is OutcomeStatus.ACKED]
    if not acked:
        return []  # nothing to have read (check_progress reports a run that acknowledged nothing)
    if fault_at is None:
        starts = sorted(o.sent_at for o in acked)
        anchor, when = starts[len(starts) // 2], "in the second half of the run"
    else:
        anchor, when = fault_at, "after the fault"
    late = {o.value for o in acked if o.sent_at >= anchor}
    if late and late.isdisjoint(x.value for x in reads):
        return [f"the tailing group stalled: it read none of the {len(late)} values acknowledged {when}"]
    return []


def check_one_master_per_epoch(broker_samples: Iterable[BrokerSample],
                               controller_samples: Iterable[ControllerSample]) -> list[str]:
    """At most one broker claims master in an epoch, and the controller names one."""
    claimed: dict[int, set[str]] = defaultdict(set)
    for s in broker_samples:
        if s.role == "master":
            claimed[s.epoch].add(s.broker)
    named: dict[int, set[int]] = defaultdict(set)
    for c in controller_samples:
        if c.master_id is not None:
            named[c.epoch].add(c.master_id)
    return ([f"brokers {sorted(n)} all claimed master at epoch {e}" for e, n in sorted(claimed.items()) if len(n) > 1]
            + [f"controller named masters {sorted(m)} at epoch {e}" for e, m in sorted(named.items()) if len(m) > 1])


def count_stale_writer_samples(broker_samples: Iterable[BrokerSample]) -> int:
    """Samples of a broker accepting writes in an epoch after another broker's answer had
    shown it accepting them in a newer one (the answer came back before the stale one's
    request left: a definite order, whatever the sampling interval)."""
    accepting = [s for s in broker_samples if s.accepting]
    # (epoch, broker) -> when the first answer showing it accepting came back.
    first_seen: dict[tuple[int, str], float] = {}
    for s in accepting:
        key = (s.epoch, s.broker)
        first_seen[key] = min(first_seen.get(key, s.t1), s.t1)
    return sum(1 for s in accepting
               if any(e > s.epoch and b != s.broker and t < s.t0 for (e, b), t in first_seen.items()))


class Timeline:
    """One broker's samples in order (its sampler asks again only after an answer)."""

    def __init__(self, samples: Iterable[BrokerSample]) -> None:
        self.samples = sorted(samples, key=lambda s: s.t0)
        self._t0 = [s.t0 for s in self.samples]
        self._t1 = [s.t1 for s in self.samples]

    def last_answered_by(self, t: float) -> BrokerSample | None:
        i = bisect.bisect_right(self._t1, t)
        return self.samples[i - 1] if i else None

    def first_asked_from(self, t: float) -> BrokerSample | None:
        i = bisect.bisect_left(self._t0, t)
        return self.samples[i] if i < len(self.samples) else None

    def bracket(self, start: float, end: float) -> tuple[BrokerSample, BrokerSample] | None:
        """The last sample answered before ``start`` and the first asked after ``end``, if
        both are of one process (no restart in between)."""
        before, after = self.last_answered_by(start), self.first_asked_from(end)
        if before is None or after is None or before.pid != after.pid:
            return None
        return before, after


def timelines(samples: Iterable[BrokerSample]) -> dict[str, Timeline]:
    per: dict[str, list[BrokerSample]] = defaultdict(list)
    for s in samples:
        per[s.broker].append(s)
    return {name: Timeline(rows) for name, rows in per.items()}


def check_coverage(outcomes: Iterable[Outcome], broker_samples: Iterable[BrokerSample],
                   final: list[StoredRecord], brokers: list[str], need: int,
                   addresses: Mapping[str, str]) -> tuple[int, list[str]]:
    """Every acknowledged record was held by ``need`` replicas when it was acknowledged.

    Soundness.  An ack of the record at commitlog offset ``o`` (size ``n``, read from the
    final store, where byte-identical replicas put it at the same offset; 1 if the final
    store lost it, as holding it takes more than ``o`` bytes anyway) was given at some
    instant before its client got it, at ``done_at``.  A replica is *proven behind* at that
    instant when its first sample asked at or after ``done_at`` shows ``maxOffset < o + n``
    and its last sample answered before the send (``sent_at``) came from the same process:
    within one process the log end only drops below an acknowledged record when the group
    cuts that record (a loss, which :func:`check_loss` reports: an uncovered ack in a run
    that lost acknowledged records may be one of those losses seen again), so it was
    behind at the ack as well.  The acknowledging broker (the store host the SEND_OK
    names) is never counted behind: it appended the record before acknowledging it.  Every
    replica not proven behind is counted as holding the record, so sampling can only miss
    a violation (a replica that caught up between the ack and its next sample), never
    invent one: the sampling interval (and a replica frozen or cut off, which answers no
    sample) costs sensitivity, not soundness.  The ack is uncovered when fewer than
    ``need`` replicas remain.
    """
    where = {rec.offset: rec for rec in final}
    lines = timelines(broker_samples)
    uncovered: list[tuple[Outcome, list[str]]] = []
    for o in outcomes:
        if o.status is not OutcomeStatus.ACKED or o.offset is None:
            continue
        rec = where.get(o.offset)
        # A record the final store lacks there (lost) still began at o: holding it needs
        # more than o bytes, in the one offset space the replicas copy bytes into.
        end = o.offset + (rec.size if rec is not None and rec.value == o.value else 1)
        acker = addresses.get(o.store or "")
        behind = [b for b in brokers
                  if b != acker and b in lines and (br := lines[b].bracket(o.sent_at, o.done_at)) is not None
                  and br[1].max_offset < end]
        if len(brokers) - len(behind) < need:
            uncovered.append((o, behind))
    if not uncovered:
        return 0, []
    o, behind = uncovered[0]
    return len(uncovered), [
        f"{len(uncovered)} acknowledged records held by fewer than {need} replicas when acknowledged "
        f"(e.g. {o.value} at offset {o.offset}: {', '.join(behind)} behind it at the ack)"]


@dataclass(frozen=True)
class AckWindow:
    """When a broker acknowledged probes as master of one epoch, as the probes saw it: it
    acknowledged no later than ``first_acked`` and no earlier than ``last_sent``."""

    broker: str
    epoch: int
    first_acked: float
    last_sent: float


def ack_windows(probe_acks: Iterable[ProbeAck], broker_samples: Iterable[BrokerSample]) -> list[AckWindow]:
    """Probe acks grouped by broker and epoch.  An ack is given the epoch its broker
    claimed as master both in its last sample answered before the probe was sent and in
    its first sample asked after the answer came back (one process, epochs only grow, so
    the ack was given in that epoch); an ack without such a bracket is left out."""
    lines = timelines(broker_samples)
    spans: dict[tuple[str, int], list[float]] = {}
    for a in probe_acks:
        br = lines[a.broker].bracket(a.sent_at, a.acked_at) if a.broker in lines else None
        if br is None or br[0].pid != a.pid:
            continue
        before, after = br
        if before.role != "master" or after.role != "master" or before.epoch != after.epoch:
            continue
        span = spans.setdefault((a.broker, before.epoch), [a.acked_at, a.sent_at])
        span[0], span[1] = min(span[0], a.acked_at), max(span[1], a.sent_at)
    return [AckWindow(b, e, first, last) for (b, e), (first, last) in spans.items()]


def check_ack_windows(windows: list[AckWindow], fault_at: float | None,
                      report: Report) -> list[str]:
    """An older epoch's acknowledgements end before a newer epoch's begin on another broker.

    Sound from the client side alone: the newer master acknowledged no later than its
    ``first_acked``, the older one no earlier than its ``last_sent``, so ``last_sent >
    first_acked`` proves both acknowledged at once for at least the difference."""
    for old in windows:
        for new in windows:
            if old.broker != new.broker and old.epoch < new.epoch and old.last_sent > new.first_acked:
                report.ack_overlap_s = max(report.ack_overlap_s, old.last_sent - new.first_acked)
    if fault_at is not None:
        before = [w.epoch for w in windows if w.first_acked <= fault_at]
        later = [w.first_acked for w in windows if before and w.epoch > max(before)]
        if later:
            report.new_master_ack_s = min(later) - fault_at
    if not windows:
        # No evidence is not a pass: the overlap check above compared nothing.
        return ["no probe acknowledgement could be placed in a master's epoch: two writers could not be checked"]
    if report.ack_overlap_s > 0:
        return [f"two brokers acknowledged writes at once for {report.ack_overlap_s:.3f}s"]
    return []


def check_monitor(monitor: MonitorLog, brokers: list[str]) -> list[str]:
    """Malformed answers are problems; so is a source that never answered a sample."""
    problems = [f"malformed status: {m}" for m in dict.fromkeys(monitor.malformed)][:3]
    if len(set(monitor.malformed)) > 3:
        problems.append(f"... {len(monitor.malformed)} malformed status answers in all")
    for source in [*brokers, "controller"]:
        if monitor.ok[source] == 0:
            problems.append(f"no successful status sample of {source} "
                            f"({monitor.errors[source]} failed)")
    return problems


def check_progress(ev: Evidence, report: Report) -> list[str]:
    """Something was acknowledged, acknowledgements went on after the fault, and a fault
    that moves the master was followed by a newer epoch with another master."""
    if report.acked == 0:
        return ["nothing was acknowledged"]
    if ev.fault_at is None:
        return []
    problems = []
    if not any(o.status is OutcomeStatus.ACKED and o.sent_at >= ev.fault_at for o in ev.outcomes):
        problems.append("no send begun after the fault was acknowledged")
    if ev.expect_failover:
        problems.extend(_check_failover(ev.controller_samples, ev.faulted_master))
    return problems


def _check_failover(samples: list[ControllerSample], faulted: int | None) -> list[str]:
    """After the controller last named the faulted master, it named another one in a newer
    epoch (a crash at a failpoint may come before the fault is marked, so the faulted
    master, not the time of the mark, anchors the check)."""
    if faulted is None:
        return ["the fault named no master it takes down: a failover cannot be shown"]
    named = [c for c in samples if c.master_id == faulted]
    if not named:
        return [f"the controller was never seen naming the faulted master {faulted}"]
    last = max(named, key=lambda c: c.t1)
    if not any(c.t0 >= last.t1 and c.epoch > last.epoch and c.master_id not in (None, faulted) for c in samples):
        return [f"no failover: the controller never named a master other than {faulted} "
                f"in an epoch after {last.epoch}"]
    return []


def check_ids(before: Mapping[str, int | None], after: Mapping[str, int | None]) -> list[str]:
    return [] if dict(before) == dict(after) else [f"broker ids changed: {dict(before)} -> {dict(after)}"]


def check_threads(thread_errors: list[str]) -> list[str]:
    return [f"a workload thread died: {e}" for e in thread_errors[:3]]


def judge(ev: Evidence) -> Report:
    """Every checker over one run's evidence."""
    r = Report(ev.scenario, evidence=ev)
    r.sent = len(ev.outcomes)
    r.acked = sum(1 for o in ev.outcomes if o.status is OutcomeStatus.ACKED)
    r.failed = sum(1 for o in ev.outcomes if o.status is OutcomeStatus.FAILED)
    r.unknown = r.sent - r.acked - r.failed
    r.samples = sum(ev.monitor.ok.values())
    r.sample_errors = sum(ev.monitor.errors.values()) + len(ev.monitor.malformed)
    final = longest_log(ev.logs)
    lost = check_loss(ev.outcomes, final)
    r.lost = len(lost)
    if lost:
        r.problems.append(f"{r.lost} acknowledged values lost (e.g. {lost[0]})")
    r.problems += check_prefix(ev.raw)
    r.problems += check_stored_values(ev.outcomes, final, r)
    r.problems += check_no_duplicates(r, ev.idempotent)
    r.uncovered, problems = check_coverage(ev.outcomes, ev.broker_samples, final, ev.brokers, ev.need,
                                           ev.addresses)
    r.problems += problems
    r.problems += check_tail(ev.reads, ev.tail_errors, final, ev.outcomes, ev.fault_at)
    r.problems += check_one_master_per_epoch(ev.broker_samples, ev.controller_samples)
    r.two_writer_samples = count_stale_writer_samples(ev.broker_samples)
    if r.two_writer_samples:
        r.problems.append(f"{r.two_writer_samples} samples found a broker accepting writes in an "
                          f"older epoch after another accepted them in a newer one")
    r.problems += check_ack_windows(ack_windows(ev.probe_acks, ev.broker_samples), ev.fault_at, r)
    r.problems += check_monitor(ev.monitor, ev.brokers)
    r.problems += check_progress(ev, r)
    r.problems += check_ids(ev.ids_before, ev.ids_after)
    r.problems += check_threads(ev.thread_errors)
    if ev.fault_at is not None:
        acked_after = [o.done_at for o in ev.outcomes
                       if o.status is OutcomeStatus.ACKED and o.done_at >= ev.fault_at]
        r.failover_s = min(acked_after) - ev.fault_at if acked_after else None
    return r
