"""The storage layer: the commitlog and the epoch map, each in its own module.

- :mod:`rmqha.store.commitlog`: :class:`CommitLog` (mmap-ed segments, group commit, crash
  recovery, the slave's receive path) and its decoded :class:`StoredMessage`;
- :mod:`rmqha.store.epoch_map`: :class:`EpochMap` and RocketMQ's ``epochFileCheckpoint``.

The hot loops behind both are the twins in :mod:`rmqha._core`.
"""
from __future__ import annotations

from rmqha.store.commitlog import BatchAppendResult, CommitLog, FlushMode, StoredMessage
from rmqha.store.epoch_map import EpochMap

__all__ = ["BatchAppendResult", "CommitLog", "EpochMap", "FlushMode", "StoredMessage"]
