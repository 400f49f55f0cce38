"""What a trend series is: its kind and the direction of a change.

Kept apart from the Spark job so the report and the CI gate (pandas only) share the names.
"""
from __future__ import annotations

from enum import StrEnum


class SeriesKind(StrEnum):
    #: One benchmark on one machine with one implementation (seconds, lower is better;
    #: or ops/s, higher is better).
    BENCHMARK = "benchmark"
    #: A speed-up of an rmqha twin over another implementation in the same run (higher is better).
    RATIO = "ratio"


class Direction(StrEnum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
