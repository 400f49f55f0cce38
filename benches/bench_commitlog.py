"""Commitlog append benchmarks: compiled vs pure twin vs the peers a Python user would pick.

Groups, per body size (100 B, 1 KiB, 4 KiB):

- ``commitlog-append_batch-<size>``: one call stores BATCH messages.  Our ``append_batch``
  (cython / python twin) against sqlite3 in WAL mode (``executemany`` in one transaction),
  py-lmdb (``putmulti(append=True)`` in one transaction), plain ``os.write`` appends of
  length-prefixed records (one syscall per record), the same records in one ``os.writev``
  per batch (``os.writev``), and a memcpy of the very bytes our log writes into a warm
  buffer (the physical limit: no headers to build, no CRC).
- ``commitlog-append-<size>``: BATCH calls of ``append`` (one Python call per message).

Every contender runs without an fsync in the timed path (our log in async mode with the
background flush pushed out of the run; sqlite ``synchronous=NORMAL``, which in WAL mode
syncs only at checkpoints; lmdb ``sync=False``; no fsync after ``os.write``), so the
numbers compare the write paths, not the disk.  The log reserves and faults in a window
ahead of its writer (first touch of a page costs 8-16 us here, and populating runs at
~0.4-1.7 GB/s on this class of VM, far below the append path's rate): each round waits,
untimed, for that warm-up, so the timed region never pays first-touch faults; after a
rewind the window is warmed again the same way.  Records/s = batch / mean time (see
``extra_info``).
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import struct
from collections.abc import Callable, Iterator

import pytest

from benches.conftest import QUICK, describe
from rmqha.store import CommitLog

SIZES = (100, 1024, 4096)
BATCH = 200 if QUICK else 1000
ROUNDS = 10 if QUICK else 40
SEGMENT = (64 if QUICK else 256) << 20
TOPIC = "bench-topic"
_LEN = struct.Struct(">i")


def _bodies(size: int) -> list[bytes]:
    return [bytes([i % 251]) * size for i in range(BATCH)]


def _info(benchmark, implementation: str, size: int, op: str) -> None:
    describe(benchmark, implementation, message_bytes=size, batch=BATCH, replicas=1,
             op=op, records_per_round=BATCH)


@pytest.fixture
def commitlog_factory(tmp_path) -> Iterator[Callable[[str], CommitLog]]:
    opened: list[CommitLog] = []

    def make(impl: str) -> CommitLog:
        log = CommitLog(tmp_path / impl, segment_bytes=SEGMENT, implementation=impl,
                        flush="async", flush_interval_ms=3_600_000)
        log.wait_prefaulted(120)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()
        # Unlinked at once, so the page cache does not write gigabytes of warmed zeros back.
        shutil.rmtree(log.directory)


def _run_log(benchmark, log: CommitLog, fn: Callable[[], object], per_round: int) -> None:
    def setup() -> None:
        # Rewind before the segment would roll, and wait for the window ahead of the
        # writer to be warm: the timed region never pays first-touch faults or a roll.
        if log.max_offset + 2 * per_round > SEGMENT:
            log.truncate(0)
        log.wait_prefaulted(120)

    benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)


# Groups are refined per body size at run time (benchmark.group), so each table compares
# contenders on the same message size.
@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("impl", ["cython", "python"])
def test_append_batch(benchmark, commitlog_factory, impl: str, size: int) -> None:
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, impl, size, "append_batch")
    log = commitlog_factory(impl)
    bodies = _bodies(size)
    _run_log(benchmark, log, lambda: log.append_batch(TOPIC, bodies), BATCH * (size + 102))


def _batch_body(bodies: list[bytes]) -> bytes:
    """A SEND_BATCH body of these messages, each with a TAGS and a UNIQ_KEY property."""
    out = bytearray()
    for i, body in enumerate(bodies):
        props = b"TAGS\x01tag\x02UNIQ_KEY\x01%032X\x02" % i
        out += struct.pack(">iiiii", 22 + len(body) + len(props), 0, 0, 0, len(body)) + body
        out += struct.pack(">h", len(props)) + props
    return bytes(out)


@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("impl", ["cython", "python"])
def test_append_batch_entries(benchmark, commitlog_factory, impl: str, size: int) -> None:
    """A batch send's body stored as it came: each message with its own properties."""
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, impl, size, "append_batch_entries")
    log = commitlog_factory(impl)
    body = _batch_body(_bodies(size))
    _run_log(benchmark, log, lambda: log.append_batch_entries(TOPIC, body, BATCH),
             BATCH * (size + 160))


