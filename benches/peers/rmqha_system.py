"""rmqha in the peer comparison: one cluster with a three-broker group and a one-broker group.

Controllers (1), a name server and the brokers are real processes (rmqha.testing.local_cluster).
Topic ``Bench3`` lives on ``broker-a`` (master + 2 slaves, ``all_ack_in_sync_state_set``:
a send is answered once all three hold it), ``Bench1`` on ``broker-b`` (one broker).  With
``flush_sync`` a third group ``broker-c`` (3 brokers, ``flush = "sync"``) serves
``BenchSync``, for the sync-flush vs async-flush latency ratio.

With a :class:`~rmqha.testing.secure_setup.SecureSetup` every port is mutual TLS, brokers check
ACL 1.0 signatures and the producers sign as an account with PUB on the topics
(``benches/peers/security_cost.py`` runs one such cluster beside a plain one); ``copies``
then says which groups to start (``(3,)``: broker-a only).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from peers.base import PeerSystem, wait_until

from rmqha.net import loop as event_loop
from rmqha.client import BlockingProducer, Consumer, Producer
from rmqha.protocol.codes import RequestCode
from rmqha.security.identity import Identity
from rmqha.testing.local_cluster import BrokerProc, Cluster
from rmqha.testing.secure_setup import SecureSetup

TOPICS = {1: "Bench1", 3: "Bench3", "sync": "BenchSync"}
CLUSTER = "rmqha-bench"


class RmqhaSystem(PeerSystem):
    name = "rmqha"
    ack_semantics = ("answered when every broker of the SyncStateSet holds the message "
                     "(all_ack_in_sync_state_set; 1 copy: the master's page cache)")
    fsync_semantics = ("flush = async (RocketMQ's default): page cache, flushed every 500 ms; "
                       "flush = sync: the master's fsync overlaps the replication round trip")

    def __init__(self, flush_sync: bool = False, *, security: SecureSetup | None = None,
                 copies: tuple[int, ...] = (3, 1), broker_config: dict[str, Any] | None = None) -> None:
        self.flush_sync = flush_sync
        #: Broker settings on top of the bench's own (e.g. ha_slave_compiled_lane = false).
        self.broker_config = dict(broker_config or {})
        self.security = security
        self.copies = copies
        self.cluster: Cluster | None = None
        self.loop = event_loop.new_event_loop()
        self.producer: Producer | None = None
        #: The same sends with ``auto_batch`` (the "window of 256, auto_batch" row).
        self.auto_producer: Producer | None = None
        self.blocking: BlockingProducer | None = None

    def start(self, workdir: Path) -> None:
        c = self.cluster = Cluster(workdir / "rmqha", cluster_name=CLUSTER)
        sec = self.security
        if sec is not None:
            c.client_security = sec.harness_security()
        c.start_controllers(1, **(sec.process_keys(Identity.controller("n0")) if sec else {}))
        c.start_namesrv(**(sec.process_keys(Identity.namesrv("ns0")) if sec else {}))
        for group, n, conf, topic in self.groups():
            brokers = self._start_group(group, n, conf)
            resp = c.request(brokers[0].address, RequestCode.UPDATE_AND_CREATE_TOPIC,
                             {"topic": topic, "readQueueNums": 8, "writeQueueNums": 8})
            assert resp.code == 0, resp.remark
            c.wait_for(lambda t=topic: c.route(t) is not None, what=f"route of {topic}")
        self.producer = self.loop.run_until_complete(self._make_producer())
        self.auto_producer = self.loop.run_until_complete(self._make_producer(auto_batch=True))
        self.blocking = BlockingProducer(c.namesrv_addresses, "bench_blocking",
                                         send_timeout_s=10.0, **self._client_options())
        for _, _, _, topic in self.groups():
            self.blocking.send(topic, b"warm-up")
            self.loop.run_until_complete(self.producer.send(topic, b"warm-up"))
            self.loop.run_until_complete(self.auto_producer.send(topic, b"warm-up"))

    def groups(self) -> list[tuple[str, int, dict[str, Any], str]]:
        """(group, brokers, config, topic) of each destination this system serves."""
        cfg: dict[str, Any] = {"all_ack_in_sync_state_set": True, "log_level": "WARNING", **self.broker_config}
        groups = [("broker-a", 3, cfg, TOPICS[3]), ("broker-b", 1, cfg, TOPICS[1])]
        groups = [g for g in groups if g[1] in self.copies]
        if self.flush_sync:
            groups.append(("broker-c", 3, {**cfg, "flush": "sync"}, TOPICS["sync"]))
        return groups

    def _start_group(self, group: str, n: int, conf: dict[str, Any]) -> list[BrokerProc]:
        """``Cluster.start_group``, each broker with its own certificate when secure."""
        c, sec = self.cluster, self.security
        assert c is not None
        if sec is None:
            return c.start_group(group, n, in_sync=True, timeout=60, **conf)
        brokers = [c.start_broker(group, **conf, **sec.broker_keys(group, f"{group}-{i}"))
                   for i in range(n)]
        c.wait_role(brokers[0], "master", 60)
        for b in brokers[1:]:
            c.wait_role(b, "slave", 60)
        ids = sorted(b.broker_id() or 0 for b in brokers)
        c.wait_for(lambda: (info := c.replica_info(group)) is not None
                   and info.sync_state_set == ids, 60, what=f"SyncStateSet {ids} of {group}")
        return brokers

    def _client_options(self) -> dict[str, Any]:
        return self.security.client_options() if self.security is not None else {}

    async def _make_producer(self, auto_batch: bool = False) -> Producer:
        assert self.cluster is not None
        return Producer(self.cluster.namesrv_addresses, "bench_async", send_timeout_s=10.0,
                        auto_batch=auto_batch, **self._client_options())

    def stop(self) -> None:
        if self.blocking is not None:
            self.blocking.close()
            self.blocking = None
        for producer in (self.producer, self.auto_producer):
            if producer is not None:
                self.loop.run_until_complete(producer.close())
        self.producer = self.auto_producer = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def one_at_a_time(self, copies: int | str, n: int, body: bytes) -> list[float]:
        assert self.blocking is not None
        topic, send, lat = TOPICS[copies], self.blocking.send, []
        for _ in range(n):
            t0 = time.perf_counter()
            r = send(topic, body)
            lat.append(time.perf_counter() - t0)
            assert r.ok, r.status
        return lat

    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        assert self.blocking is not None
        topic, lat = TOPICS[copies], []
        msgs = [body] * size
        for _ in range(n_batches):
            t0 = time.perf_counter()
            results = self.blocking.send_batch(topic, msgs)
            lat.append(time.perf_counter() - t0)
            assert results[-1].ok, results[-1].status
        return lat

    def window(self, copies: int, n: int, window: int, body: bytes,
               auto_batch: bool = False) -> None:
        self.loop.run_until_complete(self._window(TOPICS[copies], n, window, body, auto_batch,
                                                  None))

    def timed_window(self, copies: int, n: int, window: int, body: bytes) -> list[float]:
        """:meth:`window`, answering each send's time from call to ack (the peer table
        has no latencies for windows, so it uses :meth:`window`)."""
        lat: list[float] = []
        self.loop.run_until_complete(self._window(TOPICS[copies], n, window, body, False, lat))
        return lat

    async def _window(self, topic: str, n: int, window: int, body: bytes,
                      auto_batch: bool, lat: list[float] | None) -> None:
        producer = self.auto_producer if auto_batch else self.producer
        assert producer is not None
        send = producer.send
        todo = iter(range(n))
        clock = time.perf_counter

        async def worker() -> None:
            for _ in todo:
                t0 = clock()
                r = await send(topic, body)
                if lat is not None:
                    lat.append(clock() - t0)
                assert r.ok, r.status

        await asyncio.gather(*(worker() for _ in range(window)))

    def read_back(self, copies: int, n: int) -> int:
        return self.loop.run_until_complete(self._read_back(TOPICS[copies], n))

    async def _read_back(self, topic: str, n: int) -> int:
        assert self.cluster is not None
        got = 0
        async with Consumer(self.cluster.namesrv_addresses, f"readback_{time.monotonic_ns()}",
                            topic, pull_batch=256) as consumer:
            deadline = time.monotonic() + 120
            while got < n and time.monotonic() < deadline:
                got += len(await consumer.poll(timeout=2.0, max_messages=4096))
        return got

    def failover(self, body: bytes) -> float | None:
        assert self.cluster is not None and self.blocking is not None
        c = self.cluster
        master = wait_until(lambda: c.master_of("broker-a"), 30, "the master of broker-a")
        self.blocking.send(TOPICS[3], body)
        master.kill()
        killed = time.perf_counter()
        # all_ack needs the whole (shrunk) SyncStateSet: the first send acked after the kill.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = self.blocking.send(TOPICS[3], body)
            except Exception:  # noqa: BLE001 - the producer retried until its own deadline
                continue
            if r.ok:
                return time.perf_counter() - killed
        raise TimeoutError("no send acked within 60 s of the master kill")
