"""Trend job (spark_bench.trends) on synthetic histories: baselines, change points, ratios."""
from __future__ import annotations

import pytest
from spark_support import SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

if SPARK_OK:
    import pandas as pd
    from pyspark.sql import functions as F

    from spark_bench import synthetic, trends
    from spark_bench.schema import RUN_TABLE

pytestmark = SPARK_TEST_MARKS

RUNS = 60
# Benchmarks 0-3 form group op0 (cython, python, struct, lmdb); 4..103 are 100 noise-only
# series in groups op1..op25.
STEPS = {0: [(40, 1.10)], 1: [(30, 1.25)], 2: [(45, 0.80)]}


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):  # noqa: ANN001, ANN201, F811
    spec = synthetic.HistorySpec(runs=RUNS, benchmarks=104, noise=0.02, spike_rate=0.01,
                                 steps=STEPS, seed=3)
    runs = spark.createDataFrame(synthetic.history_frame(spec), RUN_TABLE)
    out = str(tmp_path_factory.mktemp("trends"))
    t = trends.compute(runs, out)
    return {"series": t.series.toPandas(), "changes": t.changes.toPandas(),
            "summary": t.summary.toPandas(), "spec": spec}


def _bench_id(spec, index: int) -> str:  # noqa: ANN001
    ident = synthetic.benchmark_identity(spec, index)
    return f"{ident['fullname']} | {spec.machine} | {ident['implementation']} | {spec.branch}"


def test_10_and_25_percent_regressions_found_at_the_right_run(tables) -> None:  # noqa: ANN001
    changes, spec = tables["changes"], tables["spec"]
    for index, expected_run, size in ((0, 40, 10.0), (1, 30, 25.0)):
        rows = changes[changes["series_id"] == _bench_id(spec, index)]
        assert rows["run_index"].tolist() == [expected_run]
        row = rows.iloc[0]
        assert row["direction"] == "regression"
        assert row["change_pct"] == pytest.approx(size, abs=3.0)
        assert row["confidence"] >= 0.99
        assert bool(row["open"])
        assert row["commit"] == synthetic.commit_of(expected_run)


def test_speed_up_reported_as_improvement(tables) -> None:  # noqa: ANN001
    changes, spec = tables["changes"], tables["spec"]
    rows = changes[changes["series_id"] == _bench_id(spec, 2)]
    assert rows["run_index"].tolist() == [45]
    assert rows.iloc[0]["direction"] == "improvement"
    assert rows.iloc[0]["change_pct"] == pytest.approx(-20.0, abs=3.0)
    assert not bool(rows.iloc[0]["open"])


def test_pure_noise_over_100_series_raises_no_alarm(tables) -> None:  # noqa: ANN001
    changes, summary = tables["changes"], tables["summary"]
    noise_series = summary[~summary["case_key"].str.startswith("op0[")]
    assert (noise_series["kind"] == "benchmark").sum() == 100
    alarms = changes[changes["series_id"].isin(noise_series["series_id"])]
    assert alarms.empty, alarms[["series_id", "run_index", "change_pct"]].to_string()


def test_ratio_series_match_implementations_by_group_and_params(tables) -> None:  # noqa: ANN001
    summary = tables["summary"]
    ratios = summary[(summary["kind"] == "ratio") & summary["case_key"].str.startswith("op0[")]
    assert sorted(ratios["implementation"]) == sorted([
        "cython vs python", "cython vs struct", "cython vs lmdb", "python vs struct", "python vs lmdb"])
    assert (ratios["runs"] == RUNS).all()
    # Before any step, cython is 2x python, 1.5x struct, 3x lmdb (synthetic speeds).
    series = tables["series"]
    early = series[(series["kind"] == "ratio") & series["case_key"].str.startswith("op0[")
                   & (series["run_index"] < 30)]
    medians = early.groupby("implementation")["value"].median()
    assert medians["cython vs python"] == pytest.approx(2.0, rel=0.05)
    assert medians["cython vs lmdb"] == pytest.approx(3.0, rel=0.05)
    assert medians["python vs struct"] == pytest.approx(0.75, rel=0.05)
    # The python twin's 25% slow-down at run 30 raises the compiled-over-pure speed-up, an
    # improvement of that ratio (higher is better).
    cp = tables["changes"]
    vs_python = cp[cp["series_id"].str.endswith("| cython vs python | main")
                   & cp["series_id"].str.startswith("op0[")]
    assert 30 in vs_python["run_index"].tolist()
    assert vs_python[vs_python["run_index"] == 30].iloc[0]["direction"] == "improvement"


