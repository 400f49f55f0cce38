"""Pop consumption (RocketMQ 5) with raw remoting requests against in-process brokers.

Each test starts :class:`test_messaging.Env` (a name server and a LocalBroker: commitlog,
MessageService, RemotingServer) and speaks RocketMQ's wire format as its Java client does:
POP_MESSAGE, ACK_MESSAGE with the message's ``POP_CK`` as ``extraInfo``,
BATCH_ACK_MESSAGE with RocketMQ's body (plus the handles in ``rh``),
CHANGE_MESSAGE_INVISIBLETIME; subscription groups and topic attributes as mqadmin sets
them.  Times are short: revive every 50 ms, delay levels of 100 ms.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from test_messaging import Env, LocalBroker, create_topic, run

from rmqha.cli import main as rmqha_cli
from rmqha.client import Producer
from rmqha.messaging.state import STATE_TOPIC
from rmqha.net.client import RemotingClient
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.message import ReceivedMessage, decode_records, encode_properties
from rmqha.protocol.pop import bitset_encode, pop_retry_topic

#: Quick revive and retry backoff (delay levels 1..8 of 100 ms).
QUICK = {"pop_revive_interval_ms": 50, "timer_precision_ms": 50,
         "message_delay_level": " ".join(["100ms"] * 8)}


async def pop(c: RemotingClient, group: str, topic: str, *, queue_id: int = -1, n: int = 32,
              invisible: int = 30_000, poll: int = 0, init: int = 0, exp: str | None = None,
              order: bool = False) -> tuple[RemotingCommand, list[ReceivedMessage]]:
    ext: dict[str, Any] = {"consumerGroup": group, "topic": topic, "queueId": queue_id,
                           "maxMsgNums": n, "invisibleTime": invisible, "pollTime": poll,
                           "bornTime": int(time.time() * 1000), "initMode": init,
                           "order": str(order).lower()}
    if exp is not None:
        ext.update(exp=exp, expType="TAG")
    resp = await c.request(RemotingCommand.request(RequestCode.POP_MESSAGE, ext), poll / 1000 + 5)
    return resp, decode_records(resp.body) if resp.code == ResponseCode.SUCCESS else []


def fields(m: ReceivedMessage) -> list[str]:
    return m.properties["POP_CK"].split(" ")


def ack_ext(group: str, m: ReceivedMessage, handle: str | None = None) -> dict[str, Any]:
    """The header RocketMQ's Java client builds from a popped message (its ackAsync)."""
    f = (handle or m.properties["POP_CK"]).split(" ")
    topic = pop_retry_topic(group, m.topic) if f[4] == "1" else m.topic
    return {"consumerGroup": group, "topic": topic, "queueId": int(f[6]), "offset": int(f[7]),
            "extraInfo": handle or m.properties["POP_CK"]}


async def ack(c: RemotingClient, group: str, m: ReceivedMessage,
              handle: str | None = None) -> RemotingCommand:
    return await c.request(RemotingCommand.request(RequestCode.ACK_MESSAGE,
                                                   ack_ext(group, m, handle)))


async def change(c: RemotingClient, group: str, m: ReceivedMessage, invisible: int,
                 handle: str | None = None) -> RemotingCommand:
    ext = {**ack_ext(group, m, handle), "invisibleTime": invisible}
    return await c.request(RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext))


async def batch_ack(c: RemotingClient, group: str, msgs: list[ReceivedMessage], *,
                    handles: list[str] | None = None, signed: bool = True) -> RemotingCommand:
    """RocketMQ's BatchAckMessageRequestBody for messages of one pop and queue."""
    f = fields(msgs[0])
    start = int(f[0])
    entry: dict[str, Any] = {"c": group, "t": msgs[0].topic, "r": f[4], "so": start,
                             "q": int(f[6]), "rq": int(f[3]), "pt": int(f[1]), "it": int(f[2]),
                             "b": bitset_encode(int(fields(m)[7]) - start for m in msgs)}
    if signed:
        entry["rh"] = handles or [m.properties["POP_CK"] for m in msgs]
    body = json.dumps({"brokerName": "broker-a", "acks": [entry]}).encode()
    return await c.request(RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, body))


