"""A ``readStream.format("rmqha")`` query into a parquet file sink, killed and restarted.

Real processes: a controller, a name server, broker-a as master and slave (all-ack), and
the query in a Spark driver process of its own (tests/support/rmqha_stream_driver.py), so
a SIGKILL of it is a crash of the driver JVM and its Python workers. "Mid micro-batch"
is read from the checkpoint: batch N's offsets are written and its commit is not.

- the driver SIGKILLed mid-batch and started again on its checkpoint: every queue offset
  in the sink exactly once, with its body;
- the broker group's master SIGKILLed mid-batch while messages keep arriving: the query
  reads on from the slave, then the new master; exactly once again, and every
  acknowledged message is there;
- negative control: a query restarted without its checkpoint (the file sink then skips
  its first batch ids as already committed) is caught by the same check.

Each test starts one to three driver JVMs (30-60 s each on two busy cores): ``slow``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from rmqha_topics import GROUP, Sent, create_topic, message, send, sent_of, start_group
from spark_support import PROJECT_ROOT, SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

from rmqha.client import BlockingProducer

pytestmark = [*SPARK_TEST_MARKS, pytest.mark.slow, pytest.mark.timeout(900)]

if SPARK_OK:
    from rmqha.spark.broker_io import QueueClient
    from rmqha.spark.options import ClientOptions
    from rmqha.spark.queues import offsets_to_json

DRIVER = os.path.join(PROJECT_ROOT, "tests", "support", "rmqha_stream_driver.py")


@pytest.fixture
def rmq(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "rmq") as c:
        start_group(c, 1)
        yield c


class Query:
    """One run of the driver process (its own process group, its log in ``log``)."""

    def __init__(self, rmq: Cluster, topic: str, work: Path, checkpoint: str, *, per_trigger: int) -> None:
        self.work = work
        self.checkpoint = work / checkpoint
        self.log = work / f"driver-{time.monotonic_ns()}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, DRIVER, "--namesrv", ";".join(rmq.namesrv_addresses), "--topic", topic,
                 "--out", str(work / "out"), "--checkpoint", str(self.checkpoint),
                 "--target", str(work / "target.json"), "--max-per-trigger", str(per_trigger)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(work),
                env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))

    def output(self) -> str:
        return self.log.read_text()

    def batch_running(self) -> int | None:
        """The id of a micro-batch whose offsets are in the checkpoint and whose commit is
        not (the query is in its middle), if one is."""
        offsets, commits = self.checkpoint / "offsets", self.checkpoint / "commits"
        planned = {int(n) for n in os.listdir(offsets) if n.isdigit()} if offsets.is_dir() else set()
        done = {int(n) for n in os.listdir(commits) if n.isdigit()} if commits.is_dir() else set()
        running = planned - done
        return max(running) if running else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def wait_done(self, timeout: float = 300) -> None:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the query did not finish in {timeout:.0f} s:\n{self.output()[-4000:]}") from None
        assert rc == 0, self.output()[-4000:]


def _wait(predicate: Callable[[], Any], timeout: float, what: str, query: Query) -> Any:  # noqa: ANN401
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        if query.proc.poll() is not None:
            raise AssertionError(f"{what}: the driver exited with {query.proc.returncode}:\n{query.output()[-4000:]}")
        time.sleep(0.05)  # polling interval of a deadline wait
    query.kill()
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{query.output()[-4000:]}")


def _confirmed_ends(rmq: Cluster, topic: str) -> dict[str, dict[str, int]]:
    with QueueClient(ClientOptions(";".join(rmq.namesrv_addresses))) as client:
        bounds = client.bounds(client.queues((topic,)))
    return offsets_to_json({q: b.high for q, b in bounds.items()})


def _set_target(work: Path, ends: dict[str, dict[str, int]]) -> None:
    tmp = work / "target.json.tmp"
    tmp.write_text(json.dumps(ends))
    tmp.rename(work / "target.json")


def check_exactly_once(session: Any, out: Path, ends: dict[str, dict[str, int]],  # noqa: ANN401
                       sent: list[Sent]) -> set[str]:
    """The sink (as Spark reads a file sink: committed files only) holds every offset of
    every queue below ``ends`` exactly once, each with the body sent there; returns the
    serials found."""
    rows = session.read.parquet(str(out)).select("queueId", "queueOffset", "body", "properties").collect()
    counts = Counter((r.queueId, r.queueOffset) for r in rows)
    want = {(int(k.split(":")[1]), o) for qs in ends.values() for k, end in qs.items() for o in range(end)}
    twice = sorted(k for k, n in counts.items() if n > 1)
    missing = sorted(want - set(counts))
    extra = sorted(set(counts) - want)
    assert not twice and not missing and not extra, (
        f"{len(twice)} offsets written more than once (first {twice[:5]}), {len(missing)} missing "
        f"(first {missing[:5]}), {len(extra)} past the ends (first {extra[:5]})")
    bodies = {(s.queue_id, s.queue_offset): s.body for s in sent}
    for r in rows:
        if (r.queueId, r.queueOffset) in bodies:
            assert bytes(r.body) == bodies[(r.queueId, r.queueOffset)]
    return {r.properties["serial"] for r in rows if r.properties and "serial" in r.properties}


def test_a_driver_killed_mid_batch_and_restarted_writes_every_message_once(rmq, tmp_path, spark) -> None:  # noqa: ANN001, F811
    create_topic(rmq, "Killed", 4)
    sent = send(rmq.namesrv_addresses, "Killed", range(2000), size=200)
    first = Query(rmq, "Killed", tmp_path, "ckpt", per_trigger=300)
    batch = _wait(lambda: (n := first.batch_running()) is not None and n >= 2 and n, 240, "batch 2 to run", first)
    first.kill()
    assert first.batch_running() == batch  # killed in its middle: planned, not committed
    sent += send(rmq.namesrv_addresses, "Killed", range(2000, 2600), size=200)
    ends = _confirmed_ends(rmq, "Killed")
    _set_target(tmp_path, ends)
    again = Query(rmq, "Killed", tmp_path, "ckpt", per_trigger=300)
    again.wait_done()
    serials = check_exactly_once(spark, tmp_path / "out", ends, sent)
    assert serials == {s.serial for s in sent}

    # Negative control: the checkpoint lost. The new query's batch 0 (everything, no limit)
    # is skipped by the file sink as already committed: the messages sent since are lost,
    # and the check says so.
    sent += send(rmq.namesrv_addresses, "Killed", range(2600, 2700), size=200)
    ends = _confirmed_ends(rmq, "Killed")
    _set_target(tmp_path, ends)
    lost = Query(rmq, "Killed", tmp_path, "ckpt-lost", per_trigger=0)
    lost.wait_done()
    with pytest.raises(AssertionError, match="missing"):
        check_exactly_once(spark, tmp_path / "out", ends, sent)


def test_the_master_killed_mid_batch_loses_and_repeats_nothing(rmq, tmp_path, spark) -> None:  # noqa: ANN001, F811
    create_topic(rmq, "Failover", 4)
    sent = send(rmq.namesrv_addresses, "Failover", range(1500), size=200)
    acked: list[Sent] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_sending() -> None:
        serial = 10_000
        with BlockingProducer(rmq.namesrv_addresses, retry_deadline_s=60) as producer:
            while not stop.is_set():
                msgs = [message(serial + i, 200) for i in range(10)]
                serial += 10
                try:
                    results = producer.send_batch("Failover", msgs)
                except Exception as exc:  # noqa: BLE001 - recorded: a lost send is not the reader's fault
                    errors.append(exc)
                    continue
                acked.extend(s for s, r in zip(sent_of("Failover", results, msgs), results) if r.ok)
                time.sleep(0.02)  # a steady trickle, not a flood

    sender = threading.Thread(target=keep_sending, daemon=True)
    sender.start()
    query = Query(rmq, "Failover", tmp_path, "ckpt", per_trigger=300)
    try:
        _wait(lambda: (n := query.batch_running()) is not None and n >= 2, 240, "batch 2 to run", query)
        old = rmq.master_of(GROUP)
        assert old is not None
        old.kill()
        rmq.wait_for(lambda: (m := rmq.master_of(GROUP)) is not None and m is not old, timeout=60,
                     what="the slave to take over")
        n_acked = len(acked)
        rmq.wait_for(lambda: len(acked) > n_acked + 50, timeout=60, what="sends acknowledged by the new master")
    finally:
        stop.set()
        sender.join(60)
    ends = _confirmed_ends(rmq, "Failover")
    _set_target(tmp_path, ends)
    query.wait_done()
    serials = check_exactly_once(spark, tmp_path / "out", ends, sent)
    assert {s.serial for s in sent + acked} <= serials
