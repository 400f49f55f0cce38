"""The run and the table of ``bench_peers.py --jvm-peers``: rmqha beside real Apache RocketMQ 5
and Apache Kafka 4, one client against one system per row (``peers/driven.py``).

Workloads, all three-copy, 1 KiB: one at a time (3,000), batches of 32 (9,600 messages),
a window of 256 single sends (40,000), read back from the start (20,000); every workload runs
on every row before the next starts (round robin), then the failovers, one row after
another (each heals the group first).  ``--quick`` multiplies the counts by
:data:`QUICK_SCALE` (at least 32 each) and starts every JVM with the tests' heaps: it
proves the harness end to end in a few minutes and gives no figures worth writing down.

Each row is set against a baseline row with the same client where there is one (RocketMQ's
Java remoting client and the Python ``rocketmq`` 0.4.4 drive rmqha and RocketMQ alike) and
against rmqha with the nearest client where there is not (Kafka's Java client against
rmqha with the Java remoting client; ``confluent-kafka`` against rmqha's own Python
client): a cell's ``×`` is the baseline's msg/s over the row's (failover: the row's time
over the baseline's), so above 1 means rmqha is ahead.
"""
from __future__ import annotations

import importlib.util
import math
import shutil
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

from peers.base import Measurement, run_workload
from peers.driven import DRIVEN, Clusters, DrivenSystem, RmqhaTarget, make_driven, rmqha_failover
from peers.jvm import BENCH_HEAPS, KAFKA_VERSION, ROCKETMQ_VERSION, TEST_HEAPS, Heap, JarsMissing, classpath
from peers.rmqha_system import RmqhaSystem

BEGIN, END = "<!-- jvm-peers-table:begin -->", "<!-- jvm-peers-table:end -->"
SYSTEMS = DRIVEN
QUICK_SCALE = 0.02
#: (workload, messages at scale 1, parameter)
WORKLOADS = (("one at a time", 3000, 1), ("batch of 32", 32 * 300, 32),
             ("window of 256", 40_000, 256), ("read back", 20_000, 0))
#: Files of a run worth keeping (configs, stdout, the servers' own logs), not stores.
KEPT = ("*.conf", "*.properties", "*.out", "*.log", "*.err")


def parse_systems(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip() and s.strip() != "none"]
    unknown = [n for n in names if n not in DRIVEN]
    if unknown:
        raise SystemExit(f"unknown --jvm-systems {', '.join(unknown)}; known: {', '.join(DRIVEN)}")
    return names


def check_ready(systems: list[str]) -> None:
    """SystemExit before any server starts when jars or a client library are missing."""
    try:
        for module in ("rocketmq", "kafka", "driver"):
            classpath(module)
    except JarsMissing as exc:
        raise SystemExit(str(exc)) from None
    if shutil.which("java") is None:
        raise SystemExit("--jvm-peers needs java (17) on PATH")
    needs = {"rocketmq": any("py044" in s for s in systems),
             "confluent_kafka": any("confluent" in s for s in systems)}
    for module, needed in needs.items():
        if needed and importlib.util.find_spec(module) is None:
            raise SystemExit(f"--jvm-peers needs the {module} module: pip install -e '.[dev,peers]'")


def _n(x: int, scale: float) -> int:
    return max(32, int(x * scale))


