"""The CI gate: its verdict is the trend pipeline's own.

A benchmark series fails the gate when it has an *open* regression (a change point in the
worse direction, slower for times or fewer per second for rates, whose level has not
recovered) and what that regression still costs (``open_worse_pct``: the current level
against the level before the change) is at least the threshold for that benchmark.

* A lone spike never fails. In the middle of a series it is noise to the detector (a change
  point needs ``min_size`` runs on each side). In the latest run it cannot be told from a
  step yet: it is printed as ``SUSPECTED ...; rerun to confirm`` (stdout, exit code
  unchanged) when it is at or above the threshold in the worse direction.
* A 10-20 % step fails once it is confirmed: by one more run at the new level (the
  detector's look at the latest runs), or by the detector once ``min_size`` runs follow it.
* A stale series (not measured in the last ``stale_after`` runs of its machine and branch,
  because the benchmark was renamed or removed) is forgotten, whatever it did before.
* Ratio series (an rmqha twin against a peer) are reported, never gated: a peer getting
  faster is not rmqha regressing.

Exit codes of ``rmqha-trends trends|report --fail-on-regression``: 0 the gate passed,
1 at least one series failed it (one line each on stderr), 2 nothing to analyse or bad
arguments.

Plain pandas: the report and the gate run without a JVM.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_bench.series import SeriesKind

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_THRESHOLD_PCT = 10.0

EXIT_PASSED = 0
EXIT_REGRESSED = 1
EXIT_NO_DATA = 2


@dataclass(frozen=True)
class GatePolicy:
    """A global threshold and per-benchmark overrides: ``(glob, pct)`` pairs matched in
    order against the benchmark name and the series id (first match wins). A pattern equal
    to a name matches it even when the name has glob characters (``test_x[param]``)."""

    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    overrides: tuple[tuple[str, float], ...] = field(default_factory=tuple)

    def threshold_for(self, benchmark: str, series_id: str) -> float:
        for pattern, pct in self.overrides:
            if pattern in (benchmark, series_id) or fnmatch.fnmatchcase(benchmark, pattern) \
                    or fnmatch.fnmatchcase(series_id, pattern):
                return pct
        return self.threshold_pct

    @staticmethod
    def parse_override(text: str) -> tuple[str, float]:
        """``GLOB=PCT`` from the command line."""
        pattern, sep, pct = text.rpartition("=")
        if not sep or not pattern:
            raise ValueError(f"threshold override {text!r} is not GLOB=PCT")
        try:
            value = float(pct)
        except ValueError:
            raise ValueError(f"threshold override {text!r}: {pct!r} is not a number") from None
        if value < 0:
            raise ValueError(f"threshold override {text!r}: the percentage must be >= 0")
        return pattern, value


def failing(summary: pd.DataFrame, changes: pd.DataFrame,
            policy: GatePolicy | None = None) -> pd.DataFrame:
    """One row per failing series (its worst open regression), worst first, with the
    summary's columns plus ``threshold_pct`` and the change point's ``before``,
    ``current``, ``open_worse_pct``, ``change_pct``, ``cp_commit``, ``cp_run_time``."""
    import pandas as pd
    policy = policy or GatePolicy()
    columns = [*summary.columns, "threshold_pct", "before", "current", "open_worse_pct",
               "change_pct", "cp_commit", "cp_run_time", "cp_run_index"]
    if summary.empty or changes.empty:
        return pd.DataFrame(columns=columns)
    live = summary[(summary["kind"] == SeriesKind.BENCHMARK.value)
                   & ~summary["stale"].fillna(False).astype(bool)]
    open_regs = changes[changes["open"].fillna(False).astype(bool)]
    merged = live.merge(
        open_regs[["series_id", "before", "current", "open_worse_pct", "change_pct", "commit",
                   "run_time", "run_index"]]
        .rename(columns={"commit": "cp_commit", "run_time": "cp_run_time",
                         "run_index": "cp_run_index"}),
        on="series_id")
    if merged.empty:
        return pd.DataFrame(columns=columns)
    merged["threshold_pct"] = [policy.threshold_for(b, s)
                               for b, s in zip(merged["benchmark"], merged["series_id"], strict=True)]
    merged = merged[merged["open_worse_pct"] >= merged["threshold_pct"]]
    worst = (merged.sort_values("open_worse_pct", ascending=False)
             .drop_duplicates("series_id", keep="first"))
    return worst[columns].reset_index(drop=True)


def suspected(summary: pd.DataFrame, policy: GatePolicy | None = None) -> pd.DataFrame:
    """Live benchmark series whose latest run alone jumped, in the worse direction, by at
    least their threshold (what would fail the gate if a rerun confirmed it), worst first,
    with ``threshold_pct``. Tables without the ``suspect_*`` columns give none."""
    policy = policy or GatePolicy()
    if summary.empty or "suspect_worse_pct" not in summary.columns:
        return summary.iloc[0:0].assign(threshold_pct=[])
    rows = summary[(summary["kind"] == SeriesKind.BENCHMARK.value)
                   & ~summary["stale"].fillna(False).astype(bool)
                   & summary["suspect_worse_pct"].notna()].copy()
    rows["threshold_pct"] = [policy.threshold_for(b, s)
                             for b, s in zip(rows["benchmark"], rows["series_id"], strict=True)]
    rows = rows[rows["suspect_worse_pct"] >= rows["threshold_pct"]]
    return rows.sort_values("suspect_worse_pct", ascending=False).reset_index(drop=True)


def describe_suspected(rows: pd.DataFrame) -> str:
    """One line per suspected jump: not a failure, a request for a rerun."""
    lines = []
    for row in rows.itertuples(index=False):
        hib = bool(row.higher_is_better)
        lines.append(
            f"SUSPECTED {row.series_id}: {row.suspect_worse_pct:+.1f}% in the latest run alone "
            f"({'throughput down' if hib else 'slower'}; "
            f"{format_value(row.suspect_before, hib)} -> {format_value(row.latest_value, hib)}) "
            f"at commit {str(row.latest_commit)[:12]}; suspected, rerun to confirm "
            f"(not a failure; threshold {row.threshold_pct:g}%)")
    return "\n".join(lines)


def format_value(value: float, higher_is_better: bool) -> str:
    """A time in a readable unit, or a rate per second."""
    if value != value:  # NaN
        return "–"
    if higher_is_better:
        return f"{value:,.1f}/s"
    for factor, unit in ((1e9, "ns"), (1e6, "µs"), (1e3, "ms")):
        if abs(value) * factor < 1000:
            return f"{value * factor:.4g} {unit}"
    return f"{value:.4g} s"


def describe_row(row: object) -> str:
    """One line: what regressed, by how much, since which commit."""
    hib = bool(row.higher_is_better)
    when = str(row.cp_run_time)[:19]
    return (f"REGRESSION {row.series_id}: {row.open_worse_pct:+.1f}% "
            f"({'throughput down' if hib else 'slower'}; "
            f"{format_value(row.before, hib)} -> {format_value(row.current, hib)}) "
            f"since commit {str(row.cp_commit)[:12]} (run {when}); "
            f"threshold {row.threshold_pct:g}%")


def describe(rows: pd.DataFrame) -> str:
    lines = [f"gate: {len(rows)} series with an open regression at or above its threshold:"]
    lines.extend(describe_row(r) for r in rows.itertuples(index=False))
    return "\n".join(lines)
