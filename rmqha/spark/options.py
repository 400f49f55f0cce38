"""The options of ``format("rmqha")``, parsed once into typed settings, each error naming its option.

Spark hands a Python data source its options as a case-insensitive map of strings; this
module is the one place that reads them.  Names follow Spark's Kafka source where one
exists (``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``), so Kafka users find what they know; the rest are rmqha's client
settings (``namesrv``, ``accessKey``/``secretKey``, RocketMQ's ``tls.*`` keys).

An option nobody reads is an error, not a silent default: ``startingOffset`` (a typo)
would otherwise read the whole topic from the start.  Offsets per queue are JSON keyed by
topic, then by ``"<broker group>:<queue id>"``, with ``-2`` for earliest and ``-1`` for
latest as in Kafka's source: ``{"Orders": {"broker-a:0": 120, "broker-b:3": -2}}``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from rmqha.errors import ConfigError, SparkOptionError
from rmqha.security.tls import TlsSettings
from rmqha.spark.queues import QueueId

#: Kafka's markers inside a per-queue offsets JSON.
EARLIEST_MARK = -2
LATEST_MARK = -1

#: A planned range longer than this is read by several Spark tasks (one queue's range is
#: otherwise one task: a topic with 2 queues and 1 M messages would use 2 cores only).
DEFAULT_MAX_OFFSETS_PER_PARTITION = 100_000
#: How long a partition waits for offsets it was planned to read (a replica catching up
#: after a failover serves them once it has confirmed them again).
DEFAULT_READ_TIMEOUT_MS = 120_000
#: Messages asked for per pull (the broker caps one answer at 1024 and at its byte limit).
DEFAULT_PULL_BATCH = 1024

_SECURITY = ("accesskey", "secretkey")
#: RocketMQ's client TLS keys (rmqha.security.tls reads them); Spark hands options over
#: lower-cased, so they are matched without case and passed on as spelled here.
TLS_CLIENT_KEYS = ("tls.enable", "tls.client.certPath", "tls.client.keyPath", "tls.client.keyPassword",
                   "tls.client.trustCertPath", "tls.client.authServer")
_TLS_BY_LOWER = {k.lower(): k for k in TLS_CLIENT_KEYS}
#: Test only: plan each queue's latest this many offsets past what the broker reports as
#: readable, as a reader that ignored the confirm offset would (the tests' negative control).
TEST_END_PAST_CONFIRM = "testOnlyEndPastConfirm"


class OffsetKind(Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    PER_QUEUE = "json"


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest``, or offsets per queue (queues not named: ``default``)."""

    kind: OffsetKind
    per_queue: Mapping[QueueId, int] = field(default_factory=dict)
    default: OffsetKind = OffsetKind.EARLIEST


@dataclass(frozen=True)
class ClientOptions:
    """What every rmqha client made for Spark needs: where and how to connect."""

    namesrv: str
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    tls: TlsSettings | None = None


@dataclass(frozen=True)
class SourceOptions:
    client: ClientOptions
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    max_offsets_per_partition: int
    read_timeout_ms: int
    pull_batch: int
    end_past_confirm: int = 0


@dataclass(frozen=True)
class SinkOptions:
    client: ClientOptions
    #: The topic of rows without a ``topic`` column (or with a null one).
    topic: str | None
    producer_group: str