@pytest.mark.benchmark(group="commitlog-append")
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("impl", ["cython", "python"])
def test_append(benchmark, commitlog_factory, impl: str, size: int) -> None:
    benchmark.group = f"commitlog-append-{size}"
    _info(benchmark, impl, size, "append")
    log = commitlog_factory(impl)
    bodies = _bodies(size)
    append = log.append

    def run() -> None:
        for body in bodies:
            append(TOPIC, body)

    _run_log(benchmark, log, run, BATCH * (size + 102))


@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
def test_peer_sqlite_wal(benchmark, tmp_path, size: int) -> None:
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, "sqlite3-wal", size, "append_batch")
    db = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE log (id INTEGER PRIMARY KEY, topic TEXT, body BLOB)")
        rows = [(TOPIC, b) for b in _bodies(size)]

        def run() -> None:
            db.execute("BEGIN")
            db.executemany("INSERT INTO log (topic, body) VALUES (?, ?)", rows)
            db.execute("COMMIT")

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        db.close()


@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
def test_peer_lmdb(benchmark, tmp_path, size: int) -> None:
    lmdb = pytest.importorskip("lmdb")
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, "lmdb", size, "append_batch")
    env = lmdb.open(str(tmp_path / "lmdb"), map_size=16 << 30, sync=False, metasync=False)
    try:
        bodies = _bodies(size)
        counter = [0]
        key = struct.Struct(">q").pack

        def run() -> None:
            n = counter[0]
            items = [(key(n + i), b) for i, b in enumerate(bodies)]
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(items, append=True)
            counter[0] = n + len(bodies)

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        env.close()


@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
def test_peer_os_write(benchmark, tmp_path, size: int) -> None:
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, "os.write", size, "append_batch")
    fd = os.open(tmp_path / "log.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        records = [_LEN.pack(len(b)) + b for b in _bodies(size)]
        write = os.write

        def run() -> None:
            for rec in records:
                write(fd, rec)

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        os.close(fd)


@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
def test_peer_os_write_batched(benchmark, tmp_path, size: int) -> None:
    """The same length-prefixed records, a batch in one ``os.writev`` (one syscall per
    batch, as a user who batches would write them; ``os.write`` above is one per record)."""
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, "os.writev", size, "append_batch")
    fd = os.open(tmp_path / "log.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        bodies = _bodies(size)
        heads = [_LEN.pack(len(b)) for b in bodies]
        writev = os.writev
        iov_max = os.sysconf("SC_IOV_MAX")

        def run() -> None:
            # Headers and bodies interleaved without joining them (no extra copy).
            parts = [p for pair in zip(heads, bodies) for p in pair]
            for i in range(0, len(parts), iov_max):
                writev(fd, parts[i : i + iov_max])

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        os.close(fd)


@pytest.mark.benchmark(group="commitlog-append_batch")
@pytest.mark.parametrize("size", SIZES)
def test_memcpy_limit(benchmark, tmp_path, size: int) -> None:
    """Copy the exact bytes our log writes for a batch into a warm buffer."""
    benchmark.group = f"commitlog-append_batch-{size}"
    _info(benchmark, "memcpy", size, "append_batch")
    with CommitLog(tmp_path / "src", segment_bytes=SEGMENT, prefault=False) as log:
        log.append_batch(TOPIC, _bodies(size))
        data = bytes(log.read(0, log.max_offset))
    target = bytearray(len(data))
    target[:] = data  # warm: every page touched before timing
    n = len(data)

    def run() -> None:
        target[0:n] = data

    benchmark.pedantic(run, rounds=ROUNDS * 5, iterations=1, warmup_rounds=1)
