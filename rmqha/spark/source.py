"""``format("rmqha")``: the batch and stream readers of the rmqha Spark data source.

Batch: ``startingOffsets`` (default earliest) to ``endingOffsets`` (default latest, the
confirmed end when the read is planned).  Stream: each micro-batch reads from the previous
one's end offsets to the confirmed ends at its start (at most ``maxOffsetsPerTrigger``
rows); Spark writes both into its checkpoint before the batch runs, and a restarted query
re-runs the last planned batch over exactly the same ranges, so with a file sink (which
commits each batch id once) every message lands once.  The brokers' consumer offsets are
not touched: the checkpoint is the only position.

Each task reads one :class:`~rmqha.spark.planning.QueueRange` and yields Arrow record
batches of exactly the range's messages (see :mod:`rmqha.spark.broker_io` for what it
does when a broker does not answer, or the range is gone from the retained log).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from rmqha.spark.broker_io import QueueBounds, QueueClient
from rmqha.spark.options import SourceOptions
from rmqha.spark.planning import QueueRange, check_order, limit_rows, plan, resolve
from rmqha.spark.queues import QueueId, offsets_from_json, offsets_to_json
from rmqha.spark.rows import to_batch


def read_range(opts: SourceOptions, part: InputPartition) -> Iterator[Any]:
    """The record batches of one planned range (runs in an executor's Python worker)."""
    assert isinstance(part, QueueRange), part
    with QueueClient(opts.client) as client:
        for msgs in client.read(part.queue, part.start, part.end, batch=opts.pull_batch,
                                timeout_ms=opts.read_timeout_ms, fail_on_data_loss=opts.fail_on_data_loss):
            yield to_batch(msgs)


def _bounds(opts: SourceOptions) -> dict[QueueId, QueueBounds]:
    with QueueClient(opts.client) as client:
        return client.bounds(client.queues(opts.topics))


class BatchReader(DataSourceReader):
    """``spark.read.format("rmqha")``: one task per queue range, planned once."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[QueueRange]:  # type: ignore[override]
        bounds = _bounds(self.opts)
        starts = resolve("startingOffsets", self.opts.starting, bounds)
        ends = resolve("endingOffsets", self.opts.ending, bounds, past_confirm=self.opts.end_past_confirm)
        check_order(starts, ends)
        return plan(starts, ends, self.opts.max_offsets_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_range(self.opts, partition)


class StreamReader(DataSourceStreamReader):
    """``spark.readStream.format("rmqha")``: offsets are ``{topic: {"group:queue": n}}``.

    A queue that appears after the query started (a topic given more queues) is read from
    offset 0 of that queue."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        return offsets_to_json(resolve("startingOffsets", self.opts.starting, _bounds(self.opts)))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:  # type: ignore[override, type-arg]
        bounds = _bounds(self.opts)
        highs = {q: b.high + self.opts.end_past_confirm for q, b in bounds.items()}
        starts = offsets_from_json(start or {})
        # A queue never goes back: one missing from a refreshed route keeps its offset.
        highs.update({q: o for q, o in starts.items() if q not in highs})
        highs = {q: max(h, starts.get(q, 0)) for q, h in highs.items()}
        if limit is None:
            limit = self.getDefaultReadLimit()
        if isinstance(limit, ReadMaxRows):
            highs = limit_rows(starts, highs, limit.max_rows)
        return offsets_to_json(highs)

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:  # type: ignore[override, type-arg]
        return plan(offsets_from_json(start), offsets_from_json(end), self.opts.max_offsets_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        """Nothing to do: the position lives in Spark's checkpoint, not on the brokers."""
