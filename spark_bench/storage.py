"""Small files on any Hadoop file system, through the session's JVM.

The trend tables are Parquet written by Spark; the few other outputs (the report, its CSV
copies, the ingest log, the trends state) are text written here with Hadoop's
``FileSystem`` API, so ``--out`` may be ``file://``, ``hdfs://`` or ``s3a://`` like the tables.
A plain path (no scheme) is the driver's local file system, as it is for Spark.
"""
from __future__ import annotations

from pyspark.sql import SparkSession


def _fs(spark: SparkSession, path: str):  # noqa: ANN202 - py4j objects are untyped
    jvm = spark.sparkContext._jvm  # classic (non-Connect) session: the JVM is local
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath, hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def exists(spark: SparkSession, path: str) -> bool:
    hpath, fs = _fs(spark, path)
    return bool(fs.exists(hpath))


def glob_matches(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` (globs allowed) names anything."""
    hpath, fs = _fs(spark, path)
    statuses = fs.globStatus(hpath)
    return statuses is not None and len(statuses) > 0


def delete(spark: SparkSession, path: str) -> None:
    hpath, fs = _fs(spark, path)
    fs.delete(hpath, True)


def make_dirs(spark: SparkSession, path: str) -> None:
    hpath, fs = _fs(spark, path)
    fs.mkdirs(hpath)


def move_files(spark: SparkSession, source: str, target: str, prefix: str) -> int:
    """Move the files named ``prefix*`` of directory ``source`` into directory ``target``
    (created if missing), keeping their names: a rename each, no byte copied (Spark's part
    file names carry its write job's id, so they do not collide with those already there).
    Returns how many were moved."""
    src, fs = _fs(spark, source)
    dst = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(target)
    fs.mkdirs(dst)
    moved = 0
    for status in fs.listStatus(src):
        path = status.getPath()
        if status.isFile() and path.getName().startswith(prefix):
            if not fs.rename(path, spark.sparkContext._jvm.org.apache.hadoop.fs.Path(dst, path.getName())):
                raise OSError(f"could not move {path.toString()} into {target}")
            moved += 1
    return moved


def write_bytes(spark: SparkSession, path: str, data: bytes) -> None:
    """Create or replace ``path`` with ``data``."""
    hpath, fs = _fs(spark, path)
    stream = fs.create(hpath, True)
    try:
        chunk = 8 << 20  # py4j copies each call's byte[]; keep the copies bounded
        for start in range(0, len(data), chunk):
            stream.write(bytearray(data[start:start + chunk]))
    finally:
        stream.close()


def write_text(spark: SparkSession, path: str, text: str) -> None:
    write_bytes(spark, path, text.encode("utf-8"))


def read_text(spark: SparkSession, path: str) -> str | None:
    """The file's text, or None when it does not exist."""
    hpath, fs = _fs(spark, path)
    if not fs.exists(hpath):
        return None
    jvm = spark.sparkContext._jvm
    stream = fs.open(hpath)
    try:
        data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode("utf-8")


def fingerprint(spark: SparkSession, path: str, excluding: str | None = None) -> str:
    """Total size and file count under ``path``, less those under its child ``excluding``:
    changes whenever a Parquet table is appended to (one call per directory, whatever the
    number of files)."""
    hpath, fs = _fs(spark, path)
    if not fs.exists(hpath):
        return ""
    summary = fs.getContentSummary(hpath)
    counts = [summary.getLength(), summary.getFileCount(), summary.getDirectoryCount()]
    if excluding is not None:
        child = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(hpath, excluding)
        if fs.exists(child):
            inner = fs.getContentSummary(child)
            counts = [counts[0] - inner.getLength(), counts[1] - inner.getFileCount(),
                      counts[2] - inner.getDirectoryCount()]
    return ":".join(str(c) for c in counts)
