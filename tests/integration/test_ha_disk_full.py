"""A slave whose disk fills up: it says so once, backs off, reports it, and rejoins by itself.

The slave's store sits on a small tmpfs (root only; grown later, as an operator freeing
space would), or its commitlog is told there is no room beyond an offset (the same
DiskFullError the store raises when its filesystem refuses blocks; lifted later).  The
master, the sockets and both stores are real.  Before this behaviour the slave reconnected
every ``ha_reconnect_min_ms`` and logged a WARNING each time; the negative control runs the
scenario with the disk-full handling switched off and shows the checks catch that.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tmpfs import grow, tmpfs

from rmqha.broker.metrics import slave_disk_full
from rmqha.errors import DiskFullError
from rmqha.ha import slave as slave_mod
from rmqha.ha.disk_full import is_disk_full
from rmqha.testing.ha import (
    assert_same_log,
    fast_config,
    fill,
    ha_master,
    ha_slave,
    master_running,
    open_store,
    slave_running,
    wait_until_async,
)

SEG = 256 << 10
MASTER_BYTES = 1_500_000
#: How long the tests watch a slave with a full disk.
FULL_FOR_S = 2.5
RECONNECT_MIN_MS = 20
RECONNECT_MAX_MS = 400
CFG = fast_config(ha_housekeeping_interval_ms=2000, ha_reconnect_min_ms=RECONNECT_MIN_MS,
                  ha_reconnect_max_ms=RECONNECT_MAX_MS)
#: Sessions a backing-off slave can start in FULL_FOR_S (20, 40, ... 400 ms, then 400 ms
#: each: about ten), with room for slow machines; one that retries every 20 ms starts ~100.
MAX_SESSIONS = 20


@contextmanager
def _tmpfs_store(tmp_path: Path) -> Iterator[tuple[object, object, Callable[[], None]]]:
    """The slave's store on a 600 KiB tmpfs; the callable grows it."""
    with tmpfs(tmp_path / "fs", "600k") as fs:
        cl, em = open_store(str(fs / "s"), SEG, prefault_window_bytes=16 << 10)
        try:
            yield cl, em, lambda: grow(fs, "16m")
        finally:
            cl.close()


@contextmanager
def _quota_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 ) -> Iterator[tuple[object, object, Callable[[], None]]]:
    """The slave's store refuses blocks beyond 600 KB, as a full filesystem does (the
    commitlog reserves a block's space before a byte of it is written); the callable lifts it."""
    cl, em = open_store(str(tmp_path / "s"), SEG)
    room = {"limit": 600_000}
    reserve = cl._allocate

    def allocate(seg, upto: int) -> None:
        limit = room["limit"]
        if limit is not None and seg.base + upto > limit:
            raise DiskFullError(f"commitlog {tmp_path}: no disk space for offsets up to "
                                f"{seg.base + upto} (No space left on device)")
        reserve(seg, upto)

    monkeypatch.setattr(cl, "_allocate", allocate)
    try:
        yield cl, em, lambda: room.update(limit=None)
    finally:
        cl.close()


def _slave_log(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rmqha.ha.slave" and r.levelno == level]


@dataclass
class Seen:
    """What one run of the scenario measured."""

    sessions_while_full: int = 0
    full_status: dict[str, Any] = field(default_factory=dict)
    full_metric: float = -1.0
    after_status: dict[str, Any] = field(default_factory=dict)
    after_metric: float = -1.0
    catch_up_s: float = -1.0


async def _disk_full_scenario(tmp_path: Path, store) -> Seen:
    """The master holds more than the slave's disk; the slave fills it, is watched for
    FULL_FOR_S, then space is freed and it must catch up by itself."""
    seen = Seen()
    mcl, mem = open_store(str(tmp_path / "m"), SEG)
    try:
        mem.append(1, 0)
        fill(mcl, MASTER_BYTES)
        with store as (scl, sem, free_space):
            m = ha_master(mcl, mem, CFG)
            async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, CFG)) as s:
                await wait_until_async(lambda: "No space left on device" in s.last_error, 20, "the disk to fill")
                sessions, full_at = s.sessions, scl.max_offset
                await asyncio.sleep(FULL_FOR_S)  # watching the retries: a time window, not a wait
                seen.sessions_while_full = s.sessions - sessions
                seen.full_status = s.status()
                seen.full_metric = slave_disk_full(SimpleNamespace(ha_slave=s))
                assert scl.max_offset == full_at < mcl.max_offset, (scl.max_offset, full_at, mcl.max_offset)
                free_space()
                started = time.monotonic()
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 20, "catch-up once space is back")
                seen.catch_up_s = time.monotonic() - started
                seen.after_status = s.status()
                seen.after_metric = slave_disk_full(SimpleNamespace(ha_slave=s))
            assert_same_log(mcl, scl)
    finally:
        mcl.close()
    return seen


@pytest.mark.parametrize("how", ["tmpfs", "quota"])
def test_full_disk_is_logged_once_backed_off_reported_and_left_by_itself(
        tmp_path, caplog, monkeypatch, how: str) -> None:
    store = _tmpfs_store(tmp_path) if how == "tmpfs" else _quota_store(tmp_path, monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="rmqha.ha.slave"):
        seen = asyncio.run(_disk_full_scenario(tmp_path, store))
    # Backed off: a handful of sessions in the window, not one every RECONNECT_MIN_MS.
    assert seen.sessions_while_full <= MAX_SESSIONS, seen
    # Reported while full, in ha-status and the metrics.
    st = seen.full_status
    assert st["disk_full"] is True and st["disk_full_refusals"] >= 2, st
    assert st["disk_full_ms"] >= FULL_FOR_S * 1000 * 0.9, st
    assert "No space left on device" in st["last_error"], st
    assert seen.full_metric == 1.0, seen
    # Left by itself once space came back, within a backoff or so.
    assert seen.catch_up_s < RECONNECT_MAX_MS / 1000 + 10, seen
    assert seen.after_status["disk_full"] is False and seen.after_status["disk_full_refusals"] == 0, seen
    assert seen.after_metric == 0.0, seen
    # One WARNING for the whole episode, one INFO for its end.
    warnings = _slave_log(caplog, logging.WARNING)
    assert len(warnings) == 1 and "disk full at offset" in warnings[0], warnings
    backs = [m for m in _slave_log(caplog, logging.INFO) if "disk space is back" in m]
    assert len(backs) == 1, backs


def test_negative_control_without_the_handling_the_checks_fire(tmp_path, caplog, monkeypatch) -> None:
    """The old behaviour (a full disk is one more link error: a WARNING per session, and the
    backoff reset since each session got as far as the transfer): the checks above fail."""
    monkeypatch.setattr(slave_mod, "is_disk_full", lambda exc: False)
    with caplog.at_level(logging.INFO, logger="rmqha.ha.slave"):
        seen = asyncio.run(_disk_full_scenario(tmp_path, _quota_store(tmp_path, monkeypatch)))
    assert seen.sessions_while_full > MAX_SESSIONS
    assert len(_slave_log(caplog, logging.WARNING)) > MAX_SESSIONS
    assert seen.full_status["disk_full"] is False and seen.full_metric == 0.0


def test_what_counts_as_a_full_disk() -> None:
    assert is_disk_full(DiskFullError("no room"))
    assert is_disk_full(OSError(28, "No space left on device"))
    try:
        try:
            raise OSError(122, "Disk quota exceeded")
        except OSError as exc:
            raise RuntimeError("could not write epoch checkpoint") from exc
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(5, "Input/output error"))
    assert not is_disk_full(ConnectionResetError(104, "reset"))
