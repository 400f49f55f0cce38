"""The storage layer: the commitlog, the epoch map and the indexes built from the log.

- :mod:`rmqha.store.commitlog`: :class:`CommitLog`, the writer's side (appends, reads,
  truncation, retention, reset), with its collaborators one module each:
  :mod:`~rmqha.store.segments` (sparse segment files, the pre-fault window),
  :mod:`~rmqha.store.flusher` (group commit), :mod:`~rmqha.store.checkpoint`,
  :mod:`~rmqha.store.recovery` (open, verify, cut), :mod:`~rmqha.store.receive` (the
  slave's receive path), :mod:`~rmqha.store.queue_offsets` and
  :mod:`~rmqha.store.message` (:class:`StoredMessage`);
- :mod:`rmqha.store.epoch_map`: :class:`EpochMap` and RocketMQ's ``epochFileCheckpoint``;
- :mod:`rmqha.store.consume_queue` (the consume queues, in RocketMQ's ConsumeQueue files:
  :mod:`~rmqha.store.consume_queue_file`) and :mod:`rmqha.store.message_index` (keys and
  unique ids), both fed by dispatching the log and recovered from their checkpoints;
- :mod:`rmqha.store.scrub` (record checks at rest), :mod:`rmqha.store.disk_usage`.

The hot loops behind both are the twins in :mod:`rmqha._core`.
"""
from __future__ import annotations

from rmqha.store.commitlog import BatchAppendResult, CommitLog, FlushMode, StoredMessage
from rmqha.store.epoch_map import EpochMap

__all__ = ["BatchAppendResult", "CommitLog", "EpochMap", "FlushMode", "StoredMessage"]
