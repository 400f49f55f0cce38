"""Command line: ``rmqha-trends {ingest,trends,report}`` (also ``python -m spark_bench``).

* ``ingest --history PATH... --table URL``: add new pytest-benchmark files to the Parquet
  run table (only files not seen before are read).
* ``trends --out URL [--history PATH...]``: ingest first (into ``OUT/runs.parquet`` unless
  ``--table`` says otherwise), then baselines, change points and ratios, then the report.
  When nothing was ingested and the table and options are those of the last run, the
  trend tables are reused. This is what ``make trends`` runs.
* ``report --out URL``: re-render the HTML and CSV from the trend tables.
* ``publish --to rmqha://NAMESRV/TOPIC FILE...``: send benchmark files to an rmqha topic,
  one message each; ``--history rmqha://NAMESRV/TOPIC`` reads them back
  (:mod:`spark_bench.topic_history`).

Paths may be local or any Hadoop file system URL (``file://``, ``hdfs://``, ``s3a://``,
``viewfs://``); ``--conf spark.hadoop.KEY=VALUE`` (repeatable) gives Hadoop the settings such
a file system needs (name node, endpoint, credentials provider, mount table), on the driver
and on the executors alike.

Gate (``--fail-on-regression``): fail on an open regression at or above ``--threshold``
percent (``--threshold-for GLOB=PCT`` per benchmark), one line per failing series on stderr.
Exit codes: 0 passed (or no gate asked for), 1 the gate failed, 2 nothing to analyse or
bad arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_bench.changepoint import DetectorConfig
from spark_bench.gate import DEFAULT_THRESHOLD_PCT, EXIT_NO_DATA, EXIT_PASSED, EXIT_REGRESSED, GatePolicy
from spark_bench.progress import stage

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

    from spark_bench.ingest import IngestResult

RUN_TABLE_DIR = "runs.parquet"
INGEST_LOG = "ingest.json"
STATE_FILE = "trends-state.json"
#: machine_info fields a machine key may use (schema.MACHINE_FIELDS; kept here so --help
#: needs no pyspark import).
MACHINE_FIELDS = ("node", "machine", "system", "release", "python_implementation",
                  "python_version", "cpu_brand", "cpu_arch", "cpu_count", "rmqha_machine")


def _add_spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default="local[*]",
                   help="Spark master URL (default local[*]; e.g. spark://host:7077)")
    p.add_argument("--no-class-data-cache", action="store_true",
                   help="do not keep the driver JVM's classes in a class-data-sharing archive "
                        "(~190 MB under $RMQHA_TRENDS_CACHE or ~/.cache/rmqha-trends; it "
                        "saves 2-3 s of every later start)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the session (repeatable); spark.hadoop.* keys "
                        "configure Hadoop's file systems on the driver and the executors, "
                        "e.g. spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000 or a viewfs "
                        "mount table")


def _add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-plots", type=int, default=150, metavar="N",
                   help="plot at most N series with change points (default %(default)s)")


def _add_gate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 if any live benchmark series has an open regression at or "
                        "above its threshold")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_PCT, metavar="PCT",
                   help=f"gate threshold in percent (default {DEFAULT_THRESHOLD_PCT:g})")
    p.add_argument("--threshold-for", action="append", default=[], metavar="GLOB=PCT",
                   help="threshold for benchmarks or series ids matching GLOB (repeatable, "
                        "first match wins), e.g. '*test_produce*=20'")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmqha-trends", description=__doc__.split("\n\n")[0],
        epilog="exit codes: 0 passed, 1 the regression gate failed, 2 nothing to analyse or "
               "bad arguments")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="new pytest-benchmark JSON files -> Parquet run table")
    p.add_argument("--history", nargs="+", required=True, metavar="PATH",
                   help="files, directories (searched recursively) or globs; paths or URLs")
    p.add_argument("--table", required=True, help="Parquet run table (path or URL; created if missing)")
    _add_spark_args(p)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("trends", help="baselines, change points, ratios, then the report")
    p.add_argument("--history", nargs="+", metavar="PATH",
                   help="ingest these first (paths or URLs; rmqha://NAMESRV/TOPIC reads a topic "
                        "`publish` filled)")
    p.add_argument("--table", help=f"run table (default OUT/{RUN_TABLE_DIR})")
    p.add_argument("--out", required=True, help="output directory (path or URL) for tables and report")
    p.add_argument("--metric", default="median", choices=("median", "mean", "min", "ops"))
    p.add_argument("--baseline-window", type=int, default=10, metavar="RUNS",
                   help="previous runs in the rolling-median baseline (default 10)")
    p.add_argument("--alpha", type=float, default=DetectorConfig.alpha,
                   help="permutation-test significance level (default %(default)s)")
    p.add_argument("--min-change", type=float, default=DetectorConfig.min_change * 100, metavar="PCT",
                   help="smallest change worth reporting, percent (default %(default)s)")
    p.add_argument("--machine-key", metavar="FIELDS",
                   help="comma-separated machine_info fields that identify a machine, e.g. "
                        f"cpu_brand,python_version for CI runners with a new host name per "
                        f"job (choose from {', '.join(MACHINE_FIELDS)}; default: "
                        "rmqha_machine, else node)")
    p.add_argument("--branch", help="analyse this branch only (default: every branch, each "
                                    "in its own series)")
    p.add_argument("--include-dirty", action="store_true",
                   help="also analyse runs from dirty work trees (left out by default)")
    p.add_argument("--stale-after", type=int, default=5, metavar="RUNS",
                   help="a series not measured in its machine's last RUNS runs is stale "
                        "(renamed or removed): reported, never gated (default %(default)s)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML/CSV report")
    _add_report_args(p)
    _add_spark_args(p)
    _add_gate_args(p)
    p.set_defaults(func=cmd_trends)

    p = sub.add_parser("publish", help="send benchmark JSON files to an rmqha topic (one message each)")
    p.add_argument("--to", required=True, metavar="URL",
                   help="rmqha://<name server>[;<name server>...]/<topic>, what --history then reads")
    p.add_argument("files", nargs="+", metavar="FILE", help="pytest-benchmark JSON files")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("report", help="render report.html and CSV from the trend tables")
    p.add_argument("--out", required=True, help="directory written by `trends`")
    _add_report_args(p)
    _add_spark_args(p)
    _add_gate_args(p)
    p.set_defaults(func=cmd_report)
    return parser


def _policy(args: argparse.Namespace) -> GatePolicy:
    try:
        overrides = tuple(GatePolicy.parse_override(t) for t in args.threshold_for)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    return GatePolicy(threshold_pct=args.threshold, overrides=overrides)


class _UsageError(Exception):
    """Bad arguments found after parsing; exit 2 with the message."""


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``--conf KEY=VALUE`` items as a dict (a later key wins, as with spark-submit)."""
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise _UsageError(f"--conf {item!r} is not KEY=VALUE")
        conf[key] = value
    return conf


