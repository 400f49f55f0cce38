"""The official RocketMQ client (PyPI ``rocketmq`` 0.4.4, C++ 1.2.x inside) against rmqha.

The official client runs in a child process (this file is also its driver: ``python
tests/integration/test_official_client.py produce|consume ...``), so a crash in the C++ library
cannot take pytest down and every run ends cleanly.  The driver writes one JSON line per
acknowledged send or received message and flushes it at once, so a test can count what
was acknowledged even when the run is cut short.

Here the brokers are in-process (``LocalBroker`` from test_messaging); the failover runs
with real broker processes are in ``test_messaging_cluster.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).resolve()


def _driver_produce(namesrv: str, topic: str, count: int, out: str, start: int = 0,
                    size: int = 0, interval_ms: int = 0, deadline_s: float = 60.0) -> int:
    from rocketmq.client import Message, Producer

    producer = Producer("PG_OFFICIAL", timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    failures = 0
    end = time.monotonic() + deadline_s
    with open(out, "a", encoding="utf-8") as f:
        i = start
        while i < start + count and time.monotonic() < end:
            msg = Message(topic)
            msg.set_keys(f"k{i}")
            msg.set_tags("TagA")
            body = (f"m{i}:" + "x" * size).encode()
            msg.set_body(body)
            try:
                res = producer.send_sync(msg)
            except Exception as exc:  # the binding raises its own exception types
                failures += 1
                f.write(json.dumps({"error": str(exc)[:200], "i": i}) + "\n")
                f.flush()
                time.sleep(0.2)
                continue
            f.write(json.dumps({"i": i, "status": int(res.status), "msg_id": res.msg_id,
                                "offset": res.offset}) + "\n")
            f.flush()
            i += 1
            if interval_ms:
                time.sleep(interval_ms / 1000.0)
    if failures:
        # The C++ 1.2 client may abort in shutdown() after a send that failed every retry
        # (terminate on boost::thread_interrupted from its retry thread); what is under
        # test is already written and flushed, so leave without it.
        os._exit(0)
    producer.shutdown()
    return 0


def _driver_produce_delayed(namesrv: str, topic: str, count: int, level: int, out: str) -> int:
    """send_sync with Message.set_delay_time_level (the binding has no timer properties)."""
    from rocketmq.client import Message, Producer

    producer = Producer("PG_OFFICIAL_DELAY", timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    with open(out, "a", encoding="utf-8") as f:
        for i in range(count):
            msg = Message(topic)
            msg.set_keys(f"d{i}")
            msg.set_body(f"delayed{i}".encode())
            msg.set_delay_time_level(level)
            res = producer.send_sync(msg)
            f.write(json.dumps({"i": i, "status": int(res.status), "msg_id": res.msg_id,
                                "sent_ms": int(time.time() * 1000)}) + "\n")
            f.flush()
    producer.shutdown()
    return 0


def _driver_consume(namesrv: str, group: str, topic: str, want: int, out: str,
                    timeout_s: float, fail_first: bool = False, orderly: bool = False) -> int:
    from rocketmq.client import PushConsumer

    seen: set[str] = set()
    f = open(out, "a", encoding="utf-8")

    def on_message(msg: Any) -> Any:
        body = msg.body.decode("utf-8", "replace")
        failing = fail_first and msg.reconsume_times == 0
        f.write(json.dumps({"msg_id": msg.id, "body": body[:40], "len": len(body),
                            "queue_id": msg.queue_id, "offset": msg.queue_offset,
                            "topic": msg.topic, "reconsume": msg.reconsume_times,
                            "failed": failing}) + "\n")
        f.flush()
        if failing:
            # RECONSUME_LATER: the client sends it back (CONSUMER_SEND_MSG_BACK).
            raise RuntimeError("failing the first delivery on purpose")
        seen.add(msg.id)

    consumer = PushConsumer(group, orderly=orderly)
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(topic, on_message)
    consumer.start()
    end = time.monotonic() + timeout_s
    while len(seen) < want and time.monotonic() < end:
        time.sleep(0.1)
    consumer.shutdown()
    f.close()
    return 0 if len(seen) >= want else 3


def run_driver(*args: Any, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("HOME", str(Path.home()))
    return subprocess.run([sys.executable, str(DRIVER), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def start_driver(*args: Any, log: Path) -> subprocess.Popen[str]:
    """Start a driver in the background; its output goes to ``log`` (a pipe could fill)."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, str(DRIVER), *map(str, args)],
                                stdout=out, stderr=subprocess.STDOUT)


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text("utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return out


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "produce":
        ns, topic, n, out = rest[:4]
        start = int(rest[4]) if len(rest) > 4 else 0
        size = int(rest[5]) if len(rest) > 5 else 0
        interval = int(rest[6]) if len(rest) > 6 else 0
        deadline = float(rest[7]) if len(rest) > 7 else 60.0
        sys.exit(_driver_produce(ns, topic, int(n), out, start, size, interval, deadline))
    if cmd == "produce_delayed":
        ns, topic, n, level, out = rest[:5]
        sys.exit(_driver_produce_delayed(ns, topic, int(n), int(level), out))
    if cmd == "consume":
        ns, group, topic, n, out, t = rest[:6]
        mode = rest[6] if len(rest) > 6 else ""
        sys.exit(_driver_consume(ns, group, topic, int(n), out, float(t),
                                 mode == "fail_first", mode == "orderly"))
    sys.exit(f"unknown driver command {cmd}")


# --- tests (in-process brokers) ---------------------------------------------------------------

import needs  # noqa: E402  (tests/support is on the path under pytest, not in the driver)

rocketmq = needs.module("rocketmq.client", "the official client (rocketmq 0.4.4, dev extra)", module_level=True)

from test_messaging import Env  # noqa: E402  (after the client check on purpose)

from rmqha.net.loop import EventLoopThread  # noqa: E402


@pytest.fixture
def env(tmp_path: Path):
    loop = EventLoopThread("official-env")
    e = Env(tmp_path)
    try:
        loop.run(e.__aenter__(), timeout=10)
        yield e, loop
    finally:
        loop.run(e.__aexit__(None, None, None), timeout=20)
        loop.stop()


async def _create(env: Env, topic: str, queues: int) -> None:
    from test_messaging import create_topic

    for b in env.brokers:
        resp = await create_topic(b.address, topic, queues)
        assert resp.code == 0, resp.remark


def test_official_send_sync_and_push_consumer(env: Any, tmp_path: Path) -> None:
    e, loop = env
    loop.run(e.broker("broker-a"), timeout=10)
    loop.run(_create(e, "OfficialTopic", 4), timeout=10)
    sent = tmp_path / "sent.jsonl"
    # 20 small messages and 3 over 4 KiB (the C++ client zlib-compresses those).
    r = run_driver("produce", e.namesrv, "OfficialTopic", 20, sent)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_driver("produce", e.namesrv, "OfficialTopic", 3, sent, 100, 6000)
    assert r.returncode == 0, r.stdout + r.stderr
    acked = [x for x in read_lines(sent) if x.get("status") == 0]
    assert len(acked) == 23
    got_path = tmp_path / "got.jsonl"
    r = run_driver("consume", e.namesrv, "CG_OFFICIAL", "OfficialTopic", 23, got_path, 40)
    got = read_lines(got_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert {x["msg_id"] for x in acked} <= {g["msg_id"] for g in got}
    big = [g for g in got if g["len"] > 6000]
    assert len({g["msg_id"] for g in big}) == 3  # decompressed by the client
    # rmqha's consumer reads what the official producer wrote, and vice versa below.
    broker = e.brokers[0]
    assert broker.svc.state.offsets.get("CG_OFFICIAL", "OfficialTopic", 0) is not None


def test_official_send_refused_before_write_raises_and_stores_nothing(env: Any,
                                                                   tmp_path: Path) -> None:
    """min_in_sync_replicas=2 on a broker alone: the refusal comes before anything is written,
    so it is the definite failure IN_SYNC_REPLICAS_NOT_ENOUGH, which the official client
    raises (a "stored, not confirmed" FLUSH_SLAVE_TIMEOUT would come back as a status)."""
    e, loop = env
    broker = loop.run(e.broker("broker-a"), timeout=10)
    loop.run(_create(e, "OfficialRefused", 1), timeout=10)
    # Raised once the topic exists: creating a topic is a write, refused as well.
    broker.svc.ctx.config.min_in_sync_replicas = 2
    before = broker.log.max_offset
    sent = tmp_path / "sent.jsonl"
    r = run_driver("produce", e.namesrv, "OfficialRefused", 1, sent, 0, 0, 0, 3)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = read_lines(sent)
    # The C++ client reports a send that failed on every retry as "No route info" (its
    # DefaultMQProducer.cpp), whatever the broker answered; the route exists (the topic was
    # just created and routed), so what it raised is the broker's refusal.
    assert lines and all("error" in x for x in lines), lines
    assert broker.log.max_offset == before


def test_official_consumer_reads_rmqha_producer(env: Any, tmp_path: Path) -> None:
    from rmqha.client import Message, Producer

    e, loop = env
    loop.run(e.broker("broker-a"), timeout=10)
    loop.run(e.broker("broker-b"), timeout=10)
    loop.run(_create(e, "MixTopic", 2), timeout=10)

    async def produce() -> list[str]:
        async with Producer(e.namesrv) as p:
            rs = await p.send_batch("MixTopic", [Message(b"r%d" % i, tags="TagA")
                                                 for i in range(30)])
            rs.append(await p.send("MixTopic", Message(b"L" * 10000, tags="TagA")))
            rs += [await p.send("MixTopic", b"s%d" % i) for i in range(9)]
            return [r.msg_id for r in rs]

    ids = loop.run(produce(), timeout=30)
    got_path = tmp_path / "got.jsonl"
    r = run_driver("consume", e.namesrv, "CG_MIX", "MixTopic", len(ids), got_path, 40)
    got = read_lines(got_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert set(ids) <= {g["msg_id"] for g in got}


def test_official_consumer_failure_is_sent_back_and_redelivered(env: Any, tmp_path: Path) -> None:
    """A callback that fails makes the C++ client send the message back (36); the broker
    stores it in %RETRY%<group> and the client gets it again with reconsume_times 1."""
    e, loop = env
    # Retries wait delay level 3 + reconsumeTimes: short levels keep the test quick.
    loop.run(e.broker("broker-a", message_delay_level="100ms 200ms 300ms 400ms",
                      timer_precision_ms=50), timeout=10)
    loop.run(_create(e, "RetryTopic", 2), timeout=10)
    # The retry topic exists before the consumer starts, so its first route lookup finds it.
    loop.run(_create(e, "%RETRY%CG_RETRY", 1), timeout=10)
    sent = tmp_path / "sent.jsonl"
    r = run_driver("produce", e.namesrv, "RetryTopic", 5, sent)
    assert r.returncode == 0, r.stdout + r.stderr
    ids = {x["msg_id"] for x in read_lines(sent) if x.get("status") == 0}
    got_path = tmp_path / "got.jsonl"
    r = run_driver("consume", e.namesrv, "CG_RETRY", "RetryTopic", 5, got_path, 40, "fail_first")
    got = read_lines(got_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    firsts = {g["msg_id"] for g in got if g["failed"]}
    retried = {g["msg_id"] for g in got if not g["failed"] and g["reconsume"] == 1}
    # The C API stops a batch at its first failure and sends the whole batch back, so some
    # messages are only seen on redelivery; every one must come back exactly as a retry.
    assert firsts and firsts <= ids and retried == ids
    assert {g["topic"] for g in got} == {"RetryTopic"}  # the client renames retried ones back


def test_official_delayed_send_is_delivered_after_its_level(env: Any, tmp_path: Path) -> None:
    """Message.set_delay_time_level: held under SCHEDULE_TOPIC_XXXX, then delivered."""
    from rmqha.messaging.delayed_delivery import SCHEDULE_TOPIC

    e, loop = env
    b = loop.run(e.broker("broker-a", message_delay_level="200ms 700ms",
                          timer_precision_ms=50), timeout=10)
    loop.run(_create(e, "DelayTopic", 2), timeout=10)
    sent = tmp_path / "sent.jsonl"
    r = run_driver("produce_delayed", e.namesrv, "DelayTopic", 5, 2, sent)
    assert r.returncode == 0, r.stdout + r.stderr
    acked = [x for x in read_lines(sent) if x.get("status") == 0]
    assert len(acked) == 5
    assert b.svc.index.queue(SCHEDULE_TOPIC, 1) is not None  # level 2 -> queue 1
    got_path = tmp_path / "got.jsonl"
    r = run_driver("consume", e.namesrv, "CG_DELAY", "DelayTopic", 5, got_path, 40)
    got = read_lines(got_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert {x["msg_id"] for x in acked} <= {g["msg_id"] for g in got}
    stored = {q: b.svc.index.queue("DelayTopic", q) for q in (0, 1)}
    scheduled = b.svc.index.queue(SCHEDULE_TOPIC, 1)
    first_scheduled = b.log.read_message(scheduled.get(0).commit_offset).store_timestamp
    for q in stored.values():
        for i in range(len(q) if q is not None else 0):
            m = b.log.read_message(q.get(q.base + i).commit_offset)
            assert m.store_timestamp >= first_scheduled + 700


def test_official_orderly_consumer_locks_queues(env: Any, tmp_path: Path) -> None:
    """PushConsumer(orderly=True) locks each queue (LOCK_BATCH_MQ) before pulling it."""
    e, loop = env
    loop.run(e.broker("broker-a"), timeout=10)
    loop.run(_create(e, "OrderTopic", 2), timeout=10)
    sent = tmp_path / "sent.jsonl"
    assert run_driver("produce", e.namesrv, "OrderTopic", 10, sent).returncode == 0
    got_path = tmp_path / "got.jsonl"
    r = run_driver("consume", e.namesrv, "CG_ORDER", "OrderTopic", 10, got_path, 40, "orderly")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    got = read_lines(got_path)
    for q in (0, 1):  # per queue, in queue-offset order
        offsets = [g["offset"] for g in got if g["queue_id"] == q]
        assert offsets == sorted(offsets) and offsets
    locks = e.brokers[0].svc.locks
    assert locks.grants >= 2  # both queues were locked before they were pulled
    deadline = time.monotonic() + 5
    while locks.holders() and time.monotonic() < deadline:  # released when the client left
        time.sleep(0.05)
    assert not locks.holders()


def test_official_consumer_of_a_new_group_starts_at_the_end_of_a_trimmed_queue(
        env: Any, tmp_path: Path) -> None:
    """CONSUME_FROM_LAST_OFFSET (the C++ push consumer's default) for a new group: the
    broker answers QUERY_NOT_FOUND once the queue lost its first messages to retention, so
    the client starts at the max offset and gets only what is sent after it started."""
    import time as _time

    from rmqha.client import Message, Producer

    e, loop = env
    b = loop.run(e.broker("broker-a", file_reserved_hours=0.0), timeout=10)
    loop.run(_create(e, "TrimTopic", 1), timeout=10)

    async def produce(start: int, n: int) -> None:
        async with Producer(e.namesrv) as p:
            for i in range(start, start + n):
                await p.send("TrimTopic", Message(b"%04d" % i + b"x" * 1000), queue_id=0)

    loop.run(produce(0, 200), timeout=60)
    loop.run(b.svc.run_retention(now=_time.time() + 60), timeout=30)
    assert b.svc.index.queue("TrimTopic", 0).min_offset > 0
    got_path = tmp_path / "late.jsonl"
    consumer = start_driver("consume", e.namesrv, "CG_LATE", "TrimTopic", 5, got_path, 40,
                            log=tmp_path / "late.log")
    try:
        # Ready once its long-polling pull is held on the broker.
        deadline = _time.monotonic() + 30
        while not b.metrics.registry.get_sample_value("rmqha_messaging_held_pulls"):
            assert _time.monotonic() < deadline, (tmp_path / "late.log").read_text()[-2000:]
            assert consumer.poll() is None, (tmp_path / "late.log").read_text()[-2000:]
            _time.sleep(0.05)
        loop.run(produce(200, 5), timeout=30)
        assert consumer.wait(60) == 0, (tmp_path / "late.log").read_text()[-2000:]
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(10)
    offsets = sorted({g["offset"] for g in read_lines(got_path)})
    assert offsets == [200, 201, 202, 203, 204]
