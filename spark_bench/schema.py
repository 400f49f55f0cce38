"""Explicit Spark schemas: the pytest-benchmark JSON input and the ingested run table.

Spark never infers these: inference over thousands of files is slow, and a foreign file
would silently change the table's shape. Fields outside the input schema (``stats.data``,
``options``, cpu flags) are ignored by the JSON reader.
"""
from __future__ import annotations

from pyspark.sql import types as T

#: Spark's column for text that did not parse; it must be part of the read schema.
CORRUPT_COLUMN = "_corrupt_record"

_STATS = T.StructType([
    T.StructField("min", T.DoubleType()),
    T.StructField("max", T.DoubleType()),
    T.StructField("mean", T.DoubleType()),
    T.StructField("stddev", T.DoubleType()),
    T.StructField("rounds", T.LongType()),
    T.StructField("median", T.DoubleType()),
    T.StructField("iqr", T.DoubleType()),
    T.StructField("q1", T.DoubleType()),
    T.StructField("q3", T.DoubleType()),
    T.StructField("ops", T.DoubleType()),
    T.StructField("total", T.DoubleType()),
    T.StructField("iterations", T.LongType()),
])

_BENCHMARK = T.StructType([
    T.StructField("group", T.StringType()),
    T.StructField("name", T.StringType()),
    T.StructField("fullname", T.StringType()),
    T.StructField("params", T.MapType(T.StringType(), T.StringType())),
    T.StructField("param", T.StringType()),
    T.StructField("extra_info", T.MapType(T.StringType(), T.StringType())),
    T.StructField("stats", _STATS),
])

_CPU = T.StructType([
    T.StructField("brand_raw", T.StringType()),
    T.StructField("arch", T.StringType()),
    T.StructField("count", T.LongType()),
])

_MACHINE = T.StructType([
    T.StructField("node", T.StringType()),
    T.StructField("machine", T.StringType()),
    T.StructField("system", T.StringType()),
    T.StructField("release", T.StringType()),
    T.StructField("python_implementation", T.StringType()),
    T.StructField("python_version", T.StringType()),
    T.StructField("cpu", _CPU),
    # Added by benches/conftest.py: a stable id of the host that ran the benchmarks.
    T.StructField("rmqha_machine", T.StringType()),
])

_COMMIT = T.StructType([
    T.StructField("id", T.StringType()),
    T.StructField("time", T.StringType()),
    T.StructField("dirty", T.BooleanType()),
    T.StructField("branch", T.StringType()),
    T.StructField("project", T.StringType()),
])

#: One pytest-benchmark file (``--benchmark-json`` or autosave), as read by Spark.
BENCHMARK_FILE = T.StructType([
    T.StructField("machine_info", _MACHINE),
    T.StructField("commit_info", _COMMIT),
    T.StructField("benchmarks", T.ArrayType(_BENCHMARK)),
    T.StructField("datetime", T.StringType()),
    T.StructField("version", T.StringType()),
    # Added by benches/conftest.py: one id per pytest session (see ingest.run_id).
    T.StructField("rmqha_run", T.StringType()),
    T.StructField(CORRUPT_COLUMN, T.StringType()),
])

#: The ingested table: one row per benchmark per run.
RUN_TABLE = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("run_time", T.TimestampType(), False),
    T.StructField("commit", T.StringType()),
    T.StructField("commit_dirty", T.BooleanType()),
    T.StructField("branch", T.StringType()),
    T.StructField("machine", T.StringType(), False),
    T.StructField("python", T.StringType()),
    T.StructField("cpu", T.StringType()),
    T.StructField("benchmark", T.StringType(), False),
    T.StructField("name", T.StringType()),
    T.StructField("group", T.StringType()),
    T.StructField("params", T.MapType(T.StringType(), T.StringType())),
    T.StructField("implementation", T.StringType(), False),
    T.StructField("min", T.DoubleType()),
    T.StructField("median", T.DoubleType()),
    T.StructField("mean", T.DoubleType()),
    T.StructField("max", T.DoubleType()),
    T.StructField("stddev", T.DoubleType()),
    T.StructField("iqr", T.DoubleType()),
    T.StructField("ops", T.DoubleType()),
    T.StructField("rounds", T.LongType()),
    T.StructField("iterations", T.LongType()),
    T.StructField("extra_info", T.MapType(T.StringType(), T.StringType())),
    T.StructField("source_file", T.StringType()),
    T.StructField("ingested_at", T.TimestampType()),
])
