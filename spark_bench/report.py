"""Report: one self-contained HTML file (no network needed to open it) plus CSV copies.

What a reader needs first comes first: the gate's verdict and its failures worst first
(before and after values, change, since which commit), then every other open regression,
then an interactive plot per interesting series, then tables of everything else.

Plots are plotly figures (zoom, pan, hover with commit and run time); plotly.js is inlined
once in the page head and each plot is a small JSON blob. Only series with a change point
are plotted (failing ones first, capped by ``max_plots``): at 1,500 series a plot each
would be hundreds of MB, and a flat series says nothing its table row does not. The y axis
is clipped to the 1st-99th percentile of the series (plus its levels), so one spike does
not squash the rest; the points outside are drawn as triangles on the edge, with their
real value on hover.

This module is pandas only: it renders from data frames and returns the text; the caller
writes it (to any Hadoop file system via :mod:`spark_bench.storage`, or locally).
"""
from __future__ import annotations

import hashlib
import html
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from spark_bench import gate
from spark_bench.series import Direction, SeriesKind

REPORT_FILE = "report.html"
#: Columns of the series table the plots need.
POINT_COLUMNS = ["series_id", "run_index", "run_time", "commit", "value", "baseline"]
DEFAULT_MAX_PLOTS = 150


@dataclass(frozen=True)
class ReportResult:
    html: str
    plots: int
    failing: pd.DataFrame
    seconds: float


def plotted_series(summary: pd.DataFrame, changes: pd.DataFrame, failing: pd.DataFrame,
                   max_plots: int = DEFAULT_MAX_PLOTS) -> list[str]:
    """Series worth a plot, in page order: failing ones worst first, then the other series
    with change points by their largest change."""
    chosen = list(failing["series_id"])
    if not changes.empty:
        live = set(summary.loc[~summary["stale"].fillna(False).astype(bool), "series_id"])
        biggest = (changes.assign(size=changes["change_pct"].abs())
                   .groupby("series_id")["size"].max().sort_values(ascending=False))
        chosen += [s for s in biggest.index if s in live and s not in set(chosen)]
        chosen += [s for s in biggest.index if s not in set(chosen)]
    return chosen[:max_plots]


def _anchor(series_id: str) -> str:
    return "s" + hashlib.sha1(series_id.encode()).hexdigest()[:12]


def _link(series_id: str) -> str:
    return f"<a href='#{_anchor(series_id)}'>{html.escape(series_id)}</a>"


def _fmt_value(value: float, kind: str, higher_is_better: bool) -> str:
    if value is None or pd.isna(value):
        return "–"
    if kind == SeriesKind.RATIO:
        return f"{value:.3f}×"
    return gate.format_value(float(value), higher_is_better)


def _fmt_pct(value: float) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:+.1f}%"


def _table(rows: list[list[str]], header: list[str], raw_cols: frozenset[int] = frozenset(),
           css: str = "") -> str:
    if not rows:
        return "<p class='none'>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if i in raw_cols else html.escape(c)}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows)
    return f"<table class='{css}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _unit(values: np.ndarray, kind: str, higher_is_better: bool) -> tuple[float, str]:
    if kind == SeriesKind.RATIO:
        return 1.0, "speed-up ×"
    if higher_is_better:
        return 1.0, "ops/s"
    scale = float(np.median(np.abs(values))) if values.size else 1.0
    for factor, unit in ((1e9, "ns"), (1e6, "µs"), (1e3, "ms")):
        if scale * factor < 1000:
            return factor, unit
    return 1.0, "s"


def _round(values: np.ndarray) -> list[float | None]:
    """Four significant digits: the page stays small and no timing is that precise."""
    out: list[float | None] = []
    for v in values:
        out.append(None if not np.isfinite(v) else float(f"{v:.4g}"))
    return out


