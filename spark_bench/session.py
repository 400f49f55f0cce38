"""The SparkSession used by every job: local mode by default, tuned for small data.

Benchmark histories are megabytes, not terabytes, so the defaults that cost time at this
scale are turned down: 200 shuffle partitions become a few, the UI and its port are off,
the driver binds to loopback, and times are UTC so run times never shift with the host.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

#: Cheaper JIT and GC for short-lived JVMs: measured 17.6 s -> 13.1 s for a small test suite
#: together with whole-stage codegen off (tests/spark_support.py's session).
FAST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: The optimising (C2) JIT only for methods hot enough to pay for it: a trends run is a
#: minute of many short query stages, and with the default thresholds the C2 compiler
#: threads used ~18 of the driver JVM's ~45 CPU-seconds at 2,000 runs x 200 benchmarks.
#: Ten to fifty times the default thresholds cut the run's CPU from ~66 to ~55 s (C1-only
#: code, -XX:TieredStopAtLevel=1, ran the executor work twice as slowly and saved nothing).
LAZY_C2_OPTIONS = ("-XX:Tier4InvocationThreshold=200000 -XX:Tier4CompileThreshold=400000 "
                   "-XX:Tier4BackEdgeThreshold=1600000")

#: Errors-only JVM logging (Spark's default prints a screen of start-up warnings).
LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


@dataclass(frozen=True)
class SessionOptions:
    """How to build the session; ``fast_start`` trades peak speed for a quicker start."""

    master: str = DEFAULT_MASTER
    app_name: str = "rmqha-spark-bench"
    shuffle_partitions: int | None = None
    fast_start: bool = False
    extra_conf: dict[str, str] = field(default_factory=dict)
    #: Keep the driver JVM's loaded classes in a class-data-sharing archive (see
    #: :func:`class_data_archive`) so later JVMs start with them mapped, not parsed.
    class_data_sharing: bool = False


#: Where the class-data archive lives (``$RMQHA_TRENDS_CACHE``, else the user's cache dir).
def _cache_dir() -> str:
    explicit = os.environ.get("RMQHA_TRENDS_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rmqha-trends")


def class_data_archive() -> str:
    """The archive for this JVM and this PySpark's jars: a JVM only accepts an archive
    made with the same runtime and class path, so both are in the name."""
    import pyspark
    java = shutil.which("java") or ""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        java = os.path.join(home, "bin", "java")
    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    key = "\n".join([os.path.realpath(java), jars, pyspark.__version__,
                     str(sorted(os.listdir(jars)) if os.path.isdir(jars) else [])])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(_cache_dir(), f"spark-driver-{pyspark.__version__}-{digest}.jsa")


#: The archive this process's JVM is writing at its exit (tmp name, final name).
_ARCHIVE_IN_PROGRESS: list[tuple[str, str]] = []


def _remove_abandoned_archives(archive: str) -> None:
    """Delete half-written archives (``<archive>.<pid>.tmp``) of runs that no longer exist:
    a run killed before its JVM exited leaves one behind."""
    if not os.path.isdir("/proc"):
        return  # no cheap way to tell a live run from a dead one
    directory, prefix = os.path.dirname(archive), os.path.basename(archive) + "."
    for name in os.listdir(directory):
        pid = name[len(prefix):-len(".tmp")] if name.startswith(prefix) and name.endswith(".tmp") else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass  # another run removed it first


def _class_data_options() -> list[str]:
    """JVM options that use the archive, or create it (under a temporary name, renamed
    once the JVM has exited, so a concurrent run never maps a half-written file)."""
    archive = class_data_archive()
    quiet = "-Xlog:cds=off,cds+dynamic=off"
    if os.path.exists(archive):
        return [f"-XX:SharedArchiveFile={archive}", quiet]
    try:
        os.makedirs(os.path.dirname(archive), exist_ok=True)
    except OSError:
        return []  # no writable cache: start without the archive
    _remove_abandoned_archives(archive)
    pending = f"{archive}.{os.getpid()}.tmp"
    _ARCHIVE_IN_PROGRESS.append((pending, archive))
    return [f"-XX:ArchiveClassesAtExit={pending}", quiet]


def java_available() -> bool:
    """True when a ``java`` launcher can be found (JAVA_HOME or PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return True
    return shutil.which("java") is not None


def _local_cores(master: str) -> int:
    if master.startswith("local[") and master.endswith("]"):
        inner = master[len("local["):-1].split(",")[0]
        if inner.isdigit():
            return int(inner)
    return os.cpu_count() or 2


def build_session(opts: SessionOptions | None = None) -> SparkSession:
    """Create (or reuse) the session; Python workers run this interpreter."""
    opts = opts or SessionOptions()
    # Local workers must import pandas/numpy/spark_bench from the driver's environment; on a
    # cluster set PYSPARK_PYTHON to the executors' interpreter (it needs numpy and pandas).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    project_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The workers import spark_bench.changepoint for the grouped UDF.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if project_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([project_root, *paths])
    partitions = opts.shuffle_partitions or max(2, _local_cores(opts.master))
    builder = (
        SparkSession.builder.master(opts.master)
        .appName(opts.app_name)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.log.structuredLogging.enabled", "false")
        .config("spark.sql.adaptive.enabled", "true")
        # collect() and toPandas() hand results over on a one-shot loopback socket the JVM
        # closes if Python has not connected within this time (15 s by default): on a
        # starved machine the Python side can be late, and the action then fails with
        # CANNOT_OPEN_SOCKET (seen in CI-like runs under load).
        .config("spark.python.authenticate.socketTimeout", "120s")
    )
    in_process = opts.master == "local" or opts.master.startswith("local[")
    if opts.master.startswith("local"):  # local[...] and local-cluster[...]: loopback only
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    java_options = [f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}", LAZY_C2_OPTIONS]
    if opts.class_data_sharing:
        java_options.extend(_class_data_options())
    if opts.fast_start:
        java_options.append(FAST_JVM_OPTIONS)
        builder = builder.config("spark.sql.codegen.wholeStage", "false")
    extra = dict(opts.extra_conf)
    if "spark.driver.extraJavaOptions" in extra:
        java_options.append(extra.pop("spark.driver.extraJavaOptions"))
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    for key, value in extra.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if not in_process:
        # Executors in other processes (other hosts, or local-cluster's JVMs) may not see
        # this installation: ship the package with the job.
        session.sparkContext.addPyFile(_package_zip())
    return session


#: Settings with this prefix are Hadoop's (Spark copies them, without it, into every Hadoop
#: configuration it makes, on the driver and in the executors).
HADOOP_PREFIX = "spark.hadoop."


def apply_runtime_conf(spark: SparkSession, conf: dict[str, str]) -> None:
    """Give a session that is already running the settings a new one would get from
    ``extra_conf``: Hadoop keys go into its Hadoop configuration (which file-source jobs
    ship to their tasks, and :mod:`spark_bench.storage` uses), the others into its runtime
    SQL settings (Spark refuses static ones with an error naming them)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in conf.items():
        if key.startswith(HADOOP_PREFIX):
            hadoop.set(key[len(HADOOP_PREFIX):], value)
        else:
            spark.conf.set(key, value)


def stop_session(spark: SparkSession, timeout: float = 60.0) -> None:
    """Stop the session; when its JVM is writing the class-data archive, wait (bounded)
    for the JVM to exit and publish the archive under its final name."""
    gateway = getattr(spark.sparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if not _ARCHIVE_IN_PROGRESS or proc is None:
        return
    pending, archive = _ARCHIVE_IN_PROGRESS.pop()
    try:
        # The gateway JVM exits when its stdin closes; it dumps the archive on the way out.
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if os.path.exists(pending) and os.path.getsize(pending) > 0 and proc.poll() == 0:
        os.replace(pending, archive)
    elif os.path.exists(pending):
        os.remove(pending)


def _package_zip() -> str:
    """spark_bench as a zip for ``addPyFile`` (workers need it for the grouped UDF)."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    target = os.path.join(tempfile.mkdtemp(prefix="spark_bench-"), "spark_bench.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(os.listdir(package_dir)):
            if name.endswith(".py"):
                zf.write(os.path.join(package_dir, name), f"spark_bench/{name}")
    return target


def _peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of a process, from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _process_tree_cpu_seconds(root: int) -> float | None:
    """User + system CPU of ``root`` and every live descendant (with their reaped
    children): the driver JVM and its Python workers. On a shared machine this, not the
    wall time, says what the job cost."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15]) / ticks  # utime stime cutime cstime
    if root not in times:
        return None
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += times.get(pid, 0.0)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total


def resource_report(spark: SparkSession) -> str:
    """Peak memory of this Python driver and of the Spark driver JVM it started, and the CPU
    time of that JVM with its Python workers (executors of a cluster are not counted; local
    mode runs them inside the driver JVM)."""
    python = _peak_rss_mib(os.getpid())
    gateway = getattr(spark.sparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    jvm = _peak_rss_mib(proc.pid) if proc is not None else None
    cpu = _process_tree_cpu_seconds(proc.pid) if proc is not None else None
    mem = [f"python driver {python:.0f} MiB" if python is not None else "python driver ?",
           f"driver JVM {jvm:.0f} MiB" if jvm is not None else "driver JVM not measured"]
    own = os.times()
    cpu_text = (f"; CPU: driver JVM + Python workers {cpu:.1f} s, python driver "
                f"{own.user + own.system:.1f} s" if cpu is not None else "")
    return "resources: peak RSS " + ", ".join(mem) + cpu_text
