"""Command line end to end (ingest + trends + report) and the --fail-on-regression gate."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from spark_support import PROJECT_ROOT, SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

if SPARK_OK:
    import pandas as pd

    from spark_bench import synthetic
    from spark_bench.cli import main

pytestmark = SPARK_TEST_MARKS

RUNS = 30


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):  # noqa: ANN001, ANN201, F811
    """A history with a 30% step at run 12 for benchmark 4 (cython twin of group op1) and a
    lone 40% spike in the latest run of benchmark 1, pushed through `trends` once."""
    root = tmp_path_factory.mktemp("cli")
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=8, noise=0.02,
                                 steps={1: [(RUNS - 1, 1.40)], 4: [(12, 1.30)]}, seed=2)
    synthetic.write_history(spec, str(root / "history"))
    (root / "history" / "broken.json").write_text("{not json")
    out = root / "out"
    code = main(["trends", "--history", str(root / "history"), "--out", str(out),
                 "--fail-on-regression", "--threshold", "25"], spark=spark)
    return {"root": root, "out": out, "code": code, "spec": spec}


def test_gate_fails_on_an_open_regression_with_one_line_naming_it(pipeline, capsys) -> None:  # noqa: ANN001
    assert pipeline["code"] == 1
    out = str(pipeline["out"])
    assert main(["report", "--out", out, "--fail-on-regression", "--threshold", "25"]) == 1
    captured = capsys.readouterr()
    err = captured.err
    [line] = [x for x in err.splitlines() if x.startswith("REGRESSION")]
    assert "test_op1[cython-128]" in line
    assert re.search(r": \+(2[89]|3[0-2])\.\d% \(slower; ", line), line
    assert f"since commit {synthetic.commit_of(12)[:12]}" in line
    # The lone 40% spike of the latest run is not a change: no failure line for it, but it
    # is not silence either: suspected, rerun to confirm.
    assert "test_op0[python-64]" not in err
    [suspect] = [x for x in captured.out.splitlines() if x.startswith("SUSPECTED")]
    assert "test_op0[python-64]" in suspect and "rerun to confirm" in suspect


def test_gate_passes_above_the_regression_or_with_an_override_or_without_the_flag(pipeline) -> None:  # noqa: ANN001
    out = str(pipeline["out"])
    assert main(["report", "--out", out, "--fail-on-regression", "--threshold", "35"]) == 0
    assert main(["report", "--out", out, "--fail-on-regression", "--threshold", "25",
                 "--threshold-for", "*test_op1*=35"]) == 0
    assert main(["report", "--out", out, "--threshold", "25"]) == 0


def test_bad_gate_and_trend_options_exit_2(pipeline, capsys) -> None:  # noqa: ANN001
    out = str(pipeline["out"])
    assert main(["report", "--out", out, "--threshold-for", "no-percent"]) == 2
    assert "GLOB=PCT" in capsys.readouterr().err
    assert main(["trends", "--out", out, "--machine-key", "hostname"]) == 2
    assert "unknown machine key field(s) hostname" in capsys.readouterr().err


def test_report_is_one_self_contained_html_file_with_interactive_plots(pipeline) -> None:  # noqa: ANN001
    out = pipeline["out"]
    text = (out / "report.html").read_text(encoding="utf-8")
    # Self-contained: plotly.js is inlined exactly once, and the page itself refers to
    # nothing but its own anchors.
    assert text.count("* plotly.js v") == 1
    bundle_start = text.index("<script>")
    page = text[:bundle_start] + text[text.index("</script>", bundle_start):]
    assert not re.search(r"""(src|href)=['"](?!#)""", page)
    changes = pd.read_parquet(out / "changes.parquet")
    plotted = re.findall(r"<div class='plot' id='(s[0-9a-f]{12})'>", text)
    assert len(plotted) == changes["series_id"].nunique() >= 1
    assert len(re.findall(r"P\('s[0-9a-f]{12}',", text)) == len(plotted)
    # The failure leads the page, with before/after values and the commit.
    failures = text.index("Gate failures")
    assert failures < text.index("Open regressions") < text.index("All benchmark series")
    first_row = text[failures:text.index("</table>", failures)]
    assert "test_op1[cython-128]" in first_row and synthetic.commit_of(12)[:12] in first_row
    assert "broken.json" in text  # the skipped file is named in the report
    summary = pd.read_parquet(out / "summary.parquet")
    assert len(pd.read_csv(out / "summary.csv")) == len(summary) == 8 + 2 * 5
    assert len(pd.read_csv(out / "changes.csv")) == len(changes)


def test_rerun_with_nothing_new_reads_no_file_and_reuses_the_tables(spark, pipeline, capsys) -> None:  # noqa: ANN001, F811
    root = pipeline["root"]
    code = main(["trends", "--history", str(root / "history"), "--out", str(root / "out"),
                 "--fail-on-regression", "--threshold", "25"], spark=spark)
    assert code == 1
    printed = capsys.readouterr().out
    assert f"{RUNS + 1} files seen, 0 new" in printed
    assert "unchanged since the last run" in printed and "report.html is up to date" in printed


def test_a_fresh_checkout_of_the_history_is_not_parsed_and_reuses_the_tables(spark, tmp_path, capsys) -> None:  # noqa: ANN001, F811
    """New modification times (a checkout, a restored cache) on the same files: hashed,
    not parsed, and the trend tables and report of the last run still serve."""
    spec = synthetic.HistorySpec(runs=12, benchmarks=2, noise=0.02, seed=4)
    files = synthetic.write_history(spec, str(tmp_path / "history"))
    argv = ["trends", "--history", str(tmp_path / "history"), "--out", str(tmp_path / "out")]
    assert main(argv, spark=spark) == 0
    capsys.readouterr()
    for path in files:
        later = os.stat(path).st_mtime + 60
        os.utime(path, (later, later))
    assert main(argv, spark=spark) == 0
    printed = capsys.readouterr().out
    assert "12 files seen, 12 new (12 with content already stored), 0 used" in printed
    assert "unchanged since the last run" in printed and "report.html is up to date" in printed


def test_report_without_trend_tables_exits_2(tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["report", "--out", str(tmp_path)]) == 2
    assert "run `rmqha-trends trends` first" in capsys.readouterr().err


def test_trends_without_history_exits_2(spark, tmp_path, capsys) -> None:  # noqa: ANN001, F811
    code = main(["trends", "--history", str(tmp_path / "none"), "--out", str(tmp_path / "o")], spark=spark)
    assert code == 2
    assert "no benchmark history" in capsys.readouterr().err


def test_module_runs_as_a_program() -> None:
    proc = subprocess.run([sys.executable, "-m", "spark_bench", "trends", "--help"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--history", "--out", "--master", "--fail-on-regression", "--threshold",
                 "--threshold-for", "--machine-key", "--branch", "--include-dirty", "--stale-after",
                 "--conf"):
        assert flag in proc.stdout
    assert os.path.isdir(os.path.join(PROJECT_ROOT, "spark_bench"))


def test_a_url_spark_cannot_open_is_a_clear_error(spark, tmp_path, capsys) -> None:  # noqa: ANN001, F811
    code = main(["trends", "--history", "nosuchfs://bucket/history", "--out", str(tmp_path / "o")],
                spark=spark)
    assert code == 2
    err = capsys.readouterr().err
    assert "rmqha-trends: error: Spark failed" in err and "nosuchfs" in err
    assert "Traceback" not in err