def _native(system: RmqhaSystem, workload: str, n: int, param: int, body: bytes) -> Measurement:
    """rmqha's own Python client, timed in this process as in the peer table."""
    if workload == "one at a time":
        return run_workload(system, workload, 3, n, lambda: system.one_at_a_time(3, n, body))
    if workload == "batch of 32":
        return run_workload(system, workload, 3, n, lambda: system.batches(3, n // param, param, body))
    if workload == "window of 256":
        return run_workload(system, workload, 3, n, lambda: system.window(3, n, param, body))
    got: dict[str, int] = {}

    def read() -> None:
        got["n"] = system.read_back(3, n)
    m = run_workload(system, workload, 3, n, read)
    m.messages = got["n"]
    return m


def run(workdir: Path, systems: list[str], scale: float, body: bytes, *, quick: bool = False,
        failover: bool = True, keep_logs: Path | None = None,
        log: Callable[[str], None] = print) -> str:
    """Start everything, run every workload round robin, then the failovers; the table."""
    heaps = TEST_HEAPS if quick else BENCH_HEAPS
    rmqha = RmqhaSystem(copies=(3,))
    clusters = Clusters(workdir, heaps, rmqha)
    driven: dict[str, DrivenSystem] = {}
    results: dict[str, dict[str, Measurement]] = {}
    failovers: dict[str, str] = {}
    try:
        log("starting rmqha ...")
        rmqha.start_on_free_ports(workdir / "rmqha")
        driven = make_driven(systems, clusters, heaps["client"])
        for name, system in driven.items():
            log(f"starting {name} ({system.target.system}) ...")
            system.start(workdir / "drivers" / name)
        for workload, count, param in WORKLOADS:
            n = _n(count, scale)
            for name in ["rmqha", *driven]:
                try:
                    m = (_native(rmqha, workload, n, param, body) if name == "rmqha"
                         else driven[name].measure(workload, n, param, len(body)))
                except Exception as exc:  # noqa: BLE001 - one row failing keeps the table
                    traceback.print_exc()
                    m = Measurement(name, workload, 3, 0, 0.0, 0.0, note=f"failed: {type(exc).__name__}")
                results.setdefault(name, {})[workload] = m
                log(f"{workload:>14} {name:>17}: {_fmt(m.msg_per_s)} msg/s p50 {_fmt(m.p50_ms, 3)} ms "
                    f"client {_fmt(m.cpu_us_per_msg, 1)} µs/msg {m.note}")
        if failover:
            failovers = _failovers(rmqha, clusters, driven, body, log)
    finally:
        for system in driven.values():
            _quietly(system.stop)
        _quietly(clusters.stop)
        _quietly(rmqha.stop)
        if keep_logs is not None:
            keep(workdir, keep_logs)
            log(f"configs and logs kept in {keep_logs}")
    return table(results, failovers, driven, heaps, quick)


def _failovers(rmqha: RmqhaSystem, clusters: Clusters, driven: dict[str, DrivenSystem], body: bytes,
               log: Callable[[str], None]) -> dict[str, str]:
    out: dict[str, str] = {}
    runs: list[tuple[str, Callable[[], float | None], float]] = [
        ("rmqha", lambda: rmqha_failover(rmqha, RmqhaTarget(clusters), body), 60.0)]
    runs += [(name, partial(s.failover, body), s.failover_deadline_s) for name, s in driven.items()]
    for name, fn, deadline in runs:
        try:
            seconds = fn()
            out[name] = (f"{seconds:.2f}" if seconds is not None
                         else f"none acked within {deadline:g} s")
        except Exception as exc:  # noqa: BLE001 - one row failing keeps the table
            traceback.print_exc()
            out[name] = f"failed: {type(exc).__name__}"
        log(f"failover {name}: {out[name]}")
    return out


def _quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - stop the others anyway
        traceback.print_exc()


def keep(workdir: Path, dest: Path) -> None:
    """Copy the run's configs and logs (not stores) to ``dest``."""
    for pattern in KEPT:
        for path in workdir.rglob(pattern):
            if path.is_file() and "store" not in path.relative_to(workdir).parts:
                target = dest / path.relative_to(workdir)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)


def _fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def _cell(m: Measurement | None, base: Measurement | None) -> str:
    if m is None:
        return "n/a"
    if m.note:
        return m.note
    text = f"{_fmt(m.msg_per_s)} ({_fmt(m.p50_ms, 2)}, {_fmt(m.cpu_us_per_msg)})"
    if base is not None and not base.note and m.msg_per_s and base is not m:
        text += f" {base.msg_per_s / m.msg_per_s:.2f}×"
    return text


def _failover_cell(value: str | None, base: str | None) -> str:
    if value is None:
        return "n/a"
    try:
        ratio = f" {float(value) / float(base):.2f}×" if base is not None and float(base) > 0 else ""
    except ValueError:
        ratio = ""
    return value + ratio


def heaps_text(system: str, heaps: dict[str, Heap]) -> str:
    if system.startswith("rmqha"):
        return "Python processes (no heap limit)"
    if system.startswith("rocketmq"):
        return f"name server + controller {heaps['namesrv']}, 3 brokers {heaps['broker']} each"
    return f"3 nodes {heaps['kafka']} each"


def table(results: dict[str, dict[str, Measurement]], failovers: dict[str, str],
          driven: dict[str, DrivenSystem], heaps: dict[str, Heap], quick: bool) -> str:
    workloads = [w for w, _, _ in WORKLOADS]
    head = ("| system | client: how it publishes | heaps | "
            + " | ".join(f"{w} msg/s (p50 ms, client µs/msg) ×" for w in workloads)
            + " | failover s (SIGKILL of the master / leader → first acked send) × |")
    lines = [head, "|" + "---|" * (3 + len(workloads) + 1)]
    rows = [("rmqha", "rmqha", "rmqha's Python client: BlockingProducer.send / send_batch(32) / "
             "Producer.send ×256 / Consumer.poll", "rmqha")]
    rows += [(name, s.target.system, f"{s.client.label}: {s.client.publishes}", s.baseline)
             for name, s in driven.items()]
    for name, system, client, baseline in rows:
        by_w, base = results.get(name, {}), results.get(baseline, {})
        cells = [f"`{name}`: {system}" + (f" (× vs `{baseline}`)" if baseline != name else ""), client,
                 heaps_text(name, heaps) + (f"; client JVM {heaps['client']}" if "java" in name else "")]
        cells += [_cell(by_w.get(w), base.get(w) if baseline != name else None) for w in workloads]
        cells.append(_failover_cell(failovers.get(name),
                                    failovers.get(baseline) if baseline != name else None))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        "× = the baseline row's msg/s ÷ this row's (failover: this row's seconds ÷ the baseline's): "
        "above 1, rmqha is ahead.",
        f"- **RocketMQ {ROCKETMQ_VERSION}**: controller mode, name server with the controller embedded "
        "(DLedger, one node), three brokers, allAckInSyncStateSet=true (the SYNC_MASTER answers once "
        "every broker of the SyncStateSet holds the message), minInSyncReplicas=1, ASYNC_FLUSH, "
        "waitTimeMillsInSendQueue=1000 (default 200: sends refused as \"broker busy\" under load).",
        f"- **Kafka {KAFKA_VERSION}**: KRaft, three combined broker/controller nodes, one partition "
        "replicated three times, acks=all (answered once every in-sync replica has it), "
        "min.insync.replicas 3 or 2 (both three copies while all are up; with 3 nothing is acked "
        "with a node down), no flush per record.",
        "- **rmqha**: all_ack_in_sync_state_set, flush = async, one controller (as the RocketMQ row).",
        "- **rocketmq 0.4.4's batch on RocketMQ 5**: the C++ 1.2 client sends SEND_BATCH_MESSAGE "
        "without the header's `batch` field and 5.x decides on that field, so RocketMQ stores each "
        "batch of 32 as one message (32 KiB body, one message read back); rmqha stores 32.",
    ]
    if quick:
        notes.append("- **quick mode** (`--quick`): a few hundred messages per workload and the tests' "
                     "heaps: proves the harness, not a measurement.")
    return "\n".join(lines + notes)
