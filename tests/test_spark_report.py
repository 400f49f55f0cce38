"""Command line end to end (ingest + trends + report) and the --fail-on-regression gate."""
from __future__ import annotations

import base64
import os
import re
import subprocess
import sys

import pytest
from spark_support import PROJECT_ROOT, SPARK_OK, requires_spark, spark  # noqa: F401 - fixture

if SPARK_OK:
    import pandas as pd

    from spark_bench import synthetic
    from spark_bench.cli import main

pytestmark = [
    requires_spark, pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

RUNS = 30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):  # noqa: ANN001, ANN201, F811
    """A history whose last run is 40% slower for benchmark 1 (python twin of group op0),
    with a step regression at run 12 for benchmark 4, pushed through `trends` once."""
    root = tmp_path_factory.mktemp("cli")
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=8, noise=0.02,
                                 steps={1: [(RUNS - 1, 1.40)], 4: [(12, 1.30)]}, seed=2)
    synthetic.write_history(spec, str(root / "history"))
    (root / "history" / "broken.json").write_text("{not json")
    out = root / "out"
    code = main(["trends", "--history", str(root / "history"), "--out", str(out),
                 "--fail-on-regression", "--threshold", "25"], spark=spark)
    return {"root": root, "out": out, "code": code, "spec": spec}


def test_gate_fails_when_latest_run_regressed_beyond_threshold(pipeline, capsys) -> None:  # noqa: ANN001
    assert pipeline["code"] == 1


def test_gate_passes_with_a_higher_threshold_or_without_the_flag(pipeline, capsys) -> None:  # noqa: ANN001
    out = str(pipeline["out"])
    assert main(["report", "--out", out, "--fail-on-regression", "--threshold", "60"]) == 0
    assert main(["report", "--out", out, "--threshold", "25"]) == 0
    assert main(["report", "--out", out, "--fail-on-regression", "--threshold", "25"]) == 1
    err = capsys.readouterr().err
    assert "test_op0[python-64]" in err and "regressed by more than 25%" in err


def test_gate_ignores_old_regressions_already_in_the_baseline(spark, tmp_path) -> None:  # noqa: ANN001, F811
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=4, noise=0.02, steps={0: [(10, 1.5)]}, seed=4)
    synthetic.write_history(spec, str(tmp_path / "h"))
    code = main(["trends", "--history", str(tmp_path / "h"), "--out", str(tmp_path / "o"),
                 "--fail-on-regression", "--no-report"], spark=spark)
    assert code == 0
    changes = pd.read_parquet(tmp_path / "o" / "changes.parquet")
    bench0 = changes[changes["kind"] == "benchmark"]
    assert bench0["run_index"].tolist() == [10]
    assert bool(bench0.iloc[0]["open"])


def test_report_is_one_html_file_with_embedded_images(pipeline) -> None:  # noqa: ANN001
    out = pipeline["out"]
    html_path = out / "report.html"
    text = html_path.read_text(encoding="utf-8")
    # Self-contained: every image is inline, nothing else is referenced.
    assert not re.search(r"""(src|href)=['"](?!data:|#)""", text)
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    summary = pd.read_parquet(out / "summary.parquet")
    assert len(images) == len(summary) == 8 + 2 * 5
    assert all(base64.b64decode(img)[:8] == PNG_MAGIC for img in images)
    assert "broken.json" in text  # the skipped file is named in the report
    assert "Open regressions" in text and "test_op1[cython-128]" in text
    for name in ("summary", "changes", "series"):
        assert (out / f"{name}.parquet").is_dir()
    assert len(pd.read_csv(out / "summary.csv")) == len(summary)
    assert len(pd.read_csv(out / "changes.csv")) == len(pd.read_parquet(out / "changes.parquet"))
    assert not (out / "series.csv").exists()  # every point only with --points-csv
    assert main(["report", "--out", str(out), "--points-csv"]) == 0
    assert len(pd.read_csv(out / "series.csv")) == RUNS * len(summary)


def test_report_without_trend_tables_exits_2(tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["report", "--out", str(tmp_path)]) == 2
    assert "run `python -m spark_bench trends` first" in capsys.readouterr().err


def test_trends_without_history_exits_2(spark, tmp_path, capsys) -> None:  # noqa: ANN001, F811
    code = main(["trends", "--history", str(tmp_path / "none"), "--out", str(tmp_path / "o")], spark=spark)
    assert code == 2
    assert "no benchmark history" in capsys.readouterr().err


def test_module_runs_as_a_program() -> None:
    proc = subprocess.run([sys.executable, "-m", "spark_bench", "trends", "--help"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--history", "--out", "--master", "--fail-on-regression", "--threshold"):
        assert flag in proc.stdout
    assert os.path.isdir(os.path.join(PROJECT_ROOT, "spark_bench"))
