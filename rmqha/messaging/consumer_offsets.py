"""Consumer group offsets: QUERY/UPDATE_CONSUMER_OFFSET and offsets committed by pulls.

Offsets are written to the state log (:mod:`rmqha.messaging.state`) in batches: at once
for an explicit update, every ``offset_flush_interval_s`` for offsets carried by pulls.
Only a master writes; a slave keeps what it was told until it becomes master.
"""
from __future__ import annotations

import asyncio
import logging
import os

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import StoreError
from rmqha.messaging.context import Handler, MessagingContext
from rmqha.protocol.headers import QueryConsumerOffsetHeader, UpdateConsumerOffsetHeader
from rmqha.messaging.state import offsets_record
from rmqha.messaging.state_replication import StateReplication
from rmqha.protocol.command import RemotingCommand

log = logging.getLogger(__name__)


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 8 << 30


#: RocketMQ's accessMessageInMemoryMaxRatio (40) of this machine's memory.
_IN_MEMORY_BYTES = _physical_memory() * 40 // 100


class ConsumerOffsets:
    """Answers offset queries and batches committed offsets into state records."""

    def __init__(self, ctx: MessagingContext, state_log: StateReplication) -> None:
        self.ctx = ctx
        self.state_log = state_log
        self._dirty_offsets: dict[tuple[str, str, int], int] = {}
        self._offset_flush: asyncio.TimerHandle | None = None

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.QUERY_CONSUMER_OFFSET: self.on_query_offset,
            rc.UPDATE_CONSUMER_OFFSET: self.on_update_offset,
        }

    def on_master(self) -> None:
        """Became master: write what was committed meanwhile."""
        if self._dirty_offsets:
            self._schedule_offset_flush(0.0)

    def close(self) -> None:
        if self._offset_flush is not None:
            self._offset_flush.cancel()

    async def on_query_offset(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        h = QueryConsumerOffsetHeader.parse(cmd.ext_fields)
        group, topic, qid = h.consumer_group, h.topic, h.queue_id
        offset = self.ctx.state.offsets.get(group, topic, qid)
        if offset is not None:
            return cmd.response(ResponseCode.SUCCESS, None, {"offset": offset})
        # No stored offset: RocketMQ's ConsumerManageProcessor.  QUERY_NOT_FOUND lets the
        # client apply its consumeFromWhere (CONSUME_FROM_LAST_OFFSET: start at the max);
        # a queue whose first message is still at queue offset 0 and "in memory" (a young
        # queue) answers 0 so a new group on a new topic misses nothing.
        if h.set_zero_if_not_found is not False and self.young_queue(topic, qid):
            return cmd.response(ResponseCode.SUCCESS, None, {"offset": 0})
        return cmd.response(ResponseCode.QUERY_NOT_FOUND,
                            "Not found, maybe this group consumer boot first", {})

    def young_queue(self, topic: str, queue_id: int) -> bool:
        """RocketMQ's ``minOffset <= 0 && checkInMemByConsumeOffset(topic, queue, 0, 1)``:
        the queue still starts at 0 and its first record lies within the part of the log
        RocketMQ counts as in memory (accessMessageInMemoryMaxRatio, 40% of RAM, from the
        log's end)."""
        q = self.ctx.index.queue(topic, queue_id)
        if q is None or not len(q) or q.min_offset > 0:
            return False
        behind = self.ctx.log.max_offset - q.phys[0]
        return behind <= _IN_MEMORY_BYTES

    async def on_update_offset(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        h = UpdateConsumerOffsetHeader.parse(cmd.ext_fields)
        if h.commit_offset >= 0:
            self.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset, immediate=True)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    def commit(self, group: str, topic: str, queue_id: int, offset: int, *,
               immediate: bool) -> None:
        key = (group, topic, queue_id)
        if self.ctx.state.offsets.set(group, topic, queue_id, offset) or \
                key in self._dirty_offsets:
            self._dirty_offsets[key] = offset
            self._schedule_offset_flush(
                0.0 if immediate else self.ctx.config.offset_flush_interval_s)

    def _schedule_offset_flush(self, delay: float) -> None:
        if self.ctx.closed or self.ctx.role != "master":
            return  # a slave keeps them until it becomes master (set_role flushes)
        if self._offset_flush is not None:
            if delay > 0:
                return
            self._offset_flush.cancel()
        loop = asyncio.get_running_loop()
        self._offset_flush = loop.call_later(delay, self._flush_offsets)

    def _flush_offsets(self) -> None:
        self._offset_flush = None
        if not self._dirty_offsets or self.ctx.role != "master" or self.ctx.closed:
            return
        entries = [(g, t, q, o) for (g, t, q), o in self._dirty_offsets.items()]
        self._dirty_offsets.clear()
        try:
            self.state_log.write_state(offsets_record(entries))
        except StoreError as exc:
            log.error("could not write %d consumer offsets: %s", len(entries), exc)
