"""``CommitLog.append_plain_run`` stores exactly what ``append_plain`` stores send by send,
on both twins: runs across segment ends (padding and rolling), per-queue offsets, topics
seen for the first time, a send the run must leave alone, one announcement per run."""
from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest

from rmqha.errors import InvalidMessageError
from rmqha.store import CommitLog

SEG = 16 << 10
BORN_HOST = ("10.0.0.1", 1234)
BORN_DEFAULT = 1_700_000_000_000


def fixed_clock() -> int:
    return 1_700_000_000_123


def make_sends(seed: int, n: int) -> list[tuple]:
    rnd = random.Random(seed)
    return [(11, i, 1, f"t{rnd.randrange(3)}", rnd.randrange(-1, 6), 0,
             rnd.choice([0, 1_600_000_000_000 + i]), rnd.randrange(-3, 3),
             rnd.choice([b"", b"KEYS\x01k%d\x02" % i, b"A\x01b\x02TAGS\x01x\x02"]),
             rnd.randrange(2), bytes([i % 256]) * rnd.randrange(0, 1500), b"", None, None,
             None) for i in range(n)]


def open_log(path: Path, twin: str, host: tuple[str, int] = ("127.0.0.1", 10911)) -> CommitLog:
    return CommitLog(path, segment_bytes=SEG, clock=fixed_clock, prefault=False,
                     implementation=twin, store_host=host)


def one_by_one(log: CommitLog, sends: list[tuple], qids: list[int]) -> list[tuple[int, int, int]]:
    return [log.append_plain(s[3], s[10], q, s[8], s[7], s[5], s[6] or BORN_DEFAULT, BORN_HOST,
                             s[9]) for s, q in zip(sends, qids)]


def in_runs(log: CommitLog, sends: list[tuple], qids: list[int],
            cuts: list[int]) -> list[tuple[int, int, int]]:
    """Runs between ``cuts``; a send a run leaves goes one by one, as the send path does."""
    n = len(sends)
    q = array("i", qids)
    offs, sizes, qoffs = array("q", bytes(8 * n)), array("i", bytes(4 * n)), array("q", bytes(8 * n))
    placed: list[tuple[int, int, int]] = []
    points = sorted({0, n, *cuts})
    for a, b in zip(points, points[1:]):
        i = a
        while i < b:
            taken = log.append_plain_run(sends, i, b, q, BORN_DEFAULT, BORN_HOST, offs, sizes, qoffs)
            placed += [(offs[j], sizes[j], qoffs[j]) for j in range(i, i + taken)]
            i += taken
            if i < b:
                s = sends[i]
                placed += one_by_one(log, [s], [qids[i]])
                i += 1
    return placed


def log_bytes(log: CommitLog) -> bytes:
    return b"".join(bytes(log.read(a, min(a + SEG, log.max_offset) - a))
                    for a in range(0, log.max_offset, SEG))


@pytest.mark.parametrize("twin", ["cython", "python"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_runs_store_what_one_by_one_stores(tmp_path: Path, twin: str, seed: int) -> None:
    sends = make_sends(seed, 120)
    rnd = random.Random(seed)
    qids = [s[4] % 4 if s[4] >= 0 else 2 for s in sends]
    cuts = sorted(rnd.sample(range(1, len(sends)), 6))
    ref = open_log(tmp_path / "ref", twin)
    got = open_log(tmp_path / "got", twin)
    ends: list[int] = []
    try:
        want = one_by_one(ref, sends, qids)
        got.add_append_listener(ends.append)
        placed = in_runs(got, sends, qids, cuts)
        assert ref.max_offset > 3 * SEG  # the runs crossed segment ends
        assert placed == want
        assert log_bytes(got) == log_bytes(ref)
        assert got.queue_offsets() == ref.queue_offsets()
        assert got.last_queue_offset == ref.last_queue_offset
        assert ends[-1] == got.max_offset and len(ends) < len(sends)
        # Negative control: another store host is other bytes, and the comparison sees it.
        other = open_log(tmp_path / "other", twin, host=("127.0.0.2", 10911))
        try:
            in_runs(other, sends, qids, cuts)
            assert log_bytes(other) != log_bytes(ref)
        finally:
            other.close()
    finally:
        ref.close()
        got.close()


@pytest.mark.parametrize("twin", ["cython", "python"])
def test_a_run_leaves_what_append_plain_refuses(tmp_path: Path, twin: str) -> None:
    good = [s[:3] + ("T",) + s[4:] for s in make_sends(9, 5)]
    bad = good[3][:8] + (b"K\x01a\x02K\x01b\x02",) + good[3][9:]
    sends = [good[0], good[1], good[2], bad, good[4]]
    log = open_log(tmp_path, twin)
    try:
        n = len(sends)
        arrays = array("q", bytes(8 * n)), array("i", bytes(4 * n)), array("q", bytes(8 * n))
        # A topic the log has not seen yet goes one by one (which learns its bytes).
        assert log.append_plain_run(sends, 0, n, array("i", [0] * n), BORN_DEFAULT, BORN_HOST,
                                    *arrays) == 0
        one_by_one(log, sends[:1], [0])
        taken = log.append_plain_run(sends, 1, n, array("i", [0] * n), BORN_DEFAULT, BORN_HOST,
                                     *arrays)
        assert taken == 2
        end = log.max_offset
        with pytest.raises(InvalidMessageError):
            one_by_one(log, [bad], [0])
        assert log.max_offset == end
        assert log.append_plain_run(sends, 4, n, array("i", [0] * n), BORN_DEFAULT, BORN_HOST,
                                    *arrays) == 1
        assert log.queue_offset("T", 0) == 4
    finally:
        log.close()
