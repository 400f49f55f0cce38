"""Message lookup by key at 1 M messages (100 k with RMQHA_BENCH_QUICK=1).

One commitlog holds N messages; each carries a unique id (``UNIQ_KEY``) and two keys
(``KEYS``: ``order-<i>``, unique, and ``cust-<i % 1000>``, shared by N/1000 messages).
Group ``message-index-lookup``, one lookup per round, answers checked against the record:

- ``rmqha-unique``: :class:`rmqha.store.message_index.MessageIndex` (mmap hash-table
  files) for a unique id: the hash chain, then the record read and its UNIQ_KEY compared
  (what the broker's QUERY_MESSAGE does);
- ``rmqha-shared-32``: the same for a key 1000 messages share, 32 results (RocketMQ's
  defaultQueryMaxNum), each record read and checked;
- ``sqlite-unique`` / ``sqlite-shared-32``: the peer a Python user would pick, an sqlite3
  table (key, offset) with a B-tree index on key, same answers (offsets only, no record
  read: sqlite's figure is a lower bound for a lookup that returns messages);
- ``dict-unique``: a Python dict unique id -> offsets (in memory, nothing on disk), the floor.

``extra_info`` also records how long building each index took (records/s).

Group ``message-index-build``: indexing 50 k records (three keys each) into a fresh file,
the compiled scan twin against the pure one (``rmqha._core.message_index``).
"""
from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benches.conftest import QUICK, describe
from rmqha._core import TWINS, load_twin
from rmqha.protocol.message import decode_record
from rmqha.store.message_index import MessageIndex, record_matches
from rmqha.store import CommitLog

N = 100_000 if QUICK else 1_000_000
TOPIC = "orders"
BODY = b"x" * 100


class _Store:
    def __init__(self, base: Path) -> None:
        self.log = CommitLog(base / "log", segment_bytes=256 << 20, prefault=False, flush="async")
        for i in range(N):
            self.log.append(TOPIC, BODY, i % 8, {"UNIQ_KEY": f"U{i:012d}",
                                                  "KEYS": f"order-{i} cust-{i % 1000}"},
                            wait_flush=False)
        started = time.perf_counter()
        self.index = MessageIndex(base / "index")
        self.index.advance(self.log, self.log.max_offset)
        self.index_build_s = time.perf_counter() - started
        started = time.perf_counter()
        self.db = sqlite3.connect(str(base / "keys.db"))
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE k (key TEXT, off INTEGER)")
        self.mem: dict[str, list[int]] = {}

        def rows() -> Iterator[tuple[str, int]]:
            for uniq, keys, off in self._scan():
                self.mem.setdefault(uniq, []).append(off)
                yield uniq, off
                for k in keys:
                    yield k, off
        self.db.executemany("INSERT INTO k VALUES (?, ?)", rows())
        self.db.execute("CREATE INDEX k_key ON k (key, off)")
        self.db.commit()
        self.sqlite_build_s = time.perf_counter() - started

    def _scan(self) -> Iterator[tuple[str, list[str], int]]:
        pos = self.log.min_offset
        end = self.log.max_offset
        while pos < end:
            seg_end = self.log.segment_end(pos)
            view = self.log.read(pos, min(end, seg_end) - pos)
            at = 0
            while at < len(view):
                msg, size = decode_record(view, at, inflate=False)
                yield (f"{TOPIC}#{msg.properties['UNIQ_KEY']}",
                       [f"{TOPIC}#{k}" for k in msg.properties["KEYS"].split(" ")], pos + at)
                at += size
            pos += len(view)

    def lookup(self, key: str, *, unique: bool, limit: int) -> list[int]:
        """The broker's lookup (rmqha.messaging.lookup.MessageLookup.find) minus the
        confirm-offset bound: candidates, each record read and checked."""
        out = []
        topic_b, key_b = TOPIC.encode(), key.encode()
        for off in self.index.candidates(TOPIC, key):
            size = int.from_bytes(self.log.read(off, 4), "big")
            if record_matches(bytes(self.log.read(off, size)), topic_b, key_b, unique=unique):
                out.append(off)
                if len(out) >= limit:
                    break
        return out

    def close(self) -> None:
        self.index.close()
        self.db.close()
        self.log.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Store]:
    s = _Store(tmp_path_factory.mktemp("msgindex"))
    yield s
    s.close()