async def update_group(c: RemotingClient, group: str, **cfg: Any) -> None:
    resp = await c.request(RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, {"groupName": group, **cfg}))
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def send_raw(c: RemotingClient, topic: str, body: bytes, queue_id: int = 0,
                   **props: str) -> RemotingCommand:
    return await c.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "p", "b": topic, "e": queue_id, "f": 0, "g": int(time.time() * 1000), "h": 0,
        "i": encode_properties({"UNIQ_KEY": f"{topic}-{body.decode()}", **props}).decode(), "j": 0,
        "m": "false"}, body))


def in_flight(b: LocalBroker) -> int:
    return b.svc.state.pop.in_flight_count()


# --- pop, ack, batch ack, change -----------------------------------------------------------


def test_pop_ack_batch_ack_and_change_invisible(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "PT", 2)
            async with Producer(env.namesrv) as p, RemotingClient(b.address) as c:
                sent = await p.send_batch("PT", [b"a%d" % i for i in range(3)], queue_id=0)
                sent += await p.send_batch("PT", [b"b%d" % i for i in range(3)], queue_id=1)
                resp, msgs = await pop(c, "g", "PT", n=4, init=0)
                assert resp.code == ResponseCode.SUCCESS and len(msgs) == 4
                h = resp.ext_fields
                assert h["invisibleTime"] == "30000" and h["reviveQid"] == "0"
                assert h["restNum"] == "2"
                # Each message names its pop in POP_CK, as RocketMQ's extraInfo.
                for m in msgs:
                    f = fields(m)
                    assert (f[1], f[2], f[5], int(f[6]), int(f[7])) == (
                        h["popTime"], "30000", "broker-a", m.queue_id, m.queue_offset)
                    assert f[10] == "PT" and len(f) == 12
                assert {m.msg_id for m in msgs} < {r.msg_id for r in sent}
                by_q = {q: [m for m in msgs if m.queue_id == q] for q in (0, 1)}
                infos = dict(part.split(" ", 1) for part in h["msgOffsetInfo"].split(";"))
                assert infos  # "0 <queueId> o1,o2" per queue read
                first, second, third, fourth = msgs
                assert in_flight(b) == 4

                assert (await ack(c, "g", first)).code == ResponseCode.SUCCESS
                again = await ack(c, "g", first)
                assert again.code == ResponseCode.NO_MESSAGE
                assert again.ext_fields["receiptStatus"] == "NOT_IN_FLIGHT"
                assert "acked already" in again.remark

                # Batch ack of two messages of one queue.
                pair = [m for m in (second, third, fourth)
                        if m.queue_id == (second.queue_id)][:2]
                rest = [m for m in (second, third, fourth) if m not in pair]
                resp = await batch_ack(c, "g", pair)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                assert [r["status"] for r in json.loads(resp.body)["results"]] == ["OK"] * len(pair)

                # Change the invisible time: a new handle; the old one is superseded.
                target = rest[0]
                ch = await change(c, "g", target, 60_000)
                assert ch.code == ResponseCode.SUCCESS, ch.remark
                new = ch.ext_fields["extraInfo"]
                assert ch.ext_fields["invisibleTime"] == "60000"
                assert new.split(" ")[1] == ch.ext_fields["popTime"] != fields(target)[1]
                old = await ack(c, "g", target)
                assert old.ext_fields["receiptStatus"] == "SUPERSEDED"
                assert (await ack(c, "g", target, new)).code == ResponseCode.SUCCESS
                for m in rest[1:]:
                    assert (await ack(c, "g", m)).code == ResponseCode.SUCCESS
                assert in_flight(b) == 0
                assert len(by_q[0]) + len(by_q[1]) == 4

                # The last two: a batch ack without the handles is refused, nothing changes.
                resp, last = await pop(c, "g", "PT")
                assert len(last) == 2 and in_flight(b) == 2
                bare = await batch_ack(c, "g", last[:1], signed=False)
                assert bare.code == ResponseCode.MESSAGE_ILLEGAL
                assert bare.ext_fields["receiptStatus"] == "UNSIGNED" and in_flight(b) == 2
                for m in last:
                    assert (await ack(c, "g", m)).code == ResponseCode.SUCCESS
                resp, none = await pop(c, "g", "PT", poll=200)
                assert resp.code == ResponseCode.POLLING_TIMEOUT and not none
                assert resp.ext_fields["restNum"] == "0"
                got = {m.msg_id for m in msgs + last}
                assert got == {r.msg_id for r in sent}

    run(main())


