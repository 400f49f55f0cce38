"""rmqha side by side with NATS JetStream, Redis and RabbitMQ, each a real 3-node group here.
``--proxy`` adds rmqha through ``rmqha proxy`` with RocketMQ 5's official Python client
(``rmqha-proxy``, its own cluster as rmqha's); that client lives in the proxy's venv, so
run this with ``.venv-rmq5/bin/python`` then (the peers' clients go there too if wanted:
``pip install -e '.[peers]'``).


``make bench-peers`` installs what is missing and runs this; by hand::

    .venv/bin/python benches/bench_peers.py [--systems rmqha,nats,redis,rabbitmq]
        [--scale 1.0] [--write-into docs/benchmarks.md] [--flush-sync] [--[no-]security]
        [--[no-]jvm-peers] [--jvm-systems ...] [--quick] [--keep-logs DIR]

Every workload runs on every system before the next workload starts (round robin), so
machine noise hits all of them alike.  1 KiB bodies; "copies" is how many servers hold a
message when it is acked (3: the replicated destination, 1: a single-copy one).  The
table goes to stdout and, with ``--write-into FILE``, between the ``peers-table`` markers
of that Markdown file (``docs/benchmarks.md``).  Every server this starts is stopped at the
end, also on errors and Ctrl-C.

``--jvm-peers`` (on in ``make bench-peers``) then runs rmqha beside real Apache RocketMQ 5
(controller mode, three brokers) and Apache Kafka 4 (KRaft, three nodes), each row one
client against one system, the same client for rmqha and RocketMQ in a row
(``peers/driven.py``; jars from ``peers/maven``, ``make peers-jars``), into the
``jvm-peers-table`` markers; ``--jvm-systems`` picks the rows, ``--quick`` runs every
workload at a few hundred messages with small heaps (proves the harness; not numbers).

``--security`` then measures what rmqha's security costs (``peers/security_cost.py``): the
3-copy produce workloads with mutual TLS and ACL signatures on, beside the same cluster
with them off, and one master kill on each, into the ``security-table`` markers.
``make bench-peers`` runs both tables; ``PEERS_ARGS="--systems none"`` only the security
one, ``PEERS_ARGS="--no-security"`` only the peers.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import jvm_table, security_cost  # noqa: E402
from peers.base import MESSAGE_BYTES, Measurement, NotOffered, PeerSystem, run_workload  # noqa: E402

BEGIN, END = "<!-- peers-table:begin -->", "<!-- peers-table:end -->"
AUTO_WINDOW = "window of 256, rmqha auto_batch"


def make_system(name: str, flush_sync: bool) -> PeerSystem:
    if name == "rmqha":
        from peers.rmqha_system import RmqhaSystem
        return RmqhaSystem(flush_sync=flush_sync)
    if name == "nats":
        from peers.nats_system import NatsSystem
        return NatsSystem()
    if name == "redis":
        from peers.redis_system import RedisSystem
        return RedisSystem()
    if name == "rabbitmq":
        from peers.rabbitmq_system import RabbitSystem
        return RabbitSystem()
    if name == "rmqha-proxy":
        from peers.proxy_system import ProxySystem
        return ProxySystem()
    raise SystemExit(f"unknown system {name!r}")


def workloads(scale: float, flush_sync: bool) -> list[tuple[str, object, int, int]]:
    """(name, copies, messages, parameter)."""
    def n(x: int) -> int:
        return max(32, int(x * scale))
    out: list[tuple[str, object, int, int]] = []
    for copies in (3, 1):
        out += [("one at a time", copies, n(3000), 1),
                ("batch of 32", copies, n(32 * 300), 32),
                ("window of 256", copies, n(40_000), 256)]
        if copies == 3:
            # The same 256 concurrent single sends with rmqha's Producer(auto_batch=True);
            # the peers run their plain window again (their clients have no such mode).
            out.append((AUTO_WINDOW, copies, n(40_000), 256))
    if flush_sync:
        out.append(("one at a time", "sync", n(3000), 1))
    out.append(("read back", 3, n(20_000), 0))
    return out


def run_one(system: PeerSystem, name: str, copies: object, messages: int, param: int,
            body: bytes) -> Measurement:
    if name == "one at a time":
        return run_workload(system, name, copies, messages,  # type: ignore[arg-type]
                            lambda: system.one_at_a_time(copies, messages, body))  # type: ignore[arg-type]
    if name == "batch of 32":
        return run_workload(system, name, copies, messages,  # type: ignore[arg-type]
                            lambda: system.batches(copies, messages // param, param, body))  # type: ignore[arg-type]
    if name == "window of 256":
        return run_workload(system, name, copies, messages,  # type: ignore[arg-type]
                            lambda: system.window(copies, messages, param, body))  # type: ignore[arg-type]
    if name == AUTO_WINDOW:
        if system.name == "rmqha":
            return run_workload(system, name, copies, messages,  # type: ignore[arg-type]
                                lambda: system.window(copies, messages, param, body,  # type: ignore[call-arg]
                                                      auto_batch=True))
        return run_workload(system, name, copies, messages,  # type: ignore[arg-type]
                            lambda: system.window(copies, messages, param, body))  # type: ignore[arg-type]
    if name == "read back":
        got: dict[str, int] = {}

        def read() -> None:
            got["n"] = system.read_back(copies, messages)  # type: ignore[arg-type]
        m = run_workload(system, name, copies, messages, read)  # type: ignore[arg-type]
        m.messages = got["n"]
        return m
    raise ValueError(name)


def fmt(x: float, digits: int = 0) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def table(results: dict[tuple[str, object], dict[str, Measurement]], failovers: dict[str, float | None],
          systems: list[str]) -> str:
    peers = [s for s in systems if s != "rmqha"]
    head = "| workload | copies | rmqha msg/s (p50 ms, client µs/msg) | " + " | ".join(
        f"{p} msg/s (p50 ms) | rmqha ÷ {p}" for p in peers) + " |"
    lines = [head, "|" + "---|" * (2 + 1 + 2 * len(peers))]
    for (workload, copies), by_sys in results.items():
        r = by_sys.get("rmqha")
        cells = [workload, "3, flush = sync" if copies == "sync" else str(copies)]
        cells.append("n/a" if r is None else
                     f"{fmt(r.msg_per_s)} ({fmt(r.p50_ms, 2)}, {fmt(r.cpu_us_per_msg)})")
        for p in peers:
            m = by_sys.get(p)
            if m is None:
                cells += [m.note if m else "n/a", "n/a"]
                continue
            if m.note:
                cells += [m.note, "n/a"]
                continue
            cells.append(f"{fmt(m.msg_per_s)} ({fmt(m.p50_ms, 2)})")
            cells.append(f"{r.msg_per_s / m.msg_per_s:.2f}x" if r and m.msg_per_s else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    f_cells = ["failover (s, SIGKILL of the leader to the next acked send)", "3"]
    fr = failovers.get("rmqha")
    f_cells.append(fmt(fr, 2) if fr is not None else "n/a")
    for p in peers:
        fp = failovers.get(p)
        f_cells += [fmt(fp, 2) if fp is not None else "no automatic failover", "n/a"]
    lines.append("| " + " | ".join(f_cells) + " |")
    return "\n".join(lines)


def semantics(instances: dict[str, PeerSystem]) -> str:
    return "\n".join(f"- **{s.name}**: ack: {s.ack_semantics}; fsync: {s.fsync_semantics}"
                     for s in instances.values())


def check_markers(path: Path, begin: str = BEGIN, end: str = END) -> str:
    """The text of ``path``; SystemExit unless it has both markers (checked before a run
    too, so a long run never ends with nowhere to write)."""
    doc = path.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} has no {begin} ... {end} markers")
    return doc


def write_table(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace what stands between the ``begin`` and ``end`` markers of ``path`` with ``text``."""
    doc = check_markers(path, begin, end)
    before, rest = doc.split(begin, 1)
    _, after = rest.split(end, 1)
    path.write_text(f"{before}{begin}\n{text}\n{end}{after}")


