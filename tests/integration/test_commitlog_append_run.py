"""``CommitLog.append_run`` (contiguous blocks scattered in one buffer, one ``pwritev``) stores,
checks and refuses exactly what one ``append_data`` per block does, on both twins: random
cuts of a reference log (records split across blocks, segment ends inside a run), a
corrupt byte somewhere, a run that starts mid-record, a disk that fills mid-run.  Both
logs end with the same error, the same bytes in every segment file, the same max and
whole offsets, queue offsets and announced end, and read back the same after a reopen,
whether the run wrote the file (``pwritev``) or copied into the warm mapping."""
from __future__ import annotations

import errno
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rmqha.errors import CorruptRecordError
from rmqha.store import CommitLog
from rmqha.store.segments import Segment, page_up

SEG = 16 << 10


def fixed_clock() -> int:
    return 1_700_000_000_123


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[bytes]:
    """The bytes of a reference log over four segments (blank tails included)."""
    log = CommitLog(tmp_path_factory.mktemp("ref"), segment_bytes=SEG, clock=fixed_clock, prefault=False)
    try:
        rnd = random.Random(5)
        while log.max_offset < 3 * SEG + SEG // 2:
            log.append(f"t{rnd.randrange(3)}", bytes([rnd.randrange(256)]) * rnd.randrange(1, 900),
                       rnd.randrange(4))
        yield b"".join(bytes(log.read(a, min(a + SEG, log.max_offset) - a)) for a in range(0, log.max_offset, SEG))
    finally:
        log.close()


def _blocks(ref: bytes, start: int, cuts: list[int]) -> list[tuple[int, bytes]]:
    """``ref[start:]`` cut into blocks at ``cuts`` and at every segment end."""
    points = sorted({start, len(ref), *(c for c in cuts if start < c < len(ref)),
                     *range(start - start % SEG + SEG, len(ref), SEG)})
    return [(a, ref[a:b]) for a, b in zip(points, points[1:])]


def _scattered(blocks: list[tuple[int, bytes]], gaps: random.Random) -> tuple[bytearray, list[int]]:
    """The blocks' bytes in one buffer with junk between them, and their spans (position,
    size, a third value append_run ignores)."""
    buf = bytearray(gaps.randbytes(gaps.randrange(0, 60)))
    spans: list[int] = []
    for i, (_, data) in enumerate(blocks):
        spans += [len(buf), len(data), 1000 + i]
        buf += data + gaps.randbytes(gaps.randrange(0, 60))
    return buf, spans


def _outcome(log: CommitLog, directory: Path, apply: Any) -> tuple[Any, ...]:
    announced: list[int] = []
    log.add_append_listener(announced.append)
    try:
        result: Any = apply()
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        result = (type(exc).__name__, str(exc).replace(str(directory), "<log>"))
    log.flush()
    files = {os.path.basename(p): Path(p).read_bytes() for p in log.segment_files()}
    return (result, log.max_offset, log.whole_offset, log.queue_offsets(), announced[-1:], files)


def _reopened(directory: Path, twin: str) -> list[tuple[int, str, bytes, int]]:
    log = CommitLog(directory, segment_bytes=SEG, implementation=twin, clock=fixed_clock, prefault=False)
    try:
        return [(m.physical_offset, m.topic, m.body, m.queue_offset) for m in log.iter_messages()]
    finally:
        log.close()


def _compare(twin: str, ref: bytes, head: int, blocks: list[tuple[int, bytes]], seed: int,
             patch_run: Any = None, prefault: bool = False) -> tuple[tuple[Any, ...], tuple[Any, ...], bool]:
    """(run outcome, per-block outcome, whether the run's first blocks went into a warm
    mapping) of ``blocks`` after ``ref[:head]`` was stored; ``prefault``: the logs warm
    up, and the run waits for it (it then copies into the mapping rather than writing
    the file)."""
    buf, spans = _scattered(blocks, random.Random(seed))
    view = memoryview(buf)
    outcomes = []
    warm = False
    with tempfile.TemporaryDirectory() as d:
        for name in ("run", "each"):
            directory = Path(d) / name
            log = CommitLog(directory, segment_bytes=SEG, implementation=twin, clock=fixed_clock,
                            prefault=prefault)
            try:
                for offset, data in _blocks(ref[:head], 0, []):
                    log.append_data(offset, data)
                if name == "run":
                    if prefault:
                        assert log.wait_prefaulted(30)
                        warm = log._warm.faulted > head
                    if patch_run is not None:
                        patch_run(log)
                    outcome = _outcome(log, directory, lambda: log.append_run(head, view, spans))
                else:
                    outcome = _outcome(log, directory, lambda: [log.append_data(o, b) for o, b in blocks][-1])
            finally:
                log.close()
            outcomes.append((*outcome, _reopened(directory, twin)))
    view.release()
    return outcomes[0], outcomes[1], warm


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.integers(0, SEG + 300), cuts=st.lists(st.integers(0, 4 * SEG), max_size=40),
       corrupt=st.none() | st.tuples(st.integers(0, 60), st.integers(0, 1 << 20)), seed=st.integers(0, 99),
       prefault=st.booleans())
