"""Explicit Spark schemas: the ingested run table and the ingest's file manifest.

Spark never infers these: inference over thousands of files is slow, and a foreign file
would silently change the table's shape. The parser (:mod:`spark_bench.parse`) keeps only
these fields of a pytest-benchmark file (``stats.data``, ``options``, cpu flags are dropped).
"""
from __future__ import annotations

from pyspark.sql import types as T

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
    # When the commit was made (commit_info.time): runs are ordered by it when present, so a
    # run re-measuring an old commit lands where that commit belongs.
    T.StructField("commit_time", T.TimestampType()),
    # Flat machine_info fields (node, machine, system, release, python_implementation,
    # python_version, cpu_brand, cpu_arch, cpu_count, rmqha_machine): `trends --machine-key`
    # picks which of them name the machine, without re-ingesting.
    T.StructField("machine_info", T.MapType(T.StringType(), T.StringType())),
])

#: Machine-info fields a machine key may be built from (the keys of RUN_TABLE.machine_info).
MACHINE_FIELDS = ("node", "machine", "system", "release", "python_implementation",
                  "python_version", "cpu_brand", "cpu_arch", "cpu_count", "rmqha_machine")

#: One row per file ever looked at by ingest, stored beside the run table: a file listed
#: again with the same path, size and modification time is not read again, and one listed
#: under another name or time whose content digest is here is read but not parsed.
FILE_MANIFEST = T.StructType([
    T.StructField("path", T.StringType(), False),
    T.StructField("length", T.LongType(), False),
    T.StructField("modified", T.TimestampType(), False),
    T.StructField("run_id", T.StringType()),
    T.StructField("problem", T.StringType()),
    T.StructField("rows", T.LongType()),
    T.StructField("ingested_at", T.TimestampType()),
    # SHA-256 of the file's bytes (parse.content_digest); null in manifests written before
    # it was kept, whose files are then parsed once more if they turn up under a new key.
    T.StructField("content_digest", T.StringType()),
])