def compare_peers(args: argparse.Namespace, names: list[str], body: bytes) -> None:
    """The peer table: every workload on every system, round robin."""
    instances: dict[str, PeerSystem] = {}
    results: dict[tuple[str, object], dict[str, Measurement]] = {}
    failovers: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        try:
            for name in names:
                system = make_system(name, args.flush_sync)
                instances[name] = system
                print(f"starting {name} ...", flush=True)
                system.start_on_free_ports(Path(tmp) / name)
            for workload, copies, messages, param in workloads(args.scale, args.flush_sync):
                for name, system in instances.items():
                    if copies == "sync" and name != "rmqha":
                        continue
                    try:
                        m = run_one(system, workload, copies, messages, param, body)
                    except NotOffered as exc:
                        m = Measurement(name, workload, copies, 0, 0.0, 0.0,  # type: ignore[arg-type]
                                        note=str(exc))
                    except Exception as exc:  # noqa: BLE001 - one peer failing keeps the table
                        traceback.print_exc()
                        m = Measurement(name, workload, copies, 0, 0.0, 0.0,  # type: ignore[arg-type]
                                        note=f"failed: {type(exc).__name__}")
                    results.setdefault((workload, copies), {})[name] = m
                    print(f"{workload:>14} copies={copies} {name:>9}: {fmt(m.msg_per_s):>9} msg/s "
                          f"p50 {fmt(m.p50_ms, 3)} ms p99 {fmt(m.p99_ms, 3)} ms "
                          f"client {fmt(m.cpu_us_per_msg, 1)} µs/msg {m.note}", flush=True)
            if not args.no_failover:
                for name, system in instances.items():
                    try:
                        failovers[name] = system.failover(body)
                    except Exception:  # noqa: BLE001
                        traceback.print_exc()
                        failovers[name] = None
                    print(f"failover {name}: {failovers[name]}", flush=True)
        finally:
            for system in instances.values():
                try:
                    system.stop()
                except Exception:  # noqa: BLE001 - stop the others anyway
                    traceback.print_exc()
    text = table(results, failovers, names) + "\n\n" + semantics(instances)
    print(text)
    if args.write_into:
        write_table(args.write_into, text)