def test_rolling_baseline_is_the_exact_median_of_previous_runs(tables) -> None:  # noqa: ANN001
    series, spec = tables["series"], tables["spec"]
    points = series[series["series_id"] == _bench_id(spec, 5)].sort_values("run_index")
    values = points["value"].tolist()
    assert points["run_index"].tolist() == list(range(RUNS))
    assert points["baseline"].isna().tolist()[0]
    for i in (1, 4, 10, 11, 59):
        window = sorted(values[max(0, i - 10):i])
        n = len(window)
        expected = window[n // 2] if n % 2 else (window[n // 2 - 1] + window[n // 2]) / 2
        assert points.iloc[i]["baseline"] == pytest.approx(expected, rel=1e-12)
        assert points.iloc[i]["delta_pct"] == pytest.approx((values[i] / expected - 1) * 100)


def test_summary_has_one_row_per_series_with_latest_values(tables) -> None:  # noqa: ANN001
    summary, series = tables["summary"], tables["series"]
    assert summary["series_id"].is_unique
    assert set(summary["series_id"]) == set(series["series_id"])
    # 104 benchmark series and 26 groups x 5 ratio pairs.
    assert (summary["kind"] == "benchmark").sum() == 104
    assert (summary["kind"] == "ratio").sum() == 26 * 5
    last = series[series["run_index"] == RUNS - 1].set_index("series_id")["value"]
    assert (summary.set_index("series_id")["latest_value"] == last.reindex(summary["series_id"]).values).all()


def test_quick_mode_runs_form_their_own_series(spark, tmp_path) -> None:  # noqa: ANN001, F811
    """CI's quick runs measure smaller workloads: switching modes must not look like a
    change point, so quick and full runs are separate series (and ratio series)."""
    spec = synthetic.HistorySpec(runs=40, benchmarks=2, noise=0.02, seed=8)
    frame = synthetic.history_frame(spec)
    quick = frame["run_time"] >= frame["run_time"].min() + (frame["run_time"].max() - frame["run_time"].min()) / 2
    frame.loc[quick, "median"] *= 0.3
    frame["extra_info"] = [dict(info, quick="true" if q else "false")
                           for info, q in zip(frame["extra_info"], quick, strict=True)]
    t = trends.compute(spark.createDataFrame(frame, RUN_TABLE), str(tmp_path))
    summary = t.summary.toPandas()
    assert sorted(summary.groupby(["kind", "mode"]).size().items()) == [
        (("benchmark", "full"), 2), (("benchmark", "quick"), 2), (("ratio", "full"), 1), (("ratio", "quick"), 1)]
    assert (summary["runs"] == 20).all()
    assert summary[summary["mode"] == "quick"]["series_id"].str.endswith("| quick").all()
    assert t.changes.count() == 0


# --- History mistakes the issue reported, each reproduced on a generated history ---------

HISTORY_RUNS = 40


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):  # noqa: ANN001, ANN201, F811
    """One history, a machine per mistake: runs measured out of commit order, two branches,
    dirty runs that look like a 50% regression, and CI jobs with a new host name each."""
    specs = [
        synthetic.HistorySpec(runs=HISTORY_RUNS, benchmarks=2, noise=0.02, seed=21, machine="order",
                              steps={0: [(20, 1.30)]},
                              run_order=tuple((r * 7) % HISTORY_RUNS for r in range(HISTORY_RUNS))),
        synthetic.HistorySpec(runs=HISTORY_RUNS, benchmarks=2, noise=0.02, seed=22, machine="branches"),
        synthetic.HistorySpec(runs=HISTORY_RUNS, benchmarks=2, noise=0.02, seed=23, machine="branches",
                              branch="feature", commit_salt="f", steps={0: [(15, 1.30)]}),
        synthetic.HistorySpec(runs=HISTORY_RUNS, benchmarks=2, noise=0.02, seed=24, machine="dirty",
                              steps={0: [(30, 1.5)]}, dirty_runs=frozenset(range(30, 40))),
        synthetic.HistorySpec(runs=HISTORY_RUNS, benchmarks=2, noise=0.02, seed=25, machine="ci",
                              host_per_run=True, steps={0: [(25, 1.30)]}),
    ]
    frame = pd.concat([synthetic.history_frame(s) for s in specs], ignore_index=True)
    runs = spark.createDataFrame(frame, RUN_TABLE)
    t = trends.compute(runs, str(tmp_path_factory.mktemp("history")))
    return {"runs": runs, "summary": t.summary.toPandas(), "changes": t.changes.toPandas(),
            "series": t.series.toPandas(), "specs": specs}


