"""The file parser the ingest job runs in Spark's Python workers (spark_bench.parse), without
a JVM: rows of a pytest-benchmark document, run identity, problems named."""
from __future__ import annotations

import json

import needs
import pytest

pa = needs.module("pyarrow", "the spark extra", module_level=True)
needs.module("pandas", "the spark extra", module_level=True)
from spark_bench import parse, synthetic  # noqa: E402 - after the optional third-party module


def _doc(**changes: object) -> dict[str, object]:
    spec = synthetic.HistorySpec(runs=3, benchmarks=4, **changes)
    return synthetic.run_document(spec, 1, synthetic.timings(spec)[1])


def test_one_row_per_benchmark_with_run_context() -> None:
    doc = _doc()
    cols = parse.columns_of("file:/h/a.json", json.dumps(doc, indent=4).encode())
    assert len(cols["benchmark"]) == 4
    assert cols["problem"] == [None] * 4
    assert cols["implementation"] == ["cython", "python", "struct", "lmdb"]
    assert cols["commit"][0] == synthetic.commit_of(1)
    assert cols["branch"][0] == "main" and cols["commit_dirty"][0] is False
    assert cols["commit_time"][0].isoformat() == "2026-01-01T01:00:00+00:00"
    assert dict(cols["machine_info"][0])["cpu_brand"] == "Synthetic CPU"
    assert dict(cols["params"][0]) == {"implementation": "cython", "size": "64"}
    assert cols["median"][0] == doc["benchmarks"][0]["stats"]["median"]


def test_the_same_run_saved_twice_with_different_save_times_has_one_run_id() -> None:
    """Regression: --benchmark-autosave and --benchmark-json of one session (no rmqha_run
    stamp) were two runs, so every benchmark was counted twice."""
    doc = _doc()
    json_copy = dict(doc, datetime="2026-01-01T01:00:09.5+00:00")
    for bench in json_copy["benchmarks"]:
        bench["stats"] = dict(bench["stats"], data=[1.0, 2.0])  # --benchmark-json adds samples
    assert parse.run_id_of(doc) == parse.run_id_of(json_copy)
    other_run = _doc(seed=2)
    assert parse.run_id_of(other_run) != parse.run_id_of(doc)
    assert parse.run_id_of(dict(doc, rmqha_run="abc")) == parse.run_id_of(dict(other_run, rmqha_run="abc"))


@pytest.mark.parametrize(("data", "reason"), [
    (b"   ", "empty file"),
    (b'{"machine_info": {"node": "x"}, "benchm', "malformed JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (json.dumps({"name": "package.json"}).encode(), "no 'datetime'"),
    (json.dumps({"datetime": "yesterday"}).encode(), "not a timestamp"),
    (json.dumps({"datetime": "2026-01-01T00:00:00", "benchmarks": "none"}).encode(), "no 'benchmarks' list"),
    (json.dumps({"datetime": "2026-01-01T00:00:00", "benchmarks": []}).encode(), "no 'machine_info'"),
])
def test_unusable_documents_give_one_row_naming_the_problem(data: bytes, reason: str) -> None:
    cols = parse.columns_of("file:/h/bad.json", data)
    assert cols["source_file"] == ["file:/h/bad.json"]
    assert reason in cols["problem"][0]
    assert cols["benchmark"] == [None]


def test_entries_without_stats_are_kept_for_counting_with_null_median() -> None:
    doc = _doc()
    doc["benchmarks"][1] = {"name": "broken"}
    doc["benchmarks"][2]["stats"]["median"] = "fast"
    cols = parse.columns_of("p", json.dumps(doc).encode())
    assert cols["median"][1] is None and cols["median"][2] is None
    assert cols["median"][0] is not None


def test_batches_match_the_arrow_schema() -> None:
    good = json.dumps(_doc()).encode()
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), pa.array([good, b"{"], pa.binary())],
                                       names=["path", "content"])
    [out] = list(parse.parse_batches(iter([batch])))
    assert out.schema == parse.ARROW_SCHEMA
    assert out.num_rows == 5
    assert out.column("problem").null_count == 4


