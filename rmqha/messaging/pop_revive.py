"""Reviving popped messages whose invisible time ran out (RocketMQ's ``PopReviveService``).

The master looks every ``pop_revive_interval_ms`` for in-flight messages past their
deadline and, per :func:`rmqha.messaging.pop_logic.revive_plan`:

- writes a copy to the group's pop retry topic ``%RETRY%<group>_<topic>`` (queue 0)
  with its reconsume times one higher and ``1ST_POP_TIME`` set, delayed by RocketMQ's
  backoff (delay level 3 + retry count, through :mod:`rmqha.messaging.delayed_delivery`)
  unless ``pop_revive_backoff`` is off; the group pops it from there like any message;
- writes it to the group's dead-letter queue ``%DLQ%<group>`` once its retry count
  reached the group's ``retryMaxTimes`` (``RETRY_TOPIC`` names the original topic);
- leaves a FIFO message in flight (its queue delivers it again, in order).

The copies and one ``pop_revive`` record per round are appended together (copies first:
a failover between them delivers a copy twice, never none) and awaited once per round.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from rmqha.errors import ConfigError, ProtocolError, RmqhaError, StoreError
from rmqha.messaging.background import BackgroundJob
from rmqha.messaging.context import MessagingContext
from rmqha.messaging.delayed_delivery import DelayedDelivery
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.pop_ledger import PopLedger
from rmqha.messaging.pop_logic import ReviveAction, RevivePlan, revive_plan
from rmqha.messaging.pop_state import InFlight, QueueKey, revive_record
from rmqha.messaging.topic_admin import TopicAdmin
from rmqha.protocol.message import Prop, decode_record, offset_msg_id
from rmqha.protocol.pop import FIRST_POP_TIME, POP_CK, original_topic, pop_retry_topic
from rmqha.protocol.topics import DLQ_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

#: Entries per ``pop_revive`` record (a long backlog is written in several).
MAX_PER_RECORD = 512
#: Properties a copy does not keep: the handle, and a delay already served.
_DROPPED = (POP_CK, Prop.DELAY, Prop.TIMER_DELIVER_MS, Prop.TIMER_DELAY_SEC,
            Prop.TIMER_DELAY_MS, Prop.TIMER_OUT_MS, Prop.REAL_TOPIC, Prop.REAL_QID)


class PopReviver:
    """The master's revive loop."""

    def __init__(self, ctx: MessagingContext, ledger: PopLedger, writer: LogWriter,
                 topic_admin: TopicAdmin, delayed: DelayedDelivery) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self.writer = writer
        self.topic_admin = topic_admin
        self.delayed = delayed
        self._job = BackgroundJob(self._loop, lambda: not ctx.closed)
        #: Messages moved to a retry topic / a DLQ by this broker (tests, metrics).
        self.retried = 0
        self.dead_lettered = 0

    def start(self) -> None:
        self._job.start()

    def stop(self) -> None:
        self._job.stop()

    async def _loop(self) -> None:
        interval = self.ctx.config.pop_revive_interval_ms / 1000.0
        while not self.ctx.closed and self.ctx.role == "master":
            if self.ledger.ready():
                try:
                    await self.run_once()
                except (RmqhaError, OSError) as exc:
                    log.error("pop revive failed (retried next round): %s", exc)
            await asyncio.sleep(interval)

    async def run_once(self) -> int:
        """Revive everything due now; returns how many messages were moved."""
        if not self.ledger.ready():
            return 0
        now = self.ledger.now_ms()
        revived: list[list[Any]] = []
        moved = 0
        end = 0
        woken: set[str] = set()
        for key, offset, entry in list(self.ledger.pop.due(now)):
            plan = revive_plan(entry, self.ledger.retry_max(key[0]),
                               backoff=self.ctx.config.pop_revive_backoff,
                               max_level=self.delayed.max_level)
            if plan.action is ReviveAction.LEAVE and self._stored(key, offset):
                continue
            try:
                # A FIFO message deleted by retention is dropped (its queue would wait forever).
                end = max(end, self._copy(key, offset, entry, plan))
            except (StoreError, ProtocolError, ConfigError) as exc:
                log.error("pop revive of %s/%s/%d offset %d failed (retried): %s",
                          key[0], key[1], key[2], offset, exc)
                self.ledger.pop.requeue(key, offset, entry,
                                        now + self.ctx.config.pop_revive_interval_ms)
                continue
            revived.append([key[0], key[1], key[2], offset, entry.pop_time])
            moved += 1
            if entry.fifo:
                woken.add(key[1])
            if len(revived) >= MAX_PER_RECORD:
                end = max(end, self._record(revived))
                revived = []
        if revived:
            end = max(end, self._record(revived))
        self.ledger.wake(woken)
        if end:
            await self.writer.await_durable(end)
        return moved

    def _record(self, revived: list[list[Any]]) -> int:
        offset, size = self.ledger.write(revive_record(revived))
        return offset + size

    def _target(self, group: str, origin: str, plan: RevivePlan) -> str:
        """The topic a copy goes to, created if needed; a retry topic whose name RocketMQ's
        rules refuse (a long group and topic) sends the message to the DLQ instead."""
        if plan.action is ReviveAction.RETRY:
            target = pop_retry_topic(group, origin)
            try:
                if self.topic_admin.ensure_topic(target) is not None:
                    return target
            except ConfigError as exc:
                log.error("pop retry topic for group %s: %s; dead-lettering instead", group, exc)
        target = DLQ_GROUP_TOPIC_PREFIX + group
        if self.topic_admin.ensure_topic(target) is None:
            raise StoreError(f"cannot create {target}: this broker is not master")
        return target

    def _stored(self, key: QueueKey, offset: int) -> Any:
        """The index entry of an in-flight message, None once retention deleted it."""
        q = self.ctx.index.queue(key[1], key[2])
        found = None if q is None else q.get(offset)
        if found is None or found.commit_offset < self.ctx.log.min_offset:
            return None
        return found

    def _copy(self, key: QueueKey, offset: int, entry: InFlight, plan: RevivePlan) -> int:
        """Append the retry or dead-letter copy of an expired message; the end of what was
        written (0: the message is gone, nothing to copy)."""
        group, topic, queue_id = key
        ctx = self.ctx
        found = self._stored(key, offset)
        if found is None or plan.action is ReviveAction.LEAVE:
            log.warning("popped message %s/%d/%d of group %s is gone (retention or a deleted "
                        "topic): not revived", topic, queue_id, offset, group)
            return 0
        msg, _ = decode_record(ctx.log.read(found.commit_offset, found.size), inflate=False)
        props = {k: v for k, v in msg.properties.items() if k not in _DROPPED}
        origin = original_topic(topic, group)
        if entry.retry_count == 0 or FIRST_POP_TIME not in props:
            props[FIRST_POP_TIME] = str(entry.pop_time)
        target = self._target(group, origin, plan)
        if target.startswith(DLQ_GROUP_TOPIC_PREFIX):
            plan = RevivePlan(ReviveAction.DEAD_LETTER)
            props.setdefault(Prop.RETRY_TOPIC, origin)
            props.setdefault(Prop.ORIGIN_MESSAGE_ID, props.get(Prop.UNIQ_KEY) or offset_msg_id(
                ctx.config.broker_address, found.commit_offset))
        where = (target, 0)
        if plan.delay_level:
            props[Prop.DELAY] = str(plan.delay_level)
            where = self.delayed.transform(target, 0, props) or where
        placed = self.writer.append_rows_now(
            where[0], where[1], [(msg.body, props, msg.flag, entry.retry_count + 1)],
            msg.sys_flag, msg.born_timestamp, _host_port(ctx.config.broker_address))
        if plan.action is ReviveAction.DEAD_LETTER:
            self.dead_lettered += 1
            log.info("popped message %s/%d/%d of group %s delivered %d times: moved to %s",
                     topic, queue_id, offset, group, entry.retry_count + 1, target)
        else:
            self.retried += 1
        return placed[-1][0] + placed[-1][1]


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else ("127.0.0.1", 0)
