"""``rmqha demo``: the storage demo (append, close, reopen, verify) for both twins.

Appends ``--messages`` 1 KiB messages (default one million) to a commitlog in a temporary
directory (or ``--dir``) in batches, with a progress bar on stderr, closes it, reopens it
(recovery scans and validates the tail), reads every record back and checks its body,
topic, queue and queue offset, and prints records/s and MB/s for each twin.  The exit code
is non-zero when any record fails verification.  (The cluster demo replaces this later.)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

from rmqha import _core
from rmqha.store import CommitLog

_TOPIC = "demo-topic"
_QUEUES = 4


@dataclass
class DemoResult:
    implementation: str
    messages: int
    bytes_written: int
    append_seconds: float
    flush_seconds: float
    reopen_seconds: float
    verify_seconds: float
    errors: int


class _Progress:
    """A one-line text progress bar on stderr, redrawn at most every 1%."""

    def __init__(self, label: str, total: int, width: int = 32) -> None:
        self.label, self.total, self.width = label, max(total, 1), width
        self._shown = -1
        # Redrawing with \r only makes sense on a terminal; logs get the final line.
        self._live = sys.stderr.isatty()

    def update(self, done: int) -> None:
        pct = done * 100 // self.total
        if pct == self._shown or (not self._live and done < self.total):
            return
        self._shown = pct
        filled = done * self.width // self.total
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r{self.label:<18} [{bar}] {pct:3d}% {done}/{self.total}")
        sys.stderr.flush()

    def finish(self) -> None:
        self.update(self.total)
        sys.stderr.write("\n")
        sys.stderr.flush()


def _body(i: int, size: int) -> bytes:
    # Deterministic and different per message, so verification catches misplaced records.
    stamp = i.to_bytes(8, "big")
    return (stamp * (size // 8 + 1))[:size]


def run_twin(twin: str, directory: str, messages: int, size: int, batch: int,
             segment_bytes: int) -> DemoResult:
    bodies_per_batch = [[_body(i, size) for i in range(s, min(s + batch, messages))]
                        for s in range(0, messages, batch)]
    log = CommitLog(directory, segment_bytes=segment_bytes, implementation=twin)
    try:
        log.wait_prefaulted(300)
        bar = _Progress(f"{twin}: append", messages)
        done = 0
        t0 = time.perf_counter()
        for k, bodies in enumerate(bodies_per_batch):
            log.append_batch(_TOPIC, bodies, k % _QUEUES)
            done += len(bodies)
            bar.update(done)
        append_s = time.perf_counter() - t0
        bar.finish()
        t0 = time.perf_counter()
        log.flush()
        flush_s = time.perf_counter() - t0
        written = log.max_offset
    finally:
        log.close()

    t0 = time.perf_counter()
    log = CommitLog(directory, segment_bytes=segment_bytes, implementation=twin, prefault=False)
    reopen_s = time.perf_counter() - t0
    errors = 0
    try:
        bar = _Progress(f"{twin}: verify", messages)
        seen = 0
        next_qoff = [0] * _QUEUES
        t0 = time.perf_counter()
        for msg in log.iter_messages():
            k, j = divmod(seen, batch)
            qid = k % _QUEUES
            ok = (msg.topic == _TOPIC and msg.queue_id == qid
                  and msg.queue_offset == next_qoff[qid] and msg.body == _body(seen, size))
            if not ok:
                errors += 1
                if errors <= 5:
                    print(f"{twin}: record {seen} at offset {msg.physical_offset} is wrong",
                          file=sys.stderr)
            if qid == msg.queue_id:
                next_qoff[qid] += 1
            seen += 1
            if seen % 1000 == 0:
                bar.update(seen)
        verify_s = time.perf_counter() - t0
        bar.finish()
        if seen != messages:
            print(f"{twin}: read back {seen} records, expected {messages}", file=sys.stderr)
            errors += abs(messages - seen)
        if log.max_offset != written:
            print(f"{twin}: reopened log ends at {log.max_offset}, expected {written}",
                  file=sys.stderr)
            errors += 1
    finally:
        log.close()
    return DemoResult(twin, messages, written, append_s, flush_s, reopen_s, verify_s, errors)


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def cmd_demo(args: argparse.Namespace) -> int:
    if args.messages <= 0 or args.size < 0 or args.batch <= 0:
        print("rmqha demo: --messages and --batch must be > 0, --size >= 0", file=sys.stderr)
        return 2
    twins = ["python"] if _core.NO_EXTENSIONS else ["cython", "python"]
    root = args.dir or tempfile.mkdtemp(prefix="rmqha-demo-")
    results = []
    try:
        for twin in twins:
            directory = os.path.join(root, f"commitlog-{twin}")
            if os.path.exists(directory):
                shutil.rmtree(directory)
            results.append(run_twin(twin, directory, args.messages, args.size, args.batch,
                                    args.segment_mb << 20))
            if not args.keep:
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'twin':<8} {'messages':>10} {'append rec/s':>14} {'append MB/s':>12} "
          f"{'fsync s':>8} {'reopen s':>9} {'verify rec/s':>13} {'errors':>7}")
    for r in results:
        print(f"{r.implementation:<8} {r.messages:>10} "
              f"{_rate(r.messages, r.append_seconds):>14,.0f} "
              f"{_rate(r.bytes_written / 1e6, r.append_seconds):>12,.1f} "
              f"{r.flush_seconds:>8.2f} {r.reopen_seconds:>9.2f} "
              f"{_rate(r.messages, r.verify_seconds):>13,.0f} {r.errors:>7}")
    print("append = append_batch into warm mmap-ed segments (page cache); fsync = the final "
          "flush to disk; reopen = recovery (scan + validate)")
    if args.keep:
        print(f"stores kept in {root}")
    failed = sum(r.errors for r in results)
    if failed:
        print(f"verification FAILED: {failed} bad record(s)", file=sys.stderr)
        return 1
    print("verification passed: every record read back intact")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="append N 1 KiB messages, reopen, verify, print rates (both twins)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--messages", type=int, default=1_000_000, help="messages per twin")
    p.add_argument("--size", type=int, default=1024, help="body bytes per message")
    p.add_argument("--batch", type=int, default=1000, help="messages per append_batch call")
    p.add_argument("--segment-mb", type=int, default=1024, help="segment size in MiB")
    p.add_argument("--dir", default=None, help="directory for the stores (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    p.set_defaults(func=cmd_demo)
