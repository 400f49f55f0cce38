"""Cutting an HA slave's log to what its master holds (:class:`Truncator`).

At every handshake the slave finds the consistent point of its epoch entries with the
master's (:meth:`EpochMap.find_consistent_point`) and cuts its commitlog and epoch map there,
flushed, so a crash after the cut cannot bring the tail back (RocketMQ #10666).  A log with
data but no epoch entries shares nothing provable with the master (RocketMQ skipped
truncation here) and is dropped whole, as is one whose consistent point is below its min
offset.  Epoch entries that start at the cut hold no data: those the master does not have
are dropped so the master's next epoch can be recorded.

Also here, as the other ways a slave's log starts over: a restart beyond the log's end
(retention on the master removed the bytes in between) and an empty log started where the
master says (its min offset or its last segment).  Every cut lowers the confirm offset
learnt from the master and tells ``on_truncate``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rmqha.errors import ReplicationError
from rmqha.failpoints import Failpoint, hit
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress

# The slave side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.slave")


class Truncator:
    """The cuts of one slave's commitlog and epoch map."""

    def __init__(self, commitlog: ReplicatedLog, epoch_map: Any, broker_id: int, progress: SlaveProgress,
                 confirm: ConfirmTracker, on_truncate: Callable[[int], Any] | None) -> None:
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.broker_id = broker_id
        self._progress = progress
        self._confirm = confirm
        self._on_truncate = on_truncate

    def to_consistent_point(self, remote: list[tuple[int, int, int]], master: str) -> int:
        """Cut this log at the consistent point with ``remote`` (the master's epoch
        entries); the offset to receive from (0: an empty log, the master picks)."""
        cl = self.commitlog
        em = self.epoch_map
        local_max = cl.max_offset
        local_min = cl.min_offset
        if local_max <= local_min:
            if len(em):
                em.clear()  # entries describing no bytes would only confuse the next check
            self._confirm.lower(local_max)
            # 0 = "empty": the master picks its min offset or its last segment's start.
            return 0 if local_max == 0 else local_max
        point = self._consistent_point(remote, local_max)
        if point < 0 or point < local_min:
            dropped = local_max - local_min
            log.warning("HA slave %d shares no history with master %s: dropping its whole log "
                        "(%d bytes, offsets %d..%d)", self.broker_id, master, dropped, local_min, local_max)
            start = self.drop_log()
            self._progress.bytes_dropped += dropped
            self._after(start)
            return start
        if point < local_max:
            log.warning("HA slave %d truncating at %d: dropping %d bytes the master %s does not have "
                        "(local max %d)", self.broker_id, point, local_max - point, master, local_max)
            cl.truncate(point)
            hit(Failpoint.AFTER_TRUNCATE)
            em.truncate_suffix(point)
            cl.flush()
            self._progress.bytes_dropped += local_max - point
            self._after(point)
        else:
            self._drop_empty_epochs(remote, point)
        return point

    def _consistent_point(self, remote: list[tuple[int, int, int]], local_max: int) -> int:
        em = self.epoch_map
        if len(em) == 0:
            # Data but no epochs: nothing proves any byte matches the master.
            return -1
        em.set_max_offset(local_max)
        point = int(em.find_consistent_point(remote))
        em.set_max_offset(None)
        return point

    def _drop_empty_epochs(self, remote: list[tuple[int, int, int]], point: int) -> None:
        """Epochs that start at the cut hold no data; drop those the master does not have
        (same epoch, same start) so the master's next epoch can be recorded."""
        em = self.epoch_map
        shared = {(e, s) for e, s, _ in remote}
        last = em.last_entry()
        while last is not None and last[1] >= point and (last[0], last[1]) not in shared:
            em.truncate_suffix_by_epoch(last[0])
            last = em.last_entry()

    def drop_log(self, start: int = 0) -> int:
        """Empty the log (and the epoch map), to start over at ``start`` (segment-aligned;
        0 = "empty": the master then picks where); returns where the empty log starts."""
        cl = self.commitlog
        self.epoch_map.clear()
        cl.truncate(cl.min_offset)
        reset = getattr(cl, "reset", None)
        if reset is not None and cl.max_offset != start:
            reset(start)
        cl.flush()
        return int(cl.max_offset)

    def restart_at(self, offset: int, master: str) -> None:
        """The master's log starts at ``offset``, beyond this log's end: drop this log and
        start over there."""
        cl = self.commitlog
        local_min, local_max = cl.min_offset, cl.max_offset
        dropped = local_max - local_min
        log.warning(
            "HA slave %d: master %s starts its log at %d, beyond this log's end %d (retention "
            "removed the bytes in between): dropping the whole log (%d bytes, offsets %d..%d) "
            "and restarting at %d", self.broker_id, master, offset, local_max, dropped,
            local_min, local_max, offset,
        )
        self.drop_log(offset)
        self._progress.bytes_dropped += dropped
        self._after(local_min)

    def rebase(self, offset: int) -> None:
        """Start this empty log at the master's ``offset``."""
        reset = getattr(self.commitlog, "reset", None)
        if reset is None:
            raise ReplicationError(f"this commitlog cannot start an empty log at {offset}")
        reset(offset)
        log.info("HA slave %d starts its empty log at the master's offset %d", self.broker_id, offset)

    def _after(self, offset: int) -> None:
        self._progress.last_truncate = offset
        self._confirm.lower(offset)
        if self._on_truncate is not None:
            self._on_truncate(offset)
