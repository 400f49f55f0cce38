"""An HA slave whose disk is full (:class:`DiskFullWatch`): said once, reported, left by itself.

The store refuses the master's bytes when its filesystem has no room (DiskFullError, or
ENOSPC / EDQUOT under an epoch checkpoint write); the session ends, and every new one would
be refused the same way until an operator frees space.  So while the disk is full:

* the slave reconnects with an exponential backoff (``ha_reconnect_min_ms`` doubling up to
  ``ha_reconnect_max_ms``) however far each session got, instead of at once;
* one WARNING says the state began (where and why), one INFO that it ended (the log grew
  past where it was refused: space is back), nothing in between but DEBUG lines;
* ``status()`` and the broker's metrics report it (``disk_full``, since when, how many
  sessions were refused).
"""
from __future__ import annotations

import errno
import logging
import time
from typing import Any

from rmqha.errors import DiskFullError

# The slave side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.slave")

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says the filesystem is full."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, DiskFullError):
            return True
        if isinstance(cur, OSError) and cur.errno in _NO_SPACE:
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class DiskFullWatch:
    """Whether this slave's store is refusing the master's bytes for want of space."""

    __slots__ = ("broker_id", "active", "since", "refusals", "at_offset", "episodes")

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.active = False
        #: time.monotonic() when the disk was found full (0: not full).
        self.since = 0.0
        #: Sessions refused in this episode.
        self.refusals = 0
        #: The log's max offset when the disk was found full: growing past it is recovery.
        self.at_offset = -1
        #: Times the disk was found full since the slave started.
        self.episodes = 0

    def refused(self, exc: BaseException, max_offset: int, master: str) -> None:
        """A session ended because the store had no room."""
        self.refusals += 1
        if self.active:
            log.debug("HA slave %d: disk still full (%d sessions refused): %s", self.broker_id,
                      self.refusals, exc)
            return
        self.active = True
        self.since = time.monotonic()
        self.at_offset = max_offset
        self.episodes += 1
        log.warning("HA slave %d: disk full at offset %d, replication from %s stops until space is "
                    "freed (retrying with backoff, logged again once it recovers): %s",
                    self.broker_id, max_offset, master, exc)

    def stored(self, max_offset: int) -> None:
        """The log now ends at ``max_offset``: past the refusal, space is back."""
        if not self.active or max_offset <= self.at_offset:
            return
        log.info("HA slave %d: disk space is back after %.1f s (%d sessions refused); replicating "
                 "again from offset %d", self.broker_id, time.monotonic() - self.since,
                 self.refusals, self.at_offset)
        self.active = False
        self.since = 0.0
        self.refusals = 0
        self.at_offset = -1

    def status(self) -> dict[str, Any]:
        """The ``disk_full*`` fields of the slave's ``ha-status``."""
        return {
            "disk_full": self.active,
            "disk_full_ms": int((time.monotonic() - self.since) * 1000) if self.active else None,
            "disk_full_refusals": self.refusals,
        }
