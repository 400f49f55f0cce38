"""The rmqha Spark source: a batch read's rate and a stream's send-to-sink latency.

Targets (issue 41): a batch read of 1 M messages of 1 KiB on ``local[2]`` at 150k rows/s
or more; a stream's latency from a send to its row in a file sink, median at most 1 s.
RMQHA_BENCH_QUICK=1 reads 100k messages and streams for 10 s instead of 30 s;
``RMQHA_SPARK_SOURCE_MESSAGES`` sets the batch read's size.

Cluster: one broker (a master alone: the read is what is measured, not replication),
8 queues filled before the clock starts with rmqha's producer (batches of 64). The batch
read materialises every body (``sum(length(body))``), so no column is pruned away; it
runs once (a round is many seconds). The stream's latency of a message is the time its
micro-batch's commit file appeared in the checkpoint (the file sink commits before it)
minus the message's born timestamp, for messages sent one every 20 ms.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICK, describe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

MESSAGES = int(os.environ.get("RMQHA_SPARK_SOURCE_MESSAGES", "0")) or (100_000 if QUICK else 1_000_000)
BODY_BYTES = 1024
STREAM_SECONDS = 10 if QUICK else 30
QUEUES = 8

_HAVE_SPARK = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))

pytestmark = [
    pytest.mark.skipif(not _HAVE_SPARK, reason="needs Java 17+ for pyspark"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


@pytest.fixture(scope="module")
def rmq() -> Iterator[Any]:
    from cluster import Cluster

    from rmqha.protocol.codes import RequestCode
    with tempfile.TemporaryDirectory(prefix="bench-spark-source-") as tmp, Cluster(Path(tmp)) as c:
        c.start_controllers(1)
        c.start_namesrv()
        broker = c.start_broker("broker-a", segment_bytes=256 << 20, log_level="WARNING")
        c.wait_for(lambda: c.broker_role(broker) == "master", what="a master")
        for topic in ("Bulk", "Live"):
            resp = c.request(broker.address, RequestCode.UPDATE_AND_CREATE_TOPIC,
                             {"topic": topic, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6})
            assert resp.code == 0, resp.remark
            c.wait_for(lambda t=topic: c.route(t) is not None, what=f"a route for {topic}")
        yield c


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from rmqha.spark import register
    from spark_bench.session import SessionOptions, build_session
    session = build_session(SessionOptions(master="local[2]", shuffle_partitions=2, app_name="bench-spark-source"))
    register(session)
    yield session
    session.stop()


async def _fill(namesrv: list[str], topic: str, total: int) -> None:
    from rmqha.client import Message, Producer
    body = b"x" * BODY_BYTES
    async with Producer(namesrv) as producer:
        sem = asyncio.Semaphore(8)

        async def one(start: int) -> None:
            async with sem:
                n = min(64, total - start)
                results = await producer.send_batch(topic, [Message(body=body) for _ in range(n)])
                assert all(r.ok for r in results)
        await asyncio.gather(*(one(i) for i in range(0, total, 64)))


@pytest.mark.benchmark(group="spark-source")
def test_batch_read(benchmark: Any, rmq: Any, spark: Any) -> None:  # noqa: ANN401
    asyncio.run(_fill(rmq.namesrv_addresses, "Bulk", MESSAGES))
    df = (spark.read.format("rmqha").option("namesrv", ";".join(rmq.namesrv_addresses))
          .option("topic", "Bulk").load())

    def read() -> tuple[int, int, float]:
        started = time.perf_counter()
        row = df.selectExpr("count(*) AS n", "sum(length(body)) AS bytes").collect()[0]
        return int(row.n), int(row.bytes), time.perf_counter() - started

    # Timed inside too: with --benchmark-disable the function runs once and no stats exist.
    rows, size, seconds = benchmark.pedantic(read, rounds=1, iterations=1)
    assert (rows, size) == (MESSAGES, MESSAGES * BODY_BYTES)
    describe(benchmark, "pyspark", message_bytes=BODY_BYTES, rows=rows, master="local[2]",
             rows_per_s=round(rows / seconds), quick=QUICK)
    print(f"\nbatch read of {rows} messages of {BODY_BYTES} B on local[2]: {seconds:.1f} s, "
          f"{rows / seconds:,.0f} rows/s")


def _committed_batches(checkpoint: Path) -> list[tuple[float, dict[tuple[int, int], int]]]:
    """(commit time, end offset per (queue id)) of every committed micro-batch, in order."""
    out = []
    for name in sorted((n for n in os.listdir(checkpoint / "commits") if n.isdigit()), key=int):
        committed = os.stat(checkpoint / "commits" / name).st_mtime_ns / 1e9
        lines = (checkpoint / "offsets" / name).read_text().splitlines()
        ends = json.loads(lines[-1])
        out.append((committed, {int(k.split(":")[1]): v for qs in ends.values() for k, v in qs.items()}))
    return out


def _latencies(rows: list[Any], batches: list[tuple[float, dict[int, int]]]) -> list[float]:
    out = []
    for r in rows:
        committed = next(t for t, ends in batches if ends.get(r.queueId, 0) > r.queueOffset)
        out.append(committed - r.bornTimestamp.timestamp())
    return out


@pytest.mark.benchmark(group="spark-source")
def test_stream_latency(benchmark: Any, rmq: Any, spark: Any, tmp_path: Path) -> None:  # noqa: ANN401
    from rmqha.client import BlockingProducer
    namesrv = ";".join(rmq.namesrv_addresses)
    query = (spark.readStream.format("rmqha").option("namesrv", namesrv).option("topic", "Live")
             .option("startingOffsets", "earliest").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    sent = 0

    def run() -> None:
        nonlocal sent
        stop = time.monotonic() + STREAM_SECONDS
        with BlockingProducer(rmq.namesrv_addresses) as producer:
            while time.monotonic() < stop:
                assert producer.send("Live", b"live %d" % sent).ok
                sent += 1
                time.sleep(0.02)  # the send rate, not a synchronisation
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(
                (p.get("numInputRows") or 0) for p in query.recentProgress) < sent:
            time.sleep(0.1)

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        query.stop()
    rows = spark.read.parquet(str(tmp_path / "out")).select("queueId", "queueOffset", "bornTimestamp").collect()
    assert len(rows) == sent
    lat = sorted(_latencies(rows, _committed_batches(tmp_path / "ckpt")))
    p50, p99 = statistics.median(lat), lat[int(len(lat) * 0.99) - 1]
    describe(benchmark, "pyspark", messages=sent, master="local[2]", latency_p50_s=round(p50, 3),
             latency_p99_s=round(p99, 3), quick=QUICK)
    print(f"\nstream latency send -> row in sink: p50 {p50:.3f} s, p99 {p99:.3f} s over {sent} messages")
