"""A master SIGKILLed while a RocketMQ 5 client consumes through the proxy: the client keeps
its route (it names only the proxy), the proxy finds the new master, and every message
whose send was acknowledged is consumed; none acked before the kill comes back."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from proxy_harness import closing, create_topic, message, producer, simple_consumer, start_cluster, start_proxy


def test_master_killed_mid_consume(tmp_path: Path) -> None:
    with start_cluster(tmp_path, replicas=3) as cluster:
        proxy = start_proxy(cluster)
        create_topic(cluster, "f_topic")
        p = producer(proxy, ["f_topic"])
        c = simple_consumer(proxy, "f_group", "f_topic", await_s=1)
        sent: set[bytes] = set()
        acked: dict[bytes, int] = {}
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                try:
                    batch = c.receive(8, 5)
                except Exception:  # noqa: BLE001 - the client raises its own kinds mid-failover
                    continue
                for m in batch:
                    try:
                        c.ack(m)
                    except Exception:  # noqa: BLE001 - not acked: it comes again, that is allowed
                        continue
                    acked[m.body] = acked.get(m.body, 0) + 1

        with closing(p, c):
            for i in range(20):
                p.send(message("f_topic", f"before{i}".encode()))
                sent.add(f"before{i}".encode())
            reader = threading.Thread(target=consume)
            reader.start()
            cluster.wait_for(lambda: len(acked) >= 10, what="half the messages acked")
            old = cluster.master_of("broker-a")
            assert old is not None
            acked_before = dict(acked)
            old.kill()
            for i in range(20):
                body = f"after{i}".encode()
                _send_until_ok(p, body)
                sent.add(body)
            cluster.wait_for(lambda: set(acked) >= sent, timeout=40, what="every sent message acked")
            stop.set()
            reader.join(timeout=15)
        new = cluster.master_of("broker-a")
        assert new is not None and new is not old
        assert set(acked) == sent
        # An ack answered before the kill holds on the new master: never delivered again.
        assert {body: acked[body] for body in acked_before} == dict.fromkeys(acked_before, 1)


def _send_until_ok(p: Any, body: bytes, timeout_s: float = 30) -> None:
    """Send (the client retries three times itself; a failover may take longer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            p.send(message("f_topic", body))
            return
        except Exception:  # noqa: BLE001 - the client's own exception kinds
            if time.monotonic() > deadline:
                raise
