"""Epoch entries an HA slave learns from blocks (:class:`EpochWriter`), written off the
transfer path.

A block whose epoch is newer than the log's last opens an entry.  Its fsync takes several
ms, so a worker thread writes the entries, in order, while blocks keep arriving; every ack
first waits for them (:meth:`EpochWriter.settle`), so no offset is acknowledged under an
epoch not yet on disk.  After a failed entry none of the later ones is written.  While
entries are queued, the newest queued one is the log's last epoch for the checks of the
next blocks.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import CancelledError as JobCancelled
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rmqha.errors import EpochError, StoreError
from rmqha.ha.disk_full import is_disk_full

# The slave side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.slave")


class EpochWriter:
    """Queued epoch entries of one slave and the worker that writes them."""

    def __init__(self, epoch_map: Any, broker_id: int) -> None:
        self.epoch_map = epoch_map
        self.broker_id = broker_id
        #: Entries being written by the worker, in order: ((epoch, start), future).
        self._jobs: list[tuple[tuple[int, int], Future[None]]] = []
        self._worker: ThreadPoolExecutor | None = None
        self._failed: BaseException | None = None

    @property
    def pending(self) -> bool:
        """Whether entries are still being written (an ack must wait for them)."""
        return bool(self._jobs)

    def persist(self, epoch: int, start: int) -> None:
        """Queue the entry (epoch, start) for the worker."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ha-epoch")
        self._jobs.append(((epoch, start), self._worker.submit(self._append, epoch, start)))

    def _append(self, epoch: int, start: int) -> None:
        # Runs on the worker: after a failed entry none of the later ones may be written.
        if self._failed is not None:
            raise self._failed
        try:
            self.epoch_map.append(epoch, start)
        except BaseException as exc:
            self._failed = exc
            raise

    def last_entry(self) -> tuple[int, int] | None:
        if self._jobs:
            return self._jobs[-1][0]
        last = self.epoch_map.last_entry()
        return None if last is None else (last[0], last[1])

    def last_epoch(self) -> int:
        if self._jobs:
            return self._jobs[-1][0][0]
        return int(self.epoch_map.last_epoch())

    async def settle(self) -> None:
        """Wait until the queued entries are written (or raise why not)."""
        while self._jobs:
            _, fut = self._jobs[0]
            await asyncio.wrap_future(fut)
            self._jobs.pop(0)

    def settle_now(self) -> None:
        """Blocking variant, for the end of a session (the next one reads the epoch map)."""
        jobs, self._jobs = self._jobs, []
        for entry, fut in jobs:
            try:
                fut.result()
            except (EpochError, StoreError, OSError) as exc:
                # A full disk is said once, by the slave (rmqha.ha.disk_full), not per session.
                level = logging.DEBUG if is_disk_full(exc) else logging.WARNING
                log.log(level, "HA slave %d could not record an epoch entry: %s", self.broker_id, exc)
            except JobCancelled:
                # The session stopped while the entry still waited for the worker (awaiting
                # it was cancelled, and that cancels a job not yet started): never written,
                # as after a failed write; the next session starts from the epoch map.
                log.info("HA slave %d: epoch entry %s not written (session stopped)",
                         self.broker_id, entry)
        self._failed = None

    def close(self) -> None:
        self.settle_now()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
