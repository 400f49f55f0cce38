"""NATS JetStream as a peer: three nats-server processes in one cluster with JetStream on.

Streams ``BENCH3`` (file storage, replicas 3) and ``BENCH1`` (replicas 1); the client is
nats-py, publishing with ``js.publish`` (each call waits for the stream's PubAck).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from peers.base import PeerSystem, free_port, wait_port

from rmqha.net import loop as event_loop

SUBJECTS = {1: "bench1", 3: "bench3"}
STREAMS = {1: "BENCH1", 3: "BENCH3"}


class NatsSystem(PeerSystem):
    name = "nats"
    ack_semantics = ("PubAck once the stream leader and a quorum of its replicas (2 of 3) "
                     "stored the message (R1: the leader alone)")
    fsync_semantics = ("none per message: JetStream writes to the page cache and fsyncs "
                       "its files every 2 minutes (nats-server 2.9 default)")

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        # The same loop as rmqha's clients (uvloop), so the clients differ, not their loops.
        self.loop = event_loop.new_event_loop()
        self.nc = None
        self.js = None

    def start(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        names = ["n1", "n2", "n3"]
        client = {n: free_port() for n in names}
        route = {n: free_port() for n in names}
        for n in names:
            routes = ", ".join(f"nats-route://127.0.0.1:{route[m]}" for m in names if m != n)
            conf = workdir / f"{n}.conf"
            conf.write_text(
                f'server_name: {n}\nlisten: "127.0.0.1:{client[n]}"\n'
                f'jetstream {{ store_dir: "{workdir / n}", max_memory_store: 256MB, '
                f'max_file_store: 4GB }}\n'
                f'cluster {{ name: bench, listen: "127.0.0.1:{route[n]}", routes: [{routes}] }}\n')
            log = open(workdir / f"{n}.log", "wb")
            self.procs[n] = subprocess.Popen(["nats-server", "-c", str(conf)], stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            self.ports[n] = client[n]
        for n in names:
            wait_port(client[n], 30, f"nats-server {n}", self.procs[n], workdir / f"{n}.log")
        self.loop.run_until_complete(self._setup())

    async def _setup(self) -> None:
        import nats

        self.nc = await nats.connect(
            servers=[f"nats://127.0.0.1:{p}" for p in self.ports.values()],
            max_reconnect_attempts=-1, reconnect_time_wait=0.05, connect_timeout=2)
        self.js = self.nc.jetstream(timeout=10)
        deadline = time.monotonic() + 60
        for copies in (3, 1):
            while True:  # the JetStream meta leader takes a moment to be elected
                try:
                    await self.js.add_stream(name=STREAMS[copies], subjects=[SUBJECTS[copies]],
                                             num_replicas=copies, storage="file")
                    break
                except Exception:  # noqa: BLE001 - retried until the deadline
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            await self.js.publish(SUBJECTS[copies], b"warm-up")

    def stop(self) -> None:
        if self.nc is not None:
            try:
                self.loop.run_until_complete(asyncio.wait_for(self.nc.close(), 5))
            except Exception:  # noqa: BLE001 - the servers are killed next anyway
                pass
            self.nc = None
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(10)
        self.procs.clear()

    def one_at_a_time(self, copies: int, n: int, body: bytes) -> list[float]:
        return self.loop.run_until_complete(self._one_at_a_time(SUBJECTS[copies], n, body))

    async def _one_at_a_time(self, subject: str, n: int, body: bytes) -> list[float]:
        publish, lat = self.js.publish, []
        for _ in range(n):
            t0 = time.perf_counter()
            await publish(subject, body)
            lat.append(time.perf_counter() - t0)
        return lat

    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        return self.loop.run_until_complete(self._batches(SUBJECTS[copies], n_batches, size, body))

    async def _batches(self, subject: str, n_batches: int, size: int, body: bytes) -> list[float]:
        publish, lat = self.js.publish, []
        for _ in range(n_batches):
            t0 = time.perf_counter()
            await asyncio.gather(*(publish(subject, body) for _ in range(size)))
            lat.append(time.perf_counter() - t0)
        return lat

    def window(self, copies: int, n: int, window: int, body: bytes) -> None:
        self.loop.run_until_complete(self._window(SUBJECTS[copies], n, window, body))

    async def _window(self, subject: str, n: int, window: int, body: bytes) -> None:
        publish = self.js.publish
        todo = iter(range(n))

        async def worker() -> None:
            for _ in todo:
                await publish(subject, body)

        await asyncio.gather(*(worker() for _ in range(window)))

    def read_back(self, copies: int, n: int) -> int:
        return self.loop.run_until_complete(self._read_back(SUBJECTS[copies], n))

    async def _read_back(self, subject: str, n: int) -> int:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        sub = await self.js.pull_subscribe(
            subject, durable=f"rb{time.monotonic_ns()}",
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
        got = 0
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            try:
                got += len(await sub.fetch(batch=1000, timeout=2))
            except asyncio.TimeoutError:
                break
        await sub.unsubscribe()
        return got

    def failover(self, body: bytes) -> float | None:
        return self.loop.run_until_complete(self._failover(body))

    async def _failover(self, body: bytes) -> float:
        info = await self.js.stream_info(STREAMS[3])
        leader = info.cluster.leader
        await self.js.publish(SUBJECTS[3], body)
        proc = self.procs[leader]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.perf_counter()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                await self.js.publish(SUBJECTS[3], body, timeout=0.5)
                return time.perf_counter() - killed
            except Exception:  # noqa: BLE001 - no leader yet, or reconnecting
                await asyncio.sleep(0.005)
        raise TimeoutError("no JetStream publish acked within 60 s of the leader kill")
