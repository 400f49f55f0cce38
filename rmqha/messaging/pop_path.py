"""POP_MESSAGE: the broker picks the messages, remembers them as in flight, and hands out
receipt handles (RocketMQ 5's ``PopMessageProcessor``).

Master only (a pop changes state).  One pop reads the topic's queue (``queueId >= 0``) or
every readable queue (``-1``, starting at a rotating one), and for a group that is not
consume-orderly also the group's pop retry topic (first on every fifth pop, else after the
topic when the pop is not full, as RocketMQ 5's PopConsumerService).  What it takes, the
cursor moves and the in-flight entries are one ``pop_batch`` state record; the pop is
answered without waiting for its replication (a pop lost in a failover is delivered
again: at least once).

The body is the messages as PULL_MESSAGE carries them (V1 store records), each re-encoded
with its receipt handle in ``POP_CK`` (see :mod:`rmqha.messaging.receipt`); a message from
the retry topic is re-encoded under its original topic, as RocketMQ does.  A pop that finds
nothing is held up to ``pollTime`` (capped by ``long_polling_max_ms``) and answered
POLLING_TIMEOUT; it wakes when the index grows on a topic it reads or a FIFO queue it reads
unblocks.  The rules are in :mod:`rmqha.messaging.pop_logic`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rmqha.errors import ProtocolError, StoreError
from rmqha.messaging.context import Handler, MessagingContext, Refused
from rmqha.messaging.pop_ledger import PopLedger
from rmqha.messaging.pop_logic import (
    FifoGate,
    fifo_gate,
    fifo_unblocks_at,
    initial_cursor,
    rest_count,
    select,
)
from rmqha.messaging.pop_state import batch_record
from rmqha.messaging.pull_path import lz4_to_zlib, reads_lz4
from rmqha.messaging.receipt import ReceiptHandle
from rmqha.messaging.state import STATE_TOPIC
from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.headers import PopHeader
from rmqha.protocol.message import (
    decode_properties,
    parse_subscription,
    record_properties,
    record_reconsume_times,
    rewrite_record,
    tag_hash,
)
from rmqha.protocol.pop import (
    MAX_POP_MESSAGES,
    ORDER_REVIVE_QID,
    POP_CK,
    QueueInfo,
    original_topic,
    pop_retry_topic,
    retry_flag,
)
from rmqha.protocol.topics import PERM_READ, RETRY_GROUP_TOPIC_PREFIX, TopicConfig

log = logging.getLogger(__name__)

#: Index entries one pop looks at per queue (the tag filter may skip many).
SCAN_LIMIT = 256
#: RocketMQ refuses a pop that reached it this much after its poll time ran out.
TOO_LATE_MS = 500
#: A pop on a master still folding inherited state waits this long at most.
READY_WAIT_S = 3.0
#: Every n-th pop of a group reads the retry topic first (RocketMQ 5: requestCount % 5).
RETRY_FIRST_EVERY = 5


@dataclass
class _Request:
    """A checked pop request."""

    header: PopHeader
    topic: TopicConfig
    group: SubscriptionGroupConfig
    fifo: bool
    hashes: set[int] | None
    retry_topic: str

    @property
    def name(self) -> str:
        return self.header.consumer_group


@dataclass
class _Take:
    """What one pop takes from one queue."""

    topic: str
    queue_id: int
    ck_offset: int
    next_cursor: int
    #: The cursor moves (or a new queue's start is recorded) even if nothing is delivered.
    moved: bool
    #: (queue offset, retry count, raw record) per delivered message.
    delivered: list[tuple[int, int, bytes]] = field(default_factory=list)
    #: FIFO redelivery: the records' reconsume times are rewritten to the retry count.
    redelivery: bool = False
    rest: int = 0
    #: A blocked FIFO queue unblocks then (epoch ms).
    unblocks_at: int | None = None


class PopPath:
    """Answers POP_MESSAGE."""

    def __init__(self, ctx: MessagingContext, ledger: PopLedger,
                 young_queue: Callable[[str, int], bool]) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self._young_queue = young_queue
        #: Pops per group: picks the first queue of a -1 pop and when the retry topic leads.
        self._pops: dict[str, int] = {}

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.POP_MESSAGE: self.on_pop}

    def wake(self, grown: set[tuple[str, int]] | list[tuple[str, int]]) -> None:
        """The index grew for these (topic, queue id): answer the pops held on them."""
        if self.ledger.holding():
            self.ledger.wake({topic for topic, _ in grown})

    # --- the request -------------------------------------------------------------------

    async def on_pop(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            req = self._admit(PopHeader.from_ext(cmd.ext_fields))
            if not self.ledger.ready() and not await self.ledger.wait_ready(READY_WAIT_S):
                if self.ctx.role != "master":
                    self.ctx.check_writable()
                raise Refused(ResponseCode.SYSTEM_BUSY, self.ledger.behind())
            return await self._pop(cmd, req)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)

    def _admit(self, h: PopHeader) -> _Request:
        """Check a pop (RocketMQ's order of checks); Refused says why not."""
        ctx = self.ctx
        broker = ctx.config.broker_address
        if not 0 < h.max_msg_nums <= MAX_POP_MESSAGES:
            raise Refused(ResponseCode.INVALID_PARAMETER, f"the broker[{broker}] pop message's "
                          f"num must be 1..{MAX_POP_MESSAGES}, got {h.max_msg_nums}")
        if h.invisible_time <= 0:
            raise Refused(ResponseCode.INVALID_PARAMETER,
                          f"invisibleTime must be positive, got {h.invisible_time}")
        if h.born_time > 0 and self.ledger.now_ms() - h.born_time - h.poll_time > TOO_LATE_MS:
            raise Refused(ResponseCode.POLLING_TIMEOUT,
                          f"the broker[{broker}] pop message is timeout too much")
        ctx.check_writable()
        cfg = ctx.topics.get(h.topic)
        if cfg is None or h.topic == STATE_TOPIC:
            raise Refused(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic[{h.topic}] not exist, apply first please!")
        if not cfg.perm & PERM_READ:
            raise Refused(ResponseCode.NO_PERMISSION,
                          f"the topic[{h.topic}] peeking message is forbidden")
        if h.queue_id >= cfg.read_queue_nums:
            raise Refused(ResponseCode.INVALID_PARAMETER,
                          f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] "
                          f"topicConfig.readQueueNums:[{cfg.read_queue_nums}]")
        group = self.ledger.group(h.consumer_group)
        if group is None:
            raise Refused(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                          f"subscription group [{h.consumer_group}] does not exist")
        if not group.consume_enable:
            raise Refused(ResponseCode.NO_PERMISSION,
                          f"subscription group no permission, {h.consumer_group}")
        if h.exp_type and h.exp_type.upper() != "TAG":
            raise Refused(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                          f"the broker does not support consumer to filter message by "
                          f"{h.exp_type}; subscribe with a TAG expression")
        tags = parse_subscription(h.exp) if h.exp else None
        return _Request(h, cfg, group, h.order or group.consume_message_orderly,
                        None if tags is None else {tag_hash(t) for t in tags},
                        pop_retry_topic(h.consumer_group, h.topic))

    async def _pop(self, cmd: RemotingCommand, req: _Request) -> RemotingCommand:
        ctx = self.ctx
        hold_ms = min(max(req.header.poll_time, 0), ctx.config.long_polling_max_ms)
        deadline = time.monotonic() + hold_ms / 1000.0
        topics = [req.header.topic] if req.fifo else [req.header.topic, req.retry_topic]
        while True:
            answer, rest, unblocks_at = self._try_pop(cmd, req)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0 or ctx.closed or ctx.role != "master":
                return self._not_found(cmd, req, rest)
            if unblocks_at is not None:
                remaining = min(remaining, max(0.005, (unblocks_at - self.ledger.now_ms()) / 1000))
            fut = self.ledger.waiter(topics)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                self.ledger.forget(fut, topics)

    def _not_found(self, cmd: RemotingCommand, req: _Request, rest: int) -> RemotingCommand:
        h = req.header
        return cmd.response(ResponseCode.POLLING_TIMEOUT, "NO_MESSAGE_IN_QUEUE", {
            "popTime": self.ledger.now_ms(), "invisibleTime": h.invisible_time,
            "reviveQid": ORDER_REVIVE_QID if req.fifo else 0, "restNum": rest,
            "startOffsetInfo": "", "msgOffsetInfo": ""})

    # --- one attempt -------------------------------------------------------------------

    def _try_pop(self, cmd: RemotingCommand,
                 req: _Request) -> tuple[RemotingCommand | None, int, int | None]:
        """(the answer, or None to wait; messages left; when a blocked FIFO queue unblocks)."""
        now = self.ledger.now_ms()
        key = self.ledger.key()
        budget = req.header.max_msg_nums
        room = self.ctx.config.max_pull_bytes
        takes: list[_Take] = []
        unblocks: list[int] = []
        for topic, queue_id in self._sources(req):
            take = self._take(req, topic, queue_id, now, budget, room)
            if take is None:
                continue
            takes.append(take)
            budget -= len(take.delivered)
            room -= sum(len(raw) for _, _, raw in take.delivered)
            if take.unblocks_at is not None:
                unblocks.append(take.unblocks_at)
        rest = sum(t.rest for t in takes)
        batches = [[req.name, t.topic, t.queue_id, t.ck_offset, t.next_cursor,
                    [[off, rc] for off, rc, _ in t.delivered]]
                   for t in takes if t.delivered or t.moved]
        if batches:
            try:
                self.ledger.write(batch_record(now, req.header.invisible_time,
                                               self.ledger.epoch(), req.fifo, batches))
            except StoreError as exc:
                raise Refused(ResponseCode.SYSTEM_ERROR, f"pop not recorded: {exc}") from None
        if not any(t.delivered for t in takes):
            return None, rest, min(unblocks) if unblocks else None
        return self._found(cmd, req, takes, now, rest, key), rest, None

    def _sources(self, req: _Request) -> list[tuple[str, int]]:
        """(topic, queue id) in the order this pop reads them."""
        h = req.header
        n = self._pops.get(req.name, 0)
        self._pops[req.name] = n + 1
        if h.queue_id >= 0:
            queues = [h.queue_id]
        else:
            count = req.topic.read_queue_nums
            queues = [(n + i) % count for i in range(count)]
        main = [(h.topic, q) for q in queues]
        if req.fifo or self.ctx.index.queue(req.retry_topic, 0) is None:
            return main
        retry = [(req.retry_topic, 0)]
        return retry + main if n % RETRY_FIRST_EVERY == 0 else main + retry

    def _take(self, req: _Request, topic: str, queue_id: int, now: int, budget: int,
              room: int) -> _Take | None:
        """What this pop takes from one queue (None: the queue has never held anything)."""
        ctx = self.ctx
        q = ctx.index.queue(topic, queue_id)
        if q is None:
            return None
        lo, hi = q.min_offset, q.max_offset
        pq = self.ledger.pop.queue((req.name, topic, queue_id))
        if pq is None:
            cursor = initial_cursor(
                req.header.init_mode, lo, hi,
                committed=ctx.state.offsets.get(req.name, topic, queue_id),
                retry_topic=topic.startswith(RETRY_GROUP_TOPIC_PREFIX),
                young=self._young_queue(topic, queue_id))
            moved = True
        else:
            cursor, moved = max(pq.cursor, lo), pq.cursor < lo
        base = _Take(topic, queue_id, cursor, cursor, moved, rest=rest_count(hi, cursor))
        if req.fifo:
            gate, again = fifo_gate(pq, now, req.group.retry_max_times)
            if gate is FifoGate.BLOCKED:
                base.unblocks_at = fifo_unblocks_at(pq)
                return base
            if gate is FifoGate.DEAD_LETTER_PENDING:
                return base
            if gate is FifoGate.REDELIVER:
                return self._redeliver(base, req, again[:budget], room)
        if budget <= 0 or cursor >= hi:
            return base
        phys, sizes, tags = q.slice(cursor, SCAN_LIMIT)
        hashes = req.hashes if topic == req.header.topic else None
        sel = select(cursor, tags, sizes, hashes, budget, room)
        delivered, bad = self._read([(off, phys[off - cursor], sizes[off - cursor])
                                     for off in sel.offsets])
        next_cursor = sel.next_cursor if bad is None else bad
        base.delivered = [(off, record_reconsume_times(raw), raw) for off, raw in delivered]
        base.next_cursor = next_cursor
        base.moved = base.moved or next_cursor != cursor
        base.rest = rest_count(hi, next_cursor)
        return base

    def _redeliver(self, base: _Take, req: _Request, offsets: list[int], room: int) -> _Take:
        """A FIFO queue whose in-flight messages are all visible again: those, in order."""
        q = self.ctx.index.queue(base.topic, base.queue_id)
        assert q is not None
        pq = self.ledger.pop.queue((req.name, base.topic, base.queue_id))
        assert pq is not None
        wanted: list[tuple[int, int, int]] = []
        for off in offsets:
            entry = q.get(off)
            if entry is None:
                break  # deleted by retention: the reviver drops it
            if wanted and room - entry.size < 0:
                break
            room -= entry.size
            wanted.append((off, entry.commit_offset, entry.size))
        delivered, _ = self._read(wanted)
        base.delivered = [(off, pq.inflight[off].retry_count + 1, raw) for off, raw in delivered]
        base.redelivery = True
        if delivered:
            base.ck_offset = delivered[0][0]
        return base

    def _read(self, wanted: list[tuple[int, int, int]]) -> tuple[list[tuple[int, bytes]], int | None]:
        """The records at (queue offset, commit offset, size), up to the first whose CRC
        fails (its queue offset is returned: never served, and the cursor stops there)."""
        ctx = self.ctx
        verify = getattr(ctx.log, "verify", None)
        out: list[tuple[int, bytes]] = []
        for off, phys, size in wanted:
            if verify is not None and verify(phys, size) is not None:
                if not out:
                    raise Refused(ResponseCode.SYSTEM_ERROR,
                                  f"the record at commitlog offset {phys} on {ctx.broker_name}/"
                                  f"{ctx.broker_id} failed its CRC check and is not served; "
                                  f"run `rmqha scrub` on this store")
                return out, off
            out.append((off, bytes(ctx.log.read(phys, size))))
        return out, None

    # --- the answer --------------------------------------------------------------------

    def _found(self, cmd: RemotingCommand, req: _Request, takes: list[_Take], pop_time: int,
               rest: int, key: bytes) -> RemotingCommand:
        ctx = self.ctx
        h = req.header
        info = QueueInfo()
        parts: list[bytes] = []
        epoch = self.ledger.epoch()
        revive_qid = ORDER_REVIVE_QID if req.fifo else 0
        for t in takes:
            if not t.delivered:
                continue
            offsets = [off for off, _, _ in t.delivered]
            info.add(t.topic, t.queue_id, t.ck_offset, offsets,
                     [rc for _, rc, _ in t.delivered] if req.fifo else None)
            topic = original_topic(t.topic, req.name)
            for off, rc, raw in t.delivered:
                handle = ReceiptHandle(t.ck_offset, pop_time, h.invisible_time, revive_qid,
                                       retry_flag(t.topic), ctx.broker_name, t.queue_id, off,
                                       epoch, rc, t.topic)
                props = decode_properties(record_properties(raw))
                props[POP_CK] = handle.sign(key, req.name)
                # A retried message goes out under its original topic, as RocketMQ's.
                parts.append(rewrite_record(raw, props,
                                            topic=topic if topic != t.topic else None,
                                            reconsume_times=rc if t.redelivery else None))
        if ctx.metrics is not None:
            ctx.metrics.messages_served.inc(len(parts))
        body = b"".join(parts)
        if not reads_lz4(cmd):
            body = lz4_to_zlib(body)
        return cmd.response(ResponseCode.SUCCESS, "FOUND", {
            "popTime": pop_time, "invisibleTime": h.invisible_time, "reviveQid": revive_qid,
            "restNum": rest, **info.header()}, body)