def test_pop_is_held_until_a_message_arrives(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "LP", 1)
            async with Producer(env.namesrv) as p, RemotingClient(b.address) as c:
                started = time.monotonic()
                pending = asyncio.ensure_future(pop(c, "g", "LP", poll=10_000))
                await asyncio.sleep(0.3)
                assert not pending.done()
                await p.send("LP", b"wake")
                resp, msgs = await pending
                assert resp.code == ResponseCode.SUCCESS and time.monotonic() - started < 5
                assert [m.body for m in msgs] == [b"wake"]
                # A tag filter skips what it leaves out (the cursor passes it).
                await p.send_batch("LP", [b"x"], queue_id=0)
                from rmqha.client import Message
                await p.send("LP", Message(b"tagged", tags="A"))
                resp, msgs = await pop(c, "g", "LP", exp="A", poll=2_000)
                assert [m.body for m in msgs] == [b"tagged"]

    run(main())


# --- redelivery, retry topic, dead letters ---------------------------------------------------


def test_expired_pop_is_redelivered_through_the_retry_topic(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**QUICK)
            await create_topic(b.address, "RT", 1)
            async with Producer(env.namesrv) as p, RemotingClient(b.address) as c:
                sent = await p.send("RT", b"again")
                _, first = await pop(c, "g", "RT", invisible=200)
                assert [m.msg_id for m in first] == [sent.msg_id]
                # Not acked: after 200 ms it goes to %RETRY%g_RT (100 ms of backoff) and back.
                resp, again = await pop(c, "g", "RT", poll=5_000)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                m = again[0]
                assert (m.msg_id, m.body, m.topic, m.reconsume_times) == (
                    sent.msg_id, b"again", "RT", 1)
                f = fields(m)
                assert f[4] == "1" and f[10] == pop_retry_topic("g", "RT") and f[9] == "1"
                assert m.properties["1ST_POP_TIME"] == fields(first[0])[1]
                assert b.svc.pop_reviver.retried == 1 and b.svc.delayed.delivered >= 1
                # The first handle expired; the new one acks (Java names the retry topic).
                late = await ack(c, "g", first[0])
                assert late.ext_fields["receiptStatus"] == "EXPIRED"
                assert (await ack(c, "g", m)).code == ResponseCode.SUCCESS
                resp, none = await pop(c, "g", "RT", poll=400)
                assert resp.code == ResponseCode.POLLING_TIMEOUT and not none

    run(main())


def test_dead_letter_after_the_groups_retry_max(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**QUICK)
            await create_topic(b.address, "DT", 1)
            async with Producer(env.namesrv) as p, RemotingClient(b.address) as c:
                await update_group(c, "dg", retryMaxTimes=2)
                sent = await p.send("DT", b"poison")
                deliveries: list[int] = []
                deadline = time.monotonic() + 20
                while b.svc.pop_reviver.dead_lettered == 0 and time.monotonic() < deadline:
                    _, msgs = await pop(c, "dg", "DT", invisible=100, poll=1_000)
                    deliveries += [m.reconsume_times for m in msgs if m.msg_id == sent.msg_id]
                # Delivered with 0, 1 and 2 earlier deliveries, then dead-lettered.
                assert deliveries == [0, 1, 2]
                dead: list[ReceivedMessage] = []
                deadline = time.monotonic() + 5
                while not dead and time.monotonic() < deadline:
                    dlq = await c.request(dlq_pull())
                    if dlq.code == ResponseCode.SUCCESS:
                        dead = decode_records(dlq.body)
                    else:
                        await asyncio.sleep(0.05)  # the copy is being confirmed
                assert [(m.msg_id, m.properties["RETRY_TOPIC"], m.reconsume_times)
                        for m in dead] == [(sent.msg_id, "DT", 3)]
                resp, none = await pop(c, "dg", "DT", poll=300)
                assert resp.code == ResponseCode.POLLING_TIMEOUT and not none
                assert in_flight(b) == 0

    run(main())


