"""The report page (spark_bench.report) at the issue's scale, without a JVM: 1,500 series of
2,000 runs, 300 of them with a change point. Plotting every series made a 60 MB page."""
from __future__ import annotations

import re

import needs

pd = needs.module("pandas", "the spark extra", module_level=True)
np = needs.module("numpy", "the spark extra", module_level=True)
needs.module("plotly", "the spark extra", module_level=True)
from spark_bench import gate, report  # noqa: E402 - after the optional third-party modules

SERIES, RUNS, WITH_CHANGES = 1500, 2000, 300


def _tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(7)
    ids = [f"benches/bench_x.py::test_case[{i}] | host | cython | main" for i in range(SERIES)]
    commits = [f"{i:040x}" for i in range(RUNS)]
    times = pd.date_range("2026-01-01", periods=RUNS, freq="h")
    summary = pd.DataFrame({
        "kind": "benchmark", "series_id": ids, "benchmark": [i.split(" | ")[0] for i in ids],
        "machine": "host", "branch": "main", "implementation": "cython", "mode": "full",
        "runs": RUNS, "latest_run_time": times[-1], "latest_value": 1e-6, "baseline": 1e-6,
        "delta_pct": 0.5, "worse_pct": 0.5, "higher_is_better": False,
        "changes": [1 if i < WITH_CHANGES else 0 for i in range(SERIES)],
        "open_regressions": [1 if i < 40 else 0 for i in range(SERIES)],
        "stale": [i % 500 == 499 for i in range(SERIES)], "runs_since_seen": 0,
    })
    changes = pd.DataFrame({
        "series_id": ids[:WITH_CHANGES], "kind": "benchmark", "run_index": 1500,
        "run_id": "r1500", "run_time": times[1500], "commit": commits[1500],
        "before": 1e-6, "after": [1.0e-6 * (1.05 + 0.001 * i) for i in range(WITH_CHANGES)],
        "change_pct": [5.0 + 0.1 * i for i in range(WITH_CHANGES)],
        "worse_pct": [5.0 + 0.1 * i for i in range(WITH_CHANGES)],
        "confidence": 0.995, "z": 12.0, "direction": "regression",
        "open": [i < 40 for i in range(WITH_CHANGES)],
        "current": [1.0e-6 * (1.05 + 0.001 * i) for i in range(WITH_CHANGES)],
        "open_worse_pct": [5.0 + 0.1 * i for i in range(WITH_CHANGES)],
    })
    values = 1e-6 * (1 + 0.03 * rng.standard_normal((WITH_CHANGES, RUNS)))
    values[:, 1500:] *= 1.1
    values[:, 777] *= 5  # one huge spike per series: must not squash the axis
    points = pd.DataFrame({
        "series_id": np.repeat(ids[:WITH_CHANGES], RUNS), "run_index": np.tile(np.arange(RUNS), WITH_CHANGES),
        "run_time": np.tile(times, WITH_CHANGES), "commit": np.tile(commits, WITH_CHANGES),
        "value": values.ravel(), "baseline": values.ravel(),
    })
    return summary, changes, points


def test_a_1500_series_report_plots_the_interesting_ones_and_stays_small() -> None:
    summary, changes, points = _tables()
    result = report.render(summary, changes, points, gate.GatePolicy(threshold_pct=6.0))
    text = result.html
    size_mb = len(text.encode()) / 1e6
    assert result.plots == report.DEFAULT_MAX_PLOTS
    # plotly.js (4.8 MB) once, then about 25 KB per plot of 2,000 points.
    assert size_mb < 12, size_mb
    assert text.count("* plotly.js v") == 1
    # Every series is still listed; failing ones (open, >= 6%, not stale) lead, worst first.
    assert all(f"test_case[{i}]" in text for i in (0, 999, 1499))
    fails = result.failing
    assert len(fails) == 30 and fails["open_worse_pct"].is_monotonic_decreasing
    first_plot = re.search(r"<div class='plot' id='(s[0-9a-f]{12})'>", text).group(1)
    assert first_plot == report._anchor(fails["series_id"].iloc[0])
    # Robust axis: the 5x spike is drawn as an off-scale marker, the axis stays near 1 µs.
    fig = report._figure(points[points["series_id"] == summary["series_id"][0]],
                         changes.iloc[:1], "benchmark", False, "t", report._RunLabels())
    low, high = fig["layout"]["yaxis"]["range"]
    assert 0.8 < low < 1.0 and 1.1 < high < 1.4
    [outside] = [t for t in fig["data"] if t["name"] == "outside the axis"]
    assert 777 in outside["x"] and len(outside["x"]) < 20  # the spike and a few tail points
    assert outside["customdata"][outside["x"].index(777)] > 4.5
