"""Pure-Python twin of batch limiting and the confirm offset (hot paths; ARCHITECTURE.md lists them).

This module owns the small exact rules the HA master applies per transfer and per ack; the
compiled twin ``rmqha._core.ha_offsets`` has the same API and results.

Decisions on RocketMQ's AutoSwitch HA behaviour (its issues #6662 and #6728):
  * ``limit_batch`` never lets a batch cross the end of the epoch ``from_offset`` is in, the
    segment end, ``want`` or ``max_batch``.  The newest epoch is open-ended (RocketMQ uses -1
    for its end), so only ``want`` bounds it.  Unlike RocketMQ, the returned epoch is the one
    the batch belongs to (RocketMQ labelled the last chunk of an old epoch with the next one).
  * ``confirm_offset``: an ack of ``None`` or any negative value means "that SyncStateSet
    member has no live connection, or has not reported yet"; it freezes the confirm offset
    (returns ``previous``), as #6662 demands.  RocketMQ's #6728 instead *ignored* acks <= 0,
    which lets the confirm offset pass a member that holds nothing; here a 0 ack is a real
    ack (that member has an empty log) and takes part in the minimum.
"""
from __future__ import annotations

from typing import Any, Iterable

from rmqha.errors import EpochError

#: RocketMQ's haTransferBatchSize default.
DEFAULT_MAX_BATCH = 32 * 1024
#: ha_max_time_slave_not_catchup_ms default.
DEFAULT_MAX_LAG_MS = 15000


def _epoch_of(epoch_map: Any, from_offset: int) -> tuple[int, int, int]:
    """(epoch, start, end) holding from_offset; end -1 for the open-ended newest epoch."""
    lock = getattr(epoch_map, "_lock", None)
    if lock is not None:
        # The public EpochMap's lock (re-entrant) makes the two lookups one consistent read.
        with lock:
            return _epoch_of_unlocked(epoch_map, from_offset)
    return _epoch_of_unlocked(epoch_map, from_offset)


def _epoch_of_unlocked(epoch_map: Any, from_offset: int) -> tuple[int, int, int]:
    last = epoch_map.last_entry()
    if last is None:
        raise EpochError(f"no epoch holds offset {from_offset}: the epoch map is empty")
    if from_offset >= last[1]:
        return last[0], last[1], -1
    entry = epoch_map.entry_for_offset(from_offset)
    if entry is None:
        first = epoch_map.first_entry()
        raise EpochError(
            f"no epoch holds offset {from_offset}: the first epoch {first[0]} starts at {first[1]}"
        )
    return entry


def limit_batch(
    epoch_map: Any, from_offset: int, want: int, segment_end: int, max_batch: int = DEFAULT_MAX_BATCH
) -> tuple[int, int, int]:
    """(epoch, epoch_start, size) of the next transfer batch starting at ``from_offset``."""
    if from_offset < 0:
        raise ValueError(f"from_offset {from_offset} is negative")
    if want < 0:
        raise ValueError(f"want {want} is negative")
    if max_batch <= 0:
        raise ValueError(f"max_batch {max_batch} must be positive")
    if segment_end < from_offset:
        raise ValueError(f"segment_end {segment_end} is before from_offset {from_offset}")
    epoch, start, end = _epoch_of(epoch_map, from_offset)
    size = min(want, max_batch, segment_end - from_offset)
    if end >= 0 and end - from_offset < size:
        size = end - from_offset
    return epoch, start, size


def confirm_offset(master_max: int, acks: Iterable[int | None], previous: int) -> int:
    """min(master_max, acks) over the other SyncStateSet members; ``previous`` if one is absent."""
    c = master_max
    for a in acks:
        if a is None or a < 0:
            return previous
        if a < c:
            c = a
    return c


def should_expand(ack: int, confirm: int, epoch_start: int) -> bool:
    """A slave joins the SyncStateSet once its ack reached the confirm offset and the epoch start."""
    return ack >= 0 and ack >= confirm and ack >= epoch_start


def should_shrink(now_ms: int, last_caught_up_ms: int, max_lag_ms: int = DEFAULT_MAX_LAG_MS) -> bool:
    """A slave leaves the SyncStateSet when it has not caught up for more than ``max_lag_ms``."""
    return now_ms - last_caught_up_ms > max_lag_ms
