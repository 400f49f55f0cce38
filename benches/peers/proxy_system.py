"""rmqha through ``rmqha proxy`` with RocketMQ 5's official Python client, in the peer
comparison (``bench_peers.py --proxy``).

The cluster is :class:`~peers.rmqha_system.RmqhaSystem`'s (its own: a three-broker group
for ``Bench3``, a one-broker group for ``Bench1``), with a proxy process in front; the
workloads go through the proxy with ``rocketmq-python-client`` 5.x, which sends one
message per request (no batch send: that row says so).  The client needs its own venv
(``.venv-rmq5``, made by ``make test-proxy``): run ``bench_peers.py`` with its Python.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from peers.base import NotOffered, wait_until
from peers.rmqha_system import TOPICS, RmqhaSystem
from rmqha.testing.local_proxy import ProxyProc, start_proxy

#: Acks of one received batch in flight at once (the client's ack_async needs an asyncio
#: loop in the calling thread and returns nothing in 5.1.2).
ACK_THREADS = 8
BATCH = 32


def client_module() -> Any:
    """The 5.x client's ``rocketmq`` module; SystemExit naming the venv to use without it."""
    try:
        import rocketmq
    except ImportError as exc:
        raise SystemExit(f"--proxy needs RocketMQ 5's client (rocketmq-python-client): run "
                         f"bench_peers.py with .venv-rmq5/bin/python (make test-proxy makes it) "
                         f"({exc})") from None
    if not hasattr(rocketmq, "SimpleConsumer"):
        raise SystemExit("--proxy needs rocketmq-python-client 5.x, not the rocketmq 0.4.4 of the "
                         "dev extra: run bench_peers.py with .venv-rmq5/bin/python")
    return rocketmq


class ProxySystem(RmqhaSystem):
    name = "rmqha-proxy"
    ack_semantics = ("as rmqha (the same brokers and ack policy), through `rmqha proxy`: "
                     "RocketMQ 5's Python client over gRPC, one message per request")
    fsync_semantics = "as rmqha (flush = async)"

    def __init__(self) -> None:
        super().__init__(flush_sync=False)
        self.rmq = client_module()
        self.proxy: ProxyProc | None = None
        self.producer5: Any = None

    def start(self, workdir: Path) -> None:
        super().start(workdir)
        assert self.cluster is not None
        self.proxy = start_proxy(self.cluster, timeout=60, log_level="WARNING")
        self.producer5 = self.rmq.Producer(self._configuration(), [TOPICS[1], TOPICS[3]])
        self.producer5.startup()
        for topic in (TOPICS[1], TOPICS[3]):
            self.producer5.send(self._message(topic, b"warm-up"))

    def stop(self) -> None:
        if self.producer5 is not None:
            self.producer5.shutdown()
            self.producer5 = None
        super().stop()

    def _configuration(self) -> Any:
        assert self.proxy is not None
        return self.rmq.ClientConfiguration(self.proxy.address, self.rmq.Credentials(),
                                            request_timeout=10)

    def _message(self, topic: str, body: bytes) -> Any:
        m = self.rmq.Message()
        m.topic = topic
        m.body = body
        return m

    def one_at_a_time(self, copies: int | str, n: int, body: bytes) -> list[float]:
        topic, send, lat = TOPICS[copies], self.producer5.send, []
        for _ in range(n):
            t0 = time.perf_counter()
            send(self._message(topic, body))
            lat.append(time.perf_counter() - t0)
        return lat

    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        raise NotOffered("no batch send in the 5.x client")

    def window(self, copies: int, n: int, window: int, body: bytes,
               auto_batch: bool = False) -> None:
        topic, free = TOPICS[copies], threading.BoundedSemaphore(window)
        failures: list[BaseException] = []

        def done(future: Any) -> None:
            if future.exception() is not None:
                failures.append(future.exception())
            free.release()

        for _ in range(n):
            free.acquire()
            self.producer5.send_async(self._message(topic, body)).add_done_callback(done)
        for _ in range(window):  # all answered once the whole window is free again
            free.acquire()
        assert not failures, f"{len(failures)} sends failed, e.g. {failures[0]!r}"

    def read_back(self, copies: int, n: int) -> int:
        consumer = self.rmq.SimpleConsumer(self._configuration(), f"readback5_{time.monotonic_ns()}",
                                           {TOPICS[copies]: self.rmq.FilterExpression()},
                                           await_duration=2)
        consumer.startup()
        got, deadline = 0, time.monotonic() + 120
        try:
            with ThreadPoolExecutor(ACK_THREADS) as ackers:
                while got < n and time.monotonic() < deadline:
                    batch = consumer.receive(BATCH, 30)
                    list(ackers.map(consumer.ack, batch))
                    got += len(batch)
        finally:
            consumer.shutdown()
        return got

    def failover(self, body: bytes) -> float | None:
        assert self.cluster is not None
        c = self.cluster
        master = wait_until(lambda: c.master_of("broker-a"), 30, "the master of broker-a")
        self.producer5.send(self._message(TOPICS[3], body))
        master.kill()
        killed = time.perf_counter()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.producer5.send(self._message(TOPICS[3], body))
            except Exception:  # noqa: BLE001 - the client's kinds; it retried three times itself
                continue
            return time.perf_counter() - killed
        raise TimeoutError("no send acked within 60 s of the master kill")