def _session(args: argparse.Namespace, spark: SparkSession | None) -> tuple[SparkSession, bool]:
    """The given session (tests share one) or a new one we must stop."""
    conf = parse_conf(args.conf)
    if spark is not None:
        from spark_bench.session import apply_runtime_conf
        apply_runtime_conf(spark, conf)
        return spark, False
    from spark_bench.session import SessionOptions, build_session, java_available
    if not java_available():
        raise _UsageError("Java 17+ is needed for Spark (set JAVA_HOME or put java on PATH)")
    return build_session(SessionOptions(master=args.master, extra_conf=conf,
                                        class_data_sharing=not args.no_class_data_cache)), True


def _stop(session: SparkSession, owned: bool) -> None:
    if owned:
        from spark_bench.session import resource_report, stop_session
        print(resource_report(session))
        stop_session(session)


def _print_ingest(result: IngestResult) -> None:
    for skipped in result.skipped:
        print(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    if result.entries_invalid:
        print(f"skipped {result.entries_invalid} benchmark entries without a name or median",
              file=sys.stderr)
    same = (f" ({result.files_known_content} with content already stored)"
            if result.files_known_content else "")
    print(f"ingest: {result.files_seen} files seen, {result.files_new} new{same}, "
          f"{result.files_ingested} used, {len(result.skipped)} skipped; {result.rows_new} new "
          f"rows, {result.rows_duplicate} duplicate; table {result.table} ({result.seconds:.1f} s)")


def cmd_ingest(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    from spark_bench.ingest import ingest
    session, owned = _session(args, spark)
    try:
        result = ingest(session, args.history, args.table)
    finally:
        _stop(session, owned)
    _print_ingest(result)
    return EXIT_PASSED if result.files_seen else EXIT_NO_DATA


def _gate(args: argparse.Namespace, failing: pd.DataFrame, suspects: pd.DataFrame) -> int:
    from spark_bench import gate
    if len(suspects):
        print(gate.describe_suspected(suspects))
    if len(failing):
        print(gate.describe(failing), file=sys.stderr)
        return EXIT_REGRESSED if args.fail_on_regression else EXIT_PASSED
    if args.fail_on_regression:
        print(f"gate: passed (no open regression at or above {args.threshold:g}%"
              f"{' or its override' if args.threshold_for else ''})")
    return EXIT_PASSED


def _trend_config(args: argparse.Namespace):  # noqa: ANN202 - pyspark-free signature
    from spark_bench import trends
    machine_key = tuple(f.strip() for f in (args.machine_key or "").split(",") if f.strip())
    try:
        return trends.TrendConfig(
            metric=args.metric, baseline_window=args.baseline_window,
            detector=DetectorConfig(alpha=args.alpha, min_change=args.min_change / 100.0),
            machine_key=machine_key, branch=args.branch, include_dirty=args.include_dirty,
            stale_after=args.stale_after)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def cmd_trends(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    from spark_bench import storage, trends
    from spark_bench.ingest import MANIFEST_DIR, ingest, read_table, table_exists
    policy = _policy(args)
    cfg = _trend_config(args)
    out = args.out
    table = args.table or storage.join(out, RUN_TABLE_DIR)
    session, owned = _session(args, spark)
    try:
        ingest_log = None
        if args.history:
            with stage("ingest: parsing new benchmark files"):
                result = ingest(session, args.history, table)
            _print_ingest(result)
            ingest_log = result.as_dict()
            storage.write_text(session, storage.join(out, INGEST_LOG), json.dumps(ingest_log, indent=2))
        if not table_exists(session, table):
            print(f"no benchmark history: {table} does not exist and nothing was ingested "
                  f"(run `make bench` to record runs)", file=sys.stderr)
            return EXIT_NO_DATA
        started = time.perf_counter()
        # Nothing new in the table and the same options: the tables (and, for the same gate
        # options, the report) of the last run are still right. The manifest is left out:
        # files that added no run (known content, foreign files) change nothing.
        state = {"table": storage.fingerprint(session, table, excluding=MANIFEST_DIR),
                 "config": repr(cfg), "tables": trends.TABLES_VERSION}
        state_path = storage.join(out, STATE_FILE)
        saved_text = storage.read_text(session, state_path)
        saved = json.loads(saved_text) if saved_text else {}
        reused = (all(saved.get(k) == v for k, v in state.items())
                  and storage.exists(session, storage.join(out, "summary.parquet")))
        with stage("trends: series, baselines and change points"):
            if reused:
                tables = trends.load(session, out)
            else:
                tables = trends.compute(read_table(session, table), out, cfg)
            summary = tables.summary.toPandas()
            changes = tables.changes.toPandas()
        report_key = f"{policy!r} max_plots={args.max_plots}"
        print(f"trends: {len(summary)} series, {len(changes)} change points "
              f"({time.perf_counter() - started:.1f} s{', unchanged since the last run' if reused else ''}); "
              f"tables in {out}")
        if summary.empty:
            print("no benchmark series to analyse (every run filtered out?)", file=sys.stderr)
            return EXIT_NO_DATA
        if args.no_report or (reused and saved.get("report") == report_key
                              and storage.exists(session, storage.join(out, "report.html"))):
            from spark_bench import gate
            storage.write_text(session, state_path, json.dumps(
                {**state, "report": saved.get("report") if reused else None}))
            if not args.no_report:
                print(f"report: {out.rstrip('/')}/report.html is up to date")
            return _gate(args, gate.failing(summary, changes, policy), gate.suspected(summary, policy))
        if ingest_log is None:
            text = storage.read_text(session, storage.join(out, INGEST_LOG))
            ingest_log = json.loads(text) if text else None
        with stage("report: plotting the series with change points"):
            code = _report(args, policy, summary, changes, ingest_log,
                           lambda ids: tables.series.filter(tables.series["series_id"].isin(ids))
                           .select(*_point_columns()).toPandas(),
                           lambda name, text: storage.write_text(session, storage.join(out, name),
                                                                 text))
        storage.write_text(session, state_path, json.dumps({**state, "report": report_key}))
        return code
    finally:
        _stop(session, owned)


def _point_columns() -> list[str]:
    from spark_bench.report import POINT_COLUMNS
    return POINT_COLUMNS


def _report(args: argparse.Namespace, policy: GatePolicy, summary: pd.DataFrame,
            changes: pd.DataFrame, ingest_log: dict[str, object] | None, load_points, write) -> int:  # noqa: ANN001
    from spark_bench import gate, report
    started = time.perf_counter()
    failing = gate.failing(summary, changes, policy)
    ids = report.plotted_series(summary, changes, failing, args.max_plots)
    points = load_points(ids) if ids else None
    import pandas as pd
    result = report.render(summary, changes, points if points is not None else pd.DataFrame(
        columns=report.POINT_COLUMNS), policy, ingest_log, args.max_plots)
    write(report.REPORT_FILE, result.html)
    write("summary.csv", summary.to_csv(index=False))
    write("changes.csv", changes.to_csv(index=False))
    print(f"report: {args.out.rstrip('/')}/{report.REPORT_FILE} ({result.plots} plots, "
          f"{len(result.html.encode()) / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s); "
          f"summary.csv, changes.csv")
    return _gate(args, result.failing, gate.suspected(summary, policy))


def cmd_publish(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    from spark_bench.topic_history import publish
    try:
        sent = publish(args.to, args.files)
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc
    print(f"published {sent} file(s) to {args.to}")
    return EXIT_PASSED


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def cmd_report(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    policy = _policy(args)
    if _is_local(args.out) and spark is None:
        # Local tables: pandas/pyarrow read them, no JVM needed.
        import os

        import pandas as pd
        out = args.out[len("file://"):] if args.out.startswith("file://") else args.out
        out = out[len("file:"):] if out.startswith("file:") else out
        if not os.path.exists(os.path.join(out, "summary.parquet")):
            print(f"no trend tables in {args.out}: run `rmqha-trends trends` first", file=sys.stderr)
            return EXIT_NO_DATA
        summary = pd.read_parquet(os.path.join(out, "summary.parquet"))
        changes = pd.read_parquet(os.path.join(out, "changes.parquet"))
        log_path = os.path.join(out, INGEST_LOG)
        ingest_log = None
        if os.path.exists(log_path):
            with open(log_path, encoding="utf-8") as fh:
                ingest_log = json.load(fh)

        def write(name: str, text: str) -> None:
            with open(os.path.join(out, name), "w", encoding="utf-8") as fh:
                fh.write(text)

        return _report(args, policy, summary, changes, ingest_log,
                       lambda ids: pd.read_parquet(os.path.join(out, "series.parquet"),
                                                   columns=_point_columns(),
                                                   filters=[("series_id", "in", ids)]),
                       write)
    from spark_bench import storage, trends
    session, owned = _session(args, spark)
    try:
        if not storage.exists(session, storage.join(args.out, "summary.parquet")):
            print(f"no trend tables in {args.out}: run `rmqha-trends trends` first", file=sys.stderr)
            return EXIT_NO_DATA
        tables = trends.load(session, args.out)
        text = storage.read_text(session, storage.join(args.out, INGEST_LOG))
        return _report(args, policy, tables.summary.toPandas(), tables.changes.toPandas(),
                       json.loads(text) if text else None,
                       lambda ids: tables.series.filter(tables.series["series_id"].isin(ids))
                       .select(*_point_columns()).toPandas(),
                       lambda name, t: storage.write_text(session, storage.join(args.out, name), t))
    finally:
        _stop(session, owned)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Entry point; ``spark`` lets tests pass their shared session (it is not stopped)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_conf(getattr(args, "conf", []))  # a malformed setting is refused before any work starts
        return int(args.func(args, spark))
    except _UsageError as exc:
        print(f"rmqha-trends: error: {exc}", file=sys.stderr)
        return EXIT_NO_DATA
    except Exception as exc:
        # A path Spark cannot open (unknown URL scheme, missing credentials, unreachable
        # name node) surfaces as a JVM exception: say which, without a py4j stack.
        reason = _spark_failure(exc)
        if reason is None:
            raise
        print(f"rmqha-trends: error: {reason}", file=sys.stderr)
        return EXIT_NO_DATA


def _spark_failure(exc: Exception) -> str | None:
    """The first line of a Spark/JVM error, or None for any other exception."""
    try:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException
    except ImportError:
        return None
    if isinstance(exc, Py4JJavaError):
        java = exc.java_exception
        return f"Spark failed: {java.getClass().getName()}: {java.getMessage()}"
    if isinstance(exc, PySparkException):
        return f"Spark failed: {str(exc).splitlines()[0]}"
    return None
