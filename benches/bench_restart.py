"""Restart to serving, and anonymous memory, of a broker's store as its log grows.

A store of N GiB of 1 KiB messages (topic ``bench``, 8 queues, TAGS and KEYS on every
message, 1 GiB commitlog segments as the broker's default) is built once per size: the
commitlog written, then a first :class:`~rmqha.messaging.service.MessageService` start
that builds the consume queues and the message index from it, closed cleanly.  Each round
starts a new process that opens the store as a broker does (``CommitLog`` with the
broker's defaults, then ``MessageService``: consume-queue recovery, the state fold, the
message index) and serves: a pull's worth of entries from every queue's end (index read,
each entry checked against its record, the records read) and a lookup by key.  The
round's time is from the process's spawn (interpreter and imports included) to that
answer; the process then reports its ``RssAnon`` (``/proc/self/status``; ``Anonymous``
from ``smaps_rollup`` when that is missing): the mapped log and queue files are
file-backed pages and not part of it.

Cases (``extra_info["shutdown"]``): ``clean``, after a close; ``crash``, after a process
that appended 20 MiB more, let the index follow, and was SIGKILLed before anything was
checkpointed (so the restart re-dispatches from the checkpoint).  Targets: under 1 s to
serving and under 150 MB anonymous at every size (``extra_info["meets_targets"]``).

Sizes: ``RMQHA_BENCH_RESTART_GIB`` (comma separated, default ``0.25`` so ``make bench``
stays short; the full run is ``1,4,16``); stores live under ``RMQHA_BENCH_RESTART_DIR``
(default: pytest's temporary directory) and are reused while there.  Page cache: the
rounds run warm (the store was just written or read); a cold cache adds the disk reads of
the last segments (the commitlog CRC-checks ``verify_segments_on_open`` = 2 segments at
open), which this machine cannot drop.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from benches.conftest import describe

GIB = 1 << 30
SEGMENT = GIB
TOPIC = "bench"
QUEUES = 8
BODY = 1024 - 91 - len(TOPIC) - 40  # a record of about 1 KiB with its properties
BATCH = 256
ROUNDS = 5
TARGET_S = 1.0
TARGET_ANON_BYTES = 150 * 1000 * 1000
CRASH_APPEND_BYTES = 20 << 20


def _sizes() -> list[float]:
    raw = os.environ.get("RMQHA_BENCH_RESTART_GIB", "0.25")
    return [float(s) for s in raw.split(",") if s.strip()]


# --- the child processes --------------------------------------------------------------------


def _open(store: Path) -> tuple[Any, Any]:
    from rmqha.messaging.context import MessagingConfig
    from rmqha.messaging.service import MessageService
    from rmqha.store import CommitLog

    log = CommitLog(store / "commitlog", segment_bytes=SEGMENT, prefault=False)
    svc = MessageService(log, store_dir=store, config=MessagingConfig(), broker_name="bench",
                         broker_id=0, replication=None)
    return log, svc


def _append(log: Any, nbytes: int, first_batch: int) -> int:
    body = b"x" * BODY
    batch = first_batch
    end = log.max_offset + nbytes
    while log.max_offset < end:
        log.append_batch(TOPIC, [body] * BATCH, batch % QUEUES,
                         {"TAGS": "TagA", "KEYS": f"order-{batch}"}, wait_flush=False)
        batch += 1
    return batch


def _anon_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    with open("/proc/self/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status nor Anonymous in smaps_rollup")


def child_generate(store: Path, gib: float) -> None:
    from rmqha.store import CommitLog

    log = CommitLog(store / "commitlog", segment_bytes=SEGMENT, prefault=False)
    _append(log, int(gib * GIB), 0)
    log.close()
    log, svc = _open(store)  # the first start: consume queues and message index built
    svc.close()
    log.close()


def child_crash(store: Path) -> None:
    log, svc = _open(store)
    first = int(log.max_offset // (BATCH * 1024))
    _append(log, CRASH_APPEND_BYTES, first)
    svc.on_confirm_offset(log.max_offset)
    log.flush()  # the log is durable; the queues' checkpoint is not past the new records
    os.kill(os.getpid(), signal.SIGKILL)


def child_serve(store: Path, spawned_at: float) -> None:
    opened_at = time.time()
    log, svc = _open(store)
    service_at = time.time()
    served = 0
    for qid in range(QUEUES):
        q = svc.index.queue(TOPIC, qid)
        phys, sizes, _tags = q.slice(max(q.min_offset, q.max_offset - 32), 32)
        served += sum(len(log.read(p, s)) for p, s in zip(phys, sizes))
    found = svc._lookup.find(TOPIC, "order-1", max_num=1)
    serving_at = time.time()
    report = {
        "restart_s": serving_at - spawned_at,
        "imports_s": opened_at - spawned_at,
        "open_s": service_at - opened_at,
        "serve_s": serving_at - service_at,
        "rss_anon_bytes": _anon_bytes(),
        "served_bytes": served,
        "found": len(found),
        "log_bytes": log.max_offset - log.min_offset,
        "commitlog_walked_from": log.recovery_start,
        "redispatched_records": svc.index.dispatched,
        "queue_checkpoint": svc.index.last_recovery.checkpoint,
    }
    print(json.dumps(report), flush=True)
    svc.close()
    log.close()


# --- the benchmark ----------------------------------------------------------------------------


def _child(*args: str) -> list[str]:
    return [sys.executable, __file__, *args]


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # An installed broker imports cached bytecode: so do the children (out of the tree).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX",
                   str(Path(tempfile.gettempdir()) / "rmqha-bench-restart-pycache"))
    return env


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[float, Path]:
    base = os.environ.get("RMQHA_BENCH_RESTART_DIR")
    root = Path(base) if base else tmp_path_factory.mktemp("restart")
    out = {}
    for gib in _sizes():
        store = root / f"store-{gib:g}g"
        if not (store / "consumequeue" / "checkpoint").exists():
            store.mkdir(parents=True, exist_ok=True)
            subprocess.run(_child("generate", str(store), str(gib)), env=_env(), check=True)
        out[gib] = store
    return out


@pytest.mark.benchmark(group="restart-to-serving")
@pytest.mark.parametrize("shutdown", ["clean", "crash"])
@pytest.mark.parametrize("gib", _sizes())
def test_restart_to_serving(benchmark, stores: dict[float, Path], gib: float,
                            shutdown: str) -> None:
    store = stores[gib]
    reports: list[dict[str, Any]] = []
    serving: list[subprocess.Popen[str]] = []

    def finish() -> None:
        while serving:
            assert serving.pop().wait(timeout=600) == 0

    def setup() -> None:
        finish()  # the previous round's process closes the store (untimed)
        if shutdown == "crash":
            done = subprocess.run(_child("crash", str(store)), env=_env())
            assert done.returncode == -signal.SIGKILL, done

    def restart() -> None:
        """Timed: spawn to the first answer (the process reports it on its stdout)."""
        spawned = time.time()
        proc = subprocess.Popen(_child("serve", str(store), repr(spawned)), env=_env(),
                                stdout=subprocess.PIPE, text=True)
        serving.append(proc)
        reports.append(json.loads(proc.stdout.readline()))  # type: ignore[union-attr]

    benchmark.pedantic(restart, setup=setup, rounds=ROUNDS, iterations=1)
    finish()
    last = reports[-1]
    restart_s = max(r["restart_s"] for r in reports)
    anon = max(r["rss_anon_bytes"] for r in reports)
    describe(benchmark, "cython", message_bytes=1024, store_gib=gib, shutdown=shutdown)
    benchmark.extra_info.update({
        "restart_s_max": restart_s, "restart_s_min": min(r["restart_s"] for r in reports),
        "imports_s": last["imports_s"], "open_s": last["open_s"], "serve_s": last["serve_s"],
        "rss_anon_bytes_max": anon, "log_bytes": last["log_bytes"],
        "redispatched_records": last["redispatched_records"],
        "commitlog_walked_from": last["commitlog_walked_from"],
        "meets_targets": restart_s < TARGET_S and anon < TARGET_ANON_BYTES,
    })
    assert last["served_bytes"] > 0 and last["found"] == 1
    if shutdown == "clean":
        assert last["redispatched_records"] == 0


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    if mode == "generate":
        child_generate(where, float(sys.argv[3]))
    elif mode == "crash":
        child_crash(where)
    elif mode == "serve":
        child_serve(where, float(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: generate, crash or serve")
