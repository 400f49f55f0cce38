"""Batch limiting, confirm offset and SyncStateSet rules of the HA master (``rmqha.ha.offsets``).

This module owns the public names of the HA master's two hot paths; the rules and their decisions on
RocketMQ's behaviour are documented in ``rmqha._core.ha_offsets_py``, and the compiled twin
``rmqha._core.ha_offsets`` is used when it imports.

* ``limit_batch(epoch_map, from_offset, want, segment_end, max_batch=32768) -> (epoch, epoch_start, size)``
  accepts the public :class:`rmqha.store.epoch_map.EpochMap` of either twin (or a bare core).
* ``confirm_offset(master_max, acks, previous)``: ``acks`` are the ack offsets of the other
  SyncStateSet members; ``None`` or a negative value marks a member without a live
  connection (or that has not reported yet) and freezes the result at ``previous``.
* ``should_expand(ack, confirm, epoch_start)``, ``should_shrink(now_ms, last_caught_up_ms, max_lag_ms=15000)``.
"""
from __future__ import annotations

from rmqha import _core
from rmqha._core._protocols import HaOffsetsTwin

_impl: HaOffsetsTwin = _core.load("ha_offsets")

DEFAULT_MAX_BATCH: int = _impl.DEFAULT_MAX_BATCH
DEFAULT_MAX_LAG_MS: int = _impl.DEFAULT_MAX_LAG_MS
limit_batch = _impl.limit_batch
confirm_offset = _impl.confirm_offset
should_expand = _impl.should_expand
should_shrink = _impl.should_shrink

__all__ = [
    "DEFAULT_MAX_BATCH", "DEFAULT_MAX_LAG_MS", "confirm_offset", "limit_batch", "should_expand",
    "should_shrink",
]
