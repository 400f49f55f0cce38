"""The Spark trend pipeline itself: ingest, trend/change-point computation, report render.

Full size is the issue's 2,000 runs x 200 benchmarks (400,000 rows plus 500,000 ratio
points); RMQHA_BENCH_QUICK=1 uses 200 runs x 40 benchmarks. Each stage runs once per
benchmark round (pedantic, one round): a stage takes seconds to minutes, and a warm-up round
would double the cost without making the figure more honest. Rates go to extra_info.
"""
from __future__ import annotations

import importlib.util
import os
import shutil

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

#: Outputs shared by the stages, in file order: ingest -> trends -> report.
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
    session = build_session(SessionOptions(master="local[*]",
                                           extra_conf={"spark.driver.memory": "2g"}))
    yield session
    session.stop()


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
    _STATE["trends"] = counts
    return counts


@pytest.mark.benchmark(group="spark-pipeline")
def test_ingest(benchmark, spark, workdir) -> None:  # noqa: ANN001
    result = benchmark.pedantic(_ingest, args=(spark, workdir), rounds=1, iterations=1)
    assert result.rows_new == RUNS * BENCHMARKS
    seconds = benchmark.stats.stats.median
    describe(benchmark, "pyspark", runs=RUNS, benchmarks=BENCHMARKS, rows=result.rows_new,
             files=result.files_seen, rows_per_s=round(result.rows_new / seconds),
             files_per_s=round(result.files_seen / seconds, 1), quick=QUICK)


@pytest.mark.benchmark(group="spark-pipeline")
def test_trends(benchmark, spark, workdir) -> None:  # noqa: ANN001
    points, series, changes = benchmark.pedantic(_trends, args=(spark, workdir), rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median
    describe(benchmark, "pyspark", runs=RUNS, benchmarks=BENCHMARKS, input_rows=RUNS * BENCHMARKS,
             series_points=points, series=series, changes=changes,
             rows_per_s=round(RUNS * BENCHMARKS / seconds),
             points_per_s=round(points / seconds), quick=QUICK)


@pytest.mark.benchmark(group="spark-pipeline")
def test_report(benchmark, spark, workdir) -> None:  # noqa: ANN001
    from spark_bench.report import render
    if "trends" not in _STATE:
        _trends(spark, workdir)
    result = benchmark.pedantic(render, args=(str(workdir / "out"),), rounds=1, iterations=1)
    describe(benchmark, "matplotlib-agg", runs=RUNS, benchmarks=BENCHMARKS, plots=result.plots,
             html_bytes=os.path.getsize(result.html_path), quick=QUICK)
