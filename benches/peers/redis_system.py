"""Redis as a peer: a primary and two replicas (redis-server processes), streams with XADD.

``appendonly yes`` with ``appendfsync everysec`` on all three.  Three copies: XADD then
``WAIT 2 0`` in the same pipeline (one round trip); one copy: XADD alone.  Batches are a
pipeline of 32 XADDs (and one WAIT).  The client is redis-py's asyncio client.
"""
from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

from peers.base import PeerSystem, free_port, wait_port, wait_until

from rmqha.net import loop as event_loop

STREAMS = {1: "bench1", 3: "bench3"}


class RedisSystem(PeerSystem):
    name = "redis"
    ack_semantics = ("XADD answered by the primary; with 3 copies WAIT 2 returns once both "
                     "replicas acknowledged the replication stream (in their memory)")
    fsync_semantics = "appendonly yes, appendfsync everysec (an fsync per second, none per write)"

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        # The same loop as rmqha's clients (uvloop), so the clients differ, not their loops.
        self.loop = event_loop.new_event_loop()
        self.client = None
        self.window_client = None

    def start(self, workdir: Path) -> None:
        import redis

        workdir.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port() for _ in range(3)]
        for i, port in enumerate(self.ports):
            d = workdir / f"r{i}"
            d.mkdir()
            args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                    "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                    "--protected-mode", "no", "--daemonize", "no"]
            if i:
                args += ["--replicaof", "127.0.0.1", str(self.ports[0])]
            log = open(workdir / f"r{i}.log", "wb")
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        for i, (port, server) in enumerate(zip(self.ports, self.procs)):
            wait_port(port, 30, "redis-server", server, workdir / f"r{i}.log")
        primary = redis.Redis(port=self.ports[0])
        wait_until(lambda: primary.info("replication").get("connected_slaves") == 2
                   and all(primary.info("replication").get(f"slave{i}", {}).get("state") == "online"
                           for i in range(2)), 30, "two online replicas")
        primary.close()
        self.loop.run_until_complete(self._connect())

    async def _connect(self) -> None:
        import redis.asyncio as aredis

        self.client = aredis.Redis(port=self.ports[0], max_connections=8)
        # WAIT blocks its connection: a window of 256 needs 256 connections.
        self.window_client = aredis.Redis(port=self.ports[0], max_connections=512)
        for stream in STREAMS.values():
            await self.client.xadd(stream, {"b": b"warm-up"})

    def stop(self) -> None:
        for c in (self.client, self.window_client):
            if c is not None:
                try:
                    self.loop.run_until_complete(asyncio.wait_for(c.aclose(), 5))
                except Exception:  # noqa: BLE001 - the servers are killed next anyway
                    pass
        self.client = self.window_client = None
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(10)
        self.procs.clear()

    async def _append(self, client, copies: int, bodies: list[bytes]) -> None:  # type: ignore[no-untyped-def]
        pipe = client.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd(STREAMS[copies], {"b": b})
        if copies > 1:
            pipe.execute_command("WAIT", copies - 1, 0)
        out = await pipe.execute()
        if copies > 1 and out[-1] < copies - 1:
            raise AssertionError(f"WAIT saw {out[-1]} replicas")

    def one_at_a_time(self, copies: int, n: int, body: bytes) -> list[float]:
        async def run() -> list[float]:
            lat = []
            for _ in range(n):
                t0 = time.perf_counter()
                await self._append(self.client, copies, [body])
                lat.append(time.perf_counter() - t0)
            return lat
        return self.loop.run_until_complete(run())

    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        async def run() -> list[float]:
            lat, bodies = [], [body] * size
            for _ in range(n_batches):
                t0 = time.perf_counter()
                await self._append(self.client, copies, bodies)
                lat.append(time.perf_counter() - t0)
            return lat
        return self.loop.run_until_complete(run())

    def window(self, copies: int, n: int, window: int, body: bytes) -> None:
        async def run() -> None:
            todo = iter(range(n))

            async def worker() -> None:
                for _ in todo:
                    await self._append(self.window_client, copies, [body])

            await asyncio.gather(*(worker() for _ in range(window)))
        self.loop.run_until_complete(run())

    def read_back(self, copies: int, n: int) -> int:
        async def run() -> int:
            got, start = 0, "-"
            while got < n:
                rows = await self.client.xrange(STREAMS[copies], min=start, count=1000)
                if not rows:
                    break
                got += len(rows)
                start = "(" + rows[-1][0].decode()
            return got
        return self.loop.run_until_complete(run())
