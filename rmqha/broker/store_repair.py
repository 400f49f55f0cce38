"""What a broker does to a store damaged at rest, apart from the broker's wiring.

Two repairs, both for a broker that can fetch its log again from its master: a slave whose
log holds records that failed their check cuts it at the first one (the HA link fetches
the rest again), and a store missing a segment file is moved aside whole when
``rebuild_store_from_master`` asks for it (the identity file stays, so the broker keeps
its id).  Neither is ever done to a master: it has no one to fetch from.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from rmqha.broker.confirm_checkpoint import FILE_NAME as CONFIRM_FILE
from rmqha.messaging.service import CONSUME_QUEUE_DIR
from rmqha.store import CommitLog
from rmqha.store.epoch_map import EpochMap

log = logging.getLogger("rmqha.broker.broker")

#: The commitlog's directory and the epoch file, under a broker's store directory.
COMMITLOG_DIR = "commitlog"
EPOCH_FILE = "epochFileCheckpoint"


def cut_at_first_bad_record(commitlog: CommitLog, epoch_map: EpochMap) -> int | None:
    """Cut the log (and its epoch map) at the first record that failed its check, durably;
    the offset cut at, or None when every checked record is whole."""
    bad = commitlog.first_corrupt_offset()
    if bad is None:
        return None
    before = int(commitlog.max_offset)
    log.warning("cutting the log at %d, the first record that failed its check (%d bytes "
                "dropped); the master sends them again", bad, before - bad)
    commitlog.truncate(bad)
    epoch_map.truncate_suffix(bad)
    commitlog.flush()
    return bad


def move_store_aside(store_dir: Path, why: str) -> Path:
    """Move the log, its epoch map, confirm offset and consume queues (not the identity)
    into ``aside-<time>/`` with a WHY file; the broker then starts on an empty store."""
    aside = store_dir / f"aside-{time.strftime('%Y%m%dT%H%M%S')}"
    aside.mkdir()
    for name in (COMMITLOG_DIR, EPOCH_FILE, EPOCH_FILE + ".bak", CONFIRM_FILE, CONSUME_QUEUE_DIR):
        if (store_dir / name).exists():
            os.replace(store_dir / name, aside / name)
    (aside / "WHY").write_text(why + "\n", encoding="utf-8")
    return aside
