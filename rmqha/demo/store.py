"""``rmqha demo-store``: the storage demo, one commitlog per twin, written and verified.

It appends ``messages`` records to a commitlog in batches with a progress bar on stderr,
closes it, reopens it (recovery scans and validates the tail), reads every record back and
checks its body, topic, queue and queue offset.  :func:`run_twin` returns the rates and the
number of bad records; the command in :mod:`rmqha.cli.demo` prints them.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rmqha.demo.report import ProgressBar
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
        bar = ProgressBar(f"{twin}: append", messages)
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
        bar = ProgressBar(f"{twin}: verify", messages)
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
