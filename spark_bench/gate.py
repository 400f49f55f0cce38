"""The CI gate: did the latest run of any benchmark series regress beyond a threshold?

"Regressed" compares the latest run with its rolling baseline (median of the previous runs)
in the series' "worse" direction: slower for times, fewer per second for rates. Change
points need several runs after a change to be significant, so they are reported but do not
decide the gate; a single-run jump past a generous threshold does. Timing noise on shared
VMs reaches 40-69% between identical runs, hence the default of 25%.
"""
from __future__ import annotations

import pandas as pd

from spark_bench.series import SeriesKind

DEFAULT_THRESHOLD_PCT = 25.0


def failing(summary: pd.DataFrame, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> pd.DataFrame:
    """Benchmark series whose latest run is worse than its baseline by more than the
    threshold, worst first. Ratio series are reported, not gated: a peer getting faster is
    not rmqha regressing."""
    if summary.empty:
        return summary
    worse = pd.to_numeric(summary["worse_pct"], errors="coerce")
    rows = summary[(summary["kind"] == SeriesKind.BENCHMARK.value) & (worse > threshold_pct)]
    return rows.sort_values("worse_pct", ascending=False)


def describe(rows: pd.DataFrame, threshold_pct: float) -> str:
    lines = [f"{len(rows)} series regressed by more than {threshold_pct:g}% at their latest run:"]
    for row in rows.itertuples(index=False):
        lines.append(f"  {row.series_id}: {row.worse_pct:+.1f}% vs baseline "
                     f"(run {row.latest_run_time}, commit {str(row.latest_commit)[:12]})")
    return "\n".join(lines)
