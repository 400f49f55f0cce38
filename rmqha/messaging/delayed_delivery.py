"""Delayed and timed messages: RocketMQ's delay levels and RocketMQ 5's timer properties.

A send carrying ``DELAY=<level>`` is stored under ``SCHEDULE_TOPIC_XXXX``, queue
``level - 1``; one carrying ``TIMER_DELIVER_MS`` (an epoch time), ``TIMER_DELAY_SEC`` or
``TIMER_DELAY_MS`` is stored under ``rmq_sys_wheel_timer``, queue 0, with its due time in
``TIMER_OUT_MS``.  Either way the real topic and queue ride along in ``REAL_TOPIC`` /
``REAL_QID``, and nothing is visible on the real topic until the scheduler (master only)
writes the message there once it is due.  Delivery is never early: a message is written
once ``now >= due`` (the scheduler ticks every ``timer_precision_ms``).

Progress is state in the replicated log, so a new master or a restarted broker resumes
without loss (at worst a message delivered just before a failover is delivered again):

- a delay level's queue is in due order (one delay, store order), so its progress is one
  offset, kept as a consumer offset of the internal group ``SCHEDULE_GROUP``;
- timer messages fall due out of order, so their progress is the set of delivered
  timer-queue offsets above a low mark (``timer_done`` state records, folded into
  :class:`rmqha.messaging.state.TimerProgress`).  Every replica keeps the pending timer
  messages in a heap as its index passes them, so a new master starts with it.

Delay levels also drive consumer retries (see :mod:`rmqha.messaging.send_back`).
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqha.protocol.codes import ResponseCode
from rmqha.errors import ConfigError, ProtocolError, RmqhaError, StoreError
from rmqha.messaging.background import BackgroundJob
from rmqha.store.consume_queue import ScannedRecord
from rmqha.messaging.context import MessagingContext, Refused
from rmqha.messaging.log_writer import LogWriter
from rmqha.protocol.message import Prop, decode_record, find_property, record_properties
from rmqha.messaging.state import timer_done_record
from rmqha.messaging.state_replication import StateReplication
from rmqha.messaging.topic_admin import TopicAdmin

if TYPE_CHECKING:
    from rmqha.messaging.consumer_offsets import ConsumerOffsets

log = logging.getLogger(__name__)

#: RocketMQ's delay-level topic (queue id = level - 1).
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ 5's timer topic.
TIMER_TOPIC = "rmq_sys_wheel_timer"
#: The internal consumer group whose offsets on SCHEDULE_TOPIC are the levels' progress.
SCHEDULE_GROUP = "RMQ_SYS_SCHEDULE_GROUP"

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")
#: Properties that ask for a delay; none of them survives delivery.
_DELAY_PROPS = (Prop.DELAY, Prop.TIMER_DELIVER_MS, Prop.TIMER_DELAY_SEC, Prop.TIMER_DELAY_MS)


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 10s 1m"`` -> [1000, 5000, 10000, 60000] (levels 1..N, in ms)."""
    out = []
    for i, word in enumerate(str(text).split(), 1):
        m = _LEVEL.match(word.strip().lower())
        if m is None:
            raise ConfigError(f"message_delay_level: level {i} {word!r} is not a duration "
                              f"like 500ms, 1s, 2m, 1h or 1d")
        ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
        if ms <= 0:
            raise ConfigError(f"message_delay_level: level {i} {word!r} must be positive")
        out.append(ms)
    if not out:
        raise ConfigError("message_delay_level is empty: at least one level is needed")
    return out


def asks_for_delay(properties: str) -> bool:
    """Cheap test on a raw properties string (the send path's hot path)."""
    return "DELAY\x01" in properties or "TIMER_" in properties


@dataclass(order=True)
class _TimerEntry:
    due_ms: int
    queue_offset: int
    commit_offset: int
    size: int


