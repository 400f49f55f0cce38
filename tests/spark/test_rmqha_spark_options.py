"""The rmqha Spark source's options and planning rules, without a JVM or a broker.

Every bad option is refused with a SparkOptionError whose ``option`` is the option's name
(and whose message says it); ``latest`` resolves to the confirmed end, JSON offsets past
it are refused; ranges split at maxOffsetsPerPartition; a trigger limit is shared by what
each queue has waiting and reads exactly the limit.
"""
from __future__ import annotations

import pytest
from needs import module

module("pyspark", "the rmqha Spark source needs pyspark (the spark extra)", module_level=True)

from rmqha.errors import SparkOptionError  # noqa: E402
from rmqha.spark.broker_io import QueueBounds  # noqa: E402
from rmqha.spark.options import OffsetKind, sink_options, source_options  # noqa: E402
from rmqha.spark.planning import check_order, limit_rows, plan, resolve  # noqa: E402
from rmqha.spark.queues import QueueId, offsets_from_json, offsets_to_json  # noqa: E402

BASE = {"namesrv": "127.0.0.1:9876", "topic": "T"}
Q0, Q1 = QueueId("T", "broker-a", 0), QueueId("T", "broker-b", 1)


@pytest.mark.parametrize(("extra", "option"), [
    ({"namesrv": ""}, "namesrv"),
    ({"topic": " , "}, "topic"),
    ({"startingOffset": "earliest"}, "startingOffset"),
    ({"startingOffsets": "newest"}, "startingOffsets"),
    ({"startingOffsets": '{"T": {"broker-a": 3}}'}, "startingOffsets"),
    ({"startingOffsets": '{"U": {"broker-a:0": 3}}'}, "startingOffsets"),
    ({"startingOffsets": '{"T": {"broker-a:0": -3}}'}, "startingOffsets"),
    ({"startingOffsets": "latest"}, "startingOffsets"),
    ({"endingOffsets": "earliest"}, "endingOffsets"),
    ({"endingOffsets": '{"T": {"broker-a:0": -2}}'}, "endingOffsets"),
    ({"maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger"),
    ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"maxOffsetsPerPartition": "0"}, "maxOffsetsPerPartition"),
    ({"readTimeoutMs": "soon"}, "readTimeoutMs"),
    ({"accessKey": "rocketmq2"}, "secretKey"),
    ({"tls.client.nonsense": "x"}, "tls.client.nonsense"),
])
def test_a_bad_batch_option_is_refused_by_name(extra: dict[str, str], option: str) -> None:
    with pytest.raises(SparkOptionError) as err:
        source_options({**BASE, **extra}, streaming=False)
    assert err.value.option == option
    assert repr(option) in str(err.value)


def test_stream_only_and_batch_only_options() -> None:
    with pytest.raises(SparkOptionError) as err:
        source_options({**BASE, "endingOffsets": "latest"}, streaming=True)
    assert err.value.option == "endingOffsets"
    opts = source_options({**BASE, "maxOffsetsPerTrigger": "7", "TOPIC": "T,U"}, streaming=True)
    assert opts.max_offsets_per_trigger == 7 and opts.topics == ("T", "U")
    assert opts.starting.kind is OffsetKind.LATEST  # a stream starts at the end unless asked


def test_sink_options_and_tls_keys() -> None:
    with pytest.raises(SparkOptionError) as err:
        sink_options({**BASE, "startingOffsets": "earliest"})
    assert err.value.option == "startingOffsets"
    opts = sink_options({**BASE, "accessKey": "ak", "secretKey": "sk", "TLS.ENABLE": "true",
                         "tls.client.trustcertpath": "/ca.pem"})
    assert opts.client.tls is not None and opts.client.tls.client_trust_cert_path == "/ca.pem"
    assert "sk" not in repr(opts)


def test_latest_is_the_confirmed_end_and_json_past_it_is_refused() -> None:
    bounds = {Q0: QueueBounds(5, 50), Q1: QueueBounds(0, 7)}
    spec = source_options({**BASE, "startingOffsets": '{"T": {"broker-a:0": 10}}'}, streaming=False).starting
    assert resolve("startingOffsets", spec, bounds) == {Q0: 10, Q1: 0}  # unnamed queues: earliest
    ending = source_options(BASE, streaming=False).ending
    assert resolve("endingOffsets", ending, bounds) == {Q0: 50, Q1: 7}
    past = source_options({**BASE, "endingOffsets": '{"T": {"broker-b:1": 8}}'}, streaming=False).ending
    with pytest.raises(SparkOptionError, match="past the queue's confirmed end 7") as err:
        resolve("endingOffsets", past, bounds)
    assert err.value.option == "endingOffsets"
    unknown = source_options({**BASE, "endingOffsets": '{"T": {"broker-c:0": 1}}'}, streaming=False).ending
    with pytest.raises(SparkOptionError, match="no such queue"):
        resolve("endingOffsets", unknown, bounds)
    with pytest.raises(SparkOptionError, match="before its startingOffsets"):
        check_order({Q0: 10}, {Q0: 9})


def test_ranges_split_and_trigger_limits() -> None:
    parts = plan({Q0: 5, Q1: 0}, {Q0: 30, Q1: 0}, 10)
    assert [(p.queue, p.start, p.end) for p in parts] == [(Q0, 5, 15), (Q0, 15, 25), (Q0, 25, 30)]
    ends = limit_rows({Q0: 0, Q1: 0}, {Q0: 90, Q1: 10}, 11)
    assert sum(ends.values()) == 11 and ends[Q0] > ends[Q1] >= 1
    assert limit_rows({Q0: 0}, {Q0: 5}, 100) == {Q0: 5}
    assert offsets_from_json(offsets_to_json({Q0: 3, Q1: 4})) == {Q0: 3, Q1: 4}
    assert offsets_to_json({Q0: 3}) == {"T": {"broker-a:0": 3}}
