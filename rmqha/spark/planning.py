"""Which offsets a read covers: options resolved against the brokers, ranges split for tasks.

Pure functions over :class:`~rmqha.spark.broker_io.QueueBounds`, so the rules are tested
without Spark: ``earliest`` is a queue's min offset, ``latest`` its confirmed end (never
past it: see :mod:`rmqha.spark.broker_io`), JSON offsets are checked against both, and a
stream's trigger limit is shared between queues in proportion to what each has waiting
(Kafka's rule), so no queue starves.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from rmqha.errors import SparkOptionError
from rmqha.spark.broker_io import QueueBounds
from rmqha.spark.options import EARLIEST_MARK, LATEST_MARK, OffsetKind, OffsetSpec
from rmqha.spark.queues import QueueId


@dataclass
class QueueRange(InputPartition):
    """One Spark task's work: offsets ``[start, end)`` of one queue (pyspark's documented
    way of subclassing InputPartition: a dataclass, no ``value``)."""

    queue: QueueId
    start: int
    end: int


def resolve(option: str, spec: OffsetSpec, bounds: Mapping[QueueId, QueueBounds], *,
            past_confirm: int = 0) -> dict[QueueId, int]:
    """``spec`` (the option named ``option``) as an offset for every queue of ``bounds``.

    ``past_confirm`` is the tests' negative control only: latest planned that many offsets
    past the confirmed end."""
    unknown = sorted(set(spec.per_queue) - set(bounds))
    if unknown:
        names = ", ".join(f"{q.topic} {q.key}" for q in unknown)
        raise SparkOptionError(option, f"no such queue in the topics' routes: {names}")
    out: dict[QueueId, int] = {}
    for q, b in bounds.items():
        value = spec.per_queue.get(q)
        kind = spec.kind if spec.kind is not OffsetKind.PER_QUEUE else spec.default
        if value == EARLIEST_MARK or (value is None and kind is OffsetKind.EARLIEST):
            out[q] = b.low
        elif value == LATEST_MARK or (value is None and kind is OffsetKind.LATEST):
            out[q] = b.high + past_confirm
        else:
            assert value is not None
            if value > b.high:
                raise SparkOptionError(option, f"{q.topic} {q.key}: offset {value} is past the queue's confirmed "
                                       f"end {b.high} (unreplicated messages are not readable yet)")
            out[q] = value
    return out


def check_order(starts: Mapping[QueueId, int], ends: Mapping[QueueId, int]) -> None:
    for q, start in starts.items():
        if ends.get(q, start) < start:
            raise SparkOptionError("endingOffsets", f"{q.topic} {q.key}: ends at {ends[q]}, before its "
                                   f"startingOffsets {start}")


def limit_rows(starts: Mapping[QueueId, int], highs: Mapping[QueueId, int], max_rows: int) -> dict[QueueId, int]:
    """Ends that read at most ``max_rows`` in all, shared by waiting count (largest first)."""
    lag = {q: max(0, highs[q] - starts.get(q, 0)) for q in highs}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(highs)
    share = {q: lag[q] * max_rows // total for q in lag}
    spare = max_rows - sum(share.values())
    for q in sorted(lag, key=lambda k: (-lag[k], k)):
        if spare <= 0:
            break
        if share[q] < lag[q]:
            share[q] += 1
            spare -= 1
    return {q: starts.get(q, 0) + share[q] for q in highs}


def plan(starts: Mapping[QueueId, int], ends: Mapping[QueueId, int], max_per_partition: int) -> list[QueueRange]:
    """One range per queue with something to read, split every ``max_per_partition``."""
    out: list[QueueRange] = []
    for q in sorted(ends):
        start, end = starts.get(q, 0), ends[q]
        while start < end:
            stop = min(end, start + max_per_partition)
            out.append(QueueRange(q, start, stop))
            start = stop
    return out
