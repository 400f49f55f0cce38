"""``--history``, ``--table`` and ``--out`` as Hadoop URLs that are not ``file:``.

There is no HDFS or S3 here, so the stand-in is ``viewfs://``: a Hadoop file system that
pyspark's bundled Hadoop client ships, whose mount table (given with ``--conf
spark.hadoop.fs.viewfs.mounttable.NAME.link./DIR=file:///...``) maps its paths onto real
directories. Every byte then goes through Hadoop's ``FileSystem`` API: code that handed
such a URL to ``open()`` or ``os.path`` would fail, or write ``./viewfs:/...`` under the
working directory, which each test checks stays empty.

``hdfs://`` and ``s3a://`` are checked as far as this machine allows: an ``hdfs://`` URL
reaches HDFS's client (which then finds no name node on the free port), and ``s3a://``
without the hadoop-aws jar is a one-line error naming the missing class, not a traceback.
Regression tests for the issue's "--history/--out not accepting hdfs:// or s3a:// URLs".
"""
from __future__ import annotations

import os
import uuid

import pytest
from cluster import free_port
from spark_support import SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

if SPARK_OK:
    import pandas as pd

    from spark_bench import synthetic
    from spark_bench.cli import main, parse_conf

pytestmark = SPARK_TEST_MARKS

RUNS = 24


def viewfs_mounts(root, links: dict[str, str]) -> tuple[str, list[str]]:  # noqa: ANN001
    """A viewfs mount table of its own (a new name each time: Hadoop caches a file system
    per URL authority, so a reused name would keep an older table) mapping ``/NAME`` to
    ``root/DIR`` for each ``NAME: DIR``; returns the ``viewfs://table`` prefix and the
    ``--conf`` arguments that set it up."""
    table = f"t{uuid.uuid4().hex[:10]}"
    args: list[str] = []
    for name, directory in links.items():
        target = root / directory
        target.mkdir(parents=True, exist_ok=True)
        args += ["--conf", f"spark.hadoop.fs.viewfs.mounttable.{table}.link./{name}=file://{target}"]
    return f"viewfs://{table}", args


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """The working directory, empty: nothing may be written there through a URL."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert sorted(os.listdir(cwd)) == [], "a URL was used as a local path"


def test_trends_with_viewfs_history_table_and_out_then_a_rerun_and_report(
        spark, tmp_path, empty_cwd, capsys) -> None:  # noqa: ANN001, F811
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=4, noise=0.02, steps={0: [(12, 1.3)]}, seed=5)
    synthetic.write_history(spec, str(tmp_path / "store" / "history"))
    fs, conf = viewfs_mounts(tmp_path / "store", {"history": "history", "tables": "tables",
                                                   "out": "out"})
    argv = ["trends", "--history", f"{fs}/history", "--table", f"{fs}/tables/runs",
            "--out", f"{fs}/out/trends", "--fail-on-regression", *conf]

    assert main(argv, spark=spark) == 1  # the 30% step fails the gate
    first = capsys.readouterr()
    assert f"{RUNS} files seen, {RUNS} new, {RUNS} used, 0 skipped; {RUNS * 4} new rows" in first.out
    assert f"table {fs}/tables/runs" in first.out
    [line] = [x for x in first.err.splitlines() if x.startswith("REGRESSION")]
    assert f"since commit {synthetic.commit_of(12)[:12]}" in line
    # Everything landed in the mapped directories, through Hadoop.
    real_out = tmp_path / "store" / "out" / "trends"
    assert (tmp_path / "store" / "tables" / "runs" / "_files").is_dir()
    assert (real_out / "report.html").stat().st_size > 0
    assert len(pd.read_parquet(real_out / "summary.parquet")) == len(pd.read_csv(real_out / "summary.csv"))

    # A rerun lists the history again and reads none of it.
    assert main(argv, spark=spark) == 1
    again = capsys.readouterr()
    assert f"{RUNS} files seen, 0 new" in again.out
    assert "unchanged since the last run" in again.out and "report.html is up to date" in again.out

    # `report` re-renders from the tables through Spark (a URL is not read with pandas).
    os.remove(real_out / "report.html")
    assert main(["report", "--out", f"{fs}/out/trends", "--fail-on-regression", *conf],
                spark=spark) == 1
    assert (real_out / "report.html").stat().st_size > 0
    assert "REGRESSION" in capsys.readouterr().err


def test_an_hdfs_url_reaches_the_hdfs_client(spark, tmp_path, empty_cwd, capsys) -> None:  # noqa: ANN001, F811
    """No name node listens on the port, so HDFS's own client says so: the URL was handed
    to Hadoop, not refused by the command or opened as a local path."""
    synthetic.write_history(synthetic.HistorySpec(runs=2, benchmarks=2), str(tmp_path / "history"))
    namenode = f"hdfs://127.0.0.1:{free_port()}"
    no_retry = ["--conf", "spark.hadoop.ipc.client.connect.max.retries=0"]
    for argv in (["--history", f"{namenode}/bench", "--out", str(tmp_path / "o1")],
                 ["--history", str(tmp_path / "history"), "--out", f"{namenode}/trends"]):
        assert main(["trends", *argv, *no_retry], spark=spark) == 2
        err = capsys.readouterr().err
        assert "rmqha-trends: error: Spark failed: java.net.ConnectException" in err, err
        assert "Connection refused" in err and "Traceback" not in err


def test_s3a_without_hadoop_aws_names_the_missing_class(spark, tmp_path, empty_cwd, capsys) -> None:  # noqa: ANN001, F811
    """pyspark ships no S3 client: s3a:// needs hadoop-aws on the class path (README)."""
    assert main(["trends", "--history", "s3a://bucket/bench", "--out", str(tmp_path / "o")],
                spark=spark) == 2
    err = capsys.readouterr().err
    assert "S3AFileSystem not found" in err and "Traceback" not in err


def test_conf_items_must_be_key_value(tmp_path, capsys) -> None:  # noqa: ANN001
    assert parse_conf(["a.b=1", "c=x=y", "a.b=2", "empty="]) == {"a.b": "2", "c": "x=y", "empty": ""}
    for bad in ("novalue", "=x"):
        assert main(["report", "--out", str(tmp_path), "--conf", bad]) == 2
        assert f"--conf {bad!r} is not KEY=VALUE" in capsys.readouterr().err


def test_conf_reaches_a_new_session(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """Without a session handed in, the settings go to the session the command builds (the
    cluster test, tests/spark/test_spark_cluster.py, runs this for real in a new process)."""
    from spark_bench import session as session_module
    built: list[object] = []

    class _Built(Exception):
        pass

    def fake_build(opts):  # noqa: ANN001, ANN202
        built.append(opts)
        raise _Built

    monkeypatch.setattr(session_module, "build_session", fake_build)
    with pytest.raises(_Built):
        main(["trends", "--out", str(tmp_path), "--master", "local[1]", "--no-class-data-cache",
              "--conf", "spark.hadoop.fs.defaultFS=file:///", "--conf", "spark.executor.memory=2g"])
    [opts] = built
    assert opts.master == "local[1]" and not opts.class_data_sharing
    assert opts.extra_conf == {"spark.hadoop.fs.defaultFS": "file:///", "spark.executor.memory": "2g"}
