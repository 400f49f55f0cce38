"""The cost of rmqha's security: the produce workloads with TLS and ACL on, beside off.

Two rmqha clusters of the same shape run at once (a controller, a name server and the
three-broker group ``broker-a``, ``all_ack_in_sync_state_set``): one plain, one with its
security on as ``deploy/`` has it (:mod:`rmqha.testing.secure_setup`: every port mutual TLS,
``enforcing``, certificates from ``rmqha certs dev-cluster``; brokers with ``aclEnable``;
the producer signs every request as an account with PUB on the topic).  Each workload
runs first unmeasured on both sides (a tenth of a round: connections, routes and
caches warm), then in ``rounds`` rounds, off then on in even rounds and on then off in
odd ones, so neither side always comes second; a side's figures are the sum of its rounds.

The table says throughput and p50 with security on over off, and the p50 added, against
the targets: at most 15% of the throughput lost for batches, at most 0.05 ms added to
the p50 of one message at a time.  Last, each side's master is killed once (the peer
table's failover: from the kill to the first send acknowledged by the new master's whole
SyncStateSet), against the target that failover is unchanged: at most
:data:`MAX_FAILOVER_ADDED_S` slower with security on (a new master's TLS handshakes, the
client's and its slave's, are on that path).
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peers.base import Measurement, run_workload
from peers.rmqha_system import CLUSTER, TOPICS, RmqhaSystem
from rmqha.testing.secure_setup import Account, SecureSetup

BEGIN, END = "<!-- security-table:begin -->", "<!-- security-table:end -->"
COPIES = 3
ROUNDS = 2
MAX_THROUGHPUT_COST = 0.15
MAX_P50_ADDED_MS = 0.05
#: The benchmark's producer account: PUB on the topic, nothing else.
PRODUCER_KEY = "bench-producer"
#: "Failover unchanged": the kill-to-ack time with security on at most this much longer.
MAX_FAILOVER_ADDED_S = 0.05


@dataclass(frozen=True)
class Failover:
    """Seconds from a master's kill to the first acknowledged send, off and on (None: none
    was acknowledged in time)."""

    off_s: float | None
    on_s: float | None


@dataclass(frozen=True)
class Workload:
    name: str
    messages: int
    #: Messages per batch, or sends in flight.
    param: int
    target: str


WORKLOADS = [
    Workload("one at a time", 3000, 1, "p50"),
    Workload("batch of 32", 32 * 300, 32, "throughput"),
    Workload("window of 256", 40_000, 256, ""),
]


def per_round(w: Workload, scale: float, rounds: int) -> int:
    """Messages each side sends in one round: at least two batches or windows' worth."""
    n = max(2 * w.param, int(w.messages * scale) // rounds)
    return n - n % w.param


def run_side(system: RmqhaSystem, w: Workload, n: int, body: bytes) -> Measurement:
    calls: dict[str, Callable[[], object]] = {
        "one at a time": lambda: system.one_at_a_time(COPIES, n, body),
        "batch of 32": lambda: system.batches(COPIES, n // w.param, w.param, body),
        "window of 256": lambda: system.timed_window(COPIES, n, w.param, body),
    }
    return run_workload(system, w.name, COPIES, n, calls[w.name])


def secure_setup(directory: Path) -> SecureSetup:
    """Certificates for the secured cluster's processes and its accounts: the admin (the
    harness creates topics with it) and the producer's, PUB on the benchmark's topic only."""
    return SecureSetup.make(directory, cluster=CLUSTER, groups={"broker-a": 3},
                            app=Account.new(PRODUCER_KEY, topics={TOPICS[COPIES]: "PUB"}),
                            admin_key="bench-admin")


def merged(parts: list[Measurement]) -> Measurement:
    first = parts[0]
    out = Measurement(first.system, first.workload, first.copies, 0, 0.0, 0.0)
    for m in parts:
        out.messages += m.messages
        out.elapsed_s += m.elapsed_s
        out.client_cpu_s += m.client_cpu_s
        out.latencies_s += m.latencies_s
    return out


def measure(workdir: Path, scale: float, body: bytes, rounds: int = ROUNDS,
            log: Callable[[str], None] = print
            ) -> tuple[dict[str, tuple[Measurement, Measurement]], Failover]:
    """(off, on) per workload, then one failover per side (it kills the master, so it goes
    last); every process started here is stopped before returning."""
    setup = secure_setup(workdir / "secure-files")
    off, on = RmqhaSystem(copies=(COPIES,)), RmqhaSystem(security=setup, copies=(COPIES,))
    results: dict[str, tuple[Measurement, Measurement]] = {}
    try:
        for name, system in (("off", off), ("on", on)):
            log(f"starting rmqha with security {name} ...")
            system.start(workdir / f"security-{name}")
        for w in WORKLOADS:
            results[w.name] = _rounds(off, on, w, per_round(w, scale, rounds), rounds, body, log)
        failover = Failover(off.failover(body), on.failover(body))
        log(f"failover: off {failover.off_s} s, on {failover.on_s} s")
    finally:
        for system in (off, on):
            system.stop()
    return results, failover


def _rounds(off: RmqhaSystem, on: RmqhaSystem, w: Workload, n: int, rounds: int,
            body: bytes, log: Callable[[str], None]) -> tuple[Measurement, Measurement]:
    warm_up = max(2 * w.param, n // 10 - n // 10 % w.param)
    for system in (off, on):
        run_side(system, w, warm_up, body)
    parts: dict[str, list[Measurement]] = {"off": [], "on": []}
    for r in range(rounds):
        order = [("off", off), ("on", on)] if r % 2 == 0 else [("on", on), ("off", off)]
        for side, system in order:
            m = run_side(system, w, n, body)
            parts[side].append(m)
            log(f"{w.name:>14} round {r} security {side:>3}: {m.msg_per_s:>9,.0f} msg/s "
                f"p50 {m.p50_ms:.3f} ms")
    return merged(parts["off"]), merged(parts["on"])


def _verdict(w: Workload, off: Measurement, on: Measurement) -> str:
    if w.target == "throughput":
        cost = 1 - on.msg_per_s / off.msg_per_s if off.msg_per_s else math.nan
        ok = cost <= MAX_THROUGHPUT_COST
        return (f"≤ {MAX_THROUGHPUT_COST:.0%} throughput cost: "
                f"{'met' if ok else 'missed'} (cost {cost:+.1%})")
    if w.target == "p50":
        added = on.p50_ms - off.p50_ms
        ok = added <= MAX_P50_ADDED_MS
        return f"≤ {MAX_P50_ADDED_MS} ms added to p50: {'met' if ok else 'missed'} ({added:+.3f} ms)"
    return "none (reported)"


def _ratio(a: float, b: float) -> str:
    return "n/a" if not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}x"


def _failover_row(f: Failover) -> str:
    if f.off_s is None or f.on_s is None:
        return f"| failover | {f.off_s} s | {f.on_s} s | | | | unchanged: not measured |"
    added = f.on_s - f.off_s
    ok = added <= MAX_FAILOVER_ADDED_S
    return (f"| failover | {f.off_s:.3f} s | {f.on_s:.3f} s | | {f.on_s / f.off_s:.2f}x | "
            f"{added * 1000:+.0f} ms | unchanged (≤ {MAX_FAILOVER_ADDED_S * 1000:.0f} ms added): "
            f"{'met' if ok else 'missed'} |")


def table(results: dict[str, tuple[Measurement, Measurement]], scale: float, rounds: int,
          failover: Failover | None = None) -> str:
    lines = ["| workload (3 copies) | off: msg/s (p50 ms) | on: msg/s (p50 ms) | "
             "throughput on ÷ off | p50 on ÷ off | p50 added (ms) | target |",
             "|---|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        if w.name not in results:
            continue
        off, on = results[w.name]
        lines.append(" | ".join([
            f"| {w.name}", f"{off.msg_per_s:,.0f} ({off.p50_ms:.3f})",
            f"{on.msg_per_s:,.0f} ({on.p50_ms:.3f})", _ratio(on.msg_per_s, off.msg_per_s),
            _ratio(on.p50_ms, off.p50_ms), f"{on.p50_ms - off.p50_ms:+.3f}",
            _verdict(w, off, on)]) + " |")
    if failover is not None:
        lines.append(_failover_row(failover))
    sent = ", ".join(f"{name} {off.messages:,}" for name, (off, _) in results.items())
    lines += ["", f"Measured {dt.date.today().isoformat()} with `--security --scale {scale:g}`: "
              f"{rounds} rounds (off/on alternating first); messages per side: {sent}; "
              "p50 is per message (one at a time, window) or per batch; "
              "failover is one master kill per side, the time to the first acknowledged send "
              "(in its p50 columns). "
              "On: mutual TLS (`enforcing`, `need.client.auth = require`) on every port and "
              "link, brokers with `aclEnable`, the producer signing as an account with PUB "
              "on the topic. Off: the same cluster without them."]
    return "\n".join(lines)