def _bench(summary, machine: str, index: int = 0, branch: str = "main"):  # noqa: ANN001, ANN202
    name = synthetic.benchmark_identity(synthetic.HistorySpec(runs=1, benchmarks=2), index)["fullname"]
    return summary[(summary["kind"] == "benchmark") & (summary["benchmark"] == name)
                   & summary["machine"].str.startswith(machine) & (summary["branch"] == branch)]


def test_runs_are_in_commit_order_not_the_order_they_ran(history) -> None:  # noqa: ANN001
    """Regression: runs were ordered by the time they ran, so re-measuring old commits
    scrambled the series and hid the step at commit 20."""
    [series_id] = _bench(history["summary"], "order")["series_id"]
    points = history["series"][history["series"]["series_id"] == series_id].sort_values("run_index")
    assert points["commit"].tolist() == [synthetic.commit_of(r) for r in range(HISTORY_RUNS)]
    changes = history["changes"][history["changes"]["series_id"] == series_id]
    assert changes["commit"].tolist() == [synthetic.commit_of(20)]


def test_branches_are_separate_series(history, spark) -> None:  # noqa: ANN001, F811
    """Regression: every branch was mixed into one series."""
    summary, changes = history["summary"], history["changes"]
    [main_id] = _bench(summary, "branches")["series_id"]
    [feature_id] = _bench(summary, "branches", branch="feature")["series_id"]
    assert changes[changes["series_id"] == main_id].empty
    assert changes[changes["series_id"] == feature_id]["commit"].tolist() == [synthetic.commit_of(15, "f")]
    only_main = trends.select_runs(history["runs"], trends.TrendConfig(branch="main"))
    assert {r["branch"] for r in only_main.select("branch").distinct().collect()} == {"main"}


def test_dirty_runs_are_left_out_unless_asked_for(history) -> None:  # noqa: ANN001
    """Regression: runs from dirty work trees were analysed like clean ones."""
    dirty = _bench(history["summary"], "dirty")
    assert dirty["runs"].tolist() == [30]
    assert history["changes"][history["changes"]["series_id"].isin(dirty["series_id"])].empty
    with_dirty = trends.select_runs(history["runs"].filter("machine = 'dirty'"),
                                    trends.TrendConfig(include_dirty=True))
    assert with_dirty.select("run_id").distinct().count() == HISTORY_RUNS


def test_machine_key_joins_ci_jobs_with_new_host_names_into_one_series(history, tmp_path) -> None:  # noqa: ANN001
    """Regression: a new host name per CI job gave one-point series and no detection."""
    assert len(_bench(history["summary"], "ci-job")) == HISTORY_RUNS  # one series per job
    ci = history["runs"].filter(F.col("machine").startswith("ci-job"))
    t = trends.compute(ci, str(tmp_path), trends.TrendConfig(machine_key=("cpu_brand", "python_version")))
    summary = t.summary.toPandas()
    [row] = _bench(summary, "Synthetic CPU/3.11.7").itertuples(index=False)
    assert row.runs == HISTORY_RUNS
    changes = t.changes.toPandas()
    assert changes[changes["series_id"] == row.series_id]["commit"].tolist() == [synthetic.commit_of(25)]
    with pytest.raises(ValueError, match="unknown machine key field"):
        trends.TrendConfig(machine_key=("hostname",))
