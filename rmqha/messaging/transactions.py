"""Transactional messages, as RocketMQ does them: half messages, END_TRANSACTION, check-backs.

A send flagged ``TRANSACTION_PREPARED`` (sysFlag 0x4) is stored as a *half message* under
``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0) with its real topic and queue in ``REAL_TOPIC`` /
``REAL_QID``: consumers of the real topic do not see it.  END_TRANSACTION (37) then either
commits (the message is written to its real topic, sysFlag COMMIT) or rolls back; both
write an *op record* (tag ``d``, body = the half's queue offset) under
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` that closes the half message.

A half message neither committed nor rolled back ``transaction_timeout_ms`` after it was
born is checked back: the master re-stores it with ``TRANSACTION_CHECK_TIMES`` + 1 (the
new copy supersedes the old one) and sends CHECK_TRANSACTION_STATE (39) to a connected
producer of its group (known from heartbeats), which answers with END_TRANSACTION.  After
``transaction_check_max`` checks the message is discarded to ``TRANS_CHECK_MAX_TIME_TOPIC``
(with an op record), as RocketMQ's default check listener does.

Everything is in the replicated log, and every replica folds the half and op records into
the pending set as its index passes them (only confirmed records), so a new master knows
every open transaction at once and a commit acknowledged before a failover is visible
after it exactly once.  A committed message carries ``TRAN_PREPARED_QUEUE_OFFSET`` and is
folded too, so a commit whose op record was lost in a crash is not committed again.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, RmqhaError, StoreError
from rmqha.messaging.background import BackgroundJob
from rmqha.store.consume_queue import ScannedRecord
from rmqha.messaging.context import Handler, MessagingContext, Refused
from rmqha.messaging.delayed_delivery import DelayedDelivery
from rmqha.protocol.headers import CheckTransactionStateHeader, EndTransactionHeader
from rmqha.messaging.log_writer import LogWriter
from rmqha.protocol.message import Prop, SysFlag, decode_record, offset_msg_id
from rmqha.messaging.topic_admin import TopicAdmin
from rmqha.protocol.command import RemotingCommand

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: The op record's tag (RocketMQ ``TransactionalMessageUtil.REMOVE_TAG``).
REMOVE_TAG = "d"
#: Op-record property naming how the transaction ended (rmqha's; RocketMQ keeps no outcome).
END_PROPERTY = "RMQHA_TRAN_END"
#: The property a committed message carries (the half's queue offset): the index hands
#: such records to :meth:`Transactions.on_committed_record`, so a commit whose op record
#: was lost in a crash still closes its transaction.
COMMITTED_MARK = Prop.TRANSACTION_PREPARED_QUEUE_OFFSET
#: Outcomes remembered per transaction id, so a repeated END_TRANSACTION is answered
#: without writing twice.
_RESOLVED_KEPT = 100_000
_TRANSACTION_BITS = int(SysFlag.TRANSACTION_ROLLBACK)


class Outcome(str, Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    DISCARD = "discard"


@dataclass
class PendingHalf:
    """The current copy of an open transaction's half message."""

    queue_offset: int
    commit_offset: int
    size: int
    group: str
    transaction_id: str
    real_topic: str
    born_ms: int
    store_ms: int
    check_times: int
    immunity_ms: int | None


def transaction_type(sys_flag: int) -> int:
    return sys_flag & _TRANSACTION_BITS


