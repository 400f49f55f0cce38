"""Benchmark history kept in an rmqha topic: runs published as messages, read back as files.

``make bench BENCH_PUBLISH=rmqha://127.0.0.1:9876/bench-history`` sends the run's
pytest-benchmark JSON document as one message (``rmqha-trends publish``), and
``rmqha-trends trends --history rmqha://127.0.0.1:9876/bench-history`` reads the topic
through ``format("rmqha")`` (:mod:`rmqha.spark`) instead of listing files. The ingest then
treats each message as a file: its "path" is the URL with the message's queue and offset
(``rmqha://ns/topic#broker-a:0@17``), its length the body's, its modification time the
store time, its content the body; parsing, run identity, the manifest and everything after
are the files' (a message is parsed once, a run published twice is stored once), so the
report is the same as from the files themselves.

Name servers in a URL are separated by ``;`` (``rmqha://a:9876;b:9876/topic``); ACL
credentials come from the environment as for every rmqha client (``RMQHA_ACCESS_KEY``,
``RMQHA_SECRET_KEY``).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

SCHEME = "rmqha://"


@dataclass(frozen=True)
class TopicUrl:
    namesrv: str
    topic: str

    @classmethod
    def parse(cls, url: str) -> TopicUrl:
        rest = url[len(SCHEME):] if url.startswith(SCHEME) else ""
        namesrv, _, topic = rest.partition("/")
        if not namesrv or not topic or "/" in topic or "#" in topic:
            raise ValueError(f"{url!r} is not rmqha://<name server>[;<name server>...]/<topic>")
        return cls(namesrv, topic)

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.namesrv}/{self.topic}"


def is_topic(path: str) -> bool:
    return path.startswith(SCHEME)


def source_of(path: str) -> str:
    """The topic URL a message's path (``URL#group:queue@offset``) came from."""
    return path.split("#", 1)[0]


def messages(spark: SparkSession, url: str) -> DataFrame:
    """Every message of the topic as a file: ``path``, ``length``, ``modified``, ``content``."""
    from rmqha.spark import register
    where = TopicUrl.parse(url)
    register(spark)
    df = (spark.read.format("rmqha").option("namesrv", where.namesrv).option("topic", where.topic).load())
    path = F.format_string("%s#%s:%d@%d", F.lit(where.url), "brokerGroup", "queueId", "queueOffset")
    return df.select(path.alias("path"), F.length("body").cast("long").alias("length"),
                     F.col("storeTimestamp").alias("modified"), F.col("body").alias("content"))


def listing(spark: SparkSession, urls: Sequence[str]) -> DataFrame:
    """The ingest's listing (path, length, modified) of the topics' messages."""
    frames = [messages(spark, u).select("path", "length", "modified") for u in urls]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def contents(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """``path`` and ``content`` of the messages named by ``paths`` (a listing's paths)."""
    wanted = sorted(set(paths))
    frames = [messages(spark, u).filter(F.col("path").isin(*[p for p in wanted if source_of(p) == u]))
              for u in sorted({source_of(p) for p in wanted})]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out.select("path", "content")


def publish(url: str, files: Sequence[str]) -> int:
    """Send each file as one message (acknowledged sends); returns how many."""
    from rmqha.client import BlockingProducer, Message
    where = TopicUrl.parse(url)
    sent = 0
    with BlockingProducer(where.namesrv, "rmqha_trends_publisher") as producer:
        for name in files:
            with open(name, "rb") as fh:
                body = fh.read()
            result = producer.send(where.topic, Message(body=body, keys=os.path.basename(name),
                                                        properties={"file": os.path.basename(name)}))
            if not result.ok:
                raise RuntimeError(f"{name}: not acknowledged by {where.url} ({result.status.value})")
            sent += 1
    return sent
