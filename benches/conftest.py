"""Shared benchmark settings: quick mode for CI-sized runs."""
from __future__ import annotations

import os

#: RMQHA_BENCH_QUICK=1 shrinks long benchmarks (cluster paths) to CI size.
QUICK: bool = os.environ.get("RMQHA_BENCH_QUICK", "") not in ("", "0")
