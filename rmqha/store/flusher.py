"""Group-commit flushing of the commitlog.

One thread ``fdatasync``s the segments holding bytes past the flushed offset: in ``async``
mode every ``flush_interval_ms``; in ``sync`` mode as soon as an append waits for it, so
every append that arrived meanwhile shares one fsync (group commit), and bytes appended
with nobody waiting (an HA slave's) within ``LAZY_FLUSH_S``.  Waiters block in
:meth:`Flusher.wait_flushed` or hold a future from :meth:`Flusher.future`.  The checkpoint
file follows the flushed offset at most every ``checkpoint_interval_ms``, and so does the
queue-offset snapshot (taken before the fdatasync, written after it: the table it holds
is the log's at a record boundary the fdatasync covered).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from enum import Enum
from typing import Protocol

from rmqha.errors import StoreClosedError
from rmqha.failpoints import Failpoint, hit
from rmqha.store.checkpoint import Checkpoint
from rmqha.store.segments import Segment

log = logging.getLogger(__name__)


#: Sync mode: how long a flush asked for with no waiter may wait to gather more bytes.
LAZY_FLUSH_S = 0.01


class FlushMode(str, Enum):
    ASYNC = "async"   # a background flush every flush_interval_ms
    SYNC = "sync"     # an append returns once an fsync covers it (group commit)


#: (generation, record boundary, queue-offset table there)
TableSnapshot = tuple[int, int, dict[tuple[bytes, int], int]]


class SnapshotSource(Protocol):
    """Where the flusher gets the queue-offset snapshot and keeps it (the commitlog)."""

    def take_snapshot(self) -> TableSnapshot | None: ...

    def save_snapshot(self, snap: TableSnapshot) -> bool: ...


class Flusher:
    """The flushed offset, its waiters and the thread that moves it.

    ``segments`` is the log's dict of open segments, ``io_lock`` the log's lock over fd
    lifetimes (an fdatasync never meets a closed fd); ``max_offset`` and ``min_offset``
    read the log.  ``lock`` guards ``flushed_offset`` and the waiters.
    """

    def __init__(self, mode: FlushMode, *, flush_interval_s: float,
                 checkpoint_interval_s: float, segments: dict[int, Segment],
                 segment_bytes: int, io_lock: threading.Lock, checkpoint: Checkpoint,
                 max_offset: Callable[[], int], min_offset: Callable[[], int],
                 snapshots: SnapshotSource | None = None) -> None:
        self.mode = mode
        self._flush_interval = flush_interval_s
        self._checkpoint_interval = checkpoint_interval_s
        self._segments = segments
        self._sb = segment_bytes
        self._io_lock = io_lock
        self._checkpoint = checkpoint
        self._max_offset = max_offset
        self._min_offset = min_offset
        self._snapshots = snapshots
        self.lock = threading.Lock()
        self._flushed_cond = threading.Condition(self.lock)  # waiters on flushes
        self._flusher_cond = threading.Condition(self.lock)  # wakes the flusher
        self._wanted = 0     # offset a waiter needs flushed (sync mode: flush at once)
        self._requested = 0  # offset asked for without a waiter (sync mode: flush lazily)
        self._futures: list[tuple[int, int, Future[int]]] = []
        self._future_seq = itertools.count()
        self.count = 0                    # fdatasync rounds done (group-commit evidence)
        self.flushed_offset = 0
        self._last_checkpoint = 0.0
        self._checkpointed = -1
        self._stopping = False
        self.closed = False
        self._thread = threading.Thread(target=self._loop, name="commitlog-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a flush under way completes first)."""
        with self.lock:
            self._stopping = True
            self._flusher_cond.notify_all()
        self._thread.join()

    def fail_pending(self) -> None:
        """The log closed: every waiter and future still pending gets StoreClosedError."""
        with self.lock:
            self.closed = True
            for _, _, fut in self._futures:
                if not fut.done():
                    fut.set_exception(StoreClosedError("commitlog closed"))
            self._futures.clear()
            self._flushed_cond.notify_all()

    def request(self, offset: int) -> None:
        """Sync mode: have the flusher cover ``offset`` within ``LAZY_FLUSH_S``, nobody
        waiting (a slave that acks from its page cache; RocketMQ's group commit service
        likewise flushes every 10 ms when no request waits).  Requests gather: one fsync
        per period, not per block, so the disk the master's waited-for fsyncs use is not
        kept busy by its slaves'."""
        with self.lock:
            if self._requested < offset:
                if self._requested <= self.flushed_offset < offset:
                    self._flusher_cond.notify()  # it may be in the long idle wait
                self._requested = offset

    def wait_flushed(self, offset: int) -> None:
        with self.lock:
            if self.flushed_offset >= offset:
                return
            if self._wanted < offset:
                self._wanted = offset
                self._flusher_cond.notify()
            while self.flushed_offset < offset:
                if self.closed:
                    raise StoreClosedError("commitlog closed before the record was flushed")
                self._flushed_cond.wait()

    def future(self, offset: int) -> Future[int]:
        fut: Future[int] = Future()
        with self.lock:
            if self.flushed_offset >= offset:
                fut.set_result(self.flushed_offset)
                return fut
            if self.closed:
                fut.set_exception(StoreClosedError("commitlog is closed"))
                return fut
            heapq.heappush(self._futures, (offset, next(self._future_seq), fut))
            if self.mode is FlushMode.SYNC and self._wanted < offset:
                self._wanted = offset
                self._flusher_cond.notify()
        return fut

    def _loop(self) -> None:
        while True:
            with self.lock:
                if self.mode is FlushMode.SYNC:
                    while not self._stopping and self._wanted <= self.flushed_offset:
                        if self._requested > self.flushed_offset:
                            # Gather what arrives within the period (a waiter cuts it
                            # short), then one fsync for all of it.
                            self._flusher_cond.wait(LAZY_FLUSH_S)
                            break
                        # Idle: a request or a waiter wakes it; only a wait that ran out
                        # flushes for the checkpoint.  (Breaking out on any wake once a
                        # checkpoint was due made every block that came after a pause
                        # its own fsync: a slave fsynced per message one at a time.)
                        woken = self._flusher_cond.wait(self._checkpoint_interval)
                        if not woken and self.flushed_offset > self._checkpointed:
                            break
                elif not self._stopping:
                    self._flusher_cond.wait(self._flush_interval)
                if self._stopping:
                    return
            try:
                self.flush_now()
            except OSError as exc:
                log.error("commitlog flush failed: %s", exc)
                time.sleep(self._flush_interval)

    def flush_now(self, force_checkpoint: bool = False) -> None:
        snap = None
        if self._snapshots is not None and (
                force_checkpoint
                or time.monotonic() - self._last_checkpoint >= self._checkpoint_interval):
            snap = self._snapshots.take_snapshot()
        self._flush(force_checkpoint)
        if snap is not None and snap[1] <= self.flushed_offset:
            self._snapshots.save_snapshot(snap)  # type: ignore[union-attr]

    def _flush(self, force_checkpoint: bool) -> None:
        with self._io_lock:
            target = self._max_offset()
            start = self.flushed_offset
            if target > start:
                for seg in list(self._segments.values()):
                    if seg.base < target and seg.base + self._sb > start:
                        os.fdatasync(seg.fd)
                hit(Failpoint.AFTER_FLUSH)  # only flushes that wrote something count
            with self.lock:
                if target > self.flushed_offset:
                    self.flushed_offset = target
                    self.count += 1
                self._resolve_futures()
                self._flushed_cond.notify_all()
            now = time.monotonic()
            if force_checkpoint or (self.flushed_offset != self._checkpointed and
                                    now - self._last_checkpoint >= self._checkpoint_interval):
                self.write_checkpoint()

    def _resolve_futures(self) -> None:
        while self._futures and self._futures[0][0] <= self.flushed_offset:
            _, _, fut = heapq.heappop(self._futures)
            if not fut.done():
                fut.set_result(self.flushed_offset)

    def write_checkpoint(self, clean: bool = False) -> None:
        self._checkpoint.write(self.flushed_offset, self._min_offset(), clean)
        self._checkpointed = self.flushed_offset
        self._last_checkpoint = time.monotonic()

    # --- the log moved back (with the log's io lock held) ------------------------------------

    def lower_to(self, offset: int) -> None:
        """The log was truncated to ``offset``: nothing past it is flushed or wanted."""
        with self.lock:
            if self.flushed_offset > offset:
                self.flushed_offset = offset
            self._wanted = min(self._wanted, offset)
            self._requested = min(self._requested, offset)

    def restart_at(self, offset: int) -> None:
        """The log was reset to start (empty) at ``offset``: all of it is flushed."""
        with self.lock:
            self.flushed_offset = offset
            self._wanted = min(self._wanted, offset)
            self._requested = min(self._requested, offset)
            self._resolve_futures()
            self._flushed_cond.notify_all()

    def cut_to(self, offset: int) -> None:
        """A partial record was dropped back to ``offset``."""
        with self.lock:
            if self.flushed_offset > offset:
                self.flushed_offset = offset
