"""The pieces behind MessageService, each built alone on a MessagingContext and a real
CommitLog (no server, no client): topic admin, state replication, consumer offsets, the
delayed-delivery transform and scheduler, the transaction fold, the timer progress fold."""
from __future__ import annotations

import os

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from rmqha.protocol.codes import ResponseCode
from rmqha.messaging.clients import ClientRegistry, QueueLocks
from rmqha.store.consume_queue import ConsumeQueueIndex
from rmqha.messaging.consumer_offsets import ConsumerOffsets
from rmqha.messaging.context import MessagingConfig, MessagingContext, Refused
from rmqha.messaging.delayed_delivery import (
    SCHEDULE_GROUP,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    DelayedDelivery,
)
from rmqha.messaging.log_writer import LogWriter
from rmqha.protocol.message import Prop
from rmqha.messaging.state import STATE_TOPIC, BrokerState, TimerProgress
from rmqha.messaging.state_replication import StateReplication
from rmqha.messaging.topic_admin import TopicAdmin
from rmqha.protocol.topics import TopicTable
from rmqha.messaging.transactions import COMMITTED_MARK, HALF_TOPIC, OP_TOPIC, Outcome, Transactions
from rmqha.store import CommitLog


class Pieces:
    def __init__(self, tmp: Path, now: list[float], **cfg: Any) -> None:
        self.log = CommitLog(tmp / "cl", segment_bytes=1 << 20, prefault=False)
        topics = TopicTable(tmp / "topics.json")
        self.ctx = MessagingContext(
            log=self.log, config=MessagingConfig(**cfg), broker_name="b", broker_id=0,
            replication=None, dir=tmp, topics=topics, state=BrokerState(topics),
            index=ConsumeQueueIndex(tmp / "consumequeue",
                                    [STATE_TOPIC, HALF_TOPIC, OP_TOPIC, TIMER_TOPIC],
                                    COMMITTED_MARK.encode()),
            clients=ClientRegistry(), locks=QueueLocks(), role="master")
        self.state_log = StateReplication(self.ctx)
        self.writer = LogWriter(self.ctx, self.confirmed)
        self.topics = TopicAdmin(self.ctx, self.state_log, self.writer)
        self.offsets = ConsumerOffsets(self.ctx, self.state_log)
        clock = lambda: now[0]  # noqa: E731
        self.delayed = DelayedDelivery(self.ctx, self.writer, self.topics, self.state_log,
                                       self.offsets, clock=clock)
        self.txn = Transactions(self.ctx, self.writer, self.topics, self.delayed, clock=clock)
        self.watch = {STATE_TOPIC: self.state_log.on_record, HALF_TOPIC: self.txn.on_half_record,
                      OP_TOPIC: self.txn.on_op_record, TIMER_TOPIC: self.delayed.on_timer_record}

    def confirmed(self, offset: int) -> None:
        self.ctx.index.advance(
            self.log, offset, lambda r: self.watch.get(r.topic, self.txn.on_committed_record)(r))


@pytest.fixture
def now() -> list[float]:
    return [1_700_000_000.0]


@pytest.fixture
def pieces(tmp_path: Path, now: list[float]):
    p = Pieces(tmp_path, now, message_delay_level="1s 2s", timer_max_delay_s=100)
    try:
        yield p
    finally:
        p.log.close()


def test_topic_admin_creates_through_the_state_log(pieces: Pieces) -> None:
    cfg = pieces.topics.ensure_topic("fresh")
    assert cfg is not None and cfg.write_queue_nums == 4
    pieces.confirmed(pieces.log.max_offset)
    # A second broker folding the same log gets the same table.
    other = BrokerState(TopicTable(pieces.ctx.dir / "other.json"))
    q = pieces.ctx.index.queue(STATE_TOPIC, 0)
    from rmqha.protocol.message import decode_record

    for i in range(len(q)):
        msg, _ = decode_record(pieces.log.read(q.phys[i], q.sizes[i]), inflate=False)
        other.apply(msg.body, persist=False)
    assert other.topics.get("fresh") == cfg
    pieces.ctx.role = "slave"
    assert pieces.topics.ensure_topic("not-on-a-slave") is None


def test_delay_transform_levels_and_timers(pieces: Pieces, now: list[float]) -> None:
    props = {Prop.DELAY: "9", Prop.TIMER_DELAY_SEC: "5"}
    assert pieces.delayed.transform("t", 3, props) == (SCHEDULE_TOPIC, 1)  # clamped to 2
    assert props == {Prop.DELAY: "2", Prop.REAL_TOPIC: "t", Prop.REAL_QID: "3"}
    props = {Prop.TIMER_DELAY_MS: "1500"}
    assert pieces.delayed.transform("t", 0, props) == (TIMER_TOPIC, 0)
    assert props[Prop.TIMER_OUT_MS] == str(int(now[0] * 1000) + 1500)
    past = {Prop.TIMER_DELIVER_MS: str(int(now[0] * 1000) - 1)}
    assert pieces.delayed.transform("t", 0, past) is None and past == {}
    with pytest.raises(Refused) as e:
        pieces.delayed.transform("t", 0, {Prop.TIMER_DELAY_SEC: "101"})
    assert e.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert pieces.delayed.transform("t", 0, {Prop.KEYS: "k"}) is None