class Transactions:
    """The half-message store, END_TRANSACTION and the master's check-back loop."""

    def __init__(self, ctx: MessagingContext, writer: LogWriter, topic_admin: TopicAdmin,
                 delayed: DelayedDelivery, clock: Callable[[], float] = time.time) -> None:
        self.ctx = ctx
        self.writer = writer
        self.topic_admin = topic_admin
        self.delayed = delayed
        self.clock = clock
        self.pending: dict[int, PendingHalf] = {}
        self._by_txn: dict[str, int] = {}
        self._resolved: OrderedDict[str, Outcome] = OrderedDict()
        self._in_flight: set[str] = set()
        self._job = BackgroundJob(self._loop, lambda: not ctx.closed)
        #: Check-backs sent by this broker (metrics, tests).
        self.checks_sent = 0

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.END_TRANSACTION: self.on_end_transaction}

    # --- the send side ----------------------------------------------------------------------

    @staticmethod
    def transform_half(topic: str, queue_id: int, props: dict[str, str], sys_flag: int,
                       producer_group: str) -> tuple[str, int, int]:
        """Where a prepared message is stored: (half topic, 0, sysFlag without the
        transaction bits), ``props`` updated in place."""
        uniq = props.get(Prop.UNIQ_KEY)
        if uniq:
            props[Prop.TRANSACTION_ID] = uniq
        props.setdefault(Prop.PRODUCER_GROUP, producer_group)
        props[Prop.REAL_TOPIC] = topic
        props[Prop.REAL_QID] = str(queue_id)
        return HALF_TOPIC, 0, sys_flag & ~_TRANSACTION_BITS

    # --- what every replica keeps ------------------------------------------------------------

    def on_half_record(self, rec: ScannedRecord) -> None:
        try:
            msg, _ = decode_record(self.ctx.log.read(rec.commit_offset, rec.size), inflate=False)
        except (ProtocolError, StoreError) as exc:
            log.error("half message at %d unreadable: %s", rec.commit_offset, exc)
            return
        props = msg.properties
        txn = props.get(Prop.TRANSACTION_ID) or props.get(Prop.UNIQ_KEY) or str(rec.commit_offset)
        if txn in self._resolved:
            return
        old = self._by_txn.get(txn)
        if old is not None:
            self.pending.pop(old, None)  # a check re-stored it: the new copy replaces it
        immunity = props.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS)
        try:
            immunity_ms = int(immunity) * 1000 if immunity else None
            check_times = int(props.get(Prop.TRANSACTION_CHECK_TIMES, "0"))
        except ValueError:
            immunity_ms, check_times = None, 0
        self.pending[rec.queue_offset] = PendingHalf(
            rec.queue_offset, rec.commit_offset, rec.size, props.get(Prop.PRODUCER_GROUP, ""),
            txn, props.get(Prop.REAL_TOPIC, ""), msg.born_timestamp, msg.store_timestamp,
            check_times, immunity_ms)
        self._by_txn[txn] = rec.queue_offset

    def on_committed_record(self, rec: ScannedRecord) -> None:
        """A committed message reached the index: its transaction is closed even if the op
        record after it never made it (a crash between the two writes)."""
        try:
            msg, _ = decode_record(self.ctx.log.read(rec.commit_offset, rec.size), inflate=False)
            half_offset = int(msg.properties.get(COMMITTED_MARK, ""))
        except (ProtocolError, StoreError, ValueError):
            return
        if transaction_type(msg.sys_flag) != SysFlag.TRANSACTION_COMMIT:
            return
        p = self.pending.get(half_offset)
        txn = msg.properties.get(Prop.TRANSACTION_ID) or msg.properties.get(Prop.UNIQ_KEY)
        if p is None or p.transaction_id != txn:
            return
        self._close(half_offset, Outcome.COMMIT)

    def _close(self, half_offset: int, outcome: Outcome) -> None:
        p = self.pending.pop(half_offset, None)
        if p is None:
            return
        if self._by_txn.get(p.transaction_id) == half_offset:
            del self._by_txn[p.transaction_id]
        self._resolved[p.transaction_id] = outcome
        while len(self._resolved) > _RESOLVED_KEPT:
            self._resolved.popitem(last=False)

    def on_op_record(self, rec: ScannedRecord) -> None:
        try:
            msg, _ = decode_record(self.ctx.log.read(rec.commit_offset, rec.size), inflate=False)
        except (ProtocolError, StoreError) as exc:
            log.error("op record at %d unreadable: %s", rec.commit_offset, exc)
            return
        if msg.properties.get(Prop.TAGS) != REMOVE_TAG:
            return
        try:
            outcome = Outcome(msg.properties.get(END_PROPERTY, Outcome.ROLLBACK.value))
        except ValueError:
            outcome = Outcome.ROLLBACK
        for part in bytes(msg.body).decode("ascii", "replace").split(","):
            try:
                half_offset = int(part)
            except ValueError:
                continue
            self._close(half_offset, outcome)

    def reload(self) -> None:
        """Fold the half and op queues again (after a truncation)."""
        self.pending.clear()
        self._by_txn.clear()
        self._resolved.clear()
        records: list[tuple[int, ScannedRecord]] = []
        for topic in (HALF_TOPIC, OP_TOPIC):
            q = self.ctx.index.queue(topic, 0)
            if q is None:
                continue
            records += [(e.commit_offset, ScannedRecord(topic, 0, e.queue_offset,
                                                        e.commit_offset, e.size))
                        for e in q.entries()]
        for _, rec in sorted(records, key=lambda r: r[0]):
            (self.on_half_record if rec.topic == HALF_TOPIC else self.on_op_record)(rec)

    def outcome(self, transaction_id: str) -> Outcome | None:
        return self._resolved.get(transaction_id)

    # --- END_TRANSACTION ---------------------------------------------------------------------

    async def on_end_transaction(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
        try:
            self.ctx.check_writable()
            h = EndTransactionHeader.parse(cmd.ext_fields)
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc))
        kind = h.commit_or_rollback
        if kind == SysFlag.TRANSACTION_COMMIT:
            outcome = Outcome.COMMIT
        elif kind == SysFlag.TRANSACTION_ROLLBACK:
            outcome = Outcome.ROLLBACK
        else:
            # UNKNOW: the producer does not know yet; the check-back asks again (no answer,
            # as RocketMQ).
            return None
        try:
            self._check_real_topic(cmd, conn, h.commit_log_offset)
            code, remark = await self.end(h.producer_group, h.commit_log_offset, outcome)
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        return cmd.response(code, remark, {})

    def _check_real_topic(self, cmd: RemotingCommand, conn: RequestPeer, offset: int) -> None:
        """Ending a transaction writes its message to its real topic: the sender needs PUB
        there (the record's own topic when it is no half message; :meth:`end` refuses it)."""
        try:
            msg, _ = decode_record(self.ctx.read_record(offset), inflate=False)
        except (StoreError, ProtocolError):
            return  # nothing readable there: end() answers it, naming nothing of a record
        real = msg.properties.get(Prop.REAL_TOPIC, "") if msg.topic == HALF_TOPIC else msg.topic
        self.ctx.check_record(cmd, conn, offset, real)

    async def end(self, group: str, commit_offset: int,
                  outcome: Outcome) -> tuple[int, str | None]:
        """Commit or roll back the transaction whose half message is at ``commit_offset``."""
        ctx = self.ctx
        try:
            raw = ctx.read_record(commit_offset)
            msg, _ = decode_record(raw, inflate=False)
        except (StoreError, ProtocolError) as exc:
            return ResponseCode.SYSTEM_ERROR, f"Find prepared transaction message failed: {exc}"
        if msg.topic != HALF_TOPIC:
            return ResponseCode.SYSTEM_ERROR, f"the message at {commit_offset} is not a half message"
        if msg.properties.get(Prop.PRODUCER_GROUP, "") != group:
            return ResponseCode.SYSTEM_ERROR, "The producer group wrong"
        txn = (msg.properties.get(Prop.TRANSACTION_ID) or msg.properties.get(Prop.UNIQ_KEY)
               or str(commit_offset))
        done = self._resolved.get(txn)
        if done is not None:
            if done == outcome:
                return ResponseCode.SUCCESS, None  # a repeated END: already done, once
            return ResponseCode.SYSTEM_ERROR, f"transaction {txn} was already {done.value}"
        half_offset = self._by_txn.get(txn)
        if half_offset is None:
            return ResponseCode.SYSTEM_ERROR, f"transaction {txn} has no pending half message"
        if txn in self._in_flight:
            return ResponseCode.SYSTEM_BUSY, f"transaction {txn} is being ended"
        self._in_flight.add(txn)
        try:
            return await self._end(self.pending[half_offset], outcome)
        finally:
            self._in_flight.discard(txn)

    async def _end(self, p: PendingHalf, outcome: Outcome) -> tuple[int, str | None]:
        ctx = self.ctx
        end = -1
        if outcome is Outcome.COMMIT:
            msg, _ = decode_record(ctx.log.read(p.commit_offset, p.size), inflate=False)
            props = dict(msg.properties)
            topic = props.pop(Prop.REAL_TOPIC, "")
            try:
                queue_id = int(props.pop(Prop.REAL_QID, "0"))
            except ValueError:
                queue_id = 0
            props.pop(Prop.TRANSACTION_PREPARED, None)
            props[Prop.TRANSACTION_PREPARED_QUEUE_OFFSET] = str(p.queue_offset)
            cfg = self.topic_admin.ensure_topic(topic)
            if cfg is None:
                return ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist"
            queue_id %= max(1, cfg.write_queue_nums)
            # A delayed transactional message starts its delay at the commit (RocketMQ).
            where = self.delayed.transform(topic, queue_id, props)
            if where is not None:
                topic, queue_id = where
            sys_flag = (msg.sys_flag & ~_TRANSACTION_BITS) | SysFlag.TRANSACTION_COMMIT
            placed = await self.writer.append_rows(
                topic, queue_id, [(msg.body, props, msg.flag, msg.reconsume_times)],
                sys_flag, msg.born_timestamp, _host_tuple(msg.born_host))
            end = placed[-1][0] + placed[-1][1]
        elif outcome is Outcome.DISCARD:
            msg, _ = decode_record(ctx.log.read(p.commit_offset, p.size), inflate=False)
            placed = await self.writer.append_rows(
                CHECK_MAX_TOPIC, 0, [(msg.body, dict(msg.properties), msg.flag,
                                      msg.reconsume_times)],
                msg.sys_flag, msg.born_timestamp, _host_tuple(msg.born_host))
        placed = await self.writer.append_rows(
            OP_TOPIC, 0, [(str(p.queue_offset).encode(), {Prop.TAGS: REMOVE_TAG,
                                                            END_PROPERTY: outcome.value}, 0, 0)],
            0, int(self.clock() * 1000), ("127.0.0.1", 0))
        end = max(end, placed[-1][0] + placed[-1][1])
        code, status = await self.writer.await_durable(end)
        if ctx.metrics is not None:
            ctx.metrics.transactions_ended.labels(outcome.value).inc()
        return code, None if code == ResponseCode.SUCCESS else status

    # --- the master's check-backs ------------------------------------------------------------

    def start(self) -> None:
        self._job.start()

    def stop(self) -> None:
        self._job.stop()

    async def _loop(self) -> None:
        cfg = self.ctx.config
        period = min(cfg.transaction_check_interval_ms, cfg.transaction_timeout_ms) / 1000.0
        while not self.ctx.closed and self.ctx.role == "master":
            try:
                await self.check_once()
            except (RmqhaError, OSError) as exc:
                log.error("transaction check failed (retried): %s", exc)
            await asyncio.sleep(max(0.05, period / 2))

    async def check_once(self) -> int:
        """Check back (or discard) every half message due for it; returns how many."""
        cfg = self.ctx.config
        now_ms = int(self.clock() * 1000)
        n = 0
        for p in sorted(self.pending.values(), key=lambda p: p.queue_offset):
            if self.ctx.role != "master":
                break
            if p.transaction_id in self._in_flight or self._by_txn.get(
                    p.transaction_id) != p.queue_offset:
                continue
            if p.commit_offset < self.ctx.log.min_offset:
                # Retention deleted it (older than file_reserved_hours): RocketMQ skips
                # such half messages too.
                log.warning("half message %s of %s is below the log's start: forgotten",
                            p.transaction_id, p.group)
                del self.pending[p.queue_offset]
                del self._by_txn[p.transaction_id]
                continue
            immunity = p.immunity_ms if p.immunity_ms is not None else cfg.transaction_timeout_ms
            if now_ms - p.born_ms < immunity:
                continue
            if p.check_times and now_ms - p.store_ms < cfg.transaction_check_interval_ms:
                continue
            self._in_flight.add(p.transaction_id)
            try:
                if p.check_times >= cfg.transaction_check_max:
                    log.warning("transaction %s of %s checked %d times: discarded to %s",
                                p.transaction_id, p.group, p.check_times, CHECK_MAX_TOPIC)
                    await self._end(p, Outcome.DISCARD)
                else:
                    await self._check(p)
            finally:
                self._in_flight.discard(p.transaction_id)
            n += 1
        return n

    async def _check(self, p: PendingHalf) -> None:
        ctx = self.ctx
        msg, _ = decode_record(ctx.log.read(p.commit_offset, p.size), inflate=False)
        props = dict(msg.properties)
        props[Prop.TRANSACTION_CHECK_TIMES] = str(p.check_times + 1)
        placed = await self.writer.append_rows(
            HALF_TOPIC, 0, [(msg.body, props, msg.flag, msg.reconsume_times)],
            msg.sys_flag, msg.born_timestamp, _host_tuple(msg.born_host))
        offset, size = placed[0]
        # Mark it now: the index passes the new copy only once it is confirmed.
        p.check_times += 1
        p.store_ms = int(self.clock() * 1000)
        code, _ = await self.writer.await_durable(offset + size)
        if code != ResponseCode.SUCCESS:
            return  # not safe yet: the next round checks the copy once it is confirmed
        producers = ctx.clients.producers(p.group)
        if not producers:
            log.info("transaction %s: no producer of %s connected to check it", p.transaction_id,
                     p.group)
            return
        queue_offset = ctx.queue_offset_at(offset)
        header = CheckTransactionStateHeader(
            tran_state_table_offset=queue_offset, commit_log_offset=offset,
            msg_id=props.get(Prop.UNIQ_KEY, p.transaction_id),
            transaction_id=p.transaction_id,
            offset_msg_id=offset_msg_id(ctx.config.broker_address, offset),
            topic=p.real_topic, broker_name=ctx.broker_name,
        ).build()
        req = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header,
                                      bytes(ctx.log.read(offset, size)), oneway=True)
        conn = random.choice(producers).connection
        try:
            await conn.send(req)
            self.checks_sent += 1
            if ctx.metrics is not None:
                ctx.metrics.transaction_checks.inc()
        except RmqhaError as exc:
            log.info("check-back of %s to %s failed: %s", p.transaction_id,
                     getattr(conn, "name", "?"), exc)


def _host_tuple(host: str) -> tuple[str, int]:
    h, _, port = host.rpartition(":")
    return (h, int(port)) if h and port.isdigit() else ("127.0.0.1", 0)
