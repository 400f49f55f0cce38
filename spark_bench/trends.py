"""Trends: per-series rolling baselines, change points and ratio series.

A *series* is one benchmark on one machine, branch and implementation, in commit order
(``commit_info.time``; runs without it, or several runs of one commit, by run time). The
machine is the ingest's default (``rmqha_machine`` or the host name) unless ``machine_key``
names the machine_info fields that identify it, e.g. ``("cpu_brand", "python_version")`` for
CI runners that get a new host name per job. Runs from dirty trees are left out unless
``include_dirty``; ``branch`` keeps one branch only.
Ratio series compare implementations measured side by side in the same run: the compiled
twin against the pure one, and each rmqha twin against every peer (sqlite3-wal, lmdb, ...),
matched by benchmark group (or test function) and parameters. A ratio is a speed-up: how
many times faster the rmqha side is, so higher is better.

Each series is analysed in one grouped Arrow UDF (``applyInArrow``): ordering, the
rolling baseline (the exact median of the previous ``baseline_window`` runs), the change
points of :mod:`spark_bench.changepoint` and its look at the latest runs: a jump of the
latest run alone is *suspected* (``suspect_*`` columns on that point and in the summary:
reported, rerun to confirm, never gated); two or more runs off the level are a change.
Spark does the rest: selecting runs, building series and ratio series, the per-machine
staleness and the summary.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_bench.changepoint import DetectorConfig, detect_with_tail
from spark_bench.schema import MACHINE_FIELDS
from spark_bench.series import Direction, SeriesKind

#: Implementations that are rmqha's own (the twins); everything else is a peer.
RMQHA_IMPLEMENTATIONS = ("cython", "python")
#: extra_info keys that define what was measured, so only like is compared with like.
CASE_INFO_KEYS = ("message_bytes", "batch", "replicas")
#: Metrics a series can follow; only ops is "higher is better".
METRICS = ("median", "mean", "min", "ops")

SERIES_COLUMNS = [
    "kind", "series_id", "benchmark", "machine", "branch", "implementation", "mode", "case_key",
    "run_index", "run_id", "run_time", "order_time", "commit", "value", "higher_is_better",
    "baseline", "delta_pct", "worse_pct",
]
#: Branch name used when a run recorded none (pytest-benchmark's own placeholder).
UNKNOWN_BRANCH = "(unknown)"

CHANGE_SCHEMA = T.StructType([
    T.StructField("series_id", T.StringType()),
    T.StructField("kind", T.StringType()),
    T.StructField("run_index", T.LongType()),
    T.StructField("run_id", T.StringType()),
    T.StructField("run_time", T.TimestampType()),
    T.StructField("commit", T.StringType()),
    T.StructField("before", T.DoubleType()),
    T.StructField("after", T.DoubleType()),
    T.StructField("change_pct", T.DoubleType()),
    T.StructField("worse_pct", T.DoubleType()),
    T.StructField("confidence", T.DoubleType()),
    T.StructField("z", T.DoubleType()),
    T.StructField("direction", T.StringType()),
    T.StructField("open", T.BooleanType()),
    # The series' level now (median since its last change point) and how much worse that
    # is than `before`: what an open regression still costs.
    T.StructField("current", T.DoubleType()),
    T.StructField("open_worse_pct", T.DoubleType()),
])


@dataclass(frozen=True)
class TrendConfig:
    metric: str = "median"
    baseline_window: int = 10
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    #: machine_info fields (schema.MACHINE_FIELDS) that name the machine; () = ingest's default.
    machine_key: tuple[str, ...] = ()
    #: Analyse this branch only; None = every branch, each in its own series.
    branch: str | None = None
    include_dirty: bool = False
    #: A series not measured in the last this-many runs of its machine and branch is stale:
    #: renamed or removed, so it is reported but never gated.
    stale_after: int = 5

    def __post_init__(self) -> None:
        unknown = [f for f in self.machine_key if f not in MACHINE_FIELDS]
        if unknown:
            raise ValueError(f"unknown machine key field(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(MACHINE_FIELDS)}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, not {self.metric!r}")
        if self.stale_after < 1 or self.baseline_window < 1:
            raise ValueError("stale_after and baseline_window must be at least 1")


@dataclass
class TrendTables:
    """The job's outputs: every point with its baseline, the change points, one summary row
    per series (latest value against baseline, change and open-regression counts)."""

    series: DataFrame
    changes: DataFrame
    summary: DataFrame


def _case_key(runs: DataFrame) -> Column:
    """What was measured, without who measured it: group (or test function), parameters
    other than the implementation, and the size fields of extra_info."""
    impl = F.col("implementation")
    params = F.map_filter(
        F.coalesce(F.col("params"), F.create_map().cast("map<string,string>")),
        lambda k, v: ~(k.isin("twin", "impl", "implementation", "peer") | (v == impl)))
    param_text = F.array_join(
        F.transform(F.array_sort(F.map_entries(params)),
                    lambda e: F.concat(e["key"], F.lit("="), F.coalesce(e["value"], F.lit("None")))),
        ",")
    info = F.concat_ws(",", *(
        F.when(F.col("extra_info")[k].isNotNull(),
               F.concat(F.lit(f"{k}="), F.col("extra_info")[k])) for k in CASE_INFO_KEYS))
    base = F.coalesce(F.col("group"), F.regexp_replace(F.col("name"), r"\[.*\]$", ""))
    detail = F.concat_ws(",", F.when(param_text != "", param_text), F.when(info != "", info))
    return F.when(detail != "", F.concat(base, F.lit("["), detail, F.lit("]"))).otherwise(base)


def select_runs(runs: DataFrame, cfg: TrendConfig) -> DataFrame:
    """The runs to analyse, with ``machine`` re-keyed, ``branch`` filled and ``order_time``."""
    if not cfg.include_dirty:
        runs = runs.filter(~F.coalesce(F.col("commit_dirty"), F.lit(False)))
    runs = runs.withColumn("branch", F.coalesce(F.col("branch"), F.lit(UNKNOWN_BRANCH)))
    if cfg.branch is not None:
        runs = runs.filter(F.col("branch") == cfg.branch)
    if cfg.machine_key:
        key = F.concat_ws("/", *(F.col("machine_info")[f] for f in cfg.machine_key))
        runs = runs.withColumn("machine", F.when(key != "", key).otherwise(F.col("machine")))
    return runs.withColumn("order_time", F.coalesce(F.col("commit_time"), F.col("run_time")))


def benchmark_points(runs: DataFrame, metric: str) -> DataFrame:
    """One point per benchmark per run of ``select_runs`` output."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, not {metric!r}")
    # Quick-mode runs (RMQHA_BENCH_QUICK=1, CI) measure smaller workloads; mixing them into
    # the full-mode series would show every switch as a change point.
    mode = F.when(F.lower(F.col("extra_info")["quick"]) == "true", "quick").otherwise("full")
    return runs.select(
        F.lit(SeriesKind.BENCHMARK.value).alias("kind"),
        F.concat_ws(" | ", "benchmark", "machine", "implementation", "branch",
                    F.when(mode == "quick", F.lit("quick"))).alias("series_id"),
        "benchmark", "machine", "branch", "implementation", mode.alias("mode"),
        _case_key(runs).alias("case_key"),
        "run_id", "run_time", "order_time", "commit",
        F.col(metric).cast("double").alias("value"),
        F.lit(metric == "ops").alias("higher_is_better"),
    ).filter(F.col("value").isNotNull())


