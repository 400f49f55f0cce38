"""The queue-offset table: the next queue offset of every (topic, queue id), the table's
base in ``queue_offsets.json`` (what deleted segments held, and where the log's start was
moved by retention or ``reset``), and its snapshot in ``queue_offsets.snapshot`` (the
whole table at a flushed record boundary, so opening the log scans only what follows it
instead of every segment)."""
from __future__ import annotations

import json
import logging
import os

from rmqha.errors import MissingSegmentError
from rmqha.store.segments import fsync_dir, segment_path, sidecar_path

log = logging.getLogger(__name__)

#: Sidecars of the commitlog directory (:func:`rmqha.store.segments.sidecar_path`).
QUEUE_BASE_FILE = "queue_offsets.json"
QUEUE_SNAPSHOT_FILE = "queue_offsets.snapshot"

QueueKey = tuple[bytes, int]


class QueueOffsets:
    """``next[(topic bytes, queue id)]`` is the queue offset the next record there gets.

    The writer's hot path holds a reference to ``next``: it is changed in place, never
    replaced.  ``base`` is the table at the log's start (records of deleted segments).
    """

    def __init__(self, directory: str) -> None:
        self._dir = directory
        self.next: dict[QueueKey, int] = {}
        self.base: dict[QueueKey, int] = {}

    @property
    def _path(self) -> str:
        return sidecar_path(self._dir, QUEUE_BASE_FILE)

    def replace(self, table: dict[QueueKey, int]) -> None:
        self.next.clear()
        self.next.update(table)

    def clear(self) -> None:
        """An empty log (``reset``): no queue has records yet."""
        self.base = {}
        self.next.clear()

    def forget(self, dropped: dict[QueueKey, int]) -> None:
        """Records were truncated: ``dropped`` holds the lowest dropped queue offset of
        each queue, which becomes that queue's next offset."""
        table = self.next
        for key, q in dropped.items():
            if q < table.get(key, 0):
                if q:
                    table[key] = q
                else:
                    table.pop(key, None)

    def save_base(self, valid_at: int) -> None:
        """Write ``base`` as the table at log offset ``valid_at`` (fsynced, atomically)."""
        path = self._path
        doc = {"valid_at": valid_at,
               "queues": [[t.decode("latin-1"), q, n] for (t, q), n in self.base.items()]}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))

    def save_snapshot(self, valid_at: int, table: dict[QueueKey, int], since: int) -> None:
        """Write ``table`` as the whole table at log offset ``valid_at``, a record boundary
        below which the log is flushed; ``since`` is an earlier record boundary (the
        previous snapshot's), from which opening the log checks that records still tile up
        to ``valid_at``.  fsynced, atomically: a crash leaves the old one or the new one."""
        path = sidecar_path(self._dir, QUEUE_SNAPSHOT_FILE)
        doc = {"valid_at": valid_at, "since": since,
               "queues": [[t.decode("latin-1"), q, n] for (t, q), n in table.items()]}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, separators=(",", ":"))
            fh.flush()
            os.fdatasync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))  # the rename itself, or a power loss brings the old table back

    def load_snapshot(self) -> tuple[int, int, dict[QueueKey, int]] | None:
        """(valid_at, since, table) of the last snapshot; None when there is none or it is
        unreadable (then the log is scanned from its start)."""
        path = sidecar_path(self._dir, QUEUE_SNAPSHOT_FILE)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            valid_at = int(doc["valid_at"])
            since = min(int(doc.get("since", 0)), valid_at)
            table = {(t.encode("latin-1"), int(q)): int(n) for t, q, n in doc["queues"]}
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s is unreadable (%s): the queue offsets are rebuilt from the whole "
                        "log", path, exc)
            return None
        return valid_at, since, table

    def check_first_segment(self, first_base: int) -> None:
        """A log may start past 0 only where retention or ``reset`` moved its start, and
        both record that start in ``queue_offsets.json`` first; anything else is a first
        segment gone missing (a slave would then claim bytes it does not hold)."""
        if first_base == 0:
            return
        try:
            with open(self._path, encoding="utf-8") as fh:
                recorded = int(json.load(fh)["valid_at"])
        except FileNotFoundError:
            recorded = 0
        except (ValueError, KeyError, TypeError):
            return  # unreadable: load_base says so; the segments are the evidence left
        if recorded < first_base:
            raise MissingSegmentError(
                f"commitlog segment {segment_path(self._dir, recorded)} is missing: the log "
                f"starts at {segment_path(self._dir, first_base)} but the store records its "
                f"start at {recorded} ({QUEUE_BASE_FILE}); restore the file, or let the broker "
                f"rebuild this store from its master (rebuild_store_from_master)")

    def load_base(self, first_base: int) -> None:
        """Read ``base`` back for a log whose first segment starts at ``first_base``."""
        path = self._path
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            if doc["valid_at"] < first_base:
                # Segments went missing without being recorded (deleted by hand?): the table
                # is still the best lower bound for queues that lived only in them.
                log.warning("%s describes the log before %s, but the log starts at %d",
                            path, doc["valid_at"], first_base)
            # Records still present (valid_at > first_base after a crash mid-delete) are
            # scanned again on top and only raise the values.
            self.base = {(t.encode("latin-1"), int(q)): int(n) for t, q, n in doc["queues"]}
        except FileNotFoundError:
            self.base = {}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s is unreadable (%s): queue offsets restart from the log", path, exc)
            self.base = {}
