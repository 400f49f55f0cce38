"""The consume-queue walk (``rmqha._core.queue_scan.index_runs``), compiled vs pure twin.

One call walks 1,000 committed 1 KiB records of 8 queues written in runs of 32 (what a
batch send leaves), each with a TAGS property, and returns the runs the index extends
itself by.  Records/s = 1,000 / mean time.
"""
from __future__ import annotations

import struct

import pytest

from benches.conftest import describe
from rmqha._core import load_twin
from rmqha.protocol.message import tag_hash

RECORDS = 1000
HOST = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)


def _log() -> bytes:
    records = load_twin("records", "cython")
    buf = bytearray(RECORDS * 1200)
    pos = 0
    for i in range(RECORDS):
        queue = (i // 32) % 8
        pos += records.write_message(buf, pos, b"BenchTopic", b"x" * 1024,
                                     b"TAGS\x01TagA\x02KEYS\x01k\x02", queue, 0, i, pos, 0, 1,
                                     HOST, 2, HOST, 0, 0)
    return bytes(buf[:pos])


LOG = _log()


def _hash(raw: bytes) -> int:
    return tag_hash(raw.decode("utf-8", errors="replace"))


@pytest.mark.benchmark(group="queue_scan-index_runs")
@pytest.mark.parametrize("impl", ["cython", "python"])
def test_index_runs(benchmark, impl: str) -> None:
    describe(benchmark, impl, message_bytes=1024, batch=RECORDS, op="index_runs",
             records_per_round=RECORDS)
    mod = load_twin("queue_scan", impl)
    view = memoryview(LOG)
    consumed, runs, bad = benchmark(mod.index_runs, view, 0, frozenset(), None, _hash)
    assert consumed == len(LOG) and bad is None and len(runs) == RECORDS // 32 + 1