POINT_SCHEMA = T.StructType([
    T.StructField(c, {"run_time": T.TimestampType(), "order_time": T.TimestampType(),
                      "value": T.DoubleType(), "higher_is_better": T.BooleanType()}
                  .get(c, T.StringType()))
    for c in ("kind", "series_id", "benchmark", "machine", "branch", "implementation", "mode",
              "case_key", "run_id", "run_time", "order_time", "commit", "value",
              "higher_is_better")])


#: POINT_SCHEMA in Arrow types (an empty result still needs its columns).
POINT_ARROW_SCHEMA = pa.schema([
    (f.name, {T.TimestampType: pa.timestamp("us", tz="UTC"), T.DoubleType: pa.float64(),
              T.BooleanType: pa.bool_()}.get(type(f.dataType), pa.string()))
    for f in POINT_SCHEMA.fields])


def _case_ratios(metric: str):  # noqa: ANN202 - returns the UDF body
    """Body of the grouped Arrow UDF: all implementations of one case on one machine,
    branch and mode in; their side-by-side ratios per run out. Runs and implementations
    are dictionary-encoded in Arrow and the ratios taken on a runs x implementations
    matrix, so no text cell becomes a Python string."""
    def run(table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            return POINT_ARROW_SCHEMA.empty_table()
        runs = pc.dictionary_encode(table.column("run_id")).combine_chunks()
        impls = pc.dictionary_encode(table.column("implementation")).combine_chunks()
        run_idx = runs.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        impl_idx = impls.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        values = table.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
        n_runs, n_impls = len(runs.dictionary), len(impls.dictionary)
        # A case measured twice by one implementation in one run is ambiguous: left out.
        cell = run_idx * n_impls + impl_idx
        once = np.bincount(cell, minlength=n_runs * n_impls)[cell] == 1
        wide = np.full((n_runs, n_impls), np.nan)
        wide[run_idx[once], impl_idx[once]] = values[once]
        # The row each run's time and commit are taken from: its first unambiguous one.
        first_row = np.full(n_runs, table.num_rows)
        np.minimum.at(first_row, run_idx[once], np.flatnonzero(once))
        names = impls.dictionary.to_pylist()
        column = {name: i for i, name in enumerate(names)}
        head = {c: table.column(c)[0].as_py() for c in ("machine", "branch", "mode", "case_key")}
        pieces: list[tuple[str, np.ndarray, np.ndarray]] = []
        for a in sorted(names):
            if a not in RMQHA_IMPLEMENTATIONS:
                continue
            for b in sorted(names):
                if b == a or (a == "python" and b == "cython"):  # cython vs python once
                    continue
                wa, wb = wide[:, column[a]], wide[:, column[b]]
                # Times: b/a is how many times faster a is. Rates (ops): a/b.
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = (wa / wb) if metric == "ops" else (wb / wa)
                keep = np.isfinite(ratio)
                if keep.any():
                    pieces.append((f"{a} vs {b}", first_row[keep], ratio[keep]))
        if not pieces:
            return POINT_ARROW_SCHEMA.empty_table()
        rows = np.concatenate([p[1] for p in pieces])
        picked = table.select(["run_id", "run_time", "order_time", "commit"]).take(rows)
        labels = [label for label, r, _ in pieces for _ in range(r.size)]
        series = [" | ".join([head["case_key"], head["machine"], label, head["branch"],
                              *(["quick"] if head["mode"] == "quick" else [])])
                  for label, _, _ in pieces]
        series_ids = [sid for sid, (_, r, _) in zip(series, pieces, strict=True)
                      for _ in range(r.size)]
        n = rows.size
        columns = {
            "kind": pa.array([SeriesKind.RATIO.value] * n, pa.string()),
            "series_id": pa.array(series_ids, pa.string()),
            "benchmark": pa.array([head["case_key"]] * n, pa.string()),
            "machine": pa.array([head["machine"]] * n, pa.string()),
            "branch": pa.array([head["branch"]] * n, pa.string()),
            "implementation": pa.array(labels, pa.string()),
            "mode": pa.array([head["mode"]] * n, pa.string()),
            "case_key": pa.array([head["case_key"]] * n, pa.string()),
            "value": pa.array(np.concatenate([p[2] for p in pieces])),
            "higher_is_better": pa.array(np.ones(n, dtype=bool)),
        }
        return pa.table({name: columns[name] if name in columns else picked.column(name)
                         for name in POINT_SCHEMA.names})
    return run


def ratio_points(points: DataFrame, metric: str) -> DataFrame:
    """Side-by-side speed-ups within each run, one grouped pass per case (a self-join of
    the points cost three times as much)."""
    cols = ["machine", "branch", "mode", "case_key", "implementation", "run_id", "run_time",
            "order_time", "commit", "value"]
    return (points.select(*cols)
            .groupBy("machine", "branch", "mode", "case_key")
            .applyInArrow(_case_ratios(metric), schema=POINT_SCHEMA))


#: The order of runs in a series: commit order, then the order they ran in.
RUN_ORDER = ("order_time", "run_time", "run_id")

#: Per-point change-point columns of the analysed series: set on the first point of each
#: new level, null elsewhere (the ``changes`` table is those rows).
CHANGE_COLUMNS = [
    ("cp_before", T.DoubleType()), ("cp_after", T.DoubleType()),
    ("cp_change_pct", T.DoubleType()), ("cp_worse_pct", T.DoubleType()),
    ("cp_confidence", T.DoubleType()), ("cp_z", T.DoubleType()),
    ("cp_direction", T.StringType()), ("cp_open", T.BooleanType()),
    ("cp_current", T.DoubleType()), ("cp_open_worse_pct", T.DoubleType()),
]
#: On the latest point of a series whose latest run alone jumped off its level: that level,
#: the jump (in percent, and in the worse direction) and its strength in robust sigmas.
SUSPECT_COLUMNS = [
    ("suspect_before", T.DoubleType()), ("suspect_change_pct", T.DoubleType()),
    ("suspect_worse_pct", T.DoubleType()), ("suspect_z", T.DoubleType()),
]
#: Bumped when the trend tables gain or change columns: tables an older version wrote
#: are then computed again instead of reused.
TABLES_VERSION = 2
_POINT_TYPES = {
    "run_index": T.LongType(), "run_time": T.TimestampType(), "order_time": T.TimestampType(),
    "value": T.DoubleType(), "higher_is_better": T.BooleanType(), "baseline": T.DoubleType(),
    "delta_pct": T.DoubleType(), "worse_pct": T.DoubleType(),
}
ANALYSED_SCHEMA = T.StructType(
    [T.StructField(c, _POINT_TYPES.get(c, T.StringType())) for c in SERIES_COLUMNS]
    + [T.StructField("is_latest", T.BooleanType())]
    + [T.StructField(c, t) for c, t in CHANGE_COLUMNS]
    + [T.StructField(c, t) for c, t in SUSPECT_COLUMNS])


def _analyse_series(cfg: TrendConfig):  # noqa: ANN202 - returns the UDF body
    """Body of the grouped UDF: one series in, its points with run index, rolling baseline
    and change-point columns out. One pass over each series does what window functions and
    a second UDF did before (and costs one shuffle instead of three).

    It works on the Arrow table Spark hands over (``applyInArrow``): the text columns pass
    through as Arrow buffers, where a pandas frame made a Python string of every cell of
    900,000 points (a third of the workers' time at 2,000 runs)."""
    window = cfg.baseline_window
    det = cfg.detector
    passed = [f.name for f in ANALYSED_SCHEMA.fields
              if f.name in POINT_SCHEMA.names]
    change_types = {c: _ARROW_TYPES[type(t)] for c, t in CHANGE_COLUMNS + SUSPECT_COLUMNS}

    def run(table: pa.Table) -> pa.Table:
        order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in RUN_ORDER])
        table = table.take(order)
        n = table.num_rows
        series_id = table.column("series_id")[0].as_py()
        higher_better = bool(table.column("higher_is_better")[0].as_py())
        values = table.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
        # Exact median of the previous `window` runs (NaN for the first run).
        baseline = pd.Series(values).shift(1).rolling(window, min_periods=1).median().to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            delta = np.where(baseline != 0, (values / baseline - 1.0) * 100.0, np.nan)
        run_index = np.arange(n, dtype=np.int64)
        computed = {
            "run_index": pa.array(run_index),
            "baseline": pa.array(baseline, from_pandas=True),
            "delta_pct": pa.array(delta, from_pandas=True),
            "worse_pct": pa.array(-delta if higher_better else delta, from_pandas=True),
            "is_latest": pa.array(run_index == n - 1),
        }
        cols: dict[str, list[object]] = {c: [None] * n for c, _ in CHANGE_COLUMNS}
        found, suspect_jump = detect_with_tail(values, det, seed=series_id)
        last_level = float(np.median(values[found[-1].index:])) if found else None
        for cp in found:
            worse = -cp.change if higher_better else cp.change
            open_worse = (((cp.before - last_level) if higher_better else (last_level - cp.before))
                          / abs(cp.before)) if (last_level is not None and cp.before != 0) else 0.0
            i = cp.index
            cols["cp_before"][i], cols["cp_after"][i] = cp.before, cp.after
            cols["cp_change_pct"][i] = cp.change * 100.0
            cols["cp_worse_pct"][i] = worse * 100.0
            cols["cp_confidence"][i], cols["cp_z"][i] = cp.confidence, cp.z
            cols["cp_direction"][i] = (Direction.REGRESSION if worse > 0 else Direction.IMPROVEMENT).value
            cols["cp_open"][i] = bool(worse > 0 and open_worse >= det.min_change)
            cols["cp_current"][i] = last_level
            cols["cp_open_worse_pct"][i] = open_worse * 100.0
        suspect: dict[str, list[object]] = {c: [None] * n for c, _ in SUSPECT_COLUMNS}
        if suspect_jump is not None:
            change_pct = suspect_jump.change * 100.0
            suspect["suspect_before"][-1] = suspect_jump.before
            suspect["suspect_change_pct"][-1] = change_pct
            suspect["suspect_worse_pct"][-1] = -change_pct if higher_better else change_pct
            suspect["suspect_z"][-1] = suspect_jump.z
        for c, _ in CHANGE_COLUMNS:
            computed[c] = pa.array(cols[c], type=change_types[c])
        for c, _ in SUSPECT_COLUMNS:
            computed[c] = pa.array(suspect[c], type=change_types[c])
        return pa.table({name: (table.column(name) if name in passed else computed[name])
                         for name in ANALYSED_SCHEMA.names})
    return run


