"""Types of the compiled twin ``rmqha._core.ha_offsets`` (ha_offsets.pyx); the API is ha_offsets_py's.

Checked against :class:`rmqha._core._protocols.HaOffsetsTwin` by mypy.
"""
from collections.abc import Iterable
from typing import Any

from rmqha._core.ha_offsets_py import DEFAULT_MAX_BATCH as DEFAULT_MAX_BATCH
from rmqha._core.ha_offsets_py import DEFAULT_MAX_LAG_MS as DEFAULT_MAX_LAG_MS

def limit_batch(epoch_map: Any, from_offset: int, want: int, segment_end: int,
                max_batch: int = ...) -> tuple[int, int, int]: ...
def confirm_offset(master_max: int, acks: Iterable[int | None], previous: int) -> int: ...
def should_expand(ack: int, confirm: int, epoch_start: int) -> bool: ...
def should_shrink(now_ms: int, last_caught_up_ms: int, max_lag_ms: int = ...) -> bool: ...