def test_local_files_are_read_by_the_worker_and_unreadable_ones_named(tmp_path) -> None:  # noqa: ANN001
    good = tmp_path / "a run [1].json"
    good.write_text(json.dumps(_doc()))
    missing = tmp_path / "gone.json"
    paths = [f"file:{good}", f"file://{missing}"]
    batch = pa.RecordBatch.from_arrays([pa.array(paths)], names=["path"])
    [out] = list(parse.read_and_parse_batches(iter([batch])))
    assert out.schema == parse.ARROW_SCHEMA
    rows = out.to_pylist()
    assert [r["source_file"] for r in rows] == [paths[0]] * 4 + [paths[1]]
    assert rows[-1]["problem"].startswith("cannot read the file")
    assert all(r["problem"] is None for r in rows[:4])


def test_output_batches_are_bounded_by_file_count(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(parse, "FILES_PER_BATCH", 2)
    good = json.dumps(_doc()).encode()
    batch = pa.RecordBatch.from_arrays(
        [pa.array(list("abcde")), pa.array([good] * 5, pa.binary())], names=["path", "content"])
    out = list(parse.parse_batches(iter([batch])))
    assert [b.num_rows for b in out] == [8, 8, 4]


def test_a_file_whose_content_is_known_is_hashed_not_parsed() -> None:
    """Every row carries its file's content digest; a file whose digest the manifest holds
    (the same bytes under a new name or time) gives one row with its path and digest."""
    good, other = json.dumps(_doc()).encode(), json.dumps(_doc(seed=2)).encode()
    digest = parse.content_digest(good)
    assert digest == parse.content_digest(bytes(good)) != parse.content_digest(other)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["new-name", "other", "broken"]), pa.array([good, other, b"{"], pa.binary())],
        names=["path", "content"])
    [out] = list(parse.parse_batches(iter([batch]), known=frozenset({digest})))
    rows = out.to_pylist()
    assert [r["source_file"] for r in rows] == ["new-name"] + ["other"] * 4 + ["broken"]
    known_row = rows[0]
    assert known_row["content_digest"] == digest
    assert known_row["benchmark"] is None and known_row["problem"] is None
    assert {r["content_digest"] for r in rows[1:5]} == {parse.content_digest(other)}
    assert rows[1]["benchmark"] is not None
    assert rows[-1]["problem"].startswith("malformed JSON")
    assert rows[-1]["content_digest"] == parse.content_digest(b"{")


def test_batches_are_the_rows_converted_one_by_one() -> None:
    """The batch builder repeats run-level values per file and builds maps from flat
    arrays: the same table as converting every row's values, nulls and empty maps kept."""
    from spark_bench.parse import _map_array
    cells = [[("a", "1")], None, [], [("b", None), ("c", "3")]]
    assert _map_array(cells).equals(pa.array(cells, pa.map_(pa.string(), pa.string())))
    spec = synthetic.HistorySpec(runs=3, benchmarks=4)
    docs = [synthetic.run_document(spec, r, synthetic.timings(spec)[r]) for r in range(3)]
    docs[1]["benchmarks"][2]["params"] = None  # type: ignore[index]
    files = [(f"file:/h/{i}.json", json.dumps(d).encode()) for i, d in enumerate(docs)]
    files.append(("file:/h/bad.json", b"{"))
    got = pa.Table.from_batches(list(parse._batches_of(iter(files))))
    rows: dict[str, list[object]] = {n: [] for n in parse.ARROW_SCHEMA.names}
    for path, data in files:
        cols = parse.columns_of(path, data)
        cols["content_digest"] = [parse.content_digest(data)] * len(cols["source_file"])
        for n in rows:
            rows[n].extend(cols[n])
    want = pa.table({n: pa.array(rows[n], parse.ARROW_SCHEMA.field(n).type) for n in rows},
                    schema=parse.ARROW_SCHEMA)
    assert got.num_rows == 13 and got.equals(want)
