"""Ingest: pytest-benchmark JSON files -> one Parquet row per benchmark per run.

Everything that touches the data runs in Spark, so ``paths`` and ``table`` may be any URL
Hadoop can open (``file://``, ``hdfs://``, ``s3a://``) and executors read the files
themselves; the driver only sees file names and small per-file summaries.

* **Listing** is Spark's ``binaryFile`` source with the content column pruned (so it reads
  no bytes): path, size and modification time of every ``*.json`` under ``paths``.
* **Incremental**: beside the table, ``<table>/_files`` (a Parquet manifest; Spark skips
  ``_`` names when it reads the table) records every file already looked at, with a digest
  of its content. A file listed again with the same path, size and modification time is
  not read again, so a rerun with nothing new costs one listing and one small Parquet
  read. A file under a new path or time (a fresh checkout, a restored cache, a copy) is
  read and hashed, and parsed only if its digest is not in the manifest.
* **Parsing**: executors read each new file whole with ``binaryFile`` and parse it in
  their Python workers (:mod:`spark_bench.parse`, through ``mapInArrow``): 7x faster than
  Spark's JSON reader on these documents, and a file that is not a benchmark run becomes a
  row we can name and skip instead of an exception. In local mode the workers open
  ``file:`` paths themselves, which spares the JVM a copy of every file's bytes.
* **One columnar write**: the parsed rows are staged once, in the table's own column order
  and types (plus the parser's ``problem`` and ``content_digest``, which the table's explicit
  schema never reads). When every staged row is a usable row of a new run (the usual case:
  new files, one per run, all valid) the staged Parquet files are *moved* into the table
  (a rename per file); only a batch with duplicates, bad files or known contents is
  filtered and rewritten. Moving spared re-reading and re-writing all 400,000 rows of a
  2,000-run first ingest (a quarter of the ingest's JVM CPU).
* **Run identity**: the session id benches/conftest.py writes (``rmqha_run``) or, for any
  other file, a hash of the document's content except its ``datetime`` (machine, commit and
  every benchmark's name and stats). ``--benchmark-autosave`` and ``--benchmark-json`` of one session
  write the same content stamped with different times, so they are one run; a copy of a
  file under another name is one run too. Rows are keyed by ``(run_id, benchmark)``.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from functools import partial

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_bench import parse, storage, topic_history
from spark_bench.schema import FILE_MANIFEST, RUN_TABLE

#: What the parser gives: the run table's columns (all nullable), ``problem`` and
#: ``content_digest``.
PARSED_ROWS = T.StructType([
    T.StructField(n, RUN_TABLE[n].dataType if n in RUN_TABLE.names else T.StringType())
    for n in parse.ARROW_SCHEMA.names])
#: Manifest directory inside the table directory.
MANIFEST_DIR = "_files"
#: Characters Hadoop treats as glob syntax in a path given to a reader.
_GLOB_CHARS = "\\[]{}*?"


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass
class IngestResult:
    """What one ingest did; ``skipped`` names every new file that was not used and why."""

    table: str
    files_seen: int = 0
    files_new: int = 0
    files_ingested: int = 0
    #: New by path, size or time, but with content the manifest holds: hashed, not parsed.
    files_known_content: int = 0
    rows_read: int = 0
    rows_new: int = 0
    rows_duplicate: int = 0
    entries_invalid: int = 0
    seconds: float = 0.0
    skipped: list[SkippedFile] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "table": self.table, "files_seen": self.files_seen, "files_new": self.files_new,
            "files_ingested": self.files_ingested,
            "files_known_content": self.files_known_content, "rows_read": self.rows_read,
            "rows_new": self.rows_new, "rows_duplicate": self.rows_duplicate,
            "entries_invalid": self.entries_invalid, "seconds": round(self.seconds, 3),
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
        }


def table_exists(spark: SparkSession, path: str) -> bool:
    return storage.exists(spark, path)


def manifest_path(table: str) -> str:
    return f"{table.rstrip('/')}/{MANIFEST_DIR}"


def list_json_files(spark: SparkSession, paths: list[str]) -> DataFrame:
    """``path``, ``length``, ``modified`` of every ``*.json`` file under ``paths`` (files,
    directories searched recursively, or globs). Spark lists (in parallel for many
    directories) and skips hidden names (``.x``, ``_x``) and zero-length files as it does for
    tables."""
    topics = [p for p in paths if topic_history.is_topic(p)]
    present = [p for p in paths if not topic_history.is_topic(p) and storage.glob_matches(spark, p)]
    listed = [topic_history.listing(spark, topics)] if topics else []
    if present:
        listed.append(spark.read.format("binaryFile")
                      .option("pathGlobFilter", "*.json").option("recursiveFileLookup", "true")
                      .load(present)
                      .select("path", "length", F.col("modificationTime").alias("modified")))
    if not listed:
        return spark.createDataFrame([], FILE_MANIFEST).select("path", "length", "modified")
    return listed[0] if len(listed) == 1 else listed[0].unionByName(listed[1])


def _escape_glob(path: str) -> str:
    return "".join("\\" + c if c in _GLOB_CHARS else c for c in path)


def executors_share_driver_files(spark: SparkSession) -> bool:
    """Local mode: the executors run in the driver's JVM, on the driver's file system
    (``local-cluster[...]`` starts executors of their own and counts as a cluster)."""
    master = spark.sparkContext.master
    return master == "local" or master.startswith("local[")


def parse_files(spark: SparkSession, files: list[str],
                known: frozenset[str] = frozenset()) -> DataFrame:
    """Rows (:data:`PARSED_ROWS`) of ``files``, parsed by :mod:`spark_bench.parse` in the
    executors' Python workers: from the bytes ``binaryFile`` read, or, for ``file:`` paths
    in local mode, read by the workers themselves (the file contents then never pass
    through the JVM). Files whose content digest is in ``known`` are hashed, not parsed.
    Messages of a history topic (:mod:`spark_bench.topic_history`) are parsed from their
    bodies as files are from their bytes."""
    messages = [f for f in files if topic_history.is_topic(f)]
    if messages:
        parsed = topic_history.contents(spark, messages).mapInArrow(
            partial(parse.parse_batches, known=known), PARSED_ROWS)
        others = [f for f in files if not topic_history.is_topic(f)]
        return parsed.unionByName(parse_files(spark, others, known)) if others else parsed
    if executors_share_driver_files(spark) and all(f.startswith("file:") for f in files):
        # Round-robin, so every core gets about as many files (and no lone last task).
        slices = max(1, min(len(files), 2 * spark.sparkContext.defaultParallelism))
        names = spark.createDataFrame([(f,) for f in files], "path string").repartition(slices)
        return names.mapInArrow(partial(parse.read_and_parse_batches, known=known), PARSED_ROWS)
    raw = spark.read.format("binaryFile").load([_escape_glob(f) for f in files])
    return raw.select("path", "content").mapInArrow(partial(parse.parse_batches, known=known),
                                                    PARSED_ROWS)


def known_contents(manifest: DataFrame | None, lengths: set[int]) -> dict[str, Row]:
    """Digest -> (run_id, problem, rows) of the contents the manifest holds that are
    ``lengths`` bytes long (no other can be one of the new files': a new file of a
    100,000-file history does not ship 100,000 digests to the executors)."""
    if manifest is None or not lengths:
        return {}
    rows = (manifest.filter(F.col("content_digest").isNotNull()
                            & F.col("length").isin(*sorted(lengths)))
            .select("content_digest", "run_id", "problem", "rows")
            .dropDuplicates(["content_digest"]).collect())
    return {r["content_digest"]: r for r in rows}


def conform(df: DataFrame) -> DataFrame:
    """Columns in table order and type, so every append writes the same Parquet schema."""
    return df.select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in RUN_TABLE.fields))


def read_table(spark: SparkSession, table: str) -> DataFrame:
    return spark.read.schema(RUN_TABLE).parquet(table)


def read_manifest(spark: SparkSession, table: str) -> DataFrame | None:
    path = manifest_path(table)
    return spark.read.schema(FILE_MANIFEST).parquet(path) if table_exists(spark, path) else None


def ingest(spark: SparkSession, paths: list[str], table: str) -> IngestResult:
    """Add the runs in the new files under ``paths`` to the Parquet ``table`` (created if
    missing) and record every new file in the manifest.

    New files are parsed once, into a staging directory inside the table (Parquet, so the
    per-file summary, the duplicate check and the append read columns, not JSON). A run
    already in the table, or in two new files, is stored once. One writer per table at a
    time; a crash before the manifest append only means the files are looked at again.
    """
    started = time.perf_counter()
    result = IngestResult(table=table)
    listing = list_json_files(spark, paths)
    manifest = read_manifest(spark, table)
    if manifest is not None:
        listing_rows = listing.join(
            manifest.select("path", "length", "modified", F.lit(True).alias("_known")),
            ["path", "length", "modified"], "left").collect()
    else:
        listing_rows = listing.withColumn("_known", F.lit(None).cast("boolean")).collect()
    result.files_seen = len(listing_rows)
    new = [r for r in listing_rows if not r["_known"]]
    result.files_new = len(new)
    if not new:
        result.seconds = time.perf_counter() - started
        return result

    known = known_contents(manifest, {r["length"] for r in new})
    staging = f"{table.rstrip('/')}/_staging-{uuid.uuid4().hex}"
    try:
        parsed = parse_files(spark, [r["path"] for r in new], frozenset(known))
        staged_columns = [*(F.col(f.name).cast(f.dataType).alias(f.name) for f in RUN_TABLE.fields
                            if f.name != "ingested_at"),
                          F.current_timestamp().alias("ingested_at"), "problem", "content_digest"]
        parsed.select(*staged_columns).write.parquet(staging)
        staged = spark.read.parquet(staging)
        usable = F.col("benchmark").isNotNull() & F.col("median").isNotNull()
        per_file = {r["source_file"]: r for r in (
            staged.groupBy("source_file")
            .agg(F.first("problem", ignorenulls=True).alias("problem"),
                 F.first("content_digest", ignorenulls=True).alias("content_digest"),
                 F.first("run_id", ignorenulls=True).alias("run_id"),
                 F.sum(usable.cast("int")).alias("usable"), F.count("*").alias("rows"),
                 F.sum((~usable & F.col("problem").isNull()).cast("int")).alias("invalid"))
            .collect())}

        known_runs: set[str] = set()
        if table_exists(spark, table):
            known_runs = {r["run_id"] for r in
                          read_table(spark, table).select("run_id").distinct().collect()}
        manifest_rows = []
        fresh_runs: dict[str, str] = {}  # run id -> the one new file its rows are taken from
        for entry in new:
            path = entry["path"]
            summary = per_file.get(path)
            digest = None if summary is None else summary["content_digest"]
            if digest in known:
                # Stored already under another name or time: record this one, use nothing.
                before = known[digest]
                result.files_known_content += 1
                manifest_rows.append((path, entry["length"], entry["modified"], before["run_id"],
                                      before["problem"], before["rows"], None, digest))
                continue
            problem = "empty file or no JSON document" if summary is None else summary["problem"]
            run_id = None if summary is None else summary["run_id"]
            usable_rows = 0 if summary is None else int(summary["usable"] or 0)
            if problem is None and not usable_rows:
                problem = "no benchmark entry with a name and a median"
            if problem is not None:
                result.skipped.append(SkippedFile(path, problem))
            else:
                result.files_ingested += 1
                result.rows_read += usable_rows
                result.entries_invalid += int(summary["invalid"] or 0)
                if run_id not in known_runs and path < fresh_runs.get(run_id, "\uffff"):
                    fresh_runs[run_id] = path
            manifest_rows.append((path, entry["length"], entry["modified"], run_id, problem,
                                  usable_rows, None, digest))
        result.skipped.sort(key=lambda s: s.path)

        if fresh_runs:
            # One copy of a run saved in several files (autosave + json, copies): its rows
            # come from one file, chosen here, so no shuffle is needed to drop the others.
            sources = sorted(set(fresh_runs.values()))
            result.rows_new = int(sum(int(per_file[p]["usable"] or 0) for p in sources))
            if result.rows_new == sum(int(s["rows"]) for s in per_file.values()):
                # Every staged row is wanted: the staged files become the table's.
                storage.move_files(spark, staging, table, prefix="part-")
            else:
                fresh = staged.filter(usable & F.col("problem").isNull()
                                      & F.col("source_file").isin(*sources))
                conform(fresh.withColumn("ingested_at", F.current_timestamp())
                        ).write.mode("append").parquet(table)
        result.rows_duplicate = result.rows_read - result.rows_new
        (spark.createDataFrame(manifest_rows, FILE_MANIFEST)
         .withColumn("ingested_at", F.current_timestamp())
         .coalesce(1).write.mode("append").parquet(manifest_path(table)))
    finally:
        storage.delete(spark, staging)
    result.seconds = time.perf_counter() - started
    return result
