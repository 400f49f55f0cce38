"""Report: one self-contained HTML file plus CSV copies of the trend tables.

Inputs are the Parquet tables written by :func:`spark_bench.trends.compute`; they are
small, so the report reads them with pandas/pyarrow and needs no JVM. Every plot is a PNG
rendered with matplotlib's Agg backend and embedded as base64, so the page can be mailed
or attached to a CI run as a single file.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")  # no display on CI machines; must precede pyplot
import matplotlib.artist  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from spark_bench import gate  # noqa: E402
from spark_bench.series import Direction, SeriesKind  # noqa: E402

TABLES = ("summary", "changes", "series")
INGEST_LOG = "ingest.json"
REPORT_FILE = "report.html"


@dataclass(frozen=True)
class ReportResult:
    html_path: str
    csv_paths: tuple[str, ...]
    plots: int
    failing: pd.DataFrame
    seconds: float


def load_tables(out: str) -> dict[str, pd.DataFrame]:
    tables = {}
    for name in TABLES:
        path = os.path.join(out, f"{name}.parquet")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: run `python -m spark_bench trends` first")
        tables[name] = pd.read_parquet(path)
    return tables


def _seconds_unit(values: pd.Series) -> tuple[float, str]:
    scale = float(values.abs().median()) if len(values) else 1.0
    for factor, unit in ((1e9, "ns"), (1e6, "µs"), (1e3, "ms")):
        if scale * factor < 1000:
            return factor, unit
    return 1.0, "s"


def _fmt_value(value: float, kind: str, higher_is_better: bool) -> str:
    if pd.isna(value):
        return "–"
    if kind == SeriesKind.RATIO:
        return f"{value:.3f}×"
    if higher_is_better:
        return f"{value:,.0f}/s"
    factor, unit = _seconds_unit(pd.Series([value]))
    return f"{value * factor:.4g} {unit}"


def _fmt_pct(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:+.1f}%"


def _anchor(series_id: str) -> str:
    return "s" + hashlib.sha1(series_id.encode()).hexdigest()[:12]


class _Plotter:
    """One figure, axes and pair of lines reused for every series. Re-creating them (or
    ``ax.clear()``, which rebuilds the ticks) and automatic title placement took most of
    the render time for hundreds of series; here only the data and a few texts change."""

    def __init__(self) -> None:
        self.fig = plt.figure(figsize=(8, 2.4), dpi=80)
        self.ax = self.fig.add_subplot(1, 1, 1)
        self.fig.subplots_adjust(left=0.09, right=0.99, top=0.88, bottom=0.2)
        (self.value_line,) = self.ax.plot([], [], lw=0.8, color="#4477aa")
        (self.baseline_line,) = self.ax.plot([], [], lw=0.8, ls="--", color="#999999")
        self.ax.tick_params(labelsize=7)
        self.ax.grid(alpha=0.3)
        # A fixed title position skips matplotlib's per-draw layout search for it.
        self.title = self.ax.set_title("", fontsize=8, loc="left", y=1.0, pad=3)
        self.markers: list[matplotlib.artist.Artist] = []

    def close(self) -> None:
        plt.close(self.fig)

    def render(self, points: pd.DataFrame, changes: pd.DataFrame, title: str) -> str:
        ax = self.ax
        for artist in self.markers:
            artist.remove()
        self.markers = []
        kind = str(points["kind"].iloc[0])
        if kind == SeriesKind.RATIO:
            factor, unit = 1.0, "speed-up ×"
        elif bool(points["higher_is_better"].iloc[0]):
            factor, unit = 1.0, "ops/s"
        else:
            factor, unit = _seconds_unit(points["value"])
        x = points["run_index"].to_numpy()
        self.value_line.set_data(x, points["value"].to_numpy() * factor)
        self.baseline_line.set_data(x, points["baseline"].to_numpy() * factor)
        for cp in changes.itertuples(index=False):
            colour = "#cc3311" if cp.direction == Direction.REGRESSION else "#228833"
            self.markers.append(ax.axvline(cp.run_index, color=colour, lw=1.2, alpha=0.8))
            self.markers.append(ax.annotate(
                f" {cp.change_pct:+.0f}% {str(cp.commit)[:8]}", (cp.run_index, 0.97),
                xycoords=("data", "axes fraction"), fontsize=7, color=colour, ha="left", va="top"))
        ax.relim()
        ax.autoscale_view()
        first, last = points["run_time"].iloc[0], points["run_time"].iloc[-1]
        ax.set_xlabel(f"run # ({first:%Y-%m-%d} … {last:%Y-%m-%d}); dashed: rolling baseline",
                      fontsize=7)
        ax.set_ylabel(unit, fontsize=8)
        self.title.set_text(title)
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return base64.b64encode(buf.getvalue()).decode("ascii")


def _table(rows: list[list[str]], header: list[str], raw_cols: frozenset[int] = frozenset()) -> str:
    if not rows:
        return "<p class='none'>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(f"<td>{c if i in raw_cols else html.escape(c)}</td>" for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _link(series_id: str) -> str:
    return f"<a href='#{_anchor(series_id)}'>{html.escape(series_id)}</a>"


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:12px;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
th{background:#f0f0f0} .none{color:#888} .bad{color:#cc3311;font-weight:bold}
.plot{margin:0.5em 0 1em 0} h2{margin-top:1.5em} code{font-size:12px}
"""