def _info(benchmark, store: _Store, impl: str, case: str) -> None:
    describe(benchmark, impl, message_bytes=len(BODY), batch=1, replicas=1, case=case,
             messages=N, rmqha_build_records_per_s=round(N / store.index_build_s),
             sqlite_build_records_per_s=round(N / store.sqlite_build_s))


def _keys(prefix: str, count: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    while True:
        yield f"{prefix}{rng.randrange(count)}"


@pytest.mark.benchmark(group="message-index-lookup")
def test_rmqha_unique(benchmark, store: _Store) -> None:
    _info(benchmark, store, "rmqha", "unique")
    ids = (f"U{int(k):012d}" for k in _keys("", N, 1))
    got = benchmark(lambda: store.lookup(next(ids), unique=True, limit=32))
    assert len(got) == 1


@pytest.mark.benchmark(group="message-index-lookup")
def test_rmqha_shared_32(benchmark, store: _Store) -> None:
    _info(benchmark, store, "rmqha", "shared-32")
    keys = _keys("cust-", 1000, 2)
    got = benchmark(lambda: store.lookup(next(keys), unique=False, limit=32))
    assert len(got) == 32


@pytest.mark.benchmark(group="message-index-lookup")
def test_sqlite_unique(benchmark, store: _Store) -> None:
    _info(benchmark, store, "sqlite", "unique")
    ids = (f"{TOPIC}#U{int(k):012d}" for k in _keys("", N, 1))
    q = "SELECT off FROM k WHERE key = ? ORDER BY off DESC LIMIT 32"
    got = benchmark(lambda: store.db.execute(q, (next(ids),)).fetchall())
    assert len(got) == 1


@pytest.mark.benchmark(group="message-index-lookup")
def test_sqlite_shared_32(benchmark, store: _Store) -> None:
    _info(benchmark, store, "sqlite", "shared-32")
    keys = (f"{TOPIC}#{k}" for k in _keys("cust-", 1000, 2))
    q = "SELECT off FROM k WHERE key = ? ORDER BY off DESC LIMIT 32"
    got = benchmark(lambda: store.db.execute(q, (next(keys),)).fetchall())
    assert len(got) == 32


@pytest.mark.benchmark(group="message-index-lookup")
def test_dict_unique(benchmark, store: _Store) -> None:
    _info(benchmark, store, "dict", "unique")
    ids = (f"{TOPIC}#U{int(k):012d}" for k in _keys("", N, 1))
    got = benchmark(lambda: store.mem[next(ids)][-32:])
    assert len(got) == 1


BUILD_RECORDS = 50_000


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.benchmark(group="message-index-build")
def test_build(benchmark, store: _Store, twin: str, tmp_path: Path) -> None:
    impl = load_twin("message_index", twin)
    view = bytes(store.log.read(0, min(store.log.max_offset, store.log.segment_end(0))))
    mm = bytearray(128 + 4 * (1 << 18) + 24 * 4 * BUILD_RECORDS)
    end = 0
    for _ in range(BUILD_RECORDS):  # the first BUILD_RECORDS records
        end += int.from_bytes(view[end:end + 4], "big")

    def build() -> int:
        mm[:] = bytes(len(mm))
        return impl.add_records(view, 0, end, 0, mm, 1 << 18, 128 + 4 * (1 << 18),
                                4 * BUILD_RECORDS, 0, 0, 0, (), 1024)[4]

    describe(benchmark, twin, message_bytes=len(BODY), batch=BUILD_RECORDS, replicas=1,
             case="build")
    added = benchmark.pedantic(build, rounds=5, iterations=1)
    assert added == 3 * BUILD_RECORDS