def test_scheduler_delivers_when_due_by_its_clock(pieces: Pieces, now: list[float]) -> None:
    async def main() -> None:
        now[0] = time.time()  # store timestamps come from the wall clock
        pieces.topics.ensure_topic("t")
        for body, props in ((b"lvl", {Prop.DELAY: "1"}), (b"tmr", {Prop.TIMER_DELAY_MS: "5000"})):
            where = pieces.delayed.transform("t", 0, props)
            assert where is not None
            placed = await pieces.writer.append_rows(where[0], where[1],
                                                     [(body, props, 0, 0)], 0, 0, ("1.2.3.4", 5))
            await pieces.writer.await_durable(placed[0][0] + placed[0][1])
        stored = pieces.ctx.store_timestamp(pieces.ctx.index.queue(SCHEDULE_TOPIC, 0).phys[0])
        now[0] = max(now[0], stored / 1000.0) + 0.2
        assert await pieces.delayed.run_once() == 0  # neither is due yet
        assert pieces.delayed.pending_timers() == 1
        now[0] += 10
        assert await pieces.delayed.run_once() == 2
        q = pieces.ctx.index.queue("t", 0)
        assert q is not None and q.max_offset == 2
        assert pieces.delayed.pending_timers() == 0
        assert pieces.ctx.state.timer.low == 1
        assert pieces.ctx.state.offsets.get(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0) == 1
        assert await pieces.delayed.run_once() == 0  # nothing twice

    asyncio.run(main())


def test_timer_progress_folds_out_of_order_marks() -> None:
    t = TimerProgress()
    t.mark([2, 3])
    t.advance_low(0)
    assert (t.low, t.done) == (0, {2, 3}) and t.delivered(3) and not t.delivered(0)
    t.mark([0, 1])
    t.advance_low(0)
    assert (t.low, t.done) == (4, set())
    t.load({"low": 10, "done": [12, 9]})
    assert (t.low, t.done) == (10, {12})


def test_transactions_fold_half_and_op_records(pieces: Pieces) -> None:
    async def main() -> None:
        props = {Prop.UNIQ_KEY: "U1"}
        topic, qid, flag = Transactions.transform_half("t", 1, props, 0x4, "PG")
        assert (topic, qid, flag) == (HALF_TOPIC, 0, 0)
        assert props[Prop.TRANSACTION_ID] == "U1" and props[Prop.PRODUCER_GROUP] == "PG"
        placed = await pieces.writer.append_rows(topic, qid, [(b"h", props, 0, 0)], flag,
                                                 0, ("1.2.3.4", 5))
        await pieces.writer.await_durable(placed[0][0] + placed[0][1])
        assert [p.transaction_id for p in pieces.txn.pending.values()] == ["U1"]
        code, _ = await pieces.txn.end("PG", placed[0][0], Outcome.COMMIT)
        assert code == ResponseCode.SUCCESS and not pieces.txn.pending
        q = pieces.ctx.index.queue("t", 1)
        assert q is not None and q.max_offset == 1
        pieces.txn.reload()  # the same fold from the index alone
        assert not pieces.txn.pending and pieces.txn.outcome("U1") is Outcome.COMMIT

    asyncio.run(main())


def test_commit_without_its_op_record_still_closes_the_transaction(pieces: Pieces) -> None:
    """A crash between the committed message and the op record: whoever folds the log
    (a new master) sees the commit and never commits it a second time."""
    async def main() -> None:
        props = {Prop.UNIQ_KEY: "U2"}
        topic, qid, flag = Transactions.transform_half("t", 0, props, 0x4, "PG")
        placed = await pieces.writer.append_rows(topic, qid, [(b"h", props, 0, 0)], flag,
                                                 0, ("1.2.3.4", 5))
        await pieces.writer.await_durable(placed[0][0] + placed[0][1])
        real_append = pieces.writer.append_rows

        async def crash_before_op(topic: str, *args: Any) -> Any:
            if topic == OP_TOPIC:
                raise OSError("crashed before the op record")
            return await real_append(topic, *args)

        pieces.writer.append_rows = crash_before_op  # type: ignore[method-assign]
        with pytest.raises(OSError):
            await pieces.txn.end("PG", placed[0][0], Outcome.COMMIT)
        pieces.writer.append_rows = real_append  # type: ignore[method-assign]
        assert pieces.txn.pending  # the op record never came
        pieces.confirmed(pieces.log.max_offset)
        assert not pieces.txn.pending and pieces.txn.outcome("U2") is Outcome.COMMIT
        code, _ = await pieces.txn.end("PG", placed[0][0], Outcome.COMMIT)
        assert code == ResponseCode.SUCCESS
        assert pieces.ctx.index.queue("t", 0).max_offset == 1  # committed once

    asyncio.run(main())


def test_queue_index_extend_follows_the_rules_of_add(tmp_path: Path, caplog) -> None:
    """A run from the compiled walk grows a queue: appended at the end, already-held
    offsets skipped, a gap restarts the queue there (in a new file, pre-blank units first)."""
    import struct

    from rmqha.store.consume_queue import ConsumeQueueIndex

    def run(first: int, n: int) -> bytes:
        return b"".join(struct.pack(">qiq", 100 * (first + i), 50, first + i) for i in range(n))

    idx = ConsumeQueueIndex(tmp_path / "cq", units_per_file=4)
    q = idx._make_queue(b"T", 0)
    for first, n, skipped, held in [(5, 3, 0, range(5, 8)), (8, 2, 0, range(5, 10)),
                                    (6, 6, 4, range(5, 12)), (20, 2, 0, range(20, 22))]:
        assert q.extend(first, run(first, n)) == skipped
        assert [(q.base + i, q.phys[i], q.tags[i]) for i in range(len(q))] == [
            (k, 100 * k, k) for k in held]
    assert q.extend(20, run(20, 2)) == 2 and (q.base, q.max_offset) == (20, 22)
    assert "gap from 12 to 20" in caplog.text
    assert sorted(os.listdir(tmp_path / "cq" / "T" / "0")) == [f"{20 * 20:020d}"]
    idx.close()
