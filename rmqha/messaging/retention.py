"""Retention: deleting whole commitlog segments older than ``file_reserved_hours``.

Every replica deletes its own old segments.  Before deleting state records the master
writes a state checkpoint (and waits for its replication) so the topic and offset tables
survive; a slave waits for that checkpoint to arrive.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from rmqha.protocol.codes import ResponseCode
from rmqha.errors import RmqhaError
from rmqha.messaging.background import BackgroundJob
from rmqha.messaging.context import MessagingContext
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.state import STATE_TOPIC
from rmqha.messaging.state_replication import StateReplication

log = logging.getLogger(__name__)


class Retention:
    """Runs :meth:`run_retention` every ``retention_interval_s`` once started."""

    def __init__(self, ctx: MessagingContext, state_log: StateReplication, writer: LogWriter,
                 on_segments_deleted: Callable[[int], None] | None = None) -> None:
        self.ctx = ctx
        self.state_log = state_log
        self.writer = writer
        #: Called with the new min offset after segments were deleted (epoch map trim).
        self.on_segments_deleted = on_segments_deleted
        self._job = BackgroundJob(self._loop, lambda: not ctx.closed)

    def start(self) -> None:
        self._job.start()

    def close(self) -> None:
        self._job.stop()

    async def _loop(self) -> None:
        while not self.ctx.closed:
            await asyncio.sleep(self.ctx.config.retention_interval_s)
            try:
                await self.run_retention()
            except (RmqhaError, OSError) as exc:
                log.error("retention failed: %s", exc)

    def _segment_mtime(self, start: int) -> float | None:
        directory = getattr(self.ctx.log, "directory", None)
        if directory is None:
            return None
        try:
            return os.stat(Path(directory) / f"{start:020d}").st_mtime
        except OSError:
            return None

    async def run_retention(self, now: float | None = None) -> int:
        """Delete whole segments last written more than ``file_reserved_hours`` ago.

        Never touches the segment being written, nor anything the index has not passed;
        before deleting state records the master writes a checkpoint (and waits for its
        replication) so the topic and offset tables survive.  Returns the new min offset.
        """
        ctx = self.ctx
        clog = ctx.log
        now = time.time() if now is None else now
        cutoff = now - float(ctx.config.file_reserved_hours) * 3600.0
        cut = clog.min_offset
        limit = min(ctx.index.indexed_offset, clog.max_offset)
        while True:
            start = clog.segment_start(cut)
            end = clog.segment_end(cut)
            if end > limit:
                break
            mtime = self._segment_mtime(start)
            if mtime is None or mtime > cutoff:
                break
            cut = end
        if cut <= clog.min_offset:
            return clog.min_offset
        state_q = ctx.index.queue(STATE_TOPIC, 0)
        needs_checkpoint = (state_q is not None and len(state_q) and state_q.phys[0] < cut
                            and self.state_log.last_checkpoint_offset < cut)
        if needs_checkpoint:
            if ctx.role != "master":
                return clog.min_offset  # wait for the master's checkpoint to arrive
            offset, size = self.state_log.write_state(ctx.state.checkpoint_record())
            self.state_log.last_checkpoint_offset = offset
            code, _ = await self.writer.await_durable(offset + size)
            if code != ResponseCode.SUCCESS:
                log.warning("retention postponed: checkpoint at %d not confirmed", offset)
                return clog.min_offset
        clog.delete_segments_before(cut)
        new_min = clog.min_offset
        ctx.index.trim_below(new_min)
        log.info("retention deleted segments below %d", new_min)
        if self.on_segments_deleted is not None:
            self.on_segments_deleted(new_min)
        return new_min
