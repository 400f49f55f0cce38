"""CPU per message of every process of a 3-copy group under a window of 256 plain sends.

The peer bench's window (``peers/rmqha_system.py``: real controller, name server and three
brokers on loopback, ``all_ack_in_sync_state_set``, 1 KiB bodies, the asyncio ``Producer``
with 256 sends in flight) timed by each process's own CPU clock (``/proc/<pid>/stat``),
so the master's and slaves' shares per message show apart from the client's.  By hand::

    .venv/bin/python benches/bench_window_cpu.py [--n 20000] [--window 256] [--rounds 3]
        [--profile DIR] [--strace] [--slave-lane on|off]

``--profile DIR`` profiles the last round inside each broker (cProfile, the hook in
``window_cpu/sitecustomize.py``; ``DIR/<pid>.prof`` and a summary printed); ``--strace``
counts the brokers' system calls per message in the last round (strace slows them: its
round's speed means nothing).  Speed is reported, never asserted; the machine may be shared.
"""
from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers.base import MESSAGE_BYTES  # noqa: E402
from peers.rmqha_system import RmqhaSystem  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> tuple[float, float]:
    """(user + system, system) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[12]) / TICK


def processes(system: RmqhaSystem) -> dict[str, int]:
    """Role name -> pid of the group's brokers (master first)."""
    c = system.cluster
    assert c is not None
    master = c.master_of("broker-a")
    assert master is not None and master.pid is not None
    out = {"master": master.pid}
    slaves = [b for b in c.brokers if b is not master and b.pid is not None]
    for i, b in enumerate(slaves):
        out[f"slave{i + 1}"] = b.pid  # type: ignore[assignment]
    return out


def one_round(system: RmqhaSystem, pids: dict[str, int], n: int, window: int,
              body: bytes) -> dict[str, float]:
    before = {k: cpu_s(p) for k, p in pids.items()}
    client0, t0 = time.process_time(), time.perf_counter()
    system.window(3, n, window, body)
    wall = time.perf_counter() - t0
    out: dict[str, float] = {}
    for k, p in pids.items():
        total, system_s = cpu_s(p)
        out[k] = (total - before[k][0]) / n * 1e6
        out[f"{k}.sys"] = (system_s - before[k][1]) / n * 1e6
    out["client"] = (time.process_time() - client0) / n * 1e6
    out["msg/s"] = n / wall
    return out


def show(label: str, row: dict[str, float]) -> None:
    cells = "  ".join(f"{k} {v:7.1f}" if k != "msg/s" else f"{k} {v:8.0f}"
                      for k, v in row.items())
    print(f"{label:>8}: {cells}   (µs CPU per message)", flush=True)


def strace_round(system: RmqhaSystem, pids: dict[str, int], n: int, window: int,
                 body: bytes, workdir: Path) -> None:
    tracers = {k: subprocess.Popen(["strace", "-c", "-f", "-o", str(workdir / f"{k}.strace"),
                                    "-p", str(p)], stderr=subprocess.DEVNULL)
               for k, p in pids.items()}
    time.sleep(1.0)  # attached
    system.window(3, n, window, body)
    for t in tracers.values():
        t.send_signal(signal.SIGINT)
        t.wait(30)
    for k in tracers:
        print(f"--- {k}: system calls per message")
        for line in (workdir / f"{k}.strace").read_text().splitlines()[2:]:
            parts = line.split()
            if len(parts) >= 5 and parts[3].isdigit():
                print(f"    {parts[-1]:16} {int(parts[3]) / n:6.2f}")


def profile_round(system: RmqhaSystem, pids: dict[str, int], n: int, window: int,
                  body: bytes, prof_dir: Path) -> None:
    for p in pids.values():
        os.kill(p, signal.SIGUSR1)
    time.sleep(0.5)
    system.window(3, n, window, body)
    for p in pids.values():
        os.kill(p, signal.SIGUSR2)
    time.sleep(2.0)
    for k, p in pids.items():
        path = prof_dir / f"{p}.prof"
        print(f"--- {k} ({path}): calls per message, top by own time")
        stats = pstats.Stats(str(path))
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]  # type: ignore[attr-defined]
        for (file, line, fn), (_cc, nc, tt, ct, _) in rows:
            print(f"    {nc / n:7.3f} calls {tt / n * 1e6:6.2f} µs own {ct / n * 1e6:7.2f} cum  "
                  f"{Path(file).name}:{line} {fn}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--slave-lane", choices=("on", "off"), default="on",
                    help="the slaves' compiled receive lane (ha_slave_compiled_lane), to compare")
    args = ap.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["RMQHA_PROFILE_DIR"] = str(args.profile.resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(HERE / "window_cpu"), os.environ.get("PYTHONPATH", "")])
    body = b"x" * MESSAGE_BYTES
    with tempfile.TemporaryDirectory(prefix="window-cpu-") as tmp:
        system = RmqhaSystem(copies=(3,), broker_config={"ha_slave_compiled_lane": args.slave_lane == "on"})
        try:
            system.start(Path(tmp))
            pids = processes(system)
            system.window(3, 2000, args.window, body)  # warm-up
            for r in range(args.rounds):
                show(f"round {r + 1}", one_round(system, pids, args.n, args.window, body))
            if args.profile is not None:
                profile_round(system, pids, args.n, args.window, body, args.profile)
            if args.strace:
                strace_round(system, pids, args.n, args.window, body, Path(tmp))
        finally:
            system.stop()


if __name__ == "__main__":
    main()