class _RunLabels:
    """Hover labels (commit and run time) of every plotted run, stored once per page:
    series of one machine share their runs, so each plot refers to labels by number
    (``_r`` in a trace, expanded into ``text`` by the page script) instead of repeating
    them, which was most of a plot's size."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def refs(self, points: pd.DataFrame) -> list[int]:
        out = []
        for commit, when in zip(points["commit"], points["run_time"], strict=True):
            label = f"{str(commit)[:10]} {str(when)[:16]}"
            out.append(self.index.setdefault(label, len(self.index)))
        return out

    def labels(self) -> list[str]:
        return list(self.index)


def _figure(points: pd.DataFrame, changes: pd.DataFrame, kind: str, higher_is_better: bool,
            title: str, labels: _RunLabels) -> dict[str, object]:
    """The plotly figure of one series, as the JSON-ready dict plotly.js takes."""
    values = points["value"].to_numpy(dtype=np.float64)
    factor, unit = _unit(values, kind, higher_is_better)
    y = values * factor
    run_index = points["run_index"].to_numpy()
    x = run_index.tolist()
    # A series' points are runs 0..n-1: "x0/dx" says so in a few bytes.
    xs: dict[str, object] = ({"x0": int(run_index[0]), "dx": 1}
                             if np.array_equal(run_index, np.arange(run_index[0], run_index[0] + len(x)))
                             else {"x": x})
    refs = labels.refs(points)
    levels = np.concatenate([changes["before"].to_numpy(dtype=np.float64),
                             changes["after"].to_numpy(dtype=np.float64)]) * factor
    finite = y[np.isfinite(y)]
    lo, hi = (np.quantile(finite, [0.01, 0.99]) if finite.size else (0.0, 1.0))
    if levels.size:
        lo, hi = min(lo, float(levels.min())), max(hi, float(levels.max()))
    pad = max((hi - lo) * 0.08, abs(hi) * 0.01, 1e-12)
    lo, hi = lo - pad, hi + pad
    inside = (y >= lo) & (y <= hi)
    traces: list[dict[str, object]] = [
        {"type": "scatter", "mode": "lines+markers", "name": unit, **xs,
         "y": _round(np.where(inside, y, np.nan)), "_r": refs,
         "line": {"width": 1, "color": "#4477aa"}, "marker": {"size": 3},
         "hovertemplate": "run %{x}: %{y} " + unit + "<br>%{text}<extra></extra>",
         "connectgaps": True},
        {"type": "scatter", "mode": "lines", "name": "baseline", **xs,
         "y": _round(points["baseline"].to_numpy(dtype=np.float64) * factor),
         "line": {"width": 1, "dash": "dash", "color": "#999999"}, "hoverinfo": "skip"},
    ]
    outside = ~inside & np.isfinite(y)
    if outside.any():
        idx = np.flatnonzero(outside)
        traces.append({
            "type": "scatter", "mode": "markers", "name": "outside the axis",
            "x": [x[i] for i in idx], "y": _round(np.clip(y[idx], lo, hi)),
            "customdata": _round(y[idx]), "_r": [refs[i] for i in idx],
            "marker": {"symbol": ["triangle-up" if y[i] > hi else "triangle-down" for i in idx],
                       "size": 8, "color": "#ee7733"},
            "hovertemplate": "run %{x}: %{customdata} " + unit + " (off scale)<br>%{text}<extra></extra>",
        })
    shapes, notes = [], []
    for cp in changes.itertuples(index=False):
        colour = "#cc3311" if cp.direction == Direction.REGRESSION else "#228833"
        shapes.append({"type": "line", "x0": cp.run_index, "x1": cp.run_index, "y0": 0, "y1": 1,
                       "yref": "paper", "line": {"color": colour, "width": 1.5}})
        notes.append({"x": cp.run_index, "y": 1, "yref": "paper", "showarrow": False,
                      "xanchor": "left", "yanchor": "top", "font": {"size": 10, "color": colour},
                      "text": f"{cp.change_pct:+.1f}% {str(cp.commit)[:8]}"})
    layout = {
        "title": {"text": html.escape(title), "font": {"size": 12}, "x": 0.01},
        "height": 260, "margin": {"l": 60, "r": 10, "t": 30, "b": 30},
        "xaxis": {"title": {"text": "run (commit order)"}},
        "yaxis": {"title": {"text": unit}, "range": [float(f"{lo:.4g}"), float(f"{hi:.4g}")]},
        "shapes": shapes, "annotations": notes, "showlegend": False,
    }
    return {"data": traces, "layout": layout}


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:12px;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
th{background:#f0f0f0} .none{color:#888} .bad{color:#cc3311;font-weight:bold}
.ok{color:#228833;font-weight:bold} .plot{margin:0.5em 0 1em 0;max-width:1100px}
h2{margin-top:1.5em}
"""


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs
    return get_plotlyjs()


