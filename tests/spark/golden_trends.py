"""The trend job's outputs on one fixed synthetic history, as canonical text: what
tests/spark/test_spark_trends_golden.py compares with the files under tests/spark/golden/.

The golden files were written by the job as it was before the issue-41 speed work
(``python tests/spark/golden_trends.py WRITE_DIR`` on that commit), so the test proves the
faster job gives the same summary, change points, gate verdict and report tables. Regenerate
them only for a change that is meant to alter the output, and say so in its commit.

Canonical form: rows sorted by series id (and run), the columns the job had then (new
columns are not compared), floats to 10 significant digits (Spark may sum in another order),
the report without its generation time, its inlined plotly.js and any section added since.
"""
from __future__ import annotations

import gzip
import io
import os
import re
import sys
from contextlib import redirect_stderr, redirect_stdout

#: The history: 160 runs x 24 benchmarks (four implementations, six groups) with 3% noise,
#: 2% spikes, a 20% slowdown, a 15% speed-up, a slowdown that recovers, a benchmark removed
#: before the end (stale), and one dirty run.
SPEC_ARGS = dict(runs=160, benchmarks=24, noise=0.03, spike_rate=0.02, seed=5,
                 steps={0: [(100, 1.2)], 7: [(60, 0.85)], 12: [(110, 1.25), (135, 0.8)],
                        17: [(140, 1.12)]},
                 removed_from={23: 150}, dirty_runs=frozenset({77}))
GATE_ARGS = ["--fail-on-regression", "--threshold", "10", "--threshold-for", "*test_op4*=30"]

SUMMARY_COLUMNS = [
    "kind", "series_id", "benchmark", "machine", "branch", "implementation", "mode",
    "case_key", "runs", "first_run_time", "latest_run_time", "runs_since_seen", "stale",
    "latest_run_id", "latest_commit", "latest_value", "baseline", "delta_pct", "worse_pct",
    "higher_is_better", "changes", "open_regressions", "last_change_time",
    "last_change_commit", "last_change_pct", "last_change_direction"]
CHANGE_COLUMNS = [
    "series_id", "kind", "run_index", "run_id", "run_time", "commit", "before", "after",
    "change_pct", "worse_pct", "confidence", "z", "direction", "open", "current",
    "open_worse_pct"]
SERIES_COLUMNS = ["series_id", "run_index", "run_id", "value", "baseline", "delta_pct"]
FILES = ("summary.csv", "changes.csv", "series.csv.gz", "gate.txt", "report.txt")


def _canonical(frame, columns: list[str], keys: list[str]) -> str:  # noqa: ANN001 - pandas
    import pandas as pd
    frame = frame[columns].sort_values(keys).reset_index(drop=True)
    out = frame.copy()
    for name in columns:
        if pd.api.types.is_float_dtype(frame[name]):
            out[name] = [("" if v != v else f"{v:.10g}") for v in frame[name]]
        else:
            out[name] = frame[name].astype(str)
    return out.to_csv(index=False)


def report_text(html: str) -> str:
    """The page without what changes from run to run or with the library version."""
    html = re.sub(r"<script>.{100000,}?</script>", "<script>plotly.js</script>", html, count=1,
                  flags=re.S)
    html = re.sub(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "Generated (time)", html)
    # Sections added after the golden files were written are not compared.
    html = re.sub(r"<h2>Suspected.*?(?=<h2>)", "", html, flags=re.S)
    return html.replace("><", ">\n<")


def write_text(path: str, text: str) -> None:
    """``*.gz`` compressed (reproducibly: no time in the header), other names as text."""
    data = text.encode("utf-8")
    with open(path, "wb") as fh:
        fh.write(gzip.compress(data, mtime=0) if path.endswith(".gz") else data)


def read_text(path: str) -> str:
    with open(path, "rb") as fh:
        data = fh.read()
    return (gzip.decompress(data) if path.endswith(".gz") else data).decode("utf-8")


def outputs(out: str, gate_text: str) -> dict[str, str]:
    """Canonical text of the trend tables and the report under ``out``."""
    import pandas as pd
    summary = pd.read_parquet(os.path.join(out, "summary.parquet"))
    changes = pd.read_parquet(os.path.join(out, "changes.parquet"))
    series = pd.read_parquet(os.path.join(out, "series.parquet"), columns=SERIES_COLUMNS)
    with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
        page = fh.read()
    gate_lines = sorted(line for line in gate_text.splitlines()
                        if line.startswith(("REGRESSION", "gate:")))
    return {"summary.csv": _canonical(summary, SUMMARY_COLUMNS, ["series_id"]),
            "changes.csv": _canonical(changes, CHANGE_COLUMNS, ["series_id", "run_index"]),
            "series.csv.gz": _canonical(series, SERIES_COLUMNS, ["series_id", "run_index"]),
            "gate.txt": "\n".join(gate_lines) + "\n", "report.txt": report_text(page)}


def run(root: str, spark=None) -> tuple[int, dict[str, str], str]:  # noqa: ANN001
    """Write the history under ``root``, run ``trends`` on it; (exit code, outputs, stdout)."""
    from spark_bench import synthetic
    from spark_bench.cli import main
    history, out = os.path.join(root, "history"), os.path.join(root, "out")
    synthetic.write_history(synthetic.HistorySpec(**SPEC_ARGS), history)
    err, std = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(std):
        code = main(["trends", "--history", history, "--out", out, *GATE_ARGS], spark=spark)
    return code, outputs(out, err.getvalue() + std.getvalue()), std.getvalue()


if __name__ == "__main__":
    import tempfile
    target = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        code, texts, _ = run(tmp)
    os.makedirs(target, exist_ok=True)
    for name, text in texts.items():
        write_text(os.path.join(target, name), text)
    print(f"exit {code}; wrote {', '.join(texts)} to {target}")
