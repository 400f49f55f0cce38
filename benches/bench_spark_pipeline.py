"""The Spark trend pipeline: ingest, rerun with nothing new, trends, report, end to end.

Full size is the issue's 2,000 runs x 200 benchmarks (400,000 rows plus 500,000 ratio
points, 450 series); RMQHA_BENCH_QUICK=1 uses 200 runs x 40 benchmarks. Each stage runs
once per benchmark round (pedantic, one round): a stage takes seconds to minutes, and a
warm-up round would double the cost without making the figure more honest. Rates, the
driver's peak memory and the CPU time of the driver JVM with its Python workers go to
extra_info: on a shared machine the CPU time says what a stage cost, the wall time what it
took. The end-to-end stage is the command line (``rmqha-trends trends``) in a fresh
process, so it includes the JVM start, as a user sees it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from conftest import QUICK, describe

RUNS, BENCHMARKS = (200, 40) if QUICK else (2000, 200)

_HAVE_SPARK = importlib.util.find_spec("pyspark") is not None and (
    shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME")))

pytestmark = [
    pytest.mark.skipif(not _HAVE_SPARK, reason="needs pyspark and Java 17+"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

#: Outputs shared by the stages, in file order: ingest -> rerun -> trends -> report.
_STATE: dict[str, object] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):  # noqa: ANN201
    from spark_bench import synthetic
    root = tmp_path_factory.mktemp("spark_pipeline")
    # A few real steps so the change-point stage does representative work.
    steps = {i: [(RUNS * 3 // 4, 1.2)] for i in range(0, BENCHMARKS, 10)}
    steps.update({i: [(RUNS // 3, 0.85)] for i in range(5, BENCHMARKS, 20)})
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=BENCHMARKS, noise=0.03, spike_rate=0.01,
                                 steps=steps)
    synthetic.write_history(spec, str(root / "history"))
    return root


@pytest.fixture(scope="module")
def spark():  # noqa: ANN201
    from spark_bench.session import SessionOptions, build_session
    session = build_session(SessionOptions(master="local[*]"))
    yield session
    session.stop()


def _resources(spark) -> dict[str, object]:  # noqa: ANN001
    from spark_bench.session import _peak_rss_mib, _process_tree_cpu_seconds
    proc = spark.sparkContext._gateway.proc
    cpu = _process_tree_cpu_seconds(proc.pid)
    return {"driver_jvm_peak_mib": round(_peak_rss_mib(proc.pid) or 0),
            "python_peak_mib": round(_peak_rss_mib(os.getpid()) or 0),
            "jvm_and_workers_cpu_s_total": round(cpu or 0.0, 1)}


def _ingest(spark, workdir):  # noqa: ANN001, ANN202
    from spark_bench.ingest import ingest
    table = str(workdir / "out" / "runs.parquet")
    shutil.rmtree(table, ignore_errors=True)
    result = ingest(spark, [str(workdir / "history")], table)
    _STATE["table"] = table
    return result


def _trends(spark, workdir):  # noqa: ANN001, ANN202
    from spark_bench import trends
    from spark_bench.ingest import read_table
    if "table" not in _STATE:
        _ingest(spark, workdir)
    tables = trends.compute(read_table(spark, _STATE["table"]), str(workdir / "out"))
    counts = (tables.series.count(), tables.summary.count(), tables.changes.count())
    _STATE["trends"] = tables
    return counts


@pytest.mark.benchmark(group="spark-pipeline")
def test_ingest(benchmark, spark, workdir) -> None:  # noqa: ANN001
    result = benchmark.pedantic(_ingest, args=(spark, workdir), rounds=1, iterations=1)
    assert result.rows_new == RUNS * BENCHMARKS
    seconds = benchmark.stats.stats.median
    describe(benchmark, "pyspark", runs=RUNS, benchmarks=BENCHMARKS, rows=result.rows_new,
             files=result.files_seen, rows_per_s=round(result.rows_new / seconds),
             files_per_s=round(result.files_seen / seconds, 1), quick=QUICK, **_resources(spark))


@pytest.mark.benchmark(group="spark-pipeline")
def test_ingest_nothing_new(benchmark, spark, workdir) -> None:  # noqa: ANN001
    from spark_bench.ingest import ingest
    if "table" not in _STATE:
        _ingest(spark, workdir)
    result = benchmark.pedantic(ingest, args=(spark, [str(workdir / "history")], _STATE["table"]),
                                rounds=1, iterations=1)
    assert (result.files_seen, result.files_new) == (RUNS, 0)
    describe(benchmark, "pyspark", runs=RUNS, benchmarks=BENCHMARKS, files=result.files_seen,
             quick=QUICK, **_resources(spark))


@pytest.mark.benchmark(group="spark-pipeline")
def test_trends(benchmark, spark, workdir) -> None:  # noqa: ANN001
    points, series, changes = benchmark.pedantic(_trends, args=(spark, workdir), rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median
    describe(benchmark, "pyspark", runs=RUNS, benchmarks=BENCHMARKS, input_rows=RUNS * BENCHMARKS,
             series_points=points, series=series, changes=changes,
             rows_per_s=round(RUNS * BENCHMARKS / seconds),
             points_per_s=round(points / seconds), quick=QUICK, **_resources(spark))


@pytest.mark.benchmark(group="spark-pipeline")
def test_report(benchmark, spark, workdir) -> None:  # noqa: ANN001
    from spark_bench import gate, report
    if "trends" not in _STATE:
        _trends(spark, workdir)
    tables = _STATE["trends"]
    summary, changes = tables.summary.toPandas(), tables.changes.toPandas()
    ids = report.plotted_series(summary, changes, gate.failing(summary, changes))
    points = tables.series.filter(tables.series["series_id"].isin(ids)).select(*report.POINT_COLUMNS).toPandas()
    result = benchmark.pedantic(report.render, args=(summary, changes, points), rounds=1, iterations=1)
    describe(benchmark, "plotly", runs=RUNS, benchmarks=BENCHMARKS, series=len(summary),
             plots=result.plots, html_bytes=len(result.html.encode()), quick=QUICK)


def _cli(history: str, out: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_bench", "trends", "--history", history,
                           "--out", out, "--fail-on-regression"],
                          capture_output=True, text=True, timeout=900)


@pytest.mark.benchmark(group="spark-pipeline")
def test_end_to_end_first_run(benchmark, workdir) -> None:  # noqa: ANN001
    out = str(workdir / "e2e")
    shutil.rmtree(out, ignore_errors=True)
    proc = benchmark.pedantic(_cli, args=(str(workdir / "history"), out), rounds=1, iterations=1)
    assert proc.returncode == 1, proc.stderr  # the synthetic 20% steps fail the gate
    [resources] = [line for line in proc.stdout.splitlines() if line.startswith("resources:")]
    describe(benchmark, "rmqha-trends", runs=RUNS, benchmarks=BENCHMARKS, quick=QUICK,
             resources=resources, failures=proc.stderr.count("\nREGRESSION "))


@pytest.mark.benchmark(group="spark-pipeline")
def test_end_to_end_nothing_new(benchmark, workdir) -> None:  # noqa: ANN001
    out = str(workdir / "e2e")
    if not os.path.exists(os.path.join(out, "summary.parquet")):
        _cli(str(workdir / "history"), out)
    proc = benchmark.pedantic(_cli, args=(str(workdir / "history"), out), rounds=1, iterations=1)
    assert proc.returncode == 1, proc.stderr
    assert "0 new" in proc.stdout and "unchanged since the last run" in proc.stdout
    [resources] = [line for line in proc.stdout.splitlines() if line.startswith("resources:")]
    describe(benchmark, "rmqha-trends", runs=RUNS, benchmarks=BENCHMARKS, quick=QUICK,
             resources=resources)
