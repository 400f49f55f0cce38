"""One pytest-benchmark file -> run-table rows; runs inside Spark's Python workers.

The ingest job reads new files with Spark's ``binaryFile`` source (executors read them from
wherever they live) and hands their bytes to :func:`parse_batches` through ``mapInArrow``,
so parsing scales out with the executors; in local mode, where the Python workers see the
driver's files, they read ``file:`` paths themselves (:func:`read_and_parse_batches`). Python's JSON parser does this several times
faster than Spark's JSON reader on pretty-printed 300 KB documents with an explicit schema
(measured 8.6 MB/s for ``from_json`` here), and it only has to keep the fields the run
table holds.

Every file's rows carry ``content_digest``, a hash of its bytes: the ingest keeps it in its
manifest, and a file listed under a new name or time whose digest is already there (a fresh
checkout, a restored cache, a copy) is hashed, not parsed: it gives one row with only its
path and digest (see :func:`_batches_of`).

A file that is not a usable run gives one row with ``problem`` set (and no benchmark), so
the job can name it. Entries without a name or a median give rows with those left null;
the job counts and drops them.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

try:  # 3x faster than the standard library on these documents; optional on executors
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - exercised where orjson is not installed
    _loads = json.loads

STAT_FIELDS = ("min", "median", "mean", "max", "stddev", "iqr", "ops")
COUNT_FIELDS = ("rounds", "iterations")

_STR = pa.string()
_MAP = pa.map_(pa.string(), pa.string())
_TS = pa.timestamp("us", tz="UTC")

#: Arrow layout of the rows (the Spark side is ingest.PARSED_ROWS, the same columns).
ARROW_SCHEMA = pa.schema([
    ("run_id", _STR), ("run_time", _TS), ("commit", _STR), ("commit_dirty", pa.bool_()),
    ("branch", _STR), ("machine", _STR), ("python", _STR), ("cpu", _STR),
    ("benchmark", _STR), ("name", _STR), ("group", _STR), ("params", _MAP),
    ("implementation", _STR),
    *((k, pa.float64()) for k in STAT_FIELDS), *((k, pa.int64()) for k in COUNT_FIELDS),
    ("extra_info", _MAP), ("source_file", _STR), ("commit_time", _TS), ("machine_info", _MAP),
    ("problem", _STR), ("content_digest", _STR),
])


def _text(value: Any) -> str | None:
    """A JSON value as map text: strings as they are, anything else as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _string_map(value: Any) -> list[tuple[str, str | None]] | None:
    if not isinstance(value, dict):
        return None
    return [(str(k), _text(v)) for k, v in value.items()]


