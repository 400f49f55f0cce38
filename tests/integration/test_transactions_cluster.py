"""Transactions and delayed messages across a master SIGKILL, with real broker processes.

One broker group (master + slave, all-ack), rmqha's client: a transaction committed and
acknowledged before the kill is visible after it exactly once; a transaction left open
(UNKNOW) is checked back by the new master, whose pending set was folded from the
replicated log; delay-level and timer messages sent before the kill are all delivered,
none before it was due.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any


from cluster import Cluster
from test_messaging_cluster import ALL_ACK, create_topic, start_group, wait_route

from rmqha.client import Consumer, LocalTransactionState, Producer

COMMIT = LocalTransactionState.COMMIT_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW



def test_commit_and_delays_survive_master_sigkill_and_new_master_checks_back(
        cluster: Cluster) -> None:
    cfg = {**ALL_ACK, "transaction_timeout_ms": 8000, "transaction_check_interval_ms": 500,
           "message_delay_level": "2s 3s", "timer_precision_ms": 100}
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, _ = start_group(cluster, 2, **cfg)
    create_topic(cluster, master, "TXHA", 2)
    wait_route(cluster, "TXHA")
    namesrv = cluster.namesrv_addresses

    async def main() -> None:
        checks: list[tuple[float, str]] = []

        def check(msg: Any) -> LocalTransactionState:
            checks.append((time.monotonic(), msg.msg_id))
            return COMMIT

        async with Producer(namesrv, "PG_TXHA", retry_deadline_s=30.0) as p:
            p.set_transaction_check_listener(check)
            committed = await p.send_transaction("TXHA", b"committed", lambda m, a: COMMIT)
            assert committed.end_confirmed
            pending = await p.send_transaction("TXHA", b"pending", lambda m, a: UNKNOW)
            t0 = int(time.time() * 1000)
            delayed = [await p.send("TXHA", b"d%d" % i, delay_level=1 + i % 2)
                       for i in range(10)]
            timed = [await p.send("TXHA", b"t%d" % i, deliver_at=t0 + 2500 + 50 * i)
                     for i in range(10)]
            assert all(r.ok for r in delayed + timed)
            await asyncio.to_thread(master.kill)  # SIGKILL, before anything falls due
            killed_at = time.monotonic()
            new = await asyncio.to_thread(cluster.wait_for, lambda: cluster.master_of("broker-a"),
                                          30, what="a new master")
            assert new is not master
            await asyncio.to_thread(
                cluster.wait_for, lambda: any(i == pending.msg_id for _, i in checks), 40,
                what="the new master to check the open transaction back")
            assert all(at > killed_at for at, i in checks if i == pending.msg_id)
        want = {committed.msg_id, pending.msg_id} | {r.msg_id for r in delayed + timed}
        got: list[Any] = []
        async with Consumer(namesrv, "CG_TXHA", "TXHA") as c:
            deadline = time.monotonic() + 40
            while not want <= {m.msg_id for m in got} and time.monotonic() < deadline:
                got += await c.poll(0.5)
        ids = [m.msg_id for m in got]
        assert want <= set(ids), f"missing {want - set(ids)}"
        assert ids.count(committed.msg_id) == 1, "an acknowledged commit seen twice"
        assert ids.count(pending.msg_id) == 1
        due = {r.msg_id: t0 + 2500 + 50 * i for i, r in enumerate(timed)}
        for m in got:
            if m.msg_id in due:
                assert m.store_timestamp >= due[m.msg_id]

    asyncio.run(asyncio.wait_for(main(), 150))
