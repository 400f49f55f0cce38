"""The official RocketMQ client (PyPI ``rocketmq`` 0.4.4) across a master failover.

Real processes: a controller, a name server, a master and two slaves with all-ack.  The
official producer (``send_sync``) and ``PushConsumer`` run in child processes (the driver
in test_official_client.py) while the master is SIGKILLed; every send the client saw as
OK must be consumed.  The C++ client refreshes routes every 30 s, so this test takes up
to about a minute.
"""
from __future__ import annotations

from pathlib import Path

import needs

needs.module("rocketmq.client", "the official client (rocketmq 0.4.4, dev extra)", module_level=True)

from cluster import Cluster  # noqa: E402
from test_messaging_cluster import ALL_ACK, create_topic, start_group, wait_route  # noqa: E402
from test_official_client import read_lines, start_driver  # noqa: E402


def test_official_client_send_and_consume_across_master_failover(cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    brokers = start_group(cluster, 3, **ALL_ACK)
    master = brokers[0]
    create_topic(cluster, master, "OfficialHA", 4)
    wait_route(cluster, "OfficialHA")
    ns = ";".join(cluster.namesrv_addresses)
    sent, got = tmp_path / "sent.jsonl", tmp_path / "got.jsonl"
    consumer = start_driver("consume", ns, "CG_OFFICIAL_HA", "OfficialHA", 10**6, got, 150,
                            log=tmp_path / "consume.out")
    # 60 sends, 50 ms apart: the kill lands in the middle of them.
    producer = start_driver("produce", ns, "OfficialHA", 60, sent, 0, 0, 50,
                            log=tmp_path / "produce.out")
    try:
        def acked() -> set[str]:
            return {x["msg_id"] for x in read_lines(sent) if x.get("status") == 0}

        def received() -> set[str]:
            return {x["msg_id"] for x in read_lines(got)}

        cluster.wait_for(lambda: len(acked()) >= 20, timeout=30, what="20 official sends acked")
        master.kill()
        at_kill = len(acked())
        assert at_kill < 60 and producer.poll() is None, "the producer finished before the kill"
        cluster.wait_for(lambda: cluster.master_of("broker-a"), timeout=30, what="a new master")
        cluster.wait_for(lambda: producer.poll() is not None, timeout=90,
                         what="the official producer to finish 60 sends")
        assert producer.returncode == 0, (tmp_path / "produce.out").read_text()[-2000:]
        assert len(acked()) == 60
        failed = [x for x in read_lines(sent) if "error" in x]
        print(f"acked {at_kill} before the kill, {60 - at_kill} after; {len(failed)} failed sends")
        cluster.wait_for(lambda: acked() <= received(), timeout=60,
                         what="the PushConsumer to receive every acked message")
    finally:
        for p in (producer, consumer):
            if p.poll() is None:
                p.kill()
            p.wait(10)
    # After the failover the consumer read from the new master (or a slave) without a gap.
    assert acked() <= received()