def dlq_pull() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "audit", "topic": "%DLQ%dg", "queueId": 0, "queueOffset": 0,
        "maxMsgNums": 8, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subscription": "*"})


# --- FIFO -------------------------------------------------------------------------------------


class FifoCheck:
    """A FIFO group's deliveries checked as they happen, by each message group's sequence
    numbers (bodies ``<group>:<seq>``, sent in order from 0):

    * a pop may return a queue's messages only when none of that queue is in flight (popped,
      not acked), whoever holds them;
    * each message group's messages in a pop are the next ones owed, consecutively: the
      first the lowest not yet acked;
    * each ack is of the next message owed.

    Problems are collected, not raised, so a control can show the check fires."""

    def __init__(self, groups: list[str]) -> None:
        self.next_seq = {g: 0 for g in groups}
        self.in_flight: dict[int, int] = {}
        self.problems: list[str] = []
        self.acked = 0
        self.pops: dict[str, int] = {}
        self.refused_pops: dict[str, int] = {}

    def popped(self, popper: str, msgs: list[ReceivedMessage]) -> None:
        if not msgs:
            self.refused_pops[popper] = self.refused_pops.get(popper, 0) + 1
            return
        self.pops[popper] = self.pops.get(popper, 0) + 1
        for q in sorted({m.queue_id for m in msgs}):
            if self.in_flight.get(q):
                self.problems.append(f"{popper} popped queue {q} while {self.in_flight[q]} of it are in flight")
        owed = dict(self.next_seq)
        for m in msgs:
            group, seq = _group_seq(m)
            if seq != owed[group]:
                self.problems.append(f"{popper} popped {group}:{seq} where {group}:{owed[group]} was owed")
            owed[group] = seq + 1
            self.in_flight[m.queue_id] = self.in_flight.get(m.queue_id, 0) + 1

    def acked_one(self, popper: str, m: ReceivedMessage) -> None:
        group, seq = _group_seq(m)
        if seq != self.next_seq[group]:
            self.problems.append(f"{popper} acked {group}:{seq} where {group}:{self.next_seq[group]} was owed")
        self.next_seq[group] = max(self.next_seq[group], seq + 1)
        self.in_flight[m.queue_id] -= 1
        self.acked += 1


def _group_seq(m: ReceivedMessage) -> tuple[str, int]:
    group, _, seq = m.body.decode().partition(":")
    return group, int(seq)


async def send_fifo(c: RemotingClient, topic: str, *, keys: int, per_key: int,
                    swap: tuple[int, int] | None = None) -> list[str]:
    """A FIFO topic of two queues and ``keys`` message groups (group k on queue k % 2),
    ``per_key`` messages each sent in sequence order; ``swap``: group 0's messages of
    those two sequence numbers sent in each other's place (the disorder a control injects).
    Returns the message groups."""
    resp = await create_topic(c.addr, topic, 2, attributes="+message.type=FIFO")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    groups = [f"{topic}-order-{k}" for k in range(keys)]
    for seq in range(per_key):
        for k, mg in enumerate(groups):
            sent = seq
            if swap is not None and k == 0 and seq in swap:
                sent = swap[1] if seq == swap[0] else swap[0]
            resp = await send_raw(c, topic, f"{mg}:{sent}".encode(), queue_id=k % 2, __SHARDINGKEY=mg)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
    return groups


