"""The public storage API: the commitlog, its decoded messages, and the epoch map.

``CommitLog`` and ``StoredMessage`` live in :mod:`rmqha.commitlog`; ``EpochMap`` lives in
:mod:`rmqha.epoch_map` and is imported on first use, so this module imports on its own.
"""
from __future__ import annotations

from typing import Any

from rmqha.commitlog import BatchAppendResult, CommitLog, FlushMode, StoredMessage

__all__ = ["BatchAppendResult", "CommitLog", "EpochMap", "FlushMode", "StoredMessage"]


def __getattr__(name: str) -> Any:
    if name == "EpochMap":
        from rmqha.epoch_map import EpochMap

        globals()["EpochMap"] = EpochMap
        return EpochMap
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
