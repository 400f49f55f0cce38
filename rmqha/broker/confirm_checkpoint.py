"""The broker's last known confirm offset, kept in ``store_dir/confirmOffset``.

Consumers read only up to the confirm offset: the point every SyncStateSet member holds,
which no later election can cut (RocketMQ keeps the same value in its store checkpoint).
A broker that is neither running an HA master nor an HA slave (fenced at start-up, or
between the two while it steps down) cannot compute it, so it serves up to the last value
it learned and no further; this file carries that value across restarts, so a restarted
broker serves what was confirmed before it went down without waiting for its new role.

A stale value is safe (it is only lower than the truth); a value past the log's end (data
lost in a crash before it was flushed) is capped at the log's end by the reader.  The file
is one line of ASCII digits, replaced atomically, written at most every
``interval_s`` while the offset moves (not fsynced: an older value is safe), and durably on
close and on a cut: after a power loss, a value from before a cut would call confirmed the
bytes the cut removed and that the log later took again from another master.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from rmqha.broker.identity import fsync_dir

log = logging.getLogger(__name__)

FILE_NAME = "confirmOffset"


class ConfirmCheckpoint:
    """Monotonic confirm offset learned from replication, persisted lazily."""

    def __init__(self, store_dir: Path, *, interval_s: float = 1.0) -> None:
        self.path = Path(store_dir) / FILE_NAME
        self._interval_s = interval_s
        self._offset = self._read()
        self._written = self._offset
        self._written_at = 0.0

    @property
    def offset(self) -> int:
        return self._offset

    def _read(self) -> int:
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("confirm offset file %s unreadable (%s): serving from offset 0 until "
                        "the role is known", self.path, exc)
            return 0
        if not text.isdigit():
            log.warning("confirm offset file %s holds %r, not an offset: serving from offset 0 "
                        "until the role is known", self.path, text[:40])
            return 0
        return int(text)

    def learned(self, offset: int) -> None:
        """Replication confirmed ``offset``: remember it (never moves back)."""
        if offset <= self._offset:
            return
        self._offset = offset
        now = time.monotonic()
        if now - self._written_at >= self._interval_s:
            self._write(now)

    def cut(self, offset: int) -> None:
        """The log was truncated at ``offset``: nothing past it can be confirmed here."""
        if offset < self._offset:
            log.warning("log cut at %d, below the confirm offset %d (a repair, or an unclean election)",
                        offset, self._offset)
            self._offset = offset
            self._write(time.monotonic(), durable=True)

    def flush(self) -> None:
        """Write the offset durably (on close: a clean stop leaves nothing unsynced)."""
        if self._offset != self._written:
            self._write(time.monotonic(), durable=True)

    def _write(self, now: float, *, durable: bool = False) -> None:
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        try:
            with open(tmp, "w", encoding="ascii") as fh:
                fh.write(f"{self._offset}\n")
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            if durable:
                fsync_dir(self.path.parent)
        except OSError as exc:
            # Only an availability aid: a lost write leaves an older, still-safe value.
            log.warning("could not write %s: %s", self.path, exc)
            return
        self._written = self._offset
        self._written_at = now
