"""The side-by-side ratio UDF body (spark_bench.trends._case_ratios) on Arrow tables, without
a JVM: which pairs are formed, which runs are left out, and the direction of a ratio."""
from __future__ import annotations

from datetime import UTC, datetime

import needs
import spark_support  # noqa: F401 - puts the repository root on sys.path

pa = needs.module("pyarrow", "the spark extra", module_level=True)
needs.module("pandas", "the spark extra", module_level=True)
needs.module("pyspark", "the spark extra", module_level=True)
from spark_bench import trends  # noqa: E402 - after the optional third-party modules

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _case(rows: list[tuple[str, str, float]]) -> pa.Table:
    """(run_id, implementation, value) rows of one case."""
    n = len(rows)
    return pa.table({
        "machine": ["m"] * n, "branch": ["main"] * n, "mode": ["full"] * n,
        "case_key": ["op[size=1]"] * n, "implementation": [r[1] for r in rows],
        "run_id": [r[0] for r in rows], "run_time": pa.array([T0] * n, pa.timestamp("us", tz="UTC")),
        "order_time": pa.array([T0] * n, pa.timestamp("us", tz="UTC")),
        "commit": [f"c-{r[0]}" for r in rows], "value": [r[2] for r in rows],
    })


def test_pairs_directions_and_ambiguous_runs() -> None:
    table = _case([
        ("r1", "cython", 1.0), ("r1", "python", 4.0), ("r1", "lmdb", 2.0),
        ("r2", "cython", 1.0), ("r2", "cython", 1.1), ("r2", "python", 3.0),  # cython twice
        ("r3", "python", 0.0), ("r3", "lmdb", 1.0),  # a zero time gives no finite ratio
    ])
    out = trends._case_ratios("median")(table).to_pylist()
    got = sorted((r["implementation"], r["run_id"], r["value"], r["commit"]) for r in out)
    assert got == [("cython vs lmdb", "r1", 2.0, "c-r1"), ("cython vs python", "r1", 4.0, "c-r1"),
                   ("python vs lmdb", "r1", 0.5, "c-r1")]
    assert {r["series_id"] for r in out} == {
        f"op[size=1] | m | {pair} | main" for pair in ("cython vs lmdb", "cython vs python",
                                                       "python vs lmdb")}
    assert all(r["kind"] == "ratio" and r["higher_is_better"] for r in out)


def test_rates_are_divided_the_other_way() -> None:
    table = _case([("r1", "cython", 8.0), ("r1", "python", 2.0)])
    [row] = trends._case_ratios("ops")(table).to_pylist()
    assert (row["implementation"], row["value"]) == ("cython vs python", 4.0)


def test_no_pair_gives_an_empty_table_with_the_point_columns() -> None:
    out = trends._case_ratios("median")(_case([("r1", "struct", 1.0), ("r1", "lmdb", 2.0)]))
    assert out.num_rows == 0 and out.schema == trends.POINT_ARROW_SCHEMA
    assert out.schema.names == trends.POINT_SCHEMA.names
