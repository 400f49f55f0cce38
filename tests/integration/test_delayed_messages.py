"""Delayed (delay levels) and timed (RocketMQ 5 TIMER_* properties) messages, in process.

Delivery is never early, nothing is visible on the real topic before it, progress survives
a restart without loss, and bad delay requests are refused by name.  The failover across
real processes is in ``test_transactions_cluster.py``.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from test_messaging import Env, LocalBroker, consume, create_topic, run

from rmqha.broker.config import BrokerConfig
from rmqha.client import Consumer, Message, Producer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ClientError, ConfigError, SendError
from rmqha.testing.ha import wait_until_async
from rmqha.messaging.delayed_delivery import SCHEDULE_TOPIC, TIMER_TOPIC, parse_delay_levels
from rmqha.protocol.message import Prop, encode_properties
from rmqha.net.client import RemotingClient
from rmqha.protocol.command import RemotingCommand

SHORT = {"message_delay_level": "300ms 600ms 1s", "timer_precision_ms": 50}


def test_delay_levels_parse_and_bad_levels_are_named() -> None:
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[
        -1] == 2 * 3600 * 1000
    assert parse_delay_levels("250ms 2d") == [250, 2 * 86_400_000]
    for bad, named in (("1s x", "level 2"), ("", "empty"), ("0s", "positive")):
        with pytest.raises(ConfigError, match=named):
            parse_delay_levels(bad)
    cfg = BrokerConfig(controller_addr=["127.0.0.1:1"], message_delay_level="1s 5q")
    with pytest.raises(ConfigError, match="message_delay_level"):
        cfg.validate()


def test_delay_level_and_timer_are_delivered_when_due_not_before(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**SHORT)
            await create_topic(b.address, "later", 1)
            async with Producer(env.namesrv) as p:
                started = int(time.time() * 1000)
                lvl = await p.send("later", Message(b"level-2", tags="L"), delay_level=2)
                at = await p.send("later", b"at", deliver_at=started + 400)
                ms = await p.send("later", Message(b"delay-ms",
                                                   properties={Prop.TIMER_DELAY_MS: "200"}))
                sec = await p.send("later", Message(b"delay-sec",
                                                    properties={Prop.TIMER_DELAY_SEC: "1"}))
                # Past due: stored on the topic at once.
                now = await p.send("later", b"now", deliver_at=started - 1000)
                # A level above the last is the last level (RocketMQ clamps it).
                top = await p.send("later", b"top", delay_level=99)
            assert all(r.ok for r in (lvl, at, ms, sec, now, top))
            # The answer names the queue sent to (the topic has one), not the level's queue.
            assert {r.queue.queue_id for r in (lvl, at, top)} == {0}
            assert b.svc.index.queue(SCHEDULE_TOPIC, 1).max_offset == 1
            assert b.svc.index.queue(SCHEDULE_TOPIC, 2).max_offset == 1
            assert b.svc.index.queue(TIMER_TOPIC, 0).max_offset == 3
            got = await consume(env.namesrv, "CG_LATER", "later", 6, timeout=15)
            by_body = {m.body: m for m in got}
            assert sorted(by_body) == sorted([b"level-2", b"at", b"delay-ms", b"delay-sec",
                                              b"now", b"top"])
            assert len(got) == 6
            due = {b"level-2": started + 600, b"at": started + 400, b"delay-ms": started + 200,
                   b"delay-sec": started + 1000, b"top": started + 1000}
            for body, when in due.items():
                m = by_body[body]
                # Stored on the real topic no earlier than due (store clock = this clock).
                assert m.store_timestamp >= when, (body, m.store_timestamp - when)
                assert Prop.DELAY not in m.properties and Prop.TIMER_DELAY_MS not in m.properties
                assert m.properties[Prop.REAL_TOPIC] == "later"
            assert by_body[b"level-2"].tags == "L"
            assert by_body[b"level-2"].msg_id == lvl.msg_id

    run(main())


def test_nothing_is_lost_across_a_restart(tmp_path: Path) -> None:
    # The last level and the timers fall due well after the restart, even on a busy machine.
    cfg = {**SHORT, "message_delay_level": "300ms 600ms 3s"}

    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**cfg)
            await create_topic(b.address, "durable", 1)
            async with Producer(env.namesrv) as p:
                first = [await p.send("durable", b"early-%d" % i, delay_level=1)
                         for i in range(5)]
                t0 = int(time.time() * 1000)
                rest = [await p.send("durable", b"late-%d" % i, delay_level=3)
                        for i in range(5)]
                rest += [await p.send("durable", b"timer-%d" % i, deliver_at=t0 + 3000 + i)
                         for i in range(5)]
            # The early ones are delivered, the late ones not yet: stop the broker now.
            await wait_until_async(lambda: b.svc.delayed.delivered >= 5, 10, "the early deliveries")
            assert b.svc.delayed.delivered < 15
            await b.stop()
            again = LocalBroker(tmp_path, "broker-a", env.namesrv, **cfg)
            again.port, again.address, again.store = b.port, b.address, b.store
            env.brokers.append(again)
            await again.start()
            assert again.svc.delayed.pending_timers() == 5
            want = {r.msg_id for r in first + rest}
            got = await consume_ids(env.namesrv, "CG_DURABLE", "durable", want, timeout=15)
            # At least once: a delivery whose progress was not yet written may repeat.
            assert want <= {m.msg_id for m in got}
            for m in got:
                if m.body.startswith(b"timer"):
                    assert m.store_timestamp >= t0 + 3000

    run(main())


async def consume_ids(namesrv: str, group: str, topic: str, want: set[str],
                      timeout: float) -> list[Any]:
    got: list[Any] = []
    async with Consumer(namesrv, group, topic) as c:
        deadline = time.monotonic() + timeout
        while not want <= {m.msg_id for m in got} and time.monotonic() < deadline:
            got += await c.poll(0.5)
    return got


def test_bad_delay_requests_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(timer_max_delay_s=60, **SHORT)
            async with RemotingClient(b.address) as rc:
                for props, named in (({Prop.TIMER_DELIVER_MS: "soon"}, "TIMER_DELIVER_MS"),
                                     ({Prop.TIMER_DELAY_SEC: "3600"}, "timer_max_delay_s"),
                                     ({Prop.DELAY: "x"}, "DELAY")):
                    resp = await rc.request(RemotingCommand.request(
                        RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": "bad", "e": 0, "f": 0,
                                                      "i": encode_properties(props).decode(),
                                                      "m": "false"}, b"x"))
                    assert resp.code == ResponseCode.MESSAGE_ILLEGAL, props
                    assert named in resp.remark
                for topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
                    resp = await rc.request(RemotingCommand.request(
                        RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": topic, "e": 0, "f": 0,
                                                      "m": "false"}, b"x"))
                    assert resp.code == ResponseCode.NO_PERMISSION
            async with Producer(env.namesrv, max_attempts=1) as p:
                with pytest.raises(ClientError, match="not both"):
                    await p.send("bad", b"x", delay_level=1, deliver_at=1)
                with pytest.raises(SendError, match="batch"):
                    await p.send_batch("bad", [Message(b"x", properties={Prop.DELAY: "1"})])
            assert b.svc.index.queue("bad", 0) is None

    run(main())
