"""Named crash points of a broker process, switched on by the environment.

``RMQHA_FAILPOINTS`` lists failpoint names separated by commas (for example
``RMQHA_FAILPOINTS=after_temp_meta_written``).  When the process reaches a listed point it
logs one line and ends at once with :data:`FAILPOINT_EXIT_CODE` through ``os._exit`` (no
cleanup, no buffered writes flushed by Python), which is as close to a power cut between
two steps as a test can get without a VM.  Tests use it to prove that every crash window of
the broker-id negotiation resumes to the same unique id, and that a crash at every step of
the write path (append, flush, epoch-map write, truncation) loses nothing acknowledged.
The store, HA and broker layers all call :func:`hit`, so the module sits at the root.
"""
from __future__ import annotations

import logging
import os
import sys
from enum import Enum

log = logging.getLogger(__name__)

#: Exit code of a process stopped by a failpoint (tests tell it from a real crash).
FAILPOINT_EXIT_CODE = 77

ENV_VAR = "RMQHA_FAILPOINTS"


class Failpoint(str, Enum):
    """Every crash point, in the order the broker reaches them on a first start."""

    # GetNextBrokerId answered; nothing written yet.
    AFTER_GET_NEXT_BROKER_ID = "after_get_next_broker_id"
    # The temp meta file's scratch copy is written and fsynced, not yet renamed into place.
    DURING_TEMP_META_WRITE = "during_temp_meta_write"
    # .broker.meta.temp is in place; ApplyBrokerId not sent.
    AFTER_TEMP_META_WRITTEN = "after_temp_meta_written"
    # ApplyBrokerId committed on the controller; the answer is in, .broker.meta not written.
    AFTER_APPLY_BROKER_ID = "after_apply_broker_id"
    # .broker.meta is in place; the temp file still exists.
    AFTER_META_WRITTEN = "after_meta_written"
    # The temp file is gone; RegisterBrokerToController not sent.
    AFTER_TEMP_META_REMOVED = "after_temp_meta_removed"
    # RegisterBrokerToController answered; no role taken yet.
    AFTER_REGISTER_BROKER = "after_register_broker"
    # The broker appended its new epoch entry on becoming master, before serving.
    AFTER_MASTER_EPOCH_APPENDED = "after_master_epoch_appended"
    # A send's records are in the master's commitlog; not flushed, not replicated, not acked.
    AFTER_APPEND = "after_append"
    # The commitlog fsynced up to its end; the flushed checkpoint is not written yet.
    AFTER_FLUSH = "after_flush"
    # An epoch checkpoint's new version is fsynced as a temp file, not renamed into place.
    DURING_EPOCH_MAP_WRITE = "during_epoch_map_write"
    # A slave cut its log to the point it shares with the master; its epoch map not yet.
    AFTER_TRUNCATE = "after_truncate"


def active() -> dict[str, int]:
    """The failpoints listed in the environment: name -> the hit that crashes (``name@n``
    crashes on the n-th time the point is reached; plain ``name`` on the first).  Unknown
    names are kept, and warned about."""
    raw = os.environ.get(ENV_VAR, "")
    out: dict[str, int] = {}
    for item in (n.strip() for n in raw.split(",")):
        if not item:
            continue
        name, _, count = item.partition("@")
        out[name] = int(count) if count.isdigit() and int(count) > 0 else 1
    known = {f.value for f in Failpoint}
    for name in sorted(set(out) - known):
        log.warning("unknown failpoint %r in %s (known: %s)", name, ENV_VAR, ", ".join(sorted(known)))
    return out


_ACTIVE: dict[str, int] | None = None
_HITS: dict[str, int] = {}


def hit(point: Failpoint) -> None:
    """Crash the process here if ``point`` is listed in ``RMQHA_FAILPOINTS`` (and this is
    the hit it names)."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = active()
    if not _ACTIVE or point.value not in _ACTIVE:
        return
    n = _HITS[point.value] = _HITS.get(point.value, 0) + 1
    if n == _ACTIVE[point.value]:
        msg = f"failpoint {point.value} hit: exiting with code {FAILPOINT_EXIT_CODE}"
        log.critical(msg)
        # Log handlers may buffer; the line is what tests grep for, so write it directly.
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
        os._exit(FAILPOINT_EXIT_CODE)


def reset() -> None:
    """Re-read the environment on the next :func:`hit` (for in-process tests)."""
    global _ACTIVE
    _ACTIVE = None
    _HITS.clear()