def _timestamp(value: Any) -> datetime | None:
    """ISO 8601 text as a UTC time; pytest-benchmark writes naive UTC times."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _number(value: Any, kind: type) -> Any:
    if type(value) is kind:  # the common case, first
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)


def _machine_info(info: dict[str, Any]) -> list[tuple[str, str]]:
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    fields = {
        "node": info.get("node"), "machine": info.get("machine"), "system": info.get("system"),
        "release": info.get("release"), "python_implementation": info.get("python_implementation"),
        "python_version": info.get("python_version"), "cpu_brand": cpu.get("brand_raw"),
        "cpu_arch": cpu.get("arch"), "cpu_count": cpu.get("count"),
        "rmqha_machine": info.get("rmqha_machine"),
    }
    return [(k, _text(v)) for k, v in fields.items() if v is not None]


def _problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "not a pytest-benchmark file: the document is not a JSON object"
    if "datetime" not in doc:
        return "not a pytest-benchmark file: no 'datetime'"
    if _timestamp(doc["datetime"]) is None:
        return "not a pytest-benchmark file: 'datetime' is not a timestamp"
    if not isinstance(doc.get("benchmarks"), list):
        return "not a pytest-benchmark file: no 'benchmarks' list"
    if not isinstance(doc.get("machine_info"), dict):
        return "not a pytest-benchmark file: no 'machine_info'"
    if doc.get("commit_info") is not None and not isinstance(doc["commit_info"], dict):
        return "malformed JSON or fields of the wrong type: 'commit_info' is not an object"
    return None


def run_id_of(doc: dict[str, Any]) -> str:
    """The session id our benches stamp (``rmqha_run``), else a hash of the document's
    content except its save time (machine, commit, every benchmark's name, median and
    rounds): autosave and ``--benchmark-json`` of one session, or a copy of a file, are one
    run."""
    if isinstance(doc.get("rmqha_run"), str):
        return hashlib.sha256(doc["rmqha_run"].encode()).hexdigest()[:20]
    digest = hashlib.sha256(b"content:")
    digest.update(json.dumps([doc.get("machine_info"), doc.get("commit_info")],
                             sort_keys=True, default=str).encode())
    lines = []
    for b in doc["benchmarks"]:
        st = b.get("stats") if isinstance(b, dict) else None
        if isinstance(st, dict):
            lines.append(f"{b.get('fullname')}|{st.get('median')!r}|{st.get('rounds')!r}")
    digest.update("\n".join(lines).encode())
    return digest.hexdigest()[:20]


def _problem_columns(path: str, problem: str | None) -> dict[str, list[Any]]:
    """One row naming the file (and why it gives no benchmark row, if it is not known)."""
    columns: dict[str, list[Any]] = {n: [None] for n in ARROW_SCHEMA.names}
    columns["source_file"] = [path]
    columns["problem"] = [problem]
    return columns


def content_digest(data: bytes) -> str:
    """The key of a file's content in the ingest manifest (SHA-256 runs at ~1.7 GB/s here:
    0.3 s for the 563 MB of a 2,000-run history)."""
    return hashlib.sha256(data).hexdigest()[:32]


def columns_of(path: str, data: bytes) -> dict[str, list[Any]]:
    """The rows of one file (see the module docstring), column by column: building columns
    directly costs a third of building a dict per row."""
    if not data.strip():
        return _problem_columns(path, "empty file or no JSON document")
    try:
        doc = _loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _problem_columns(path, f"malformed JSON ({exc})")
    problem = _problem(doc)
    if problem is not None:
        return _problem_columns(path, problem)
    machine = doc["machine_info"]
    commit = doc.get("commit_info") or {}
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
    python = " ".join(str(p) for p in (machine.get("python_implementation"),
                                       machine.get("python_version")) if p)
    dirty = commit.get("dirty")
    entries = [e if isinstance(e, dict) else {} for e in doc["benchmarks"]]
    n = len(entries)
    if not n:
        return {name: [] for name in ARROW_SCHEMA.names}
    run = {
        "run_id": run_id_of(doc), "run_time": _timestamp(doc["datetime"]),
        "commit": _text(commit.get("id")),
        "commit_dirty": dirty if isinstance(dirty, bool) else None,
        "branch": _text(commit.get("branch")),
        "machine": _text(machine.get("rmqha_machine") or machine.get("node")) or "unknown",
        "python": python or None, "cpu": _text(cpu.get("brand_raw")),
        "source_file": path, "commit_time": _timestamp(commit.get("time")),
        "machine_info": _machine_info(machine), "problem": None,
    }
    columns: dict[str, list[Any]] = {k: [v] * n for k, v in run.items()}
    stats = [e.get("stats") if isinstance(e.get("stats"), dict) else {} for e in entries]
    params = [_string_map(e.get("params")) for e in entries]
    extra = [_string_map(e.get("extra_info")) for e in entries]
    impls = []
    for p_items, e_items in zip(params, extra, strict=True):
        p, e = dict(p_items or ()), dict(e_items or ())
        impls.append(e.get("implementation") or p.get("twin") or p.get("implementation")
                     or p.get("impl") or "unspecified")
    columns.update({
        "benchmark": [_text(e.get("fullname")) for e in entries],
        "name": [_text(e.get("name")) for e in entries],
        "group": [_text(e.get("group")) for e in entries],
        "params": params, "extra_info": extra, "implementation": impls,
    })
    for k in STAT_FIELDS:
        columns[k] = [_number(st.get(k), float) for st in stats]
    for k in COUNT_FIELDS:
        columns[k] = [_number(st.get(k), int) for st in stats]
    return columns


#: Files whose rows go out in one Arrow batch: bounds a Python worker's memory (a batch of
#: 64 files of 200 benchmarks is ~13,000 rows) whatever the size of its input batch.
FILES_PER_BATCH = 64


#: Columns with one value per file (columns_of repeats it on each of the file's rows): a
#: batch converts one value per file to Arrow and repeats it there, instead of converting
#: every row's copy (the nine-entry machine_info map of every row was a third of the
#: conversion's time).
RUN_LEVEL = ("run_id", "run_time", "commit", "commit_dirty", "branch", "machine", "python",
             "cpu", "source_file", "commit_time", "machine_info", "problem", "content_digest")


def _batches_of(files: Iterator[tuple[str, bytes | str]],
                known: frozenset[str] = frozenset()) -> Iterator[pa.RecordBatch]:
    """(path, bytes, or the reason they could not be read) -> batches of rows. A file whose
    content digest is in ``known`` is stored already: one row with its path and digest."""
    batch = _PendingBatch()
    for path, data in files:
        if isinstance(data, str):
            found = _problem_columns(path, data)
        else:
            digest = content_digest(data)
            found = _problem_columns(path, None) if digest in known else columns_of(path, data)
            found["content_digest"] = [digest] * len(found["source_file"])
        batch.add(found)
        if batch.files == FILES_PER_BATCH:
            yield batch.record_batch()
            batch = _PendingBatch()
    if batch.files:
        yield batch.record_batch()


class _PendingBatch:
    """Rows of up to FILES_PER_BATCH files: per-row columns as lists, run-level ones as one
    value per file and the file's row count."""

    def __init__(self) -> None:
        self.rows: dict[str, list[Any]] = {n: [] for n in ARROW_SCHEMA.names if n not in RUN_LEVEL}
        self.per_file: dict[str, list[Any]] = {n: [] for n in RUN_LEVEL}
        self.counts: list[int] = []
        self.files = 0

    def add(self, found: dict[str, list[Any]]) -> None:
        n = len(found["source_file"])
        for name, values in self.rows.items():
            values.extend(found[name])
        for name, values in self.per_file.items():
            values.append(found[name][0] if n else None)
        self.counts.append(n)
        self.files += 1

    def record_batch(self) -> pa.RecordBatch:
        repeat = pa.array(np.repeat(np.arange(self.files, dtype=np.int64), self.counts))
        arrays = []
        for name in ARROW_SCHEMA.names:
            kind = ARROW_SCHEMA.field(name).type
            if name in RUN_LEVEL:
                arrays.append(pa.array(self.per_file[name], type=kind).take(repeat))
            elif kind == _MAP:
                arrays.append(_map_array(self.rows[name]))
            else:
                arrays.append(pa.array(self.rows[name], type=kind))
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _map_array(maps: list[list[tuple[str, str | None]] | None]) -> pa.Array:
    """Map cells (lists of pairs, or None) as one Arrow map array, built from flat key and
    value columns (2-3x faster than converting the nested lists)."""
    lengths = np.fromiter((0 if m is None else len(m) for m in maps), dtype=np.int32, count=len(maps))
    offsets = np.zeros(len(maps) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    keys = [k for m in maps if m for k, _ in m]
    items = [v for m in maps if m for _, v in m]
    mask = pa.array(np.fromiter((m is None for m in maps), dtype=bool, count=len(maps)))
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, _STR), pa.array(items, _STR),
                                   mask=mask if mask.true_count else None)


