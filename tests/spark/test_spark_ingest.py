"""Ingest job (spark_bench.ingest): real pytest-benchmark files, duplicates, bad files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from spark_support import PROJECT_ROOT, SPARK_OK, SPARK_TEST_MARKS, spark  # noqa: F401 - fixture

if SPARK_OK:
    from pyspark.sql import types as T

    from spark_bench import synthetic
    from spark_bench.ingest import ingest, read_table
    from spark_bench.schema import RUN_TABLE

pytestmark = SPARK_TEST_MARKS

TINY_BENCH = textwrap.dedent('''
    import struct

    import pytest

    from conftest import describe

    FMT = struct.Struct(">iqq")


    def pure_pack(a, b, c):
        return a.to_bytes(4, "big", signed=True) + b.to_bytes(8, "big", signed=True) + c.to_bytes(8, "big", signed=True)


    @pytest.mark.benchmark(group="header-pack")
    @pytest.mark.parametrize("impl", ["struct", "python"])
    @pytest.mark.parametrize("batch", [1, 8])
    def test_pack(benchmark, impl, batch):
        fn = FMT.pack if impl == "struct" else pure_pack
        describe(benchmark, impl, message_bytes=20, batch=batch)
        benchmark(lambda: [fn(1, 2, 3) for _ in range(batch)])
''')


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):  # noqa: ANN201
    """Run pytest-benchmark for real, with the project's benches/conftest.py, in a git repo
    so commit info is recorded: one --benchmark-json file and one autosave file."""
    root = tmp_path_factory.mktemp("realbench")
    shutil.copy(os.path.join(PROJECT_ROOT, "benches", "conftest.py"), root / "conftest.py")
    (root / "bench_tiny.py").write_text(TINY_BENCH)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tiny"], cwd=root, check=True)
    (root / "json").mkdir()  # --benchmark-json does not create parent directories
    # Not the xdist worker's PYTEST_* variables: the inner pytest would take itself for a
    # worker and pytest-benchmark would write no autosave file.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(RMQHA_BENCH_MACHINE="test-machine", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "bench_tiny.py",
         "--benchmark-json=json/run.json", "--benchmark-autosave",
         f"--benchmark-storage=file://{root / 'store'}", "--benchmark-min-rounds=3",
         "--benchmark-max-time=0.02", "--benchmark-disable-gc"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    json_file = root / "json" / "run.json"
    [autosave] = list((root / "store").rglob("*.json"))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    return {"json": str(json_file), "autosave": str(autosave), "commit": head.stdout.strip()}


def _fields(schema: T.StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def test_real_files_ingest_with_the_table_schema(spark, real_runs, tmp_path) -> None:  # noqa: ANN001, F811
    table = str(tmp_path / "runs")
    result = ingest(spark, [real_runs["autosave"]], table)
    assert (result.files_seen, result.files_ingested, result.rows_new) == (1, 1, 4)
    assert result.skipped == []
    df = read_table(spark, table)
    assert _fields(df.schema) == _fields(RUN_TABLE)
    rows = {r["benchmark"]: r for r in df.collect()}
    assert sorted(rows) == sorted(
        f"bench_tiny.py::test_pack[{b}-{i}]" for b in (1, 8) for i in ("struct", "python"))
    row = rows["bench_tiny.py::test_pack[8-python]"]
    assert row["implementation"] == "python"
    assert row["group"] == "header-pack"
    assert row["params"] == {"impl": "python", "batch": "8"}
    assert row["machine"] == "test-machine"
    assert row["commit"] == real_runs["commit"]
    assert row["branch"] == "main"
    assert row["commit_dirty"] is False
    assert row["rounds"] >= 3
    assert 0 < row["min"] <= row["median"] <= row["max"]
    assert row["ops"] == pytest.approx(1.0 / row["mean"])
    # The hook in benches/conftest.py stamped every benchmark with the run context.
    assert row["extra_info"]["message_bytes"] == "20"
    assert row["extra_info"]["batch"] == "8"
    assert row["extra_info"]["commit"] == real_runs["commit"]
    assert row["extra_info"]["machine"] == "test-machine"
    assert row["extra_info"]["quick"] == "false"
    assert row["source_file"].endswith(os.path.basename(real_runs["autosave"]))


def test_json_and_autosave_of_one_session_and_reingest_add_nothing_twice(spark, real_runs, tmp_path) -> None:  # noqa: ANN001, E501, F811
    with open(real_runs["json"]) as fh:
        doc = json.load(fh)
    # --benchmark-json embeds the raw samples; the schema must ignore them.
    assert doc["benchmarks"][0]["stats"]["data"]
    table = str(tmp_path / "runs")
    first = ingest(spark, [real_runs["json"], real_runs["autosave"]], table)
    assert (first.files_seen, first.files_ingested, first.rows_read, first.rows_new) == (2, 2, 8, 4)
    assert first.rows_duplicate == 4
    again = ingest(spark, [os.path.dirname(real_runs["json"]), real_runs["autosave"]], table)
    # Nothing new: both files are in the manifest, so neither is read again.
    assert (again.files_seen, again.files_new, again.rows_read, again.rows_new) == (2, 0, 0, 0)
    assert read_table(spark, table).count() == 4


def test_corrupt_foreign_and_empty_files_are_named_and_skipped(spark, tmp_path) -> None:  # noqa: ANN001, F811
    hist = tmp_path / "history"
    synthetic.write_history(synthetic.HistorySpec(runs=3, benchmarks=4), str(hist / "good"))
    (hist / "truncated.json").write_text('{"machine_info": {"node": "x"}, "benchm')
    (hist / "foreign.json").write_text(json.dumps({"name": "package.json", "version": "1.0"}, indent=2))
    (hist / "wrong_types.json").write_text(json.dumps({"datetime": "2026-01-01T00:00:00+00:00",
                                                       "benchmarks": "none", "machine_info": {}}))
    (hist / "array.json").write_text("[1, 2, 3]")
    (hist / "empty.json").write_text("")
    (hist / "notes.txt").write_text("not json, not even looked at")
    table = str(tmp_path / "runs")
    result = ingest(spark, [str(hist)], table)
    skipped = {os.path.basename(s.path): s.reason for s in result.skipped}
    # Spark's file sources skip zero-length files: empty.json is not even listed.
    assert sorted(skipped) == ["array.json", "foreign.json", "truncated.json", "wrong_types.json"]
    assert "malformed" in skipped["truncated.json"]
    assert "not a pytest-benchmark file" in skipped["foreign.json"]
    assert (result.files_seen, result.files_ingested, result.rows_new) == (7, 3, 12)
    assert read_table(spark, table).select("run_id").distinct().count() == 3


def test_same_file_under_two_names_is_one_run(spark, tmp_path) -> None:  # noqa: ANN001, F811
    spec = synthetic.HistorySpec(runs=2, benchmarks=3)
    [a, b] = synthetic.write_history(spec, str(tmp_path / "h"))
    shutil.copy(a, tmp_path / "h" / "copy_of_first.json")
    table = str(tmp_path / "runs")
    result = ingest(spark, [str(tmp_path / "h")], table)
    assert (result.files_ingested, result.rows_read, result.rows_new, result.rows_duplicate) == (3, 9, 6, 3)
    del b


def test_files_with_new_times_or_names_but_stored_content_are_not_parsed_again(spark, tmp_path) -> None:  # noqa: ANN001, F811
    """A fresh checkout (every file a new modification time) or a copied history (new
    paths) is keyed by content: hashed, recorded, not parsed, nothing added or skipped."""
    history = tmp_path / "h"
    files = synthetic.write_history(synthetic.HistorySpec(runs=4, benchmarks=3), str(history))
    (history / "foreign.json").write_text(json.dumps({"name": "package.json"}))
    table = str(tmp_path / "runs")
    first = ingest(spark, [str(history)], table)
    assert (first.files_ingested, first.rows_new, len(first.skipped)) == (4, 12, 1)
    later = os.stat(files[0]).st_mtime + 3600
    for name in os.listdir(history):
        os.utime(history / name, (later, later))
    shutil.copytree(history, tmp_path / "copy")
    # One file changed in place: new content, parsed as a new run.
    doc = json.loads(open(files[0]).read())
    doc["benchmarks"][0]["stats"]["median"] *= 2
    with open(files[0], "w") as fh:
        json.dump(doc, fh)

    again = ingest(spark, [str(history), str(tmp_path / "copy")], table)
    assert (again.files_seen, again.files_new, again.files_known_content) == (10, 10, 9)
    assert (again.files_ingested, again.rows_read, again.rows_new, again.skipped) == (1, 3, 3, [])
    assert read_table(spark, table).count() == 15
    manifest = spark.read.parquet(os.path.join(table, "_files")).toPandas()
    assert manifest["content_digest"].notna().all() and len(manifest) == 15
    # The new keys are in the manifest: the next look reads nothing.
    third = ingest(spark, [str(history), str(tmp_path / "copy")], table)
    assert (third.files_seen, third.files_new) == (10, 0)


def test_missing_history_path_reports_nothing_seen(spark, tmp_path) -> None:  # noqa: ANN001, F811
    result = ingest(spark, [str(tmp_path / "does-not-exist")], str(tmp_path / "runs"))
    assert (result.files_seen, result.rows_new) == (0, 0)
    assert not os.path.exists(tmp_path / "runs")
