"""Finding records whose bytes changed at rest: body CRCs checked below the flushed offset.

Recovery on open checks CRCs only where a crash can have torn a write (past the flushed
checkpoint); a byte that flips later, on a disk or in a copied file, sits below it.  This
module walks records and checks every body CRC and last byte (``records.scan``'s check),
stepping over a bad record when its header is intact so one flipped byte does not hide
the rest:

- :func:`bad_records` on a mapped segment (the commitlog checks its last segments on open
  and every range it serves to consumers);
- :func:`scrub_store` over a whole ``commitlog/`` directory, read-only, for ``rmqha scrub``
  (safe on a running broker's store: it never writes).
"""
from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rmqha import _core
from rmqha._core._protocols import RecordsTwin

_SEGMENT_NAME = re.compile(r"^[0-9]{20}$")
#: Stops that end a segment's data cleanly.
_CLEAN = ("END", "ZEROS", "BLANK")
#: Stops at a record whose sizes add up: the walk goes on after it.
_STEP_OVER = ("BAD_CRC", "ZERO_TAIL")


@dataclass(frozen=True)
class BadRecord:
    """A record at global ``offset`` that failed a check (``reason``: a ScanStop name)."""

    offset: int
    reason: str
    #: The record's total size when its header was intact (then the walk went on past it).
    size: int | None = None


@dataclass
class ScrubReport:
    directory: str
    segments: int = 0
    records: int = 0
    bytes_checked: int = 0
    bad: list[tuple[str, BadRecord]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad


def bad_records(codec: RecordsTwin, buf: Any, start: int, end: int, base: int) -> tuple[list[BadRecord], int]:
    """Check every record of ``buf[start:end]`` (a whole segment mapping; ``base`` is its
    global offset); returns the bad ones and how many records were checked.  A record with
    a bad CRC or a zero last byte but an intact header is stepped over; anything else ends
    the walk there."""
    S = codec.ScanStop
    bad: list[BadRecord] = []
    count = 0
    pos = start
    while pos < end:
        stop_pos, stop, n = codec.scan(buf, pos, end, base, base + pos)
        count += n
        name = S(stop).name
        if name in _CLEAN:
            break
        size = int.from_bytes(buf[stop_pos:stop_pos + 4], "big") if stop_pos + 4 <= end else 0
        if name in _STEP_OVER and 0 < size <= end - stop_pos:
            bad.append(BadRecord(base + stop_pos, name, size))
            count += 1
            pos = stop_pos + size
            continue
        bad.append(BadRecord(base + stop_pos, name))
        break
    return bad, count


def _segments(directory: str) -> Iterator[tuple[int, str]]:
    for name in sorted(os.listdir(directory)):
        if _SEGMENT_NAME.match(name):
            yield int(name), os.path.join(directory, name)


def scrub_store(directory: str | os.PathLike[str], codec: RecordsTwin | None = None) -> ScrubReport:
    """Check every record in every segment of a ``commitlog/`` directory, read-only."""
    codec = codec or _core.load("records")
    report = ScrubReport(str(directory))
    for base, path in _segments(str(directory)):
        size = os.path.getsize(path)
        report.segments += 1
        if size == 0:
            continue
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
            bad, count = bad_records(codec, mm, 0, size, base)
        report.records += count
        report.bytes_checked += size
        report.bad.extend((path, b) for b in bad)
    return report


def queues_before(codec: RecordsTwin, buf: Any, base: int, offset: int) -> dict[tuple[bytes, int], int] | None:
    """The next queue offset of each queue with records between the segment start ``base``
    (``buf`` its mapping) and ``offset``, or None when a walk over whole records from
    ``base`` does not land on ``offset`` (not a record boundary).

    Truncation checks its cut by reading the record there; a record damaged at rest (a
    length, its magic) cannot be read, yet cutting at its start is exactly a slave's repair
    (it fetches the rest again), so the cut is proved from the records before it, and so
    are the queues' next offsets.  The rest of that segment is unreadable too: a queue whose
    only records in it lie past the cut keeps its old next offset until the re-fetched
    records set it.  Rare (repairs only), so a walk of at most a segment is fine."""
    table: dict[tuple[bytes, int], int] = {}
    pos, _, _ = codec.scan(buf, 0, offset - base, base, 1 << 62, table)
    return table if pos == offset - base else None
