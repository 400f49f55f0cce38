"""Benchmark history in an rmqha topic: ``rmqha-trends publish`` then ``trends --history rmqha://...``.

A real broker (a controller, a name server, one broker) and the shared local Spark
session. The same synthetic history (16 runs, a 30% step at run 8) goes through
``trends`` once from its files and once from a topic the files were published to (four
``trends`` runs: ``slow``): the
summary, the change points and the report are the same. A rerun over the topic reads no
message as new. Negative control: the same comparison against a topic missing one run
finds the reports different.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster
from rmqha_topics import create_topic, start_group
from spark_support import SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

pytestmark = [*SPARK_TEST_MARKS, pytest.mark.slow, pytest.mark.timeout(1200)]

if SPARK_OK:
    from spark_bench import synthetic
    from spark_bench.cli import main

RUNS = 16


@pytest.fixture(scope="module")
def rmq(tmp_path_factory) -> Iterator[Cluster]:  # noqa: ANN001
    with Cluster(tmp_path_factory.mktemp("rmq")) as c:
        start_group(c, 0)
        yield c


def _trends(spark, history: str, out: Path) -> int:  # noqa: ANN001, F811
    return main(["trends", "--history", history, "--out", str(out), "--fail-on-regression"], spark=spark)


def _report(out: Path) -> dict[str, str]:
    """What a reader of the report sees: the tables and the page (the output directory
    and the page's "Generated <time>" made the same)."""
    return {name: re.sub(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "Generated TIME",
                         (out / name).read_text().replace(str(out), "OUT"))
            for name in ("summary.csv", "changes.csv", "report.html")}


def _same(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two reports are equal; when not, the first difference is printed."""
    for name in a:
        if a[name] != b[name]:
            at = next((i for i, (x, y) in enumerate(zip(a[name], b[name])) if x != y), min(len(a[name]), len(b[name])))
            print(f"{name} differs at {at}: {a[name][at - 200:at + 100]!r} vs {b[name][at - 200:at + 100]!r}")
            return False
    return True


def test_trends_from_a_topic_gives_the_report_the_files_give(spark, rmq, tmp_path, capsys) -> None:  # noqa: ANN001, F811
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=2, noise=0.02, steps={0: [(8, 1.3)]}, seed=11)
    files = synthetic.write_history(spec, str(tmp_path / "history"))
    ns = ";".join(rmq.namesrv_addresses)
    create_topic(rmq, "BenchHistory", 2)
    create_topic(rmq, "BenchHistoryShort", 2)
    assert main(["publish", "--to", f"rmqha://{ns}/BenchHistory", *files]) == 0
    assert f"published {RUNS} file(s)" in capsys.readouterr().out

    assert _trends(spark, str(tmp_path / "history"), tmp_path / "from-files") == 1  # the step fails the gate
    from_files = capsys.readouterr()
    assert _trends(spark, f"rmqha://{ns}/BenchHistory", tmp_path / "from-topic") == 1
    from_topic = capsys.readouterr()
    assert f"{RUNS} files seen, {RUNS} new, {RUNS} used, 0 skipped" in from_topic.out, from_topic
    assert _same(_report(tmp_path / "from-topic"), _report(tmp_path / "from-files"))
    gate = [line for line in from_files.err.splitlines() if "regress" in line.lower()]
    assert gate and all(line in from_topic.err for line in gate)

    # A rerun over the topic: every message is known, nothing is parsed again.
    assert _trends(spark, f"rmqha://{ns}/BenchHistory", tmp_path / "from-topic") == 1
    assert f"{RUNS} files seen, 0 new" in capsys.readouterr().out

    # Negative control: a topic holding one run less gives another report.
    assert main(["publish", "--to", f"rmqha://{ns}/BenchHistoryShort", *files[:-1]]) == 0
    _trends(spark, f"rmqha://{ns}/BenchHistoryShort", tmp_path / "short")
    assert not _same(_report(tmp_path / "short"), _report(tmp_path / "from-files"))
    assert os.path.exists(tmp_path / "short" / "report.html")


def test_a_bad_topic_url_is_refused_by_name(capsys) -> None:  # noqa: ANN001
    assert main(["publish", "--to", "rmqha://only-a-host", "x.json"]) == 2
    assert "rmqha://only-a-host" in capsys.readouterr().err