def _suspected_section(summary: pd.DataFrame, policy: gate.GatePolicy,
                       stale: dict[str, bool]) -> str:
    """Series whose latest run alone jumped off their level, largest first: empty (no
    heading) when there is none, so a page without suspects is the page it always was."""
    if "suspect_worse_pct" not in summary.columns:
        return ""
    rows = summary[summary["suspect_worse_pct"].notna()
                   & ~summary["series_id"].map(stale).fillna(False).astype(bool)]
    if rows.empty:
        return ""
    rows = rows.assign(_a=rows["suspect_change_pct"].abs()).sort_values("_a", ascending=False)
    failing_if_confirmed = set(gate.suspected(summary, policy)["series_id"])

    def verdict(r: object) -> str:
        if r.series_id in failing_if_confirmed:
            return f"would fail the gate if confirmed ({policy.threshold_for(r.benchmark, r.series_id):g}%)"
        if r.kind == SeriesKind.RATIO:
            return "ratio: reported only"
        return "improvement" if r.suspect_worse_pct < 0 else "below its threshold"

    return ("<h2>Suspected: a jump in the latest run alone, rerun to confirm</h2>"
            "<p>One run cannot tell a step from a spike: these are not failures. A rerun at "
            "the same level confirms the change (and the gate judges it); a rerun back at the "
            "old level clears it.</p>"
            + _table([[html.escape(r.series_id), str(r.latest_run_time)[:19], str(r.latest_commit)[:12],
                       _fmt_value(r.suspect_before, r.kind, r.higher_is_better),
                       _fmt_value(r.latest_value, r.kind, r.higher_is_better),
                       _fmt_pct(r.suspect_change_pct), f"{r.suspect_z:.1f}", verdict(r)]
                      for r in rows.itertuples(index=False)],
                     ["series", "latest run", "commit", "level before", "latest", "jump",
                      "strength (robust σ)", "gate"], frozenset({0})))