def _known(options: Mapping[str, str], allowed: set[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low.startswith("tls."):
            continue
        if low not in allowed:
            # Spark lower-cases option names before a Python data source sees them.
            raise SparkOptionError(key, f"unknown option of the rmqha {what} (known: "
                                   f"{', '.join(sorted(_SPELLING.get(k, k) for k in allowed))}, tls.*)")
        out[low] = str(value)
    return out


def _client(opts: Mapping[str, str], raw: Mapping[str, str]) -> ClientOptions:
    namesrv = opts.get("namesrv", "").strip()
    if not namesrv:
        raise SparkOptionError("namesrv", "required: the name servers, host:port[;host:port...]")
    ak, sk = opts.get("accesskey") or None, opts.get("secretkey") or None
    if (ak is None) != (sk is None):
        raise SparkOptionError("accessKey" if ak is None else "secretKey",
                               "accessKey and secretKey are given together or not at all")
    tls_keys: dict[str, str] = {}
    for key, value in raw.items():
        if key.lower().startswith("tls."):
            canonical = _TLS_BY_LOWER.get(key.lower())
            if canonical is None:
                raise SparkOptionError(key, f"not a client TLS key (known: {', '.join(TLS_CLIENT_KEYS)})")
            tls_keys[canonical] = str(value)
    tls = None
    if tls_keys:
        try:
            tls = TlsSettings.from_properties(tls_keys, "the rmqha Spark options")
        except ConfigError as exc:
            raise SparkOptionError("tls.*", str(exc)) from exc
        tls = tls if tls.client_enable else None
    return ClientOptions(namesrv, ak, sk, tls)


def _positive(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SparkOptionError(name, f"{text!r} is not a whole number") from None
    if value <= 0:
        raise SparkOptionError(name, f"{value} is not positive")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise SparkOptionError(name, f"{text!r} is neither true nor false")


def parse_offsets(name: str, text: str | None, default: OffsetKind, topics: tuple[str, ...]) -> OffsetSpec:
    """``earliest``, ``latest`` or per-queue JSON (see the module's docstring)."""
    if text is None:
        return OffsetSpec(default)
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return OffsetSpec(OffsetKind(word))
    try:
        data = json.loads(text)
    except ValueError:
        raise SparkOptionError(name, f"{text!r} is not earliest, latest or JSON offsets per queue") from None
    if not isinstance(data, dict):
        raise SparkOptionError(name, 'JSON offsets are an object: {"topic": {"broker-a:0": 42}}')
    per_queue: dict[QueueId, int] = {}
    for topic, queues in data.items():
        if topic not in topics:
            raise SparkOptionError(name, f"topic {topic!r} is not one of the topics read ({', '.join(topics)})")
        if not isinstance(queues, dict):
            raise SparkOptionError(name, f"topic {topic!r}: expected an object of queues, got {queues!r}")
        for key, offset in queues.items():
            try:
                qid = QueueId.parse(topic, key)
            except ValueError as exc:
                raise SparkOptionError(name, str(exc)) from None
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST_MARK:
                raise SparkOptionError(name, f"{topic} {key}: offset {offset!r} is not an offset, -1 or -2")
            per_queue[qid] = offset
    return OffsetSpec(OffsetKind.PER_QUEUE, per_queue, default)


#: How the docs spell the options (Spark hands them over lower-cased).
_SPELLING = {k.lower(): k for k in (
    "startingOffsets", "endingOffsets", "maxOffsetsPerTrigger", "failOnDataLoss", "maxOffsetsPerPartition",
    "readTimeoutMs", "pullBatch", "accessKey", "secretKey", "producerGroup", TEST_END_PAST_CONFIRM)}

_SOURCE_KEYS = {"namesrv", "topic", "startingoffsets", "endingoffsets", "maxoffsetspertrigger",
                "failondataloss", "maxoffsetsperpartition", "readtimeoutms", "pullbatch",
                TEST_END_PAST_CONFIRM.lower(), *_SECURITY}


def source_options(raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The options of ``spark.read`` (``streaming=False``) or ``spark.readStream``."""
    opts = _known(raw, _SOURCE_KEYS, "source")
    topics = tuple(t.strip() for t in opts.get("topic", "").split(",") if t.strip())
    if not topics:
        raise SparkOptionError("topic", "required: a topic, or several separated by commas")
    if streaming and "endingoffsets" in opts:
        raise SparkOptionError("endingOffsets", "a stream has no end (batch reads only)")
    starting = parse_offsets("startingOffsets", opts.get("startingoffsets"),
                             OffsetKind.LATEST if streaming else OffsetKind.EARLIEST, topics)
    ending = parse_offsets("endingOffsets", opts.get("endingoffsets"), OffsetKind.LATEST, topics)
    if ending.kind is OffsetKind.EARLIEST:
        raise SparkOptionError("endingOffsets", "earliest is not an end (latest or JSON)")
    if any(v == EARLIEST_MARK for v in ending.per_queue.values()):
        raise SparkOptionError("endingOffsets", "-2 (earliest) is not an end")
    if not streaming and "maxoffsetspertrigger" in opts:
        raise SparkOptionError("maxOffsetsPerTrigger", "streams only (a batch read has no triggers)")
    if not streaming and starting.kind is OffsetKind.LATEST:
        raise SparkOptionError("startingOffsets", "latest would read nothing in a batch read")
    end_past = _positive(opts, TEST_END_PAST_CONFIRM, None) or 0
    return SourceOptions(
        client=_client(opts, raw), topics=topics, starting=starting, ending=ending,
        max_offsets_per_trigger=_positive(opts, "maxOffsetsPerTrigger", None),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        max_offsets_per_partition=_positive(opts, "maxOffsetsPerPartition", DEFAULT_MAX_OFFSETS_PER_PARTITION)
        or DEFAULT_MAX_OFFSETS_PER_PARTITION,
        read_timeout_ms=_positive(opts, "readTimeoutMs", DEFAULT_READ_TIMEOUT_MS) or DEFAULT_READ_TIMEOUT_MS,
        pull_batch=_positive(opts, "pullBatch", DEFAULT_PULL_BATCH) or DEFAULT_PULL_BATCH,
        end_past_confirm=end_past)


_SINK_KEYS = {"namesrv", "topic", "producergroup", *_SECURITY}


def sink_options(raw: Mapping[str, str]) -> SinkOptions:
    """The options of ``df.write.format("rmqha")``."""
    opts = _known(raw, _SINK_KEYS, "sink")
    topic = opts.get("topic", "").strip() or None
    if topic is not None and "," in topic:
        raise SparkOptionError("topic", "the sink writes to one topic (or each row's topic column)")
    return SinkOptions(_client(opts, raw), topic, opts.get("producergroup", "").strip() or "rmqha_spark_sink")