def compare_jvm_peers(args: argparse.Namespace, body: bytes) -> None:
    """rmqha beside RocketMQ 5 and Kafka, one client per row (the jvm-peers table)."""
    with tempfile.TemporaryDirectory(prefix="bench-jvm-peers-") as tmp:
        text = jvm_table.run(Path(tmp), jvm_table.parse_systems(args.jvm_systems), args.scale,
                             body, quick=args.quick, failover=not args.no_failover,
                             keep_logs=args.keep_logs,
                             log=lambda line: print(line, flush=True))
    print(text)
    if args.write_into:
        write_table(args.write_into, text, jvm_table.BEGIN, jvm_table.END)


def compare_security(args: argparse.Namespace, body: bytes) -> None:
    """The security table: rmqha's produce workloads with TLS and ACL on and off."""
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        results, failover = security_cost.measure(Path(tmp), args.scale, body, args.security_rounds,
                                                  log=lambda line: print(line, flush=True))
    text = security_cost.table(results, args.scale, args.security_rounds, failover)
    print(text)
    if args.write_into:
        write_table(args.write_into, text, security_cost.BEGIN, security_cost.END)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="rmqha,nats,redis,rabbitmq",
                    help="systems of the peer table, or 'none' to skip it")
    ap.add_argument("--scale", type=float, default=None, help="multiply message counts (1.0)")
    ap.add_argument("--write-into", type=Path, metavar="FILE",
                    help="write the tables between their markers of this Markdown file")
    ap.add_argument("--flush-sync", action="store_true",
                    help="also measure rmqha with flush = sync (one at a time)")
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--proxy", action="store_true",
                    help="also rmqha through `rmqha proxy` with RocketMQ 5's Python client "
                         "(run with .venv-rmq5/bin/python)")
    ap.add_argument("--jvm-peers", action=argparse.BooleanOptionalAction, default=False,
                    help="also rmqha beside real RocketMQ 5 and Kafka, one client per row "
                         "(make bench-peers: on; jars: make peers-jars)")
    ap.add_argument("--jvm-systems", default=",".join(jvm_table.SYSTEMS),
                    help="rows of --jvm-peers (rmqha, its native client, is always run)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes and small heaps: proves the harness, gives no figures "
                         "(sets --scale 0.02 unless given, and one security round)")
    ap.add_argument("--keep-logs", type=Path, metavar="DIR",
                    help="copy the JVM peers' configs and logs here at the end")
    ap.add_argument("--security", action=argparse.BooleanOptionalAction, default=False,
                    help="also measure rmqha's produce workloads and failover with TLS + ACL "
                         "on vs off (make bench-peers: on)")
    ap.add_argument("--security-rounds", type=int, default=security_cost.ROUNDS,
                    help="rounds per workload of --security (the side going first alternates)")
    args = ap.parse_args(argv)
    if args.scale is None:
        args.scale = jvm_table.QUICK_SCALE if args.quick else 1.0
    if args.quick:
        args.security_rounds = 1
    names = [s.strip() for s in args.systems.split(",") if s.strip() and s.strip() != "none"]
    if args.proxy and "rmqha-proxy" not in names:
        names.append("rmqha-proxy")
    if "rmqha-proxy" in names:
        from peers.proxy_system import client_module
        client_module()  # before any server starts: without the client, stop here
    if not names and not args.security and not args.jvm_peers:
        raise SystemExit("nothing to run: --systems none without --security or --jvm-peers")
    if args.security_rounds < 1:
        raise SystemExit(f"--security-rounds {args.security_rounds}: at least 1")
    if args.write_into:
        if names:
            check_markers(args.write_into)
        if args.security:
            check_markers(args.write_into, security_cost.BEGIN, security_cost.END)
        if args.jvm_peers:
            check_markers(args.write_into, jvm_table.BEGIN, jvm_table.END)
    if args.jvm_peers:
        jvm_table.check_ready(jvm_table.parse_systems(args.jvm_systems))  # before any server starts
    body = os.urandom(MESSAGE_BYTES // 2).hex().encode()
    if names:
        compare_peers(args, names, body)
    if args.jvm_peers:
        compare_jvm_peers(args, body)
    if args.security:
        compare_security(args, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
