"""``rmqha scrub``: check every record's CRC in a broker's store, read-only.

A broker checks the last segments when it starts (``verify_segments_on_open``) and every
record it serves; this command checks all of them, and is safe to run on the store of a
running broker (it only reads).  Exit code 0 when every record is intact, 1 when any
failed (each named with its file and offset), 2 when the path holds no commitlog.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rmqha.cli.output import add_json_flag, emit, table
from rmqha.store.scrub import scrub_store


def _commitlog_dir(path: Path) -> Path | None:
    for candidate in (path, path / "commitlog"):
        if candidate.is_dir() and any(p.name.isdigit() and len(p.name) == 20 for p in candidate.iterdir()):
            return candidate
    return None


def _run(args: argparse.Namespace) -> int:
    directory = _commitlog_dir(Path(args.store))
    if directory is None:
        print(f"rmqha scrub: error: {args.store} holds no commitlog segments (give a broker's "
              "store_dir or its commitlog/ directory)", file=sys.stderr)
        return 2
    report = scrub_store(directory)
    data = {"directory": str(directory), "segments": report.segments, "records": report.records,
            "bytesChecked": report.bytes_checked, "ok": report.ok,
            "bad": [{"file": f, "offset": b.offset, "reason": b.reason} for f, b in report.bad]}
    lines = [f"{directory}: {report.segments} segments, {report.records:,} records, "
             f"{report.bytes_checked:,} bytes checked"]
    if report.bad:
        lines += table(["#File", "#Offset", "#Problem"],
                       [(f, b.offset, b.reason) for f, b in report.bad])
        lines.append(f"{len(report.bad)} bad record(s): a slave repairs them from its master on "
                     "its next start; on a master, restore the store or rebuild it from a slave")
    else:
        lines.append("every record intact")
    emit(args, data, lines)
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("scrub", help="check every record's CRC in a broker store (read-only)",
                              description=(__doc__ or "").split("\n\n")[1])
    p.add_argument("store", help="a broker's store_dir, or its commitlog/ directory")
    add_json_flag(p)
    p.set_defaults(func=_run)
