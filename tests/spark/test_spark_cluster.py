"""The trends pipeline, unchanged, against a real standalone Spark cluster.

A master and a worker are started from pyspark's own jars (``spark-class``) on 127.0.0.1
with free ports; ``rmqha-trends trends --master spark://...`` then runs as a separate
driver process (one SparkContext per process: the test session is local), with the history
and the output given as ``file://`` URLs, then as ``viewfs://`` URLs whose mount table the
command gets through ``--conf`` (a Hadoop file system that is not ``file:``: neither the
driver nor an executor can ``open()`` those paths, so the files reach the executor only
through Hadoop, as they would from HDFS or S3; test_spark_urls.py says why viewfs). The
executor (a JVM the worker launches, with its own Python workers, in the worker's
directory) reads and parses the files; the driver only lists them. Everything started is
stopped, process group by process group.

Regression tests for the issue's "workers without the driver's filesystem reporting 'empty
file'": every file must be used, none skipped.

It costs a master, a worker, an executor and a driver JVM per run (about 70 s for the
first, 30-40 s for the second, on two busy cores),
so it is ``slow``: ``make soak`` runs it, ``make test`` does not. Reruns reading nothing new
are tested in local mode (test_spark_report.py).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from spark_standalone import standalone_cluster
from spark_support import SPARK_OK, requires_spark

pytestmark = [requires_spark, pytest.mark.spark, pytest.mark.slow]

if SPARK_OK:
    from spark_bench import synthetic


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    """A standalone master and one worker (1 core, 1 GiB); yields the master URL."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone")) as master:
        yield master


def _run_driver(master: str, cwd, history: str, out: str, *extra: str) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    """``rmqha-trends trends`` as its own driver process, in ``cwd``."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "spark_bench", "trends", "--master", master,
           "--history", history, "--out", out, "--fail-on-regression", "--no-class-data-cache",
           *extra]
    return subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=240)


def _check_run(proc: subprocess.CompletedProcess[str], runs: int, rows: int) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output  # the 30% step fails the gate
    assert f"{runs} files seen, {runs} new, {runs} used, 0 skipped; {rows} new rows" in proc.stdout, output
    assert "skipped" not in proc.stderr.replace("0 skipped", ""), output
    assert "empty file" not in output and "cannot read the file" not in output
    assert f"since commit {synthetic.commit_of(12)[:12]}" in proc.stderr
    # The command reports what it cost: peak memory of both driver processes and CPU.
    assert re.search(r"^resources: peak RSS python driver \d+ MiB, driver JVM \d+ MiB; CPU: ",
                     proc.stdout, re.MULTILINE), proc.stdout


def test_trends_on_a_standalone_master_and_worker_with_url_paths(standalone, tmp_path) -> None:  # noqa: ANN001
    spec = synthetic.HistorySpec(runs=24, benchmarks=4, noise=0.02, steps={0: [(12, 1.3)]}, seed=5)
    synthetic.write_history(spec, str(tmp_path / "history"))
    history, out = f"file://{tmp_path / 'history'}", f"file://{tmp_path / 'out'}"
    driver_cwd = tmp_path / "driver-cwd"
    driver_cwd.mkdir()
    proc = _run_driver(standalone, driver_cwd, history, out)
    _check_run(proc, 24, 96)
    assert (tmp_path / "out" / "report.html").stat().st_size > 0
    assert (tmp_path / "out" / "runs.parquet" / "_files").is_dir()
    assert os.listdir(driver_cwd) == []


def test_trends_on_the_cluster_with_viewfs_urls_and_the_mount_table_in_conf(standalone, tmp_path) -> None:  # noqa: ANN001
    spec = synthetic.HistorySpec(runs=20, benchmarks=3, noise=0.02, steps={0: [(12, 1.3)]}, seed=6)
    store = tmp_path / "store"
    synthetic.write_history(spec, str(store / "history"))
    (store / "out").mkdir()
    table = f"c{uuid.uuid4().hex[:10]}"
    conf = []
    for name in ("history", "out"):
        conf += ["--conf", f"spark.hadoop.fs.viewfs.mounttable.{table}.link./{name}=file://{store / name}"]
    driver_cwd = tmp_path / "driver-cwd"
    driver_cwd.mkdir()
    proc = _run_driver(standalone, driver_cwd, f"viewfs://{table}/history",
                       f"viewfs://{table}/out/trends", *conf)
    _check_run(proc, 20, 60)
    assert f"table viewfs://{table}/out/trends/runs.parquet" in proc.stdout
    assert (store / "out" / "trends" / "report.html").stat().st_size > 0
    assert (store / "out" / "trends" / "runs.parquet" / "_files").is_dir()
    assert os.listdir(driver_cwd) == []