#: Arrow types of the change-point columns' Spark types.
_ARROW_TYPES = {T.DoubleType: pa.float64(), T.StringType: pa.string(), T.BooleanType: pa.bool_()}


def analyse(points: DataFrame, cfg: TrendConfig) -> DataFrame:
    """Every series' points with baseline, run index and change-point columns."""
    return points.groupBy("series_id").applyInArrow(_analyse_series(cfg), schema=ANALYSED_SCHEMA)


def changes_of(analysed: DataFrame) -> DataFrame:
    """The change points (:data:`CHANGE_SCHEMA`) of analysed series."""
    return analysed.filter(F.col("cp_before").isNotNull()).select(*(
        F.col(f"cp_{f.name}").alias(f.name) if f"cp_{f.name}" in analysed.columns else F.col(f.name)
        for f in CHANGE_SCHEMA.fields))


def summarize(series: DataFrame, changes: DataFrame, stale_after: int = 5) -> DataFrame:
    """One row per series: its latest point against the baseline, change counts, whether
    its latest run alone is a suspected jump (``suspected``, ``suspect_*``), and
    ``runs_since_seen``: how many later runs of its machine, branch and mode did not
    measure it (``stale`` from ``stale_after`` on: renamed or removed)."""
    latest = series.filter("is_latest").drop("run_index")
    scope = ["machine", "branch", "mode"]
    runs = series.select(*scope, *RUN_ORDER).distinct()
    position = runs.withColumn("runs_since_seen", F.row_number().over(
        Window.partitionBy(*scope).orderBy(*(F.desc(c) for c in RUN_ORDER))) - 1)
    latest = latest.join(position, [*scope, *RUN_ORDER], "left")
    counts = series.groupBy("series_id").agg(
        F.count("*").alias("runs"), F.min("run_time").alias("first_run_time"))
    change_stats = changes.groupBy("series_id").agg(
        F.count("*").alias("changes"),
        F.sum(F.col("open").cast("int")).alias("open_regressions"),
        F.max_by(F.struct("run_time", "commit", "change_pct", "direction"), "run_index")
        .alias("last_change"))
    return (latest.join(counts, "series_id").join(change_stats, "series_id", "left")
            .select(
                "kind", "series_id", "benchmark", "machine", "branch", "implementation", "mode",
                "case_key", "runs", "first_run_time", F.col("run_time").alias("latest_run_time"),
                "runs_since_seen",
                (F.col("runs_since_seen") >= F.lit(stale_after)).alias("stale"),
                F.col("run_id").alias("latest_run_id"), F.col("commit").alias("latest_commit"),
                F.col("value").alias("latest_value"), "baseline", "delta_pct", "worse_pct",
                "higher_is_better",
                F.coalesce("changes", F.lit(0)).alias("changes"),
                F.coalesce("open_regressions", F.lit(0)).alias("open_regressions"),
                F.col("last_change.run_time").alias("last_change_time"),
                F.col("last_change.commit").alias("last_change_commit"),
                F.col("last_change.change_pct").alias("last_change_pct"),
                F.col("last_change.direction").alias("last_change_direction"),
                F.col("suspect_worse_pct").isNotNull().alias("suspected"),
                *(c for c, _ in SUSPECT_COLUMNS)))


