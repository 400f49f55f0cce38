"""``format("rmqha")`` in one Spark session (local[2]) against a real broker group.

Cluster: a controller, a name server, broker-a as a master and a slave (all-ack: a send is
acknowledged once both hold it).  Proven here:

- a batch read gives one row per acknowledged message, every field as sent, also when
  each queue's range is split over several tasks, and from a list of topics;
- offsets given as JSON read exactly the range asked;
- a write of rows (acknowledged sends) is read back;
- bad options fail the query with the option's name;
- a reader never returns what is past the confirm offset: with the slave stopped, sends
  are stored on the master but not confirmed; a read plans and returns only the confirmed
  ones, promptly.  Negative control: the same check over a reader planned past the
  confirm offset (``testOnlyEndPastConfirm``) fails.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster
from rmqha_topics import Sent, create_topic, send, start_group
from spark_support import SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

from rmqha.client import BlockingProducer, SendStatus

pytestmark = SPARK_TEST_MARKS

if SPARK_OK:
    from pyspark.errors import PySparkException
    from pyspark.sql.utils import CapturedException

    from rmqha.spark import register


@pytest.fixture(scope="module")
def rmq(tmp_path_factory) -> Iterator[Cluster]:  # noqa: ANN001
    # The slave stays in the SyncStateSet while stopped (the confirm test needs it there),
    # and an all-ack send waits 0.5 s for it before answering FLUSH_SLAVE_TIMEOUT.
    with Cluster(tmp_path_factory.mktemp("rmq")) as c:
        start_group(c, 1, slave_timeout_ms=500, ha_max_time_slave_not_catchup_ms=600_000)
        yield c


@pytest.fixture(scope="module")
def session(spark):  # noqa: ANN001, ANN201, F811
    register(spark)
    return spark


def _read(session: Any, rmq: Cluster, topic: str, **options: str) -> list[Any]:  # noqa: ANN401
    reader = session.read.format("rmqha").option("namesrv", ";".join(rmq.namesrv_addresses))
    for key, value in {"topic": topic, **options}.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def _check_rows(rows: list[Any], sent: list[Sent]) -> None:
    """One row per sent message, every field as sent (rows in any order)."""
    got = {(r.topic, r.queueId, r.queueOffset): r for r in rows}
    assert len(got) == len(rows), "a (topic, queue, offset) appears twice"
    want = {(s.topic, s.queue_id, s.queue_offset): s for s in sent}
    assert got.keys() == want.keys()
    now = time.time()
    for key, s in want.items():
        r = got[key]
        assert (r.brokerGroup, r.commitlogOffset, bytes(r.body), r.tags, r.keys) == (
            "broker-a", s.commitlog_offset, s.body, s.tags, s.keys), (r, s)
        assert r.properties["serial"] == s.serial and r.properties["UNIQ_KEY"]
        assert now - 600 < r.bornTimestamp.timestamp() <= r.storeTimestamp.timestamp() + 1 < now + 2


def test_batch_read_gives_every_acknowledged_message_once_with_its_fields(session, rmq) -> None:  # noqa: ANN001
    create_topic(rmq, "Rows", 4)
    create_topic(rmq, "Rows2", 2)
    sent = send(rmq.namesrv_addresses, "Rows", range(600), size=100)
    assert len({s.queue_id for s in sent}) == 4
    _check_rows(_read(session, rmq, "Rows"), sent)
    # Ranges split into tasks of at most 50 offsets: the same rows.
    _check_rows(_read(session, rmq, "Rows", maxOffsetsPerPartition="50"), sent)
    sent2 = send(rmq.namesrv_addresses, "Rows2", range(600, 650))
    _check_rows(_read(session, rmq, "Rows,Rows2"), sent + sent2)


def test_json_offsets_read_exactly_the_range_asked(session, rmq) -> None:  # noqa: ANN001
    create_topic(rmq, "Ranged", 2)
    sent = send(rmq.namesrv_addresses, "Ranged", range(100))
    starting = {"Ranged": {"broker-a:0": 5, "broker-a:1": -2}}
    ending = {"Ranged": {"broker-a:0": 20, "broker-a:1": -1}}
    rows = _read(session, rmq, "Ranged", startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending))
    _check_rows(rows, [s for s in sent if s.queue_id == 1 or 5 <= s.queue_offset < 20])


def test_rows_written_with_acknowledged_sends_are_read_back(session, rmq) -> None:  # noqa: ANN001
    create_topic(rmq, "Written", 2)
    df = session.createDataFrame([(b"w%d" % i, f"tag{i % 2}", f"key{i}", {"serial": str(i)}) for i in range(300)],
                                 "body BINARY, tags STRING, keys STRING, properties MAP<STRING, STRING>")
    (df.repartition(3).write.format("rmqha").mode("append")
     .option("namesrv", ";".join(rmq.namesrv_addresses)).option("topic", "Written").save())
    rows = _read(session, rmq, "Written")
    # At least once: a retried task may store a row twice; here nothing failed, so once.
    assert sorted(bytes(r.body) for r in rows) == sorted(b"w%d" % i for i in range(300))
    assert {(bytes(r.body), r.tags, r.keys, r.properties["serial"]) for r in rows} == {
        (b"w%d" % i, f"tag{i % 2}", f"key{i}", str(i)) for i in range(300)}


@pytest.mark.parametrize(("options", "named"), [
    ({"startingOffsets": "yesterday"}, "startingOffsets"),
    ({"failOnDataLos": "false"}, "failOnDataLos"),
    ({"endingOffsets": '{"Options": {"broker-a:9": 1}}'}, "endingOffsets"),
    ({"topic": "NoSuchTopic"}, "topic"),
])
def test_a_bad_option_fails_the_read_naming_it(session, rmq, options: dict[str, str], named: str) -> None:  # noqa: ANN001
    create_topic(rmq, "Options", 1)
    with pytest.raises((PySparkException, CapturedException)) as err:
        _read(session, rmq, options.pop("topic", "Options"), **options)
    # Spark lower-cases option names before the source sees them.
    assert f"option {named.lower()!r}" in str(err.value).lower(), err.value


def test_a_bad_column_fails_the_write_naming_it(session, rmq) -> None:  # noqa: ANN001
    df = session.createDataFrame([(b"x", 1)], "body BINARY, priority INT")
    with pytest.raises((PySparkException, CapturedException)) as err:
        df.write.format("rmqha").mode("append").option("namesrv", ";".join(rmq.namesrv_addresses)).option(
            "topic", "Written").save()
    assert "option 'priority'" in str(err.value)


def _read_confirmed_only(session: Any, rmq: Cluster, confirmed: list[Sent], stored: list[Sent],  # noqa: ANN401
                         **options: str) -> None:
    """The check: a read now returns exactly ``confirmed``, none of ``stored`` (on the
    master, not confirmed), within 30 s."""
    started = time.monotonic()
    rows = _read(session, rmq, "Confirm", readTimeoutMs="5000", **options)
    assert time.monotonic() - started < 30
    offsets = {(r.queueId, r.queueOffset) for r in rows}
    assert not offsets & {(s.queue_id, s.queue_offset) for s in stored}, "unconfirmed messages were read"
    _check_rows(rows, confirmed)


def test_a_reader_never_returns_what_is_past_the_confirm_offset(session, rmq: Cluster) -> None:  # noqa: ANN001
    create_topic(rmq, "Confirm", 1)
    confirmed = send(rmq.namesrv_addresses, "Confirm", range(30))
    slave = next(b for b in rmq.brokers if b is not rmq.master_of("broker-a"))
    os.kill(slave.pid, signal.SIGSTOP)
    try:
        with BlockingProducer(rmq.namesrv_addresses, max_attempts=1) as p:
            results = p.send_batch("Confirm", [b"stored, not confirmed %d" % i for i in range(10)])
        assert {r.status for r in results} == {SendStatus.FLUSH_SLAVE_TIMEOUT}, results
        stored = [Sent("Confirm", r.queue.queue_id, r.queue_offset, 0, b"", "", "", "") for r in results]
        _read_confirmed_only(session, rmq, confirmed, stored)
        # Negative control: a reader that planned to the master's raw end (10 past the
        # confirmed one) is caught by the same check: the broker holds back what is not
        # confirmed, so that read cannot complete its plan and fails.
        with pytest.raises((AssertionError, PySparkException, CapturedException)) as err:
            _read_confirmed_only(session, rmq, confirmed, stored, **{"testOnlyEndPastConfirm": "10"})
        assert "30..39 were planned but not served" in str(err.value), err.value
    finally:
        os.kill(slave.pid, signal.SIGCONT)
