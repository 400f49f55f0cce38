"""Messages end to end with real processes: controller, name server, broker groups.

- all-ack produce survives SIGKILL of the master: no acknowledged message is lost, with
  rmqha's client and with the official RocketMQ client (send_sync + PushConsumer);
- a slave refuses writes and rmqha's client ends up on the master;
- a stalled slave makes all-ack sends answer FLUSH_SLAVE_TIMEOUT, then min_in_sync_replicas
  refuses writes (nothing written);
- a topic spread over two broker groups (``rmqha update-topic -b a,b``) is produced to and
  consumed from both.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from cluster import BrokerProc, Cluster
from rmqha.client import BlockingConsumer, BlockingProducer, Message, SendStatus
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import LocalClusterError, SendError
from rmqha.protocol.message import decode_records

ALL_ACK = {"all_ack_in_sync_state_set": True, "slave_timeout_ms": 3000}



def start_group(cluster: Cluster, n: int, group: str = "broker-a", **cfg: Any) -> list[BrokerProc]:
    brokers = [cluster.start_broker(group, **cfg) for _ in range(n)]
    cluster.wait_for(lambda: cluster.broker_role(brokers[0]) == "master",
                     what=f"{brokers[0].name} to be master")
    if n > 1:
        want = sorted(b.broker_id() for b in brokers)
        cluster.wait_for(lambda: cluster.replica_info(group).sync_state_set == want, timeout=30,
                         what=f"SyncStateSet {want}")
    return brokers


def create_topic(cluster: Cluster, broker: BrokerProc, topic: str, queues: int) -> None:
    resp = cluster.request(broker.address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6})
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def wait_route(cluster: Cluster, topic: str, groups: int = 1) -> dict[str, Any]:
    return cluster.wait_for(
        lambda: (r := cluster.route(topic)) is not None and len(r["queueDatas"]) >= groups
        and all("0" in b["brokerAddrs"] for b in r["brokerDatas"]) and r,
        what=f"a route for {topic} over {groups} group(s)")


def offset_of(cluster: Cluster, broker: BrokerProc, group: str, queue_id: int,
              topic: str = "HA") -> int:
    resp = cluster.request(broker.address, RequestCode.QUERY_CONSUMER_OFFSET,
                           {"consumerGroup": group, "topic": topic, "queueId": queue_id})
    resp.check_success()
    return int(resp.ext_fields["offset"])


def consume_all(namesrv: list[str], group: str, topic: str, want: set[str],
                timeout: float = 40.0) -> dict[str, Any]:
    got: dict[str, Any] = {}
    with BlockingConsumer(namesrv, group, topic, rebalance_interval_s=2.0) as c:
        deadline = time.monotonic() + timeout
        while not want <= set(got) and time.monotonic() < deadline:
            for m in c.poll(0.5):
                got.setdefault(m.msg_id, m)
        c.commit()
    return got


def _stacks(thread: threading.Thread, producers: list[BlockingProducer]) -> str:
    """Where a stuck producer thread is, and the coroutines its event loops hold."""
    import asyncio
    import traceback
    out: list[str] = []
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is not None:
        out.append("producer thread:\n" + "".join(traceback.format_stack(frame)))
    else:
        out.append("producer thread: ended")
    for p in producers:
        for mine in list(p._loop._all):
            for task in list(asyncio.all_tasks(mine.loop)):
                out.append(f"task {task!r} awaits:")
                c: Any = task.get_coro()
                while c is not None:
                    frame = getattr(c, "cr_frame", None) or getattr(c, "gi_frame", None)
                    if frame is None:
                        out.append(f"  {c!r}")
                        break
                    out.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} "
                               f"{frame.f_code.co_name}")
                    c = getattr(c, "cr_await", None) or getattr(c, "gi_yieldfrom", None)
    return "\n".join(out)


def test_all_ack_produce_survives_master_sigkill(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    brokers = start_group(cluster, 3, **ALL_ACK)
    master = brokers[0]
    create_topic(cluster, master, "HA", 4)
    wait_route(cluster, "HA")
    acked: dict[str, int] = {}
    not_ok: list[str] = []
    errors: list[str] = []
    after_kill: list[str] = []
    killed = threading.Event()
    stop = threading.Event()

    sends: list[str] = []  # what the producer is doing now (for a failure message)

    producers: list[BlockingProducer] = []

    def produce() -> None:
        with BlockingProducer(cluster.namesrv_addresses, retry_deadline_s=30.0, max_attempts=30,
                              max_backoff_s=0.5) as p:
            producers.append(p)
            i = 0
            # Until the main thread's wait holds: stopping at 400 acked once the kill is
            # done starved the wait for 100 acks after it whenever the first 400 came
            # before the kill (a slow consumer phase on a busy machine).
            while not stop.is_set() and (len(acked) < 400 or len(after_kill) < 100):
                try:
                    sends.append(f"send {i} at {time.monotonic():.3f}")
                    if i % 5 == 4:
                        rs = p.send_batch("HA", [Message(b"b%d-%d" % (i, j)) for j in range(8)])
                    else:
                        rs = [p.send("HA", Message(b"m%d" % i, keys=str(i)))]
                except SendError as exc:
                    errors.append(str(exc))
                    continue
                finally:
                    i += 1
                for r in rs:
                    if r.status is SendStatus.SEND_OK:
                        acked[r.msg_id] = i
                        if killed.is_set():
                            after_kill.append(r.msg_id)
                    else:
                        not_ok.append(r.msg_id)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    first: dict[str, Any] = {}
    try:
        cluster.wait_for(lambda: len(acked) >= 100, what="100 acked messages")
        # A consumer group reads some and commits; the offsets replicate with the log.
        first = consume_all(cluster.namesrv_addresses, "ha-readers", "HA", set(list(acked)[:50]))
        committed = {q: offset_of(cluster, master, "ha-readers", q) for q in range(4)}
        assert sum(committed.values()) >= 50
        for s in brokers[1:]:
            cluster.wait_for(lambda s=s: all(offset_of(cluster, s, "ha-readers", q) == o
                                             for q, o in committed.items()),
                             what=f"committed offsets on {s.name}")
        master.kill()  # SIGKILL
        killed.set()
        new_master = cluster.wait_for(lambda: cluster.master_of("broker-a"), timeout=30,
                                      what="a new master")
        assert new_master is not master
        try:
            cluster.wait_for(lambda: len(acked) >= 400 and len(after_kill) >= 100, timeout=60,
                             what="400 acked messages, 100 of them after the kill")
        except LocalClusterError as exc:
            # What the producer saw says which side stalled (route, refusal, timeout).
            raise AssertionError(
                f"acked {len(acked)} ({len(after_kill)} after the kill), not confirmed "
                f"{len(not_ok)}, {len(errors)} failed sends, the last: {errors[-3:]}; "
                f"sends in flight: {sends[-1:]}\n{_stacks(t, producers)}\n{exc}") from None
    finally:
        stop.set()
        t.join(60)
    # The same group resumes on the new master from its committed offsets...
    rest = consume_all(cluster.namesrv_addresses, "ha-readers", "HA", set(acked) - set(first))
    assert not set(first) & set(rest), "committed offsets were lost in the failover"
    # ...and a new group reads everything: no acknowledged message is missing.
    got = consume_all(cluster.namesrv_addresses, "ha-audit", "HA", set(acked))
    lost = set(acked) - set(got)
    assert not lost, f"{len(lost)} acked message(s) lost of {len(acked)}; errors {errors[:3]}"
    assert set(acked) <= set(first) | set(rest)
    print(f"acked {len(acked)} ({len(after_kill)} after the kill), not confirmed {len(not_ok)},"
          f" failed sends {len(errors)}, consumed {len(got)}")


def test_slave_refuses_and_client_lands_on_master(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, slave = start_group(cluster, 2)
    resp = cluster.request(slave.address, RequestCode.SEND_MESSAGE_V2, {
        "a": "p", "b": "TBW102", "e": 0, "f": 0, "m": "false"}, b"x")
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
    wait_route(cluster, "TBW102")
    with BlockingProducer(cluster.namesrv_addresses) as p:
        r = p.send("TBW102", b"hello")
    assert r.ok

    # The slave serves reads: once the confirm offset reaches it, a pull finds the message.
    def pull_from_slave() -> list[Any]:
        resp = cluster.request(slave.address, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "g", "topic": "TBW102", "queueId": r.queue.queue_id,
            "queueOffset": r.queue_offset, "maxMsgNums": 1, "sysFlag": 0,
            "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*"})
        return decode_records(resp.body) if resp.code == ResponseCode.SUCCESS else []

    msgs = cluster.wait_for(pull_from_slave, what="the message on the slave")
    assert msgs[0].msg_id == r.msg_id and msgs[0].body == b"hello"


def test_topic_over_two_broker_groups(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    start_group(cluster, 1, "broker-a")
    start_group(cluster, 1, "broker-b")
    # The admin command names the groups the topic's queues go to.
    out = subprocess.run([sys.executable, "-m", "rmqha", "update-topic", "-n",
                          ";".join(cluster.namesrv_addresses), "-t", "Spread",
                          "-b", "broker-a,broker-b", "-r", "4"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("OK") == 2
    route = wait_route(cluster, "Spread", groups=2)
    assert sorted(q["writeQueueNums"] for q in route["queueDatas"]) == [4, 4]
    with BlockingProducer(cluster.namesrv_addresses) as p:
        sent = [p.send("Spread", b"s%d" % i) for i in range(40)]
        sent += p.send_batch("Spread", [b"t%d" % i for i in range(32)])
    assert {r.queue.broker_name for r in sent} == {"broker-a", "broker-b"}
    got = consume_all(cluster.namesrv_addresses, "spread-readers", "Spread",
                      {r.msg_id for r in sent})
    assert {r.msg_id for r in sent} <= set(got)
    assert {m.broker_name for m in got.values()} == {"broker-a", "broker-b"}
    # The quick produce / consume commands.
    ns = ";".join(cluster.namesrv_addresses)
    out = subprocess.run([sys.executable, "-m", "rmqha", "produce", "-n", ns, "-t", "Spread",
                          "one", "two", "three"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count("SEND_OK") == 3, out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "rmqha", "consume", "-n", ns, "-t", "Spread",
                          "-g", "cli-readers", "--count", "75", "--idle-s", "10"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    bodies = {line.rsplit(" ", 1)[-1] for line in out.stdout.splitlines()}
    assert {"one", "two", "three"} <= bodies


def test_send_waiting_while_the_set_shrinks_is_stored_not_confirmed(cluster: Cluster) -> None:
    """min_in_sync_replicas=2: a send that waits while the SyncStateSet shrinks to the master
    alone is already in the log.  Its answer is FLUSH_SLAVE_TIMEOUT ("stored, not confirmed",
    a status), never IN_SYNC_REPLICAS_NOT_ENOUGH (a definite failure clients raise), and a
    consumer receives it once the slave is back."""
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, slave = start_group(cluster, 2, all_ack_in_sync_state_set=True,
                                slave_timeout_ms=4000, min_in_sync_replicas=2,
                                ha_max_time_slave_not_catchup_ms=800,
                                check_sync_state_set_period_ms=100)
    master_id = master.broker_id()
    wait_route(cluster, "TBW102")
    with BlockingProducer(cluster.namesrv_addresses, max_attempts=1, send_timeout_s=10) as p:
        assert p.send("TBW102", b"both hold it").ok
        os.kill(slave.pid, signal.SIGSTOP)
        try:
            r = p.send("TBW102", b"stored while the set shrank")
            assert r.status is SendStatus.FLUSH_SLAVE_TIMEOUT, r
            # The wait (up to 4 s) outlived the shrink (>= 0.8 s after the stop).
            assert cluster.replica_info("broker-a").sync_state_set == [master_id]
        finally:
            os.kill(slave.pid, signal.SIGCONT)
    got = consume_all(cluster.namesrv_addresses, "CG_SHRINK", "TBW102", {r.msg_id})
    assert r.msg_id in got


def test_ack_timeout_then_min_in_sync_refusal(cluster: Cluster) -> None:
    """A stalled slave: all-ack sends answer FLUSH_SLAVE_TIMEOUT (stored, not confirmed);
    once the master drops the slave from the SyncStateSet, min_in_sync_replicas=2 refuses
    writes with IN_SYNC_REPLICAS_NOT_ENOUGH and nothing is written."""
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, slave = start_group(cluster, 2, all_ack_in_sync_state_set=True,
                                slave_timeout_ms=400, min_in_sync_replicas=2)
    wait_route(cluster, "TBW102")
    with BlockingProducer(cluster.namesrv_addresses, max_attempts=1) as p:
        assert p.send("TBW102", b"both hold it").ok
        os.kill(slave.pid, signal.SIGSTOP)
        try:
            r = p.send("TBW102", b"only the master holds it")
            assert r.status is SendStatus.FLUSH_SLAVE_TIMEOUT
            master_id = master.broker_id()
            cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [master_id],
                             timeout=20, what="the stalled slave dropped from the SyncStateSet")
            before = cluster.broker_status(master)["maxOffset"]

            def refusal() -> str:
                with pytest.raises(SendError) as exc:
                    p.send("TBW102", b"refused")
                return str(exc.value.status)

            # On a starved machine a heartbeat answer can come after the test timers'
            # 1.4 s lease: that send is refused too (MASTER_LEASE_EXPIRED, nothing written)
            # and the next one meets the renewed lease.
            status = cluster.wait_for(
                lambda: (s := refusal()) != "MASTER_LEASE_EXPIRED" and s, timeout=20,
                what="a refusal that is not a lapsed lease")
            assert status == "IN_SYNC_REPLICAS_NOT_ENOUGH"
            assert cluster.broker_status(master)["maxOffset"] == before
        finally:
            os.kill(slave.pid, signal.SIGCONT)