async def fifo_schedule(address: str, group: str, topic: str, queues: list[int], check: FifoCheck,
                        total: int) -> None:
    """Two poppers, A and B, on their own connections, in a fixed order per queue: A pops
    three and holds them; B pops the same queue, and A again (a FIFO group must give
    neither anything while A's are in flight); then every popped message is acked in
    order.  Until ``total`` are acked, or a round gives nothing (a problem)."""
    async with RemotingClient(address) as a, RemotingClient(address) as b:
        conns = {"A": a, "B": b}
        while check.acked < total:
            got = 0
            for q in queues:
                held: list[tuple[str, ReceivedMessage]] = []
                for popper in ("A", "B", "A"):
                    _, msgs = await pop(conns[popper], group, topic, queue_id=q, n=3, invisible=10_000)
                    check.popped(popper, msgs)
                    held += [(popper, m) for m in msgs]
                for popper, m in held:
                    r = await ack(conns[popper], group, m)
                    assert r.code == ResponseCode.SUCCESS, r.remark
                    check.acked_one(popper, m)
                got += len(held)
            if not got:
                check.problems.append(f"a round gave nothing with {check.acked} of {total} acked")
                return


def test_fifo_order_holds_under_two_poppers(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**QUICK)
            assert (await create_topic(b.address, "FT", 2, attributes="+message.type=FIFO")
                    ).code == ResponseCode.SUCCESS
            async with RemotingClient(b.address) as c:
                await update_group(c, "fg", consumeMessageOrderly=True)
                groups = [f"order-{k}" for k in range(4)]  # for the redelivery below
                for seq in range(10):
                    for k, mg in enumerate(groups):
                        resp = await send_raw(c, "FT", f"{mg}:{seq}".encode(), queue_id=k % 2,
                                              __SHARDINGKEY=mg)
                        assert resp.code == ResponseCode.SUCCESS, resp.remark

                # A popper that never acks blocks its queue until the invisible time ends;
                # then the same messages come again, before anything after them.
                resp, held = await pop(c, "fg", "FT", queue_id=0, n=3, invisible=300)
                assert resp.ext_fields["reviveQid"] == "999" and len(held) == 3
                _, blocked = await pop(c, "fg", "FT", queue_id=0)
                assert blocked == []
                _, redelivered = await pop(c, "fg", "FT", queue_id=0, n=8, poll=3_000)
                assert [m.queue_offset for m in redelivered] == [m.queue_offset for m in held]
                assert all(m.reconsume_times == 1 for m in redelivered)
                for m in redelivered:
                    assert (await ack(c, "fg", m)).code == ResponseCode.SUCCESS

                # Two poppers on every queue in a fixed schedule, each pop and ack
                # checked as it happens (FifoCheck): deterministic, so disorder is
                # exposed on every run, not when the poppers happen to race.
                groups2 = await send_fifo(c, "FT2", keys=4, per_key=10)
                await update_group(c, "fg2", consumeMessageOrderly=True)
                check = FifoCheck(groups2)
                await fifo_schedule(b.address, "fg2", "FT2", [0, 1], check, total=40)
                assert check.problems == [] and check.acked == 40, check.problems
                assert check.pops["A"] and check.refused_pops["B"], (check.pops, check.refused_pops)

    run(main())


def test_fifo_check_fires_on_disorder_stored_or_delivered(tmp_path: Path) -> None:
    """The negative controls of FifoCheck, on the same schedule: a message group stored
    out of order (two sequence numbers swapped at send), and a group that is not orderly
    (it hands B the next messages of a queue while A holds earlier ones).  Each must be
    caught on every run."""
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**QUICK)
            async with RemotingClient(b.address) as c:
                swapped = await send_fifo(c, "FS", keys=2, per_key=6, swap=(2, 3))
                await update_group(c, "fs", consumeMessageOrderly=True)
                check = FifoCheck(swapped)
                await fifo_schedule(b.address, "fs", "FS", [0, 1], check, total=12)
                assert f"A popped {swapped[0]}:3 where {swapped[0]}:2 was owed" in check.problems, check.problems
                assert all(swapped[0] in p for p in check.problems), check.problems

                plain = await send_fifo(c, "FP", keys=2, per_key=6)
                check = FifoCheck(plain)
                await fifo_schedule(b.address, "plain", "FP", [0, 1], check, total=12)
                assert any(p.startswith("B popped queue 0 while 3 of it are in flight") for p in check.problems), \
                    check.problems

    run(main())


# --- side by side, forgery, message types ------------------------------------------------------


