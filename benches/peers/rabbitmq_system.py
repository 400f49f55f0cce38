"""RabbitMQ as a peer: three rabbitmq-server nodes joined in one cluster, quorum queues.

Each node is started directly (``/usr/lib/rabbitmq/bin/rabbitmq-server``, not the Debian
service) with its own ports, data and log dirs, a private ``HOME`` (the shared Erlang
cookie) and a private epmd port, so nothing on the machine is touched.  Queue ``bench3``
is a quorum queue over the three nodes, ``bench1`` a quorum queue of one member
(``x-quorum-initial-group-size: 1``).  The client is aio-pika with publisher confirms:
``publish`` returns when the broker confirmed the message.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from peers.base import PeerSystem, free_port, wait_port, wait_until

from rmqha.net import loop as event_loop

BIN = Path("/usr/lib/rabbitmq/bin")
QUEUES = {1: "bench1", 3: "bench3"}


def _epmd_pids(port: str) -> list[int]:
    """epmd processes started with ERL_EPMD_PORT=port (this run's, nobody else's)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"epmd" not in (entry / "cmdline").read_bytes():
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ERL_EPMD_PORT={port}".encode() in env:
            out.append(int(entry.name))
    return out


class RabbitSystem(PeerSystem):
    name = "rabbitmq"
    ack_semantics = ("publisher confirm once a majority of the quorum queue's members (2 of 3) "
                     "wrote it to their Raft log (1 copy: a quorum queue of one member)")
    fsync_semantics = ("the Raft WAL is fsynced before the confirm (batched across "
                       "concurrent publishes)")

    def __init__(self) -> None:
        self.workdir: Path | None = None
        self.env: dict[str, str] = {}
        self.nodes: list[str] = []
        self.amqp_ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.os_pids: list[int] = []
        # The same loop as rmqha's clients (uvloop), so the clients differ, not their loops.
        self.loop = event_loop.new_event_loop()
        self.conn = None
        self.channel = None

    def _ctl(self, node: str, *args: str, timeout: float = 120) -> str:
        out = subprocess.run([str(BIN / "rabbitmqctl"), "-n", node, *args], env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {node}: {out.stderr or out.stdout}")
        return out.stdout

    def start(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        cookie = workdir / ".erlang.cookie"
        cookie.write_text("RMQHABENCHCOOKIE")
        cookie.chmod(0o400)
        (workdir / "enabled_plugins").write_text("[].\n")
        self.env = {**os.environ, "HOME": str(workdir), "ERL_EPMD_PORT": str(free_port()),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
                    "RABBITMQ_CONFIG_FILE": str(workdir / "none")}
        for i in range(1, 4):
            node = f"rabbit{i}@localhost"
            port = free_port()
            env = {**self.env, "RABBITMQ_NODENAME": node, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                   "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(free_port()),
                   "RABBITMQ_MNESIA_BASE": str(workdir / f"mnesia{i}"),
                   "RABBITMQ_LOG_BASE": str(workdir / f"log{i}"),
                   # No busy-waiting schedulers: two cores are shared with everything else.
                   "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none"}
            log = open(workdir / f"node{i}.out", "wb")
            self.procs.append(subprocess.Popen([str(BIN / "rabbitmq-server")], env=env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))
            self.nodes.append(node)
            self.amqp_ports.append(port)
        for node, port in zip(self.nodes, self.amqp_ports):
            # await_startup fails at once while the node has not registered with epmd yet.
            wait_until(lambda n=node: self._ctl(n, "await_startup", "--timeout", "120", timeout=150)
                       is not None, 180, f"{node} started", interval=0.5)
            wait_port(port, 60, node)
            self.os_pids.append(int(self._ctl(node, "eval", "list_to_integer(os:getpid()).").strip()))
        for node in self.nodes[1:]:
            self._ctl(node, "stop_app")
            self._ctl(node, "join_cluster", self.nodes[0])
            self._ctl(node, "start_app")
        self.loop.run_until_complete(self._connect(0))
        self.loop.run_until_complete(self._declare())

    async def _connect(self, i: int) -> None:
        import aio_pika

        self.conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{self.amqp_ports[i]}/",
                                           timeout=5)
        self.channel = await self.conn.channel(publisher_confirms=True)

    async def _declare(self) -> None:
        for copies, q in QUEUES.items():
            await self.channel.declare_queue(q, durable=True, arguments={
                "x-queue-type": "quorum", "x-quorum-initial-group-size": copies})

    def stop(self) -> None:
        if self.conn is not None:
            try:
                self.loop.run_until_complete(asyncio.wait_for(self.conn.close(), 5))
            except Exception:  # noqa: BLE001 - the nodes are killed next anyway
                pass
            self.conn = None
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(10)
        for pid in self.os_pids:  # the Erlang VM, in case it left the process group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()
        self.os_pids.clear()
        if self.env:
            # epmd daemonizes out of the group: stop the one on this run's private port.
            for pid in _epmd_pids(self.env["ERL_EPMD_PORT"]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    async def _publish(self, copies: int, body: bytes) -> None:
        import aio_pika

        await self.channel.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=QUEUES[copies])

    def one_at_a_time(self, copies: int, n: int, body: bytes) -> list[float]:
        async def run() -> list[float]:
            lat = []
            for _ in range(n):
                t0 = time.perf_counter()
                await self._publish(copies, body)
                lat.append(time.perf_counter() - t0)
            return lat
        return self.loop.run_until_complete(run())

    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        async def run() -> list[float]:
            lat = []
            for _ in range(n_batches):
                t0 = time.perf_counter()
                await asyncio.gather(*(self._publish(copies, body) for _ in range(size)))
                lat.append(time.perf_counter() - t0)
            return lat
        return self.loop.run_until_complete(run())

    def window(self, copies: int, n: int, window: int, body: bytes) -> None:
        async def run() -> None:
            todo = iter(range(n))

            async def worker() -> None:
                for _ in todo:
                    await self._publish(copies, body)

            await asyncio.gather(*(worker() for _ in range(window)))
        self.loop.run_until_complete(run())

    def read_back(self, copies: int, n: int) -> int:
        async def run() -> int:
            channel = await self.conn.channel()
            await channel.set_qos(prefetch_count=2000)
            queue = await channel.declare_queue(QUEUES[copies], passive=True)
            got = 0
            deadline = time.monotonic() + 120
            # Acked (every 500, ``multiple``) so the prefetch bounds what is in flight: with
            # no_ack the server pushes the whole queue, and leaving the iterator then logs
            # every buffered message as lost (1.4 million lines of output).
            async with queue.iterator(no_ack=False) as it:
                async for message in it:
                    got += 1
                    done = got >= n or time.monotonic() > deadline
                    if done or got % 500 == 0:
                        await message.ack(multiple=True)
                    if done:
                        break
            await channel.close()
            return got
        return self.loop.run_until_complete(run())

    def failover(self, body: bytes) -> float | None:
        # The quorum queue's leader is on the node it was declared through (node 1).
        leader = self._ctl(self.nodes[1], "list_queues", "name", "leader", "--quiet",
                           "--no-table-headers")
        at = next((line.split()[1] for line in leader.splitlines()
                   if line.split() and line.split()[0] == QUEUES[3]), self.nodes[0])
        i = self.nodes.index(at)
        self.loop.run_until_complete(self._publish(3, body))
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        try:
            os.kill(self.os_pids[i], signal.SIGKILL)
        except ProcessLookupError:
            pass
        killed = time.perf_counter()
        survivors = [j for j in range(3) if j != i]

        async def until_confirmed() -> float:
            deadline = time.monotonic() + 60
            k = 0
            while time.monotonic() < deadline:
                try:
                    if self.conn is None or self.conn.is_closed:
                        await self._connect(survivors[k % 2])
                    await asyncio.wait_for(self._publish(3, body), 1.0)
                    return time.perf_counter() - killed
                except Exception:  # noqa: BLE001 - connection lost or no leader yet
                    k += 1
                    if self.conn is not None and not self.conn.is_closed and i == 0:
                        await self.conn.close()
                    self.conn = None
                    await asyncio.sleep(0.005)
            raise TimeoutError("no publish confirmed within 60 s of the leader kill")
        return self.loop.run_until_complete(until_confirmed())
