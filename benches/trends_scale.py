"""The trends command at scale: wall time, CPU time and peak memory of ``rmqha-trends
trends`` end to end on synthetic histories (``make bench-trends``).

For each size (default 2,000 and 20,000 runs x 200 benchmarks; ``synthetic.bench_spec``:
3% noise, 1% spikes, 20% slowdowns in the last thousand runs) it generates the history once
(kept under ``--work``; 563 MB of JSON per 2,000 runs), then times three commands, each a
fresh process as a user or CI runs it:

* ``first``: nothing ingested yet (parse every file, build the table, analyse, report);
* ``rerun``: the same command again, nothing new (the tables and report are reused);
* ``one-more-run``: one new run file added (CI's everyday case: ingest one file, analyse
  the whole history again, report).

Peak memory is the high-water mark of the *summed* resident memory of the whole process
tree (the Python driver, the Spark driver JVM with the executors of local mode, every
Python worker), sampled every 50 ms from /proc; the sum of each process's own peak
(VmHWM, an upper bound: they need not peak at once) is printed too. CPU is user + system
time of the tree (reaped children included). Linux only (/proc).

The machine's load is printed with each line: on a shared machine, wall times say little
and CPU times more. ``--master spark://host:port`` runs the commands on a cluster (then the
executors run under the cluster's workers and are not in the measured tree).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from spark_bench import synthetic  # noqa: E402 - after the path set-up above


@dataclass
class Measured:
    wall_s: float
    code: int
    peak_tree_rss_mib: float
    sum_of_peaks_mib: float
    cpu_s: float
    output: str


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")  # its own utime + stime


def _tree(root: int) -> list[int]:
    kids, out, frontier = _children(), [], [root]
    while frontier:
        pid = frontier.pop()
        out.append(pid)
        frontier.extend(kids.get(pid, []))
    return out


#: Seconds between the progress notes of a running command.
NOTE_EVERY_S = 60.0


def measure(cmd: list[str], env: dict[str, str]) -> Measured:
    """Run ``cmd`` and poll its process tree until it exits."""
    started, before = time.perf_counter(), os.times()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    peak_sum = 0.0
    hwm: dict[int, int] = {}
    cpu: dict[int, float] = {}
    chunks: list[str] = []
    stream = proc.stdout
    assert stream is not None  # stdout=PIPE
    reader = threading.Thread(target=lambda: chunks.append(stream.read()), daemon=True)
    reader.start()
    next_note = started + NOTE_EVERY_S
    while proc.poll() is None:
        pids = _tree(proc.pid)
        now_sum = sum(_status_kib(p, "VmRSS:") for p in pids) / 1024.0
        peak_sum = max(peak_sum, now_sum)
        if time.perf_counter() >= next_note:  # a long run shows it is alive, and its memory
            next_note += NOTE_EVERY_S
            print(f"    ... {time.perf_counter() - started:.0f} s: {len(pids)} processes, RSS "
                  f"{now_sum:.0f} MiB (peak {peak_sum:.0f}), CPU {sum(cpu.values()):.0f} s",
                  flush=True)
        for p in pids:
            hwm[p] = max(hwm.get(p, 0), _status_kib(p, "VmHWM:"))
            cpu[p] = max(cpu.get(p, 0.0), _cpu_s(p))
        time.sleep(0.05)  # sampling period of the memory poll
    reader.join(timeout=30)
    wall = time.perf_counter() - started
    # Reaped descendants' CPU reaches us through the root's wait; a process that exited
    # unreaped is only in the last poll: the larger of the two.
    after = os.times()
    reaped = (after.children_user + after.children_system
              - before.children_user - before.children_system)
    total_cpu = max(reaped, sum(cpu.values()))
    return Measured(wall, proc.returncode, peak_sum, sum(hwm.values()) / 1024.0, total_cpu,
                    "".join(chunks))


def _history(work: str, runs: int, benchmarks: int) -> str:
    path = os.path.join(work, f"history-{runs}x{benchmarks}")
    done = os.path.join(path, ".complete")
    if not os.path.exists(done):
        started = time.perf_counter()
        print(f"generating {runs} x {benchmarks} into {path} ...", flush=True)
        synthetic.write_history(synthetic.bench_spec(runs, benchmarks), path)
        with open(done, "w", encoding="ascii") as fh:
            fh.write("ok\n")
        print(f"  generated in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def _line(label: str, m: Measured) -> str:
    gate = {0: "passed", 1: "failed", 2: "no data"}.get(m.code, f"exit {m.code}")
    return (f"{label:>28}: {m.wall_s:7.1f} s wall, {m.cpu_s:7.1f} CPU-s, peak RSS of the tree "
            f"{m.peak_tree_rss_mib:6.0f} MiB (sum of per-process peaks {m.sum_of_peaks_mib:6.0f} "
            f"MiB), gate {gate}, load {os.getloadavg()[0]:.1f}")


def run_size(args: argparse.Namespace, runs: int) -> None:
    history = _history(args.work, runs, args.benchmarks)
    out = os.path.join(args.work, f"out-{runs}x{args.benchmarks}")
    shutil.rmtree(out, ignore_errors=True)
    extra = os.path.join(args.work, f"extra-{runs}x{args.benchmarks}")
    shutil.rmtree(extra, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    base = [sys.executable, "-m", "spark_bench", "trends", "--out", out, "--fail-on-regression",
            "--master", args.master, *args.trends_args]
    steps = [("first", [history]), ("rerun", [history])]
    if not args.no_one_more:
        steps.append(("one-more-run", [history, extra]))
    for label, paths in steps:
        if label == "one-more-run":
            grown = dataclasses.replace(synthetic.bench_spec(runs, args.benchmarks), runs=runs + 1)
            synthetic.write_history(grown, extra, first=runs)
        m = measure([*base, "--history", *paths], env)
        print(_line(f"{runs} x {args.benchmarks} {label}", m), flush=True)
        if args.verbose or m.code not in (0, 1):
            print(m.output)
        else:
            for text in m.output.splitlines():
                if text.startswith(("ingest:", "trends:", "report:", "resources:")):
                    print(f"{'':>30}{text}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, action="append", help="history length (repeatable; "
                   "default 2000 and 20000)")
    p.add_argument("--benchmarks", type=int, default=200)
    p.add_argument("--work", default=os.path.join(ROOT, "reports", "bench-trends"),
                   help="where histories (kept between runs) and outputs go")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--no-one-more", action="store_true", help="skip the one-more-run step")
    p.add_argument("--verbose", action="store_true", help="print each command's output")
    p.add_argument("trends_args", nargs="*", help="more `rmqha-trends trends` arguments (after --)")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    for runs in args.runs or [2000, 20000]:
        run_size(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