def test_pop_and_pull_groups_side_by_side(tmp_path: Path) -> None:
    async def main() -> None:
        from test_messaging import consume
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "SS", 2)
            async with Producer(env.namesrv) as p, RemotingClient(b.address) as c:
                sent = {r.msg_id for r in await p.send_batch("SS", [b"x%d" % i for i in range(10)],
                                                             queue_id=0)}
                sent |= {r.msg_id for r in await p.send_batch("SS", [b"y%d" % i for i in range(10)],
                                                              queue_id=1)}
                pulled = await consume(env.namesrv, "pullers", "SS", 20)
                popped: list[ReceivedMessage] = []
                while len(popped) < 20:
                    _, msgs = await pop(c, "poppers", "SS", poll=1_000)
                    assert msgs
                    popped += msgs
                    for m in msgs:
                        assert (await ack(c, "poppers", m)).code == ResponseCode.SUCCESS
                assert {m.msg_id for m in pulled} == sent == {m.msg_id for m in popped}
                # The pull group's offsets and the pop group's progress are separate.
                more = await p.send("SS", b"late")
                _, msgs = await pop(c, "poppers", "SS", poll=2_000)
                assert [m.msg_id for m in msgs] == [more.msg_id]
                again = await consume(env.namesrv, "pullers", "SS", 1)
                assert [m.msg_id for m in again] == [more.msg_id]

    run(main())


def test_forged_handles_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "FG", 1)
            async with Producer(env.namesrv) as p, RemotingClient(b.address) as c:
                await p.send_batch("FG", [b"one", b"two"], queue_id=0)
                _, (one, two) = await pop(c, "g", "FG")
                before = json.dumps(b.svc.state.pop.to_json(), sort_keys=True)
                state_end = b.svc.index.queue(STATE_TOPIC, 0).max_offset
                parts = fields(one)
                # One's handle re-pointed at two's offset (signature kept).
                moved = " ".join(parts[:7] + [str(two.queue_offset)] + parts[8:])
                # RocketMQ's unsigned 8-field extraInfo, another group, another broker.
                unsigned = " ".join(parts[:8])
                other_broker = " ".join(parts[:5] + ["broker-b"] + parts[6:])
                cases = [
                    (await ack(c, "g", two, moved), "FORGED", ResponseCode.MESSAGE_ILLEGAL),
                    (await ack(c, "intruder", one), "FORGED", ResponseCode.MESSAGE_ILLEGAL),
                    (await ack(c, "g", one, unsigned), "UNSIGNED", ResponseCode.MESSAGE_ILLEGAL),
                    (await ack(c, "g", one, other_broker), "WRONG_BROKER",
                     ResponseCode.MESSAGE_ILLEGAL),
                    (await change(c, "g", two, 1, moved), "FORGED", ResponseCode.MESSAGE_ILLEGAL),
                    (await batch_ack(c, "g", [two], handles=[moved]), "FORGED",
                     ResponseCode.MESSAGE_ILLEGAL),
                ]
                # A genuine handle with a request naming another message.
                mismatch = await c.request(RemotingCommand.request(RequestCode.ACK_MESSAGE, {
                    **ack_ext("g", one), "offset": two.queue_offset}))
                cases.append((mismatch, "MISMATCH", ResponseCode.MESSAGE_ILLEGAL))
                for resp, status, code in cases:
                    assert (resp.code, resp.ext_fields.get("receiptStatus")) == (code, status), (
                        resp.remark)
                    assert resp.remark
                assert json.dumps(b.svc.state.pop.to_json(), sort_keys=True) == before
                assert b.svc.index.queue(STATE_TOPIC, 0).max_offset == state_end
                # The control: the genuine handles ack, and that does change the state.
                assert (await ack(c, "g", one)).code == ResponseCode.SUCCESS
                assert (await ack(c, "g", two)).code == ResponseCode.SUCCESS
                assert in_flight(b) == 0

    run(main())