def render(out: str, threshold_pct: float = gate.DEFAULT_THRESHOLD_PCT,
           points_csv: bool = False) -> ReportResult:
    """Write ``report.html`` and CSV copies of the summary and change tables into ``out``;
    with ``points_csv`` also every series point (large: 2,000 runs x 450 series is 300 MB
    of CSV, and ``series.parquet`` already holds it)."""
    started = time.perf_counter()
    tables = load_tables(out)
    summary, changes, series = tables["summary"], tables["changes"], tables["series"]
    csv_paths = []
    for name, df in tables.items():
        if name == "series" and not points_csv:
            continue
        path = os.path.join(out, f"{name}.csv")
        df.to_csv(path, index=False)
        csv_paths.append(path)
    ingest_log = None
    log_path = os.path.join(out, INGEST_LOG)
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8") as fh:
            ingest_log = json.load(fh)

    fails = gate.failing(summary, threshold_pct)
    summary = summary.sort_values(["kind", "series_id"])
    bench = summary[summary["kind"] == SeriesKind.BENCHMARK.value]
    ratios = summary[summary["kind"] == SeriesKind.RATIO.value]
    open_regs = changes[changes["open"].fillna(False).astype(bool)].sort_values("worse_pct", ascending=False)

    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>rmqha benchmark trends</title>"
             f"<style>{_CSS}</style></head><body>"]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts.append("<h1>rmqha benchmark trends</h1>")
    parts.append(
        f"<p>Generated {now}. {len(bench)} benchmark series, {len(ratios)} ratio series, "
        f"{series['run_id'].nunique()} runs, {len(changes)} change points, "
        f"{len(open_regs)} open regressions. Gate: latest run worse than its rolling baseline "
        f"by more than {threshold_pct:g}%: <span class='{'bad' if len(fails) else ''}'>"
        f"{len(fails)} series</span>.</p>")
    if ingest_log is not None:
        parts.append(
            f"<p>Ingest: {ingest_log.get('files_seen', 0)} files seen, "
            f"{ingest_log.get('files_ingested', 0)} used, {ingest_log.get('rows_new', 0)} new rows, "
            f"{ingest_log.get('rows_duplicate', 0)} duplicates.</p>")
        skipped = ingest_log.get("skipped", [])
        if skipped:
            parts.append("<h2>Skipped files</h2>")
            parts.append(_table([[s["path"], s["reason"]] for s in skipped], ["file", "reason"]))

    parts.append(f"<h2>Latest run regressed by more than {threshold_pct:g}%</h2>")
    parts.append(_table([
        [_link(r.series_id), _fmt_value(r.latest_value, r.kind, r.higher_is_better),
         _fmt_value(r.baseline, r.kind, r.higher_is_better), _fmt_pct(r.worse_pct),
         str(r.latest_commit)[:12]]
        for r in fails.itertuples(index=False)],
        ["series", "latest", "baseline", "worse by", "commit"], frozenset({0})))

    parts.append("<h2>Open regressions (change points not yet recovered)</h2>")
    parts.append(_table([
        [_link(r.series_id), str(r.run_time), str(r.commit)[:12], _fmt_pct(r.change_pct),
         f"{r.confidence:.3f}"]
        for r in open_regs.itertuples(index=False)],
        ["series", "run time", "commit", "change", "confidence"], frozenset({0})))

    parts.append("<h2>Current values</h2>")
    parts.append(_table([
        [_link(r.series_id), str(r.latest_run_time), _fmt_value(r.latest_value, r.kind, r.higher_is_better),
         _fmt_value(r.baseline, r.kind, r.higher_is_better), _fmt_pct(r.delta_pct), str(r.runs),
         str(r.changes), str(r.open_regressions)]
        for r in bench.itertuples(index=False)],
        ["series", "latest run", "latest", "baseline", "Δ vs baseline", "runs", "changes", "open"],
        frozenset({0})))

    parts.append("<h2>Ratios (speed-up of the rmqha side, same run, same case)</h2>")
    parts.append(_table([
        [_link(r.series_id), _fmt_value(r.latest_value, r.kind, True), _fmt_value(r.baseline, r.kind, True),
         _fmt_pct(r.delta_pct), str(r.runs), str(r.changes)]
        for r in ratios.itertuples(index=False)],
        ["ratio series", "latest", "baseline", "Δ", "runs", "changes"], frozenset({0})))

    parts.append("<h2>All change points</h2>")
    parts.append(_table([
        [_link(r.series_id), str(r.run_time), str(r.commit)[:12], r.direction, _fmt_pct(r.change_pct),
         f"{r.confidence:.3f}", "yes" if r.open else ""]
        for r in changes.sort_values(["series_id", "run_index"]).itertuples(index=False)],
        ["series", "run time", "commit", "direction", "change", "confidence", "open"], frozenset({0})))

    parts.append("<h2>Series</h2>")
    plotter = _Plotter()
    plots = 0
    try:
        by_series = dict(tuple(series.sort_values("run_index").groupby("series_id", sort=True)))
        cp_by_series = dict(tuple(changes.groupby("series_id")))
        empty = changes.iloc[0:0]
        for series_id in summary["series_id"]:
            points = by_series.get(series_id)
            if points is None:
                continue
            png = plotter.render(points, cp_by_series.get(series_id, empty), series_id)
            parts.append(f"<div class='plot' id='{_anchor(series_id)}'>"
                         f"<img alt='{html.escape(series_id)}' src='data:image/png;base64,{png}'></div>")
            plots += 1
    finally:
        plotter.close()
    parts.append("</body></html>")

    html_path = os.path.join(out, REPORT_FILE)
    with open(html_path, "w", encoding="utf-8") as fh:
        fh.write("".join(parts))
    return ReportResult(html_path=os.path.abspath(html_path), csv_paths=tuple(csv_paths),
                        plots=plots, failing=fails, seconds=time.perf_counter() - started)