def render(summary: pd.DataFrame, changes: pd.DataFrame, points: pd.DataFrame,
           policy: gate.GatePolicy | None = None, ingest_log: dict[str, object] | None = None,
           max_plots: int = DEFAULT_MAX_PLOTS) -> ReportResult:
    """The report page. ``points`` needs the rows (:data:`POINT_COLUMNS`) of the series
    :func:`plotted_series` picks; more are ignored."""
    import json

    started = time.perf_counter()
    policy = policy or gate.GatePolicy()
    fails = gate.failing(summary, changes, policy)
    failing_ids = set(fails["series_id"])
    kinds = dict(zip(summary["series_id"], summary["kind"], strict=True))
    hib = dict(zip(summary["series_id"], summary["higher_is_better"].astype(bool), strict=True))
    stale = dict(zip(summary["series_id"], summary["stale"].fillna(False).astype(bool), strict=True))
    bench = summary[summary["kind"] == SeriesKind.BENCHMARK.value]
    ratios = summary[summary["kind"] == SeriesKind.RATIO.value]
    open_regs = changes[changes["open"].fillna(False).astype(bool)].sort_values(
        "open_worse_pct", ascending=False)
    runs = int(summary["runs"].max()) if len(summary) else 0

    def verdict(series_id: str) -> str:
        if series_id in failing_ids:
            return "FAILS the gate"
        if stale.get(series_id):
            return "stale (not run lately): ignored"
        if kinds.get(series_id) == SeriesKind.RATIO:
            return "ratio: reported only"
        return "below its threshold"

    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>rmqha benchmark trends</title>", f"<style>{_CSS}</style>",
             f"<script>{_plotly_js()}</script></head><body>"]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    overrides = "".join(f"; {html.escape(p)}: {t:g}%" for p, t in policy.overrides)
    status = (f"<span class='bad'>FAILED: {len(fails)} series</span>" if len(fails)
              else "<span class='ok'>passed</span>")
    parts.append("<h1>rmqha benchmark trends</h1>")
    parts.append(
        f"<p>Generated {now}. {len(bench)} benchmark series, {len(ratios)} ratio series, "
        f"up to {runs} runs per series, {len(changes)} change points, {len(open_regs)} open "
        f"regressions, {int(summary['stale'].fillna(False).astype(bool).sum())} stale series.</p>"
        f"<p>Gate (an open regression at or above {policy.threshold_pct:g}%{overrides}): "
        f"{status}.</p>")
    if ingest_log is not None:
        parts.append(
            f"<p>Ingest: {ingest_log.get('files_seen', 0)} files seen, "
            f"{ingest_log.get('files_new', 0)} new, {ingest_log.get('files_ingested', 0)} used, "
            f"{ingest_log.get('rows_new', 0)} new rows, "
            f"{ingest_log.get('rows_duplicate', 0)} duplicate rows.</p>")

    parts.append("<h2>Gate failures, worst first</h2>")
    parts.append(_table([
        [_link(r.series_id), _fmt_value(r.before, r.kind, r.higher_is_better),
         _fmt_value(r.current, r.kind, r.higher_is_better), _fmt_pct(r.open_worse_pct),
         f"{r.threshold_pct:g}%", str(r.cp_commit)[:12], str(r.cp_run_time)[:19]]
        for r in fails.itertuples(index=False)],
        ["series", "before", "now", "worse by", "threshold", "since commit", "run time"],
        frozenset({0}), "bad"))

    parts.append(_suspected_section(summary, policy, stale))

    parts.append("<h2>Open regressions (not recovered), worst first</h2>")
    parts.append(_table([
        [_link(r.series_id), _fmt_value(r.before, kinds.get(r.series_id, ""), hib.get(r.series_id, False)),
         _fmt_value(r.current, kinds.get(r.series_id, ""), hib.get(r.series_id, False)),
         _fmt_pct(r.open_worse_pct), _fmt_pct(r.change_pct), str(r.commit)[:12],
         str(r.run_time)[:19], f"{r.z:.1f}", verdict(r.series_id)]
        for r in open_regs.itertuples(index=False)],
        ["series", "before", "now", "worse by", "step", "since commit", "run time",
         "strength (robust σ)", "gate"], frozenset({0})))

    plot_ids = plotted_series(summary, changes, fails, max_plots)
    parts.append(f"<h2>Series with change points ({len(plot_ids)} plotted)</h2>"
                 "<p>Drag to zoom, double-click to reset; dashed: rolling baseline; vertical "
                 "lines: change points; triangles: points beyond the 1st-99th percentile axis.</p>")
    by_series = dict(tuple(points[points["series_id"].isin(plot_ids)]
                           .sort_values("run_index").groupby("series_id", sort=False)))
    cp_by_series = dict(tuple(changes.groupby("series_id"))) if len(changes) else {}
    empty = changes.iloc[0:0]
    scripts = []
    labels = _RunLabels()
    plots = 0
    for series_id in plot_ids:
        pts = by_series.get(series_id)
        if pts is None or pts.empty:
            continue
        fig = _figure(pts, cp_by_series.get(series_id, empty), kinds.get(series_id, ""),
                      hib.get(series_id, False), series_id, labels)
        anchor = _anchor(series_id)
        parts.append(f"<div class='plot' id='{anchor}'></div>")
        scripts.append(f"P('{anchor}',{json.dumps(fig, separators=(',', ':'))});")
        plots += 1

    parts.append("<h2>All benchmark series</h2>")
    ordered = bench.assign(_w=pd.to_numeric(bench["worse_pct"], errors="coerce").fillna(-1e18)
                           ).sort_values(["open_regressions", "_w"], ascending=False)
    parts.append(_table([
        [_link(r.series_id) if r.series_id in set(plot_ids) else html.escape(r.series_id),
         str(r.latest_run_time)[:19], _fmt_value(r.latest_value, r.kind, r.higher_is_better),
         _fmt_value(r.baseline, r.kind, r.higher_is_better), _fmt_pct(r.delta_pct), str(r.runs),
         str(r.changes), str(r.open_regressions), "stale" if r.stale else ""]
        for r in ordered.itertuples(index=False)],
        ["series", "latest run", "latest", "baseline", "Δ vs baseline", "runs", "changes", "open",
         ""], frozenset({0})))

    parts.append("<h2>Ratios (speed-up of the rmqha side, same run, same case)</h2>")
    parts.append(_table([
        [_link(r.series_id) if r.series_id in set(plot_ids) else html.escape(r.series_id),
         _fmt_value(r.latest_value, r.kind, True), _fmt_value(r.baseline, r.kind, True),
         _fmt_pct(r.delta_pct), str(r.runs), str(r.changes)]
        for r in ratios.sort_values("series_id").itertuples(index=False)],
        ["ratio series", "latest", "baseline", "Δ", "runs", "changes"], frozenset({0})))

    parts.append("<h2>All change points, largest first</h2>")
    parts.append(_table([
        [html.escape(r.series_id), str(r.run_time)[:19], str(r.commit)[:12], r.direction,
         _fmt_pct(r.change_pct), f"{r.z:.1f}", "yes" if r.open else ""]
        for r in changes.assign(_a=changes["change_pct"].abs()).sort_values("_a", ascending=False)
        .itertuples(index=False)],
        ["series", "run time", "commit", "direction", "change", "strength (robust σ)", "open"],
        frozenset({0})))

    if ingest_log and ingest_log.get("skipped"):
        parts.append("<h2>Skipped files</h2>")
        parts.append(_table([[str(s["path"]), str(s["reason"])] for s in ingest_log["skipped"]],
                            ["file", "reason"]))

    # Plots are drawn after the page is parsed, one per animation frame, so a long report
    # shows its tables at once.
    parts.append("<script>const R=" + json.dumps(labels.labels(), separators=(",", ":"))
                 + ";const Q=[];function P(i,f){Q.push([i,f]);}" + "".join(scripts)
                 + "function D(){const t=Q.shift();if(!t)return;for(const d of t[1].data){"
                 "if(d._r){d.text=d._r.map(k=>R[k]);delete d._r;}}"
                 "Plotly.newPlot(t[0],t[1].data,t[1].layout,{responsive:true,displaylogo:false});"
                 "requestAnimationFrame(D);}requestAnimationFrame(D);</script></body></html>")
    return ReportResult(html="".join(parts), plots=plots, failing=fails,
                        seconds=time.perf_counter() - started)