def test_topic_message_types_groups_by_cli_and_internal_state(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            ns = env.namesrv
            code = await asyncio.to_thread(rmqha_cli, [
                "update-topic", "-n", ns, "-t", "Fifo", "-r", "2", "-a", "+message.type=FIFO"])
            assert code == 0
            code = await asyncio.to_thread(rmqha_cli, [
                "update-topic", "-n", ns, "-t", "Bad", "-a", "+message.type=BOGUS"])
            assert code == 1 and "Bad" not in b.svc.topics
            code = await asyncio.to_thread(rmqha_cli, [
                "update-sub-group", "-n", ns, "-c", "c", "-g", "ordered", "-o", "true", "-r", "5"])
            assert code == 0
            assert b.svc.topics.get("Fifo").attributes == {"message.type": "FIFO"}
            async with RemotingClient(b.address) as c:
                groups = await c.request(RemotingCommand.request(
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
                cfg = groups.json_body()["subscriptionGroupTable"]["ordered"]
                assert cfg["consumeMessageOrderly"] is True and cfg["retryMaxTimes"] == 5
                normal = await send_raw(c, "Fifo", b"n")
                assert normal.code == ResponseCode.MESSAGE_ILLEGAL
                assert "expected type is FIFO, but actual type is NORMAL" in normal.remark
                fifo = await send_raw(c, "Fifo", b"f", __SHARDINGKEY="g1")
                assert fifo.code == ResponseCode.SUCCESS
                delayed = await send_raw(c, "Fifo", b"d", DELAY="1", __SHARDINGKEY="g1")
                assert delayed.code == ResponseCode.MESSAGE_ILLEGAL
                # An update without attributes keeps them; a topic without any takes anything.
                assert (await create_topic(b.address, "Fifo", 2)).code == ResponseCode.SUCCESS
                assert b.svc.topics.get("Fifo").attributes == {"message.type": "FIFO"}
                await create_topic(b.address, "Plain", 1)
                assert (await send_raw(c, "Plain", b"d", DELAY="1")).code == ResponseCode.SUCCESS
                assert (await send_raw(c, "Plain", b"p")).code == ResponseCode.SUCCESS
                # The orderly group's pops are FIFO even when the request does not say so.
                resp, msgs = await pop(c, "ordered", "Fifo", poll=1_000)
                assert resp.ext_fields["reviveQid"] == "999" and len(msgs) == 1
                # The broker's state topic (holding the handle key) is not served.
                pull = await c.request(RemotingCommand.request(RequestCode.PULL_MESSAGE, {
                    "consumerGroup": "x", "topic": STATE_TOPIC, "queueId": 0, "queueOffset": 0,
                    "maxMsgNums": 8, "sysFlag": 0, "commitOffset": 0,
                    "suspendTimeoutMillis": 0, "subscription": "*"}))
                assert pull.code == ResponseCode.NO_PERMISSION
                state_rec = b.svc.index.queue(STATE_TOPIC, 0).get(0).commit_offset
                view = await c.request(RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                                               {"offset": state_rec}))
                assert view.code == ResponseCode.NO_PERMISSION
                plain_rec = b.svc.index.queue("Plain", 0).get(0).commit_offset
                view = await c.request(RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                                               {"offset": plain_rec}))
                assert view.code == ResponseCode.SUCCESS

    run(main())


def test_pop_state_and_key_survive_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "RS", 1)
            async with Producer(env.namesrv) as p:
                await p.send_batch("RS", [b"k0", b"k1", b"k2"], queue_id=0)
            async with RemotingClient(b.address) as c:
                _, msgs = await pop(c, "g", "RS")
                assert (await ack(c, "g", msgs[0])).code == ResponseCode.SUCCESS
            await b.stop()
            env.brokers.remove(b)
            again = LocalBroker(tmp_path, "broker-a", env.namesrv)
            again.store = b.store
            env.brokers.append(again)
            await again.start()
            assert again.svc.state.pop.in_flight_count() == 2
            async with RemotingClient(again.address) as c:
                # The handles of the first life still ack; nothing new to pop.
                assert (await ack(c, "g", msgs[1])).code == ResponseCode.SUCCESS
                assert (await ack(c, "g", msgs[0])).ext_fields["receiptStatus"] == "NOT_IN_FLIGHT"
                _, none = await pop(c, "g", "RS", poll=200)
                assert none == []
                assert (await ack(c, "g", msgs[2])).code == ResponseCode.SUCCESS

    run(main())
