"""Opt-in cProfile of one window in a process started beside it (``bench_window_cpu.py``).

Only on the path of processes that ``bench_window_cpu.py --profile DIR`` starts: with
``RMQHA_PROFILE_DIR`` set, SIGUSR1 starts a profiler and SIGUSR2 stops it and dumps the
stats to ``DIR/<pid>.prof`` (so only the measured window is profiled, not start-up).
"""
from __future__ import annotations

import cProfile
import os
import signal
from types import FrameType

_DIR = os.environ.get("RMQHA_PROFILE_DIR")
_profiler: list[cProfile.Profile] = []


def _start(_sig: int, _frame: FrameType | None) -> None:
    p = cProfile.Profile()
    _profiler[:] = [p]
    p.enable()


def _stop(_sig: int, _frame: FrameType | None) -> None:
    if _profiler:
        p = _profiler.pop()
        p.disable()
        p.dump_stats(os.path.join(_DIR or ".", f"{os.getpid()}.prof"))


if _DIR:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