class DelayedDelivery:
    """Turns delayed sends into scheduled records and delivers them when due (master)."""

    def __init__(self, ctx: MessagingContext, writer: LogWriter, topic_admin: TopicAdmin,
                 state_log: StateReplication,
                 offsets: ConsumerOffsets,
                 clock: Callable[[], float] = time.time) -> None:
        self.ctx = ctx
        self.writer = writer
        self.topic_admin = topic_admin
        self.state_log = state_log
        self.offsets = offsets
        self.clock = clock
        self.levels_ms = parse_delay_levels(ctx.config.message_delay_level)
        self._timers: list[_TimerEntry] = []
        #: End of the last record this scheduler wrote (awaited once per round).
        self._written_end = 0
        self._job = BackgroundJob(self._loop, lambda: not ctx.closed)
        self._wake: asyncio.Event | None = None
        #: Messages delivered by this broker (metrics, tests, benches).
        self.delivered = 0

    # --- the send side ----------------------------------------------------------------------

    @property
    def max_level(self) -> int:
        return len(self.levels_ms)

    def transform(self, topic: str, queue_id: int,
                  props: dict[str, str]) -> tuple[str, int] | None:
        """Where a delayed message is stored instead of (topic, queue_id), with ``props``
        updated in place; None when the message asks for no delay (or is already due).
        Raises :class:`Refused` naming a bad timer property."""
        level_text = props.get(Prop.DELAY)
        level = 0
        if level_text is not None:
            try:
                level = int(level_text)
            except ValueError:
                raise Refused(ResponseCode.MESSAGE_ILLEGAL,
                              f"property DELAY={level_text!r} is not a delay level") from None
        if level > 0:
            # A level wins over timer properties (RocketMQ drops them).
            for key in (Prop.TIMER_DELIVER_MS, Prop.TIMER_DELAY_SEC, Prop.TIMER_DELAY_MS):
                props.pop(key, None)
            level = min(level, self.max_level)
            props[Prop.DELAY] = str(level)
            props[Prop.REAL_TOPIC] = topic
            props[Prop.REAL_QID] = str(queue_id)
            return SCHEDULE_TOPIC, level - 1
        if level_text is not None:
            props.pop(Prop.DELAY, None)
        due = self._timer_due(props)
        if due is None:
            return None
        now_ms = int(self.clock() * 1000)
        if due <= now_ms:
            for key in _DELAY_PROPS:
                props.pop(key, None)
            return None
        if due - now_ms > self.ctx.config.timer_max_delay_s * 1000:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL,
                          f"timer delay of {(due - now_ms) / 1000:.0f}s exceeds "
                          f"timer_max_delay_s={self.ctx.config.timer_max_delay_s}")
        props[Prop.TIMER_OUT_MS] = str(due)
        props[Prop.REAL_TOPIC] = topic
        props[Prop.REAL_QID] = str(queue_id)
        return TIMER_TOPIC, 0

    def _timer_due(self, props: dict[str, str]) -> int | None:
        now_ms = int(self.clock() * 1000)
        for key, scale, relative in ((Prop.TIMER_DELAY_SEC, 1000, True),
                                     (Prop.TIMER_DELAY_MS, 1, True),
                                     (Prop.TIMER_DELIVER_MS, 1, False)):
            text = props.get(key)
            if text is None:
                continue
            try:
                value = int(text)
            except ValueError:
                raise Refused(ResponseCode.MESSAGE_ILLEGAL,
                              f"property {key}={text!r} is not an integer") from None
            return now_ms + value * scale if relative else value
        return None

    # --- what every replica keeps ------------------------------------------------------------

    def on_timer_record(self, rec: ScannedRecord) -> None:
        """The index passed a timer record: remember when it is due."""
        if self.ctx.state.timer.delivered(rec.queue_offset):
            return
        try:
            raw = self.ctx.log.read(rec.commit_offset, rec.size)
            due_raw = find_property(record_properties(raw), b"TIMER_OUT_MS")
            due = int(due_raw) if due_raw else 0
        except (StoreError, ValueError, ProtocolError) as exc:
            log.error("timer record at %d unreadable: %s", rec.commit_offset, exc)
            return
        heapq.heappush(self._timers, _TimerEntry(due, rec.queue_offset, rec.commit_offset,
                                                 rec.size))
        if self._wake is not None:
            self._wake.set()

    def reload(self) -> None:
        """Rebuild the timer heap from the index (after a truncation)."""
        self._timers = []
        q = self.ctx.index.queue(TIMER_TOPIC, 0)
        if q is None:
            return
        for i in range(len(q)):
            self.on_timer_record(ScannedRecord(TIMER_TOPIC, 0, q.base + i, q.phys[i],
                                               q.sizes[i]))

    def pending_timers(self) -> int:
        timer = self.ctx.state.timer
        return sum(1 for e in self._timers if not timer.delivered(e.queue_offset))

    # --- the master's scheduler ------------------------------------------------------------

    def start(self) -> None:
        if not self._job.running:
            # A fresh event per run: a cancelled run may have left the old one set.
            self._wake = asyncio.Event()
            self._job.start()

    def stop(self) -> None:
        self._job.stop()

    async def _loop(self) -> None:
        tick = self.ctx.config.timer_precision_ms / 1000.0
        assert self._wake is not None
        while not self.ctx.closed and self.ctx.role == "master":
            try:
                await self.run_once()
            except (RmqhaError, OSError) as exc:
                log.error("delayed delivery failed (retried next tick): %s", exc)
            try:
                await asyncio.wait_for(self._wake.wait(), tick)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def run_once(self) -> int:
        """Deliver every message due now; returns how many were delivered."""
        if self.ctx.role != "master":
            return 0
        n = 0
        self._written_end = 0
        try:
            for level in range(1, self.max_level + 1):
                n += await self._deliver_level(level)
            n += await self._deliver_timers()
        finally:
            if self._written_end:
                # Replication and the index follow (a lone broker indexes here).
                await self.writer.await_durable(self._written_end)
        return n

    async def _deliver_level(self, level: int) -> int:
        ctx = self.ctx
        qid = level - 1
        q = ctx.index.queue(SCHEDULE_TOPIC, qid)
        if q is None or not len(q):
            return 0
        cursor = ctx.state.offsets.get(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid)
        start = cursor = max(q.min_offset, cursor if cursor is not None else 0)
        now_ms = int(self.clock() * 1000)
        delay_ms = self.levels_ms[qid]
        try:
            while cursor < q.max_offset and ctx.role == "master":
                entry = q.get(cursor)
                assert entry is not None
                if ctx.store_timestamp(entry.commit_offset) + delay_ms > now_ms:
                    break
                await self._deliver(entry.commit_offset, entry.size)
                cursor += 1
        finally:
            if cursor != start:
                self.offsets.commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, cursor,
                                    immediate=False)
        return cursor - start

    async def _deliver_timers(self) -> int:
        now_ms = int(self.clock() * 1000)
        timer = self.ctx.state.timer
        done: list[int] = []
        try:
            while self._timers and self._timers[0].due_ms <= now_ms \
                    and self.ctx.role == "master":
                e = heapq.heappop(self._timers)
                if timer.delivered(e.queue_offset) or e.queue_offset in done:
                    continue
                if e.commit_offset < self.ctx.log.min_offset:
                    log.error("timer message at %d was deleted by retention before it was "
                              "due", e.commit_offset)
                    continue
                try:
                    await self._deliver(e.commit_offset, e.size)
                except (RmqhaError, OSError):
                    heapq.heappush(self._timers, e)
                    raise
                done.append(e.queue_offset)
        finally:
            if done:
                self._record_timer_done(done)
        return len(done)

    def _record_timer_done(self, done: list[int]) -> None:
        timer = self.ctx.state.timer
        q = self.ctx.index.queue(TIMER_TOPIC, 0)
        timer.mark(done)
        timer.advance_low(q.min_offset if q is not None else 0)
        offset, size = self.state_log.write_state(timer_done_record(done, timer.low))
        self._written_end = max(self._written_end, offset + size)

    async def _deliver(self, commit_offset: int, size: int) -> None:
        """Write a scheduled record to its real topic (deleted topics drop it, as RocketMQ)."""
        ctx = self.ctx
        raw = ctx.log.read(commit_offset, size)
        msg, _ = decode_record(raw, inflate=False)
        props = dict(msg.properties)
        topic = props.get(Prop.REAL_TOPIC, "")
        try:
            queue_id = int(props.get(Prop.REAL_QID, "0"))
        except ValueError:
            queue_id = 0
        for key in _DELAY_PROPS:
            props.pop(key, None)
        cfg = self.topic_admin.ensure_topic(topic) if topic else None
        if cfg is None:
            log.warning("scheduled message at %d for topic %r dropped: no such topic",
                        commit_offset, topic)
            return
        queue_id %= max(1, cfg.write_queue_nums)
        host, _, port = msg.born_host.rpartition(":")
        born_host = (host, int(port)) if host and port.isdigit() else ("127.0.0.1", 0)
        placed = await self.writer.append_rows(
            topic, queue_id, [(msg.body, props, msg.flag, msg.reconsume_times)],
            msg.sys_flag, msg.born_timestamp, born_host)
        self._written_end = max(self._written_end, placed[-1][0] + placed[-1][1])
        self.delivered += 1
        if ctx.metrics is not None:
            ctx.metrics.delayed_delivered.inc()
