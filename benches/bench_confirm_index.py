"""Confirm-time indexing: the consume queues following the confirm offset one send at a
time, as a broker's ``on_confirm_offset`` does after each acknowledged send.

A commitlog holds ``RECORDS`` sends of 1 KiB over 8 queues (TAGS and KEYS each); one
round indexes the next ``PER_CONFIRM`` of them (``ConsumeQueueIndex.advance`` up to the
record's end).  Group ``confirm-index``, per twin of ``rmqha._core.queue_scan``:

- ``compiled-dispatch``: the usual confirm, one ``queue_scan.dispatch`` call writing the
  units through the queues' armed sinks;
- ``general-walk``: the same confirms the general way (``index_runs``, then a Python
  write per run), the path before the compiled dispatch.

Sends/s = PER_CONFIRM / mean time.  Speed is reported, never asserted.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from benches.conftest import describe
from rmqha._core import load_twin
from rmqha.store import CommitLog
from rmqha.store import consume_queue as cq
from rmqha.store.consume_queue import ConsumeQueueIndex

RECORDS = 4096
PER_CONFIRM = 1
BODY = b"x" * 1024


@pytest.mark.benchmark(group="confirm-index")
@pytest.mark.parametrize("impl", ["cython", "python"])
@pytest.mark.parametrize("lane", ["compiled-dispatch", "general-walk"])
def test_confirm_index(benchmark: Any, monkeypatch: pytest.MonkeyPatch, lane: str,
                       impl: str) -> None:
    describe(benchmark, f"{lane}-{impl}", message_bytes=len(BODY), batch=PER_CONFIRM,
             op="advance")
    monkeypatch.setattr(cq, "_queue_scan", load_twin("queue_scan", impl))
    if lane == "general-walk":
        monkeypatch.setattr(ConsumeQueueIndex, "_dispatch_compiled",
                            lambda self, log, start, *a: start)
    with tempfile.TemporaryDirectory() as tmp:
        log = CommitLog(Path(tmp) / "cl", segment_bytes=64 << 20, prefault=False)
        ends = [sum(log.append("BenchTopic", BODY, i % 8, {"TAGS": "TagA", "KEYS": f"k{i}"},
                               wait_flush=False)) for i in range(RECORDS)]
        idx = ConsumeQueueIndex(Path(tmp) / "cq", flush_interval_s=3600)
        idx.advance(log, ends[15])  # every queue made and armed
        confirms = iter(ends[16::PER_CONFIRM])
        done: list[int] = []

        def confirm() -> None:
            done.append(next(confirms))
            idx.advance(log, done[-1])

        try:
            # One round per confirm (--benchmark-disable runs one).
            benchmark.pedantic(confirm, rounds=(RECORDS - 16) // PER_CONFIRM, iterations=1)
            assert idx.indexed_offset == done[-1]
            assert sum(len(q) for q in idx.queues.values()) == ends.index(done[-1]) + 1
        finally:
            idx.close()
            log.close()