def parse_batches(batches: Iterator[pa.RecordBatch],
                  known: frozenset[str] = frozenset()) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: batches of (``path``, ``content``) -> batches of rows (bind
    ``known``, the content digests already stored, with functools.partial)."""
    def files() -> Iterator[tuple[str, bytes]]:
        for batch in batches:
            contents = batch.column("content")
            for i, path in enumerate(batch.column("path").to_pylist()):
                yield path, contents[i].as_py() or b""
    return _batches_of(files(), known)


def local_path(uri: str) -> str:
    """The local file name of a ``file:`` URI as Hadoop lists it (``file:/a/b`` or
    ``file:///a/b``; Hadoop does not percent-encode the path)."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri[len("file:"):] if uri.startswith("file:") else uri


def read_and_parse_batches(batches: Iterator[pa.RecordBatch],
                          known: frozenset[str] = frozenset()) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body for ``file:`` paths the Python workers can open themselves (local
    mode): batches of ``path`` -> batches of rows. The JVM then moves file names, not
    contents: reading 2,000 files of 300 KB through ``binaryFile`` and Arrow cost ~7 s of
    CPU, reading them here ~0.3 s."""
    def files() -> Iterator[tuple[str, bytes | str]]:
        for batch in batches:
            for path in batch.column("path").to_pylist():
                try:
                    with open(local_path(path), "rb") as fh:
                        yield path, fh.read()
                except OSError as exc:
                    yield path, f"cannot read the file ({exc.strerror or exc})"
    return _batches_of(files(), known)