def compute(runs: DataFrame, out: str, cfg: TrendConfig | None = None) -> TrendTables:
    """Build the trend tables from the ingested run table and write them as Parquet under
    ``out`` (``series``, ``changes``, ``summary``). Each step reads the previous one back
    from Parquet, so the grouped UDF runs exactly once."""
    cfg = cfg or TrendConfig()
    spark = runs.sparkSession
    base = out.rstrip("/")

    def materialize(df: DataFrame, name: str) -> DataFrame:
        path = f"{base}/{name}.parquet"
        df.write.mode("overwrite").parquet(path)
        return spark.read.parquet(path)

    points = benchmark_points(select_runs(runs, cfg), cfg.metric)
    series = materialize(analyse(points.unionByName(ratio_points(points, cfg.metric)), cfg), "series")
    changes = materialize(changes_of(series), "changes")
    summary = materialize(summarize(series, changes, cfg.stale_after), "summary")
    return TrendTables(series=series, changes=changes, summary=summary)


def load(spark: SparkSession, out: str) -> TrendTables:
    """The trend tables a previous :func:`compute` wrote under ``out``."""
    base = out.rstrip("/")
    return TrendTables(*(spark.read.parquet(f"{base}/{name}.parquet")
                         for name in ("series", "changes", "summary")))
