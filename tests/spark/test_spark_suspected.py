"""A jump in the latest run alone: "suspected, rerun to confirm" in the gate's output and
the report, never a failure and never silence; the same jump confirmed by one more run is
the change it is; no jump gives nothing (the negative control).

One history, end to end through ``rmqha-trends trends --fail-on-regression`` (files,
ingest, Spark, gate, report): benchmark 1 is 30% slower in the latest run alone, benchmark 5
in the latest two runs, benchmark 2 spiked in the run before the latest and came back, the
others are noise. The pandas-only ``report`` command then shows the verdict without the
confirmed regression (its threshold raised): suspected alone passes the gate.
"""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
from spark_support import SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

if SPARK_OK:
    import pandas as pd

    from spark_bench import synthetic
    from spark_bench.cli import main

pytestmark = [*SPARK_TEST_MARKS, pytest.mark.timeout(900)]

RUNS = 40
SUSPECT, CONFIRMED, SPIKED = 1, 5, 2
SPEC = synthetic.HistorySpec(
    runs=RUNS, benchmarks=8, noise=0.02, seed=31,
    steps={SUSPECT: [(RUNS - 1, 1.30)], CONFIRMED: [(RUNS - 2, 1.30)],
           SPIKED: [(RUNS - 2, 1.5), (RUNS - 1, 1 / 1.5)]}) if SPARK_OK else None


def _main(argv: list[str], spark=None) -> tuple[int, str, str]:  # noqa: ANN001
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(argv, spark=spark)
    return code, out.getvalue(), err.getvalue()


def _name(index: int) -> str:
    return str(synthetic.benchmark_identity(SPEC, index)["fullname"])


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):  # noqa: ANN001, ANN201, F811
    root = tmp_path_factory.mktemp("suspected")
    synthetic.write_history(SPEC, str(root / "history"))
    out = root / "out"
    code, stdout, stderr = _main(["trends", "--history", str(root / "history"), "--out", str(out),
                                  "--fail-on-regression"], spark)
    return {"code": code, "stdout": stdout, "stderr": stderr, "out": out,
            "summary": pd.read_parquet(out / "summary.parquet"),
            "changes": pd.read_parquet(out / "changes.parquet"),
            "report": (out / "report.html").read_text(encoding="utf-8")}


def _bench_rows(frame: pd.DataFrame, index: int) -> pd.DataFrame:
    """The benchmark series' rows (its series id is the benchmark name, then machine...)."""
    return frame[(frame["kind"] == "benchmark")
                 & frame["series_id"].str.startswith(f"{_name(index)} | ")]


def _lines(text: str, prefix: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith(prefix)]


def test_a_jump_in_the_latest_run_alone_is_suspected_not_a_failure(run) -> None:  # noqa: ANN001
    [line] = _lines(run["stdout"], "SUSPECTED")
    assert _name(SUSPECT) in line and "latest run alone" in line and "rerun to confirm" in line
    assert f"at commit {synthetic.commit_of(RUNS - 1)[:12]}" in line
    assert _name(SUSPECT) not in run["stderr"]  # no REGRESSION line for it
    row = _bench_rows(run["summary"], SUSPECT)
    assert bool(row["suspected"].iloc[0])
    assert row["suspect_worse_pct"].iloc[0] == pytest.approx(30.0, abs=6.0)
    assert _bench_rows(run["changes"], SUSPECT).empty
    section = run["report"].split("<h2>Suspected", 1)[1].split("<h2>", 1)[0]
    assert "rerun to confirm" in section and _name(SUSPECT) in section
    assert _name(CONFIRMED) not in section and _name(SPIKED) not in section


def test_the_same_jump_confirmed_by_a_rerun_is_the_regression_it_is(run) -> None:  # noqa: ANN001
    assert run["code"] == 1
    [line] = _lines(run["stderr"], "REGRESSION")
    assert _name(CONFIRMED) in line and f"since commit {synthetic.commit_of(RUNS - 2)[:12]}" in line
    [cp] = _bench_rows(run["changes"], CONFIRMED).itertuples(index=False)
    assert (cp.run_index, cp.direction, bool(cp.open)) == (RUNS - 2, "regression", True)
    assert cp.change_pct == pytest.approx(30.0, abs=6.0)
    assert not bool(_bench_rows(run["summary"], CONFIRMED)["suspected"].iloc[0])


def test_no_jump_or_a_spike_that_came_back_gives_nothing(run) -> None:  # noqa: ANN001
    quiet = [i for i in range(SPEC.benchmarks) if i not in (SUSPECT, CONFIRMED)]
    for i in quiet:
        assert not bool(_bench_rows(run["summary"], i)["suspected"].iloc[0]), _name(i)
        assert _bench_rows(run["changes"], i).empty, _name(i)
    benchmarks = run["summary"][run["summary"]["kind"] == "benchmark"]
    assert set(benchmarks.loc[benchmarks["suspected"].astype(bool), "benchmark"]) == {_name(SUSPECT)}


def test_suspected_alone_passes_the_gate_and_is_still_printed(run) -> None:  # noqa: ANN001
    code, stdout, stderr = _main(["report", "--out", str(run["out"]), "--fail-on-regression",
                                  "--threshold-for", f"{_name(CONFIRMED)}=50"])
    assert code == 0
    assert not _lines(stderr, "REGRESSION")
    [line] = _lines(stdout, "SUSPECTED")
    assert _name(SUSPECT) in line
    # Above the suspect's own threshold, it is not the gate's business: no line.
    code, stdout, _ = _main(["report", "--out", str(run["out"]), "--fail-on-regression",
                             "--threshold", "50"])
    assert code == 0 and not _lines(stdout, "SUSPECTED")