def test_a_run_stores_and_refuses_what_one_append_per_block_does(twin: str, reference: bytes, head: int,
                                                                  cuts: list[int], corrupt: Any, seed: int,
                                                                  prefault: bool) -> None:
    blocks = _blocks(reference, head, cuts)
    if corrupt is not None:
        i = corrupt[0] % len(blocks)
        offset, data = blocks[i]
        at = corrupt[1] % len(data)
        blocks[i] = (offset, data[:at] + bytes([data[at] ^ 0x41]) + data[at + 1 :])
    run, each, warm = _compare(twin, reference, head, blocks, seed, prefault=prefault)
    event(run[0][0] if isinstance(run[0], tuple) else "stored")
    event("into the mapping" if warm else "pwritev")
    assert run == each


def test_a_run_that_meets_a_full_disk_stores_what_fits_then_refuses(twin: str, reference: bytes,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk cannot take the run's blocks at once: it is appended block by block, what
    fits stored, then DiskFullError, as one append_data per block gives."""
    limit = SEG + 5 * 4096
    real = Segment.allocate

    def allocate(self: Segment, upto: int) -> None:
        if self.base + page_up(upto) > limit:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        real(self, upto)

    monkeypatch.setattr(Segment, "allocate", allocate)
    blocks = _blocks(reference, 0, list(range(0, 4 * SEG, 3000)))
    run, each, _ = _compare(twin, reference, 0, blocks, 1)
    assert run == each
    assert run[0][0] == "DiskFullError" and SEG < run[1] <= limit


def test_the_comparison_can_fail(twin: str, reference: bytes) -> None:
    """Negative control: a run that took every block as valid stores a corrupt one, and the
    comparison sees it."""
    blocks = _blocks(reference, 0, [5000, 9000])
    offset, data = blocks[1]
    blocks[1] = (offset, data[:100] + bytes(b ^ 0x41 for b in data[100:1100]) + data[1100:])

    def accept_all(log: CommitLog) -> None:
        log._is_bad = lambda *args: False  # type: ignore[method-assign]

    for prefault in (False, True):
        run, each, warm = _compare(twin, reference, 0, blocks, 2, patch_run=accept_all, prefault=prefault)
        assert warm == prefault
        assert run != each
        assert each[0][0] == "CorruptRecordError"


def _lone_runs(twin: str, ref: bytes, blocks: list[tuple[int, bytes]], directory: Path, prefault: bool,
               lone: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[Any, ...], int]:
    """The outcome of ``blocks`` each appended alone (``lone``: as a run of one, else with
    append_data) on an empty log, and how many took the run-of-one shortcut (no
    ``_tail_block``)."""
    log = CommitLog(directory, segment_bytes=SEG, implementation=twin, clock=fixed_clock, prefault=prefault)
    walks = [0]
    real = CommitLog._tail_block

    def tail_block(self: CommitLog, offset: int, n: int) -> Any:
        walks[0] += 1
        return real(self, offset, n)

    monkeypatch.setattr(CommitLog, "_tail_block", tail_block)
    try:
        if prefault:
            assert log.wait_prefaulted(30)

        def apply() -> int:
            end = 0
            for offset, data in blocks:
                end = (log.append_run(offset, memoryview(b"junk" + data), [4, len(data), 7]) if lone
                       else log.append_data(offset, data))
            return end

        outcome = _outcome(log, directory, apply)
    finally:
        log.close()
        monkeypatch.undo()
    try:
        reopened: Any = _reopened(directory, twin)
    except CorruptRecordError as exc:  # a corrupt record stored: the negative control's case
        reopened = str(exc)
    return (*outcome, reopened), len(blocks) - walks[0]


@pytest.mark.parametrize("prefault", [False, True], ids=["pwrite", "warm"])
@pytest.mark.parametrize("corrupt", [None, 7, 12])
def test_runs_of_one_store_and_refuse_what_append_data_does(twin: str, reference: bytes, prefault: bool,
                                                             corrupt: int | None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Live traffic: one block a read, each a run of one (past segment ends too, and a
    corrupt block), ends as append_data per block does; most take the shortcut."""
    blocks = _blocks(reference, 0, list(range(0, len(reference), 700)))
    if corrupt is not None:
        offset, data = blocks[corrupt]
        blocks[corrupt] = (offset, data[:50] + bytes(b ^ 0x41 for b in data[50:400]) + data[400:])
    with tempfile.TemporaryDirectory() as d:
        lone, shortcuts = _lone_runs(twin, reference, blocks, Path(d) / "lone", prefault, True, monkeypatch)
        each, _ = _lone_runs(twin, reference, blocks, Path(d) / "each", prefault, False, monkeypatch)
    assert lone == each
    assert isinstance(each[0], tuple) == (corrupt is not None)
    assert corrupt is None or each[0][0] == "CorruptRecordError"
    assert shortcuts > (corrupt or len(blocks)) // 2


def test_a_run_of_one_that_skipped_validation_is_seen(twin: str, reference: bytes,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a run of one taken as valid whatever it holds stores a corrupt
    block, and the comparison above sees it."""
    blocks = _blocks(reference, 0, list(range(0, SEG, 700)))
    offset, data = blocks[3]
    blocks[3] = (offset, data[:50] + bytes(b ^ 0x41 for b in data[50:400]) + data[400:])
    monkeypatch.setattr(CommitLog, "_is_bad", lambda *args: False)
    with tempfile.TemporaryDirectory() as d:
        lone, shortcuts = _lone_runs(twin, reference, blocks, Path(d) / "lone", False, True, monkeypatch)
    monkeypatch.undo()
    with tempfile.TemporaryDirectory() as d:
        each, _ = _lone_runs(twin, reference, blocks, Path(d) / "each", False, False, monkeypatch)
    assert shortcuts > 0
    assert lone != each and isinstance(each[0], tuple) and each[0][0] == "CorruptRecordError"
