"""``df.write.format("rmqha")``: every row sent with an acknowledged send (at least once).

Each task sends its rows with one :class:`~rmqha.client.BlockingProducer`, in batches of
up to :data:`BATCH_ROWS` rows per topic, and checks every result: only SEND_OK (stored
and acknowledged by the group's ack policy) counts.  Anything else fails the task, and
Spark runs it again, so a row may be stored twice (a send stored but not acknowledged,
or a task retried after some of its batches went out): **at least once**, never exactly
once.  Rows carry ``body`` (binary or string) and optionally ``topic`` (else the
``topic`` option), ``tags``, ``keys`` and ``properties`` (map of strings).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from rmqha.client import BlockingProducer, Message
from rmqha.errors import SparkOptionError, SparkSourceError
from rmqha.spark.options import SinkOptions

#: Rows per send_batch: one request per this many rows of a topic (1 KiB rows: ~256 KiB).
BATCH_ROWS = 256

_COLUMNS = {"topic": (StringType,), "body": (BinaryType, StringType), "tags": (StringType,),
            "keys": (StringType,), "properties": (MapType,)}


@dataclass
class SentCount(WriterCommitMessage):
    rows: int


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """The columns a row may have, each of its type; an error names the column."""
    names = schema.fieldNames()
    if "body" not in names:
        raise SparkOptionError("body", "the rows to write need a body column (binary or string)")
    if "topic" not in names and opts.topic is None:
        raise SparkOptionError("topic", "required when the rows have no topic column")
    for f in schema.fields:
        allowed = _COLUMNS.get(f.name)
        if allowed is None:
            raise SparkOptionError(f.name, f"unknown column (the sink reads {', '.join(_COLUMNS)})")
        if not isinstance(f.dataType, allowed):
            raise SparkOptionError(f.name, f"column of type {f.dataType.simpleString()}, expected "
                                   f"{' or '.join(t.typeName() for t in allowed)}")


def _message(data: dict[str, Any]) -> Message:
    body = data["body"]
    if body is None:
        raise SparkSourceError("a row has a null body")
    return Message(body=body.encode() if isinstance(body, str) else bytes(body), tags=data.get("tags"),
                   keys=data.get("keys"), properties=dict(data.get("properties") or {}))


class Writer(DataSourceWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> SentCount:
        client = self.opts.client
        sent = 0
        pending: dict[str, list[Message]] = {}
        with BlockingProducer(client.namesrv, self.opts.producer_group, access_key=client.access_key,
                              secret_key=client.secret_key, tls=client.tls) as producer:
            for row in iterator:
                data = row.asDict()
                topic = data.get("topic") or self.opts.topic
                if not topic:
                    raise SparkSourceError("a row has no topic and the topic option is not set")
                batch = pending.setdefault(topic, [])
                batch.append(_message(data))
                if len(batch) >= BATCH_ROWS:
                    sent += self._send(producer, topic, pending.pop(topic))
            for topic, batch in pending.items():
                sent += self._send(producer, topic, batch)
        return SentCount(sent)

    @staticmethod
    def _send(producer: BlockingProducer, topic: str, batch: list[Message]) -> int:
        for result in producer.send_batch(topic, batch):
            if not result.ok:
                raise SparkSourceError(f"send to {topic} not acknowledged: {result.status.value} "
                                       f"({result.queue.broker_name}:{result.queue.queue_id} offset "
                                       f"{result.queue_offset}); the task fails and Spark retries it")
        return len(batch)
