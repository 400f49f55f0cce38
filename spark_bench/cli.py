"""Command line: ``python -m spark_bench {ingest,trends,report}``.

* ``ingest --history PATH... --table DIR``: add pytest-benchmark runs to the Parquet table.
* ``trends --out DIR [--history PATH...]``: with ``--history``, ingest first (into
  ``DIR/runs.parquet`` unless ``--table`` says otherwise); then baselines, change points
  and ratio series; then the report. This is what ``make trends`` runs.
* ``report --out DIR``: re-render the HTML and CSV from the trend tables (no JVM).

``--fail-on-regression [--threshold PCT]`` on trends/report exits 1 when the latest run of
any benchmark series is worse than its baseline by more than the threshold. Exit 2 means
there was nothing to analyse.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_bench.changepoint import DetectorConfig
from spark_bench.gate import DEFAULT_THRESHOLD_PCT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_bench.ingest import IngestResult
    from spark_bench.report import ReportResult

RUN_TABLE_DIR = "runs.parquet"


def _add_spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default="local[*]",
                   help="Spark master URL (default local[*]; e.g. spark://host:7077)")


def _add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--points-csv", action="store_true",
                   help="also write every series point as series.csv (large; Parquet has it)")


def _add_gate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 if the latest run of any benchmark series regressed")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_PCT, metavar="PCT",
                   help=f"regression threshold in percent (default {DEFAULT_THRESHOLD_PCT:g})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="pytest-benchmark JSON files -> Parquet run table")
    p.add_argument("--history", nargs="+", required=True, metavar="PATH",
                   help="files, directories (searched recursively) or globs; any Spark-readable path")
    p.add_argument("--table", required=True, help="Parquet table directory (created if missing)")
    _add_spark_args(p)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("trends", help="baselines, change points, ratios, then the report")
    p.add_argument("--history", nargs="+", metavar="PATH", help="ingest these first")
    p.add_argument("--table", help=f"run table (default OUT/{RUN_TABLE_DIR})")
    p.add_argument("--out", required=True, help="output directory for tables and report")
    p.add_argument("--metric", default="median", choices=("median", "mean", "min", "ops"))
    p.add_argument("--baseline-window", type=int, default=10, metavar="RUNS",
                   help="previous runs in the rolling-median baseline (default 10)")
    p.add_argument("--alpha", type=float, default=DetectorConfig.alpha,
                   help="permutation-test significance level (default %(default)s)")
    p.add_argument("--min-change", type=float, default=DetectorConfig.min_change * 100, metavar="PCT",
                   help="smallest change worth reporting, percent (default %(default)s)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML/CSV report")
    _add_report_args(p)
    _add_spark_args(p)
    _add_gate_args(p)
    p.set_defaults(func=cmd_trends)

    p = sub.add_parser("report", help="render report.html and CSV from the trend tables")
    p.add_argument("--out", required=True, help="directory written by `trends`")
    _add_report_args(p)
    _add_gate_args(p)
    p.set_defaults(func=cmd_report)
    return parser


def _session(args: argparse.Namespace, spark: SparkSession | None) -> tuple[SparkSession, bool]:
    """The given session (tests share one) or a new one we must stop."""
    if spark is not None:
        return spark, False
    from spark_bench.session import SessionOptions, build_session, java_available
    if not java_available():
        raise SystemExit("spark_bench: Java 17+ is needed for Spark (set JAVA_HOME or put java on PATH)")
    return build_session(SessionOptions(master=args.master)), True


def _print_ingest(result: IngestResult) -> None:
    for skipped in result.skipped:
        print(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    if result.entries_invalid:
        print(f"skipped {result.entries_invalid} benchmark entries without a name or median",
              file=sys.stderr)
    print(f"ingest: {result.files_seen} files seen, {result.files_ingested} used, "
          f"{len(result.skipped)} skipped; {result.rows_new} new rows, "
          f"{result.rows_duplicate} already present; table {result.table} "
          f"({result.seconds:.1f} s)")


def cmd_ingest(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    from spark_bench.ingest import ingest
    session, owned = _session(args, spark)
    try:
        result = ingest(session, args.history, args.table)
    finally:
        if owned:
            session.stop()
    _print_ingest(result)
    return 0 if result.files_seen else 2


def _gate(out: str, args: argparse.Namespace, report_result: ReportResult | None = None) -> int:
    import pandas as pd

    from spark_bench import gate
    if report_result is not None:
        rows = report_result.failing
    else:
        rows = gate.failing(pd.read_parquet(os.path.join(out, "summary.parquet")), args.threshold)
    if len(rows):
        print(gate.describe(rows, args.threshold), file=sys.stderr)
        return 1 if args.fail_on_regression else 0
    if args.fail_on_regression:
        print(f"gate: no series regressed by more than {args.threshold:g}% at its latest run")
    return 0


def cmd_trends(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    from spark_bench import trends
    from spark_bench.ingest import ingest, read_table, table_exists
    out = args.out
    table = args.table or os.path.join(out, RUN_TABLE_DIR)
    os.makedirs(out, exist_ok=True)
    session, owned = _session(args, spark)
    try:
        if args.history:
            result = ingest(session, args.history, table)
            _print_ingest(result)
            with open(os.path.join(out, "ingest.json"), "w", encoding="utf-8") as fh:
                json.dump(result.as_dict(), fh, indent=2)
        if not table_exists(session, table):
            print(f"no benchmark history: {table} does not exist and nothing was ingested "
                  f"(run `make bench` to record runs)", file=sys.stderr)
            return 2
        started = time.perf_counter()
        cfg = trends.TrendConfig(
            metric=args.metric, baseline_window=args.baseline_window,
            detector=DetectorConfig(alpha=args.alpha, min_change=args.min_change / 100.0))
        tables = trends.compute(read_table(session, table), out, cfg)
        n_series = tables.summary.count()
        n_changes = tables.changes.count()
        print(f"trends: {n_series} series, {n_changes} change points "
              f"({time.perf_counter() - started:.1f} s); tables in {os.path.abspath(out)}")
    finally:
        if owned:
            session.stop()
    if args.no_report:
        return _gate(out, args)
    return _report(out, args)


def _report(out: str, args: argparse.Namespace) -> int:
    from spark_bench.report import render
    result = render(out, args.threshold, points_csv=args.points_csv)
    print(f"report: {result.html_path} ({result.plots} plots, {result.seconds:.1f} s); "
          f"CSV: {', '.join(result.csv_paths)}")
    return _gate(out, args, result)


def cmd_report(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    del spark  # the report reads Parquet with pyarrow; no JVM needed
    if not os.path.exists(os.path.join(args.out, "summary.parquet")):
        print(f"no trend tables in {args.out}: run `python -m spark_bench trends` first", file=sys.stderr)
        return 2
    return _report(args.out, args)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Entry point; ``spark`` lets tests pass their shared session (it is not stopped)."""
    args = build_parser().parse_args(argv)
    return int(args.func(args, spark))
