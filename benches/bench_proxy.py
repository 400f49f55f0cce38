"""RocketMQ 5's official clients through ``rmqha proxy`` (the Java 5.x client, the Python
one), beside rmqha's own client over remoting, on the same cluster; what an idle consumer
costs the proxy; and what one unary call costs grpcio's server and the proxy.

Runs in the proxy's venv (``make bench-proxy``, which also builds ``interop/``: the Java rows
run its ``io.rmqha.interop.grpc.GrpcBench`` on the shaded client jar; the Python 5.x client
cannot share ``.venv`` with the dev extra's rocketmq 0.4.4; ``make bench`` leaves this file
out).  One cluster for the module: a controller, a name server and a broker group of three
with ``all_ack_in_sync_state_set`` (a send is answered once all three hold it), 1 KiB
bodies, 8 queues, and a proxy process in front.  Each workload is measured once per client
(rows ``rocketmq5-java-grpc``, ``rocketmq5-grpc-proxy`` (Python), ``rmqha-remoting``):

- ``produce one at a time``: ``Producer.send`` (gRPC) / ``BlockingProducer.send``
  (remoting), each acknowledged before the next; per-message latency.  Target: the Java
  client's p50 within 1.5x rmqha's remoting client's;
- ``produce, 256 in flight``: ``sendAsync`` (Java) / ``Producer.send_async`` (Python) with
  at most 256 unanswered / 256 asyncio tasks each awaiting ``Producer.send`` (rmqha, no
  auto-batch).  Target: 20k msg/s;
- ``consume, batches of 32``: a SimpleConsumer's ``receive(32, ...)`` with every message
  acked (Java: ``ackAsync`` of a whole batch at once; Python: 8 acks at a time on a thread
  pool, its ``ack_async`` needs an asyncio loop in the calling thread) / rmqha's Consumer
  pulling 32 at a time; the messages are written beforehand.  Target: 20k msg/s;
- ``idle consumer``: RPCs a consumer with nothing to receive makes, counted per method at
  the proxy (one run in this process, with a counting gRPC interceptor) over a few
  seconds, for a SimpleConsumer in a receive loop and for a PushConsumer, Java and
  Python.  Target: under 5 calls per second;
- ``server CPU per unary call``: the CPU the server process spends per call (from
  ``/proc/<pid>/stat``), 64 calls in flight: grpcio with a no-op handler
  (``benches/grpc_floor_server.py``) and the proxy's QueryRoute of a cached route.

Every gRPC row also reports the proxy process's CPU per message (``proxy_cpu_us_per_msg``:
``/proc/<pid>/stat`` over the timed part), the figure that says how many messages per
second one proxy process can carry per core.  Speed and rates go to ``extra_info`` and are
printed, never asserted.  Sizes: ``RMQHA_BENCH_QUICK=1`` is CI-sized (and idles 10 s
instead of 30 s); ``RMQHA_BENCH_PROXY_SCALE`` multiplies the message counts (0.25 with
quick mode for a check that it runs).  The Python client logs under
``~/logs/rocketmq_python`` (its own choice; HOME decides where), the Java one in a
temporary directory.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import rocketmq
from conftest import QUICK
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.exception import ClientException

from rmqha.client import BlockingProducer, Consumer, Producer
from rmqha.net import loop as event_loop
from rmqha.protocol.codes import RequestCode
from rmqha.proxy.config import load_proxy_config
from rmqha.proxy.server import build_service
from rmqha.testing.local_cluster import Cluster, free_port
from rmqha.testing.local_proxy import ProxyProc, start_proxy

SCALE = float(os.environ.get("RMQHA_BENCH_PROXY_SCALE", "1"))
MESSAGE_BYTES = 1024
WINDOW = 256
BATCH = 32
ACK_THREADS = 8
IDLE_TARGET_PER_S = 5.0
PRODUCE_TOPIC, READ_TOPIC, IDLE_TOPIC = "BenchProxy", "BenchProxyRead", "BenchProxyIdle"
READ_JAVA_TOPIC = "BenchProxyReadJava"
BODY = os.urandom(MESSAGE_BYTES // 2).hex().encode()  # incompressible-ish 1 KiB


def _n(full: int, quick: int) -> int:
    return max(BATCH, int((quick if QUICK else full) * SCALE))


ONE_AT_A_TIME = _n(3000, 1000)
IN_FLIGHT = _n(40_000, 8000)
READ = _n(20_000, 4000)
#: Long enough for several polls (an idle consumer costs next to nothing: time, not load).
IDLE_WINDOW_S = 10.0 if QUICK else 30.0


@dataclass
class Run:
    """One measured workload."""

    messages: int
    elapsed_s: float
    cpu_s: float
    latencies_s: list[float] = field(default_factory=list)


def _measure(fn: Callable[[], list[float] | None], messages: int) -> Run:
    cpu0, t0 = time.process_time(), time.perf_counter()
    latencies = fn() or []
    return Run(messages, time.perf_counter() - t0, time.process_time() - cpu0, latencies)


def _report(benchmark: Any, client: str, batch: int, run: Run, proxy_cpu_s: float | None = None) -> None:
    lat = sorted(run.latencies_s)
    info = {
        "implementation": client, "message_bytes": MESSAGE_BYTES, "batch": batch, "replicas": 3,
        "messages": run.messages,
        "messages_per_s": round(run.messages / run.elapsed_s, 1),
        "client_cpu_us_per_msg": round(run.cpu_s / run.messages * 1e6, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 3) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 3) if lat else None,
    }
    if proxy_cpu_s is not None:
        info["proxy_cpu_us_per_msg"] = round(proxy_cpu_s / run.messages * 1e6, 1)
    benchmark.extra_info.update(info)
    print(f"\n{client:>22} {benchmark.group}: {info['messages_per_s']:,.0f} msg/s, p50 "
          f"{info['p50_ms']} ms, p99 {info['p99_ms']} ms, client {info['client_cpu_us_per_msg']} µs/msg"
          + (f", proxy {info['proxy_cpu_us_per_msg']} µs/msg" if proxy_cpu_s is not None else ""))


def _once(benchmark: Any, fn: Callable[[], Run]) -> Run:
    out: dict[str, Run] = {}
    benchmark.pedantic(lambda: out.setdefault("run", fn()), rounds=1, iterations=1)
    return out["run"]


# --- the Java 5.x client (interop/'s GrpcBench) and the proxy's CPU --------------------------

INTEROP = Path(__file__).resolve().parents[1] / "interop"
PY_ROW, JAVA_ROW, REMOTING_ROW = "rocketmq5-grpc-proxy", "rocketmq5-java-grpc", "rmqha-remoting"
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (``/proc/<pid>/stat``; clock ticks, 10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proxy_pid(setup: Setup) -> int:
    assert setup.proxy.pid is not None, "the proxy is not running"
    return setup.proxy.pid


def java_classpath() -> str:
    """interop/'s classes and the shaded gRPC client jar alone (the rule of
    tests/interop/grpc_side.py: the remoting client's rocketmq-proto must not come first)."""
    listing = INTEROP / "target" / "classpath.txt"
    if not listing.is_file():
        raise AssertionError(f"{listing} is missing: `make bench-proxy` runs `make interop-build` first")
    jars = [j for j in listing.read_text().strip().split(os.pathsep) if "rocketmq-client-java" in j]
    return os.pathsep.join([str(INTEROP / "target" / "classes"), *jars])


def java_command(mode: str, *args: str) -> list[str]:
    java = shutil.which("java") or "java"
    return [java, "-Xms64m", "-Xmx512m", "-XX:+UseParallelGC", "-cp", java_classpath(),
            "io.rmqha.interop.grpc.GrpcBench", mode, *args]


@dataclass
class JavaRun:
    """What GrpcBench printed last (its result) and the proxy's CPU over the timed part."""

    result: dict[str, Any]
    proxy_cpu_s: float


def run_java(endpoint: str, pid: int, mode: str, *args: str, timeout: float = 900.0) -> JavaRun:
    """Run GrpcBench to its end, sampling the proxy's CPU at its ``start`` line and at its
    result line (the JVM's start and warm-up are outside)."""
    env = {**os.environ, "INTEROP_PROXY": endpoint}
    with tempfile.TemporaryDirectory(prefix="bench-java-") as home:
        cmd = java_command(mode, *args)
        cmd.insert(1, f"-Drocketmq.log.root={home}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        start_cpu, end_cpu, result = 0.0, 0.0, None
        try:
            assert proc.stdout is not None
            for text in proc.stdout:
                if not text.startswith("{"):
                    continue
                line = json.loads(text)
                if line.get("phase") == "start":
                    start_cpu = proc_cpu_s(pid)
                elif "mode" in line:
                    end_cpu, result = proc_cpu_s(pid), line
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        err = proc.stderr.read() if proc.stderr is not None else ""
    assert proc.returncode == 0 and result is not None, f"GrpcBench {mode} exited {proc.returncode}: {err[-3000:]}"
    return JavaRun(result, end_cpu - start_cpu)


def _report_java(benchmark: Any, batch: int, run: JavaRun) -> None:
    r = run.result
    info = {
        "implementation": JAVA_ROW, "message_bytes": MESSAGE_BYTES, "batch": batch, "replicas": 3,
        "messages": r["messages"], "messages_per_s": round(r["messagesPerS"], 1),
        "client_cpu_us_per_msg": round(r["clientCpuUsPerMsg"], 1),
        "p50_ms": round(r["p50Ms"], 3) if r["p50Ms"] >= 0 else None,
        "p99_ms": round(r["p99Ms"], 3) if r["p99Ms"] >= 0 else None,
        "proxy_cpu_us_per_msg": round(run.proxy_cpu_s / r["messages"] * 1e6, 1),
    }
    benchmark.extra_info.update(info)
    print(f"\n{JAVA_ROW:>22} {benchmark.group}: {info['messages_per_s']:,.0f} msg/s, p50 {info['p50_ms']} ms, "
          f"p99 {info['p99_ms']} ms, client {info['client_cpu_us_per_msg']} µs/msg, "
          f"proxy {info['proxy_cpu_us_per_msg']} µs/msg")


def _once_java(benchmark: Any, fn: Callable[[], JavaRun]) -> JavaRun:
    out: dict[str, JavaRun] = {}
    benchmark.pedantic(lambda: out.setdefault("run", fn()), rounds=1, iterations=1)
    return out["run"]


# --- the cluster ----------------------------------------------------------------------------


@dataclass
class Setup:
    cluster: Cluster
    proxy: ProxyProc

    @property
    def namesrv(self) -> list[str]:
        return self.cluster.namesrv_addresses


@pytest.fixture(scope="module")
def bench_cluster() -> Iterator[Setup]:
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp, \
            Cluster(Path(tmp), cluster_name="rmqha-bench") as c:
        c.start_controllers(1)
        c.start_namesrv()
        brokers = c.start_group("broker-a", 3, in_sync=True, timeout=60,
                                all_ack_in_sync_state_set=True, log_level="WARNING")
        for topic in (PRODUCE_TOPIC, READ_TOPIC, READ_JAVA_TOPIC, IDLE_TOPIC):
            resp = c.request(brokers[0].address, RequestCode.UPDATE_AND_CREATE_TOPIC,
                             {"topic": topic, "readQueueNums": 8, "writeQueueNums": 8})
            assert resp.code == 0, resp.remark
            c.wait_for(lambda t=topic: c.route(t) is not None, what=f"route of {topic}")
        yield Setup(c, start_proxy(c, timeout=60, log_level="WARNING"))


def _configuration(endpoint: str) -> Any:
    return rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(), request_timeout=10)


def _message(topic: str) -> Any:
    m = rocketmq.Message()
    m.topic = topic
    m.body = BODY
    return m


def _producer(endpoint: str, topic: str) -> Any:
    p = rocketmq.Producer(_configuration(endpoint), [topic])
    p.startup()
    p.send(_message(topic))  # warm-up: route and connection
    return p


# --- produce: one at a time -------------------------------------------------------------


def _grpc_one_at_a_time(endpoint: str) -> Run:
    producer = _producer(endpoint, PRODUCE_TOPIC)
    try:
        def run() -> list[float]:
            lat = []
            for _ in range(ONE_AT_A_TIME):
                t0 = time.perf_counter()
                producer.send(_message(PRODUCE_TOPIC))
                lat.append(time.perf_counter() - t0)
            return lat
        return _measure(run, ONE_AT_A_TIME)
    finally:
        producer.shutdown()


def _remoting_one_at_a_time(namesrv: list[str]) -> Run:
    producer = BlockingProducer(namesrv, "bench_proxy_blocking", send_timeout_s=10.0)
    try:
        producer.send(PRODUCE_TOPIC, BODY)

        def run() -> list[float]:
            lat = []
            for _ in range(ONE_AT_A_TIME):
                t0 = time.perf_counter()
                r = producer.send(PRODUCE_TOPIC, BODY)
                lat.append(time.perf_counter() - t0)
                assert r.ok, r.status
            return lat
        return _measure(run, ONE_AT_A_TIME)
    finally:
        producer.close()


@pytest.mark.benchmark(group="proxy-produce-one-at-a-time")
@pytest.mark.parametrize("client", [JAVA_ROW, PY_ROW, REMOTING_ROW])
def test_produce_one_at_a_time(benchmark: Any, bench_cluster: Setup, client: str) -> None:
    pid = proxy_pid(bench_cluster)
    if client == JAVA_ROW:
        _report_java(benchmark, 1, _once_java(benchmark, lambda: run_java(
            bench_cluster.proxy.address, pid, "one", PRODUCE_TOPIC, str(ONE_AT_A_TIME))))
        return
    cpu0 = proc_cpu_s(pid)
    if client == REMOTING_ROW:
        run = _once(benchmark, lambda: _remoting_one_at_a_time(bench_cluster.namesrv))
    else:
        run = _once(benchmark, lambda: _grpc_one_at_a_time(bench_cluster.proxy.address))
    _report(benchmark, client, 1, run, None if client == REMOTING_ROW else proc_cpu_s(pid) - cpu0)


# --- produce: 256 in flight -------------------------------------------------------------


def _grpc_window(endpoint: str) -> Run:
    producer = _producer(endpoint, PRODUCE_TOPIC)
    window = threading.BoundedSemaphore(WINDOW)
    lat: list[float] = []
    failures: list[BaseException] = []

    def done(t0: float, future: Any) -> None:
        lat.append(time.perf_counter() - t0)
        if future.exception() is not None:
            failures.append(future.exception())
        window.release()

    def run() -> list[float]:
        for _ in range(IN_FLIGHT):
            window.acquire()
            t0 = time.perf_counter()
            producer.send_async(_message(PRODUCE_TOPIC)).add_done_callback(
                lambda f, t0=t0: done(t0, f))
        for _ in range(WINDOW):  # every answer is in once the whole window is free
            window.acquire()
        return lat
    try:
        run_ = _measure(run, IN_FLIGHT)
    finally:
        producer.shutdown()
    assert not failures, f"{len(failures)} sends failed, e.g. {failures[0]!r}"
    return run_


async def _remoting_window_async(namesrv: list[str]) -> list[float]:
    lat: list[float] = []
    async with Producer(namesrv, "bench_proxy_async", send_timeout_s=10.0) as producer:
        await producer.send(PRODUCE_TOPIC, BODY)
        todo = iter(range(IN_FLIGHT))

        async def worker() -> None:
            for _ in todo:
                t0 = time.perf_counter()
                r = await producer.send(PRODUCE_TOPIC, BODY)
                lat.append(time.perf_counter() - t0)
                assert r.ok, r.status
        await asyncio.gather(*(worker() for _ in range(WINDOW)))
    return lat


def _remoting_window(namesrv: list[str]) -> Run:
    loop = event_loop.new_event_loop()
    try:
        return _measure(lambda: loop.run_until_complete(_remoting_window_async(namesrv)), IN_FLIGHT)
    finally:
        loop.close()


@pytest.mark.benchmark(group="proxy-produce-256-in-flight")
@pytest.mark.parametrize("client", [JAVA_ROW, PY_ROW, REMOTING_ROW])
def test_produce_256_in_flight(benchmark: Any, bench_cluster: Setup, client: str) -> None:
    pid = proxy_pid(bench_cluster)
    if client == JAVA_ROW:
        _report_java(benchmark, 1, _once_java(benchmark, lambda: run_java(
            bench_cluster.proxy.address, pid, "window", PRODUCE_TOPIC, str(IN_FLIGHT), str(WINDOW))))
        return
    cpu0 = proc_cpu_s(pid)
    if client == REMOTING_ROW:
        run = _once(benchmark, lambda: _remoting_window(bench_cluster.namesrv))
    else:
        run = _once(benchmark, lambda: _grpc_window(bench_cluster.proxy.address))
    _report(benchmark, client, 1, run, None if client == REMOTING_ROW else proc_cpu_s(pid) - cpu0)


# --- consume: batches of 32 --------------------------------------------------------------


@pytest.fixture(scope="module")
def written(bench_cluster: Setup) -> Iterator[Any]:
    """READ messages in READ_TOPIC, and a SimpleConsumer that had received once before
    they were written (its group's pop cursors start at the beginning)."""
    consumer = rocketmq.SimpleConsumer(_configuration(bench_cluster.proxy.address), "bench_proxy_read_grpc",
                                       {READ_TOPIC: rocketmq.FilterExpression()}, await_duration=5)
    consumer.startup()
    try:
        consumer.receive(BATCH, 30)
        producer = BlockingProducer(bench_cluster.namesrv, "bench_proxy_fill", send_timeout_s=10.0)
        try:
            for start in range(0, READ, BATCH):
                results = producer.send_batch(READ_TOPIC, [BODY] * min(BATCH, READ - start))
                assert results[-1].ok, results[-1].status
        finally:
            producer.close()
        yield consumer
    finally:
        consumer.shutdown()


def _grpc_read(consumer: Any) -> Run:
    def ack(message: Any) -> None:
        consumer.ack(message)

    def run() -> list[float]:
        got, lat = 0, []
        deadline = time.monotonic() + 120
        with ThreadPoolExecutor(ACK_THREADS) as ackers:
            while got < READ and time.monotonic() < deadline:
                t0 = time.perf_counter()
                batch = consumer.receive(BATCH, 30)
                list(ackers.map(ack, batch))
                lat.append(time.perf_counter() - t0)
                got += len(batch)
        assert got >= READ, f"received {got} of {READ}"
        return lat
    return _measure(run, READ)


async def _remoting_read_async(namesrv: list[str]) -> list[float]:
    got, lat = 0, []
    async with Consumer(namesrv, "bench_proxy_read_remoting", READ_TOPIC, pull_batch=BATCH) as consumer:
        deadline = time.monotonic() + 120
        while got < READ and time.monotonic() < deadline:
            t0 = time.perf_counter()
            got += len(await consumer.poll(timeout=2.0, max_messages=BATCH))
            lat.append(time.perf_counter() - t0)
    assert got >= READ, f"read {got} of {READ}"
    return lat


def _remoting_read(namesrv: list[str]) -> Run:
    loop = event_loop.new_event_loop()
    try:
        return _measure(lambda: loop.run_until_complete(_remoting_read_async(namesrv)), READ)
    finally:
        loop.close()


@pytest.fixture(scope="module")
def written_java(bench_cluster: Setup) -> str:
    """READ messages in READ_JAVA_TOPIC, written after the Java group's first receive (its
    pop cursors start at the beginning); the group's name."""
    group = "bench_proxy_read_java"
    run_java(bench_cluster.proxy.address, proxy_pid(bench_cluster), "prime", READ_JAVA_TOPIC, "0", "1", group)
    producer = BlockingProducer(bench_cluster.namesrv, "bench_proxy_fill_java", send_timeout_s=10.0)
    try:
        for start in range(0, READ, BATCH):
            results = producer.send_batch(READ_JAVA_TOPIC, [BODY] * min(BATCH, READ - start))
            assert results[-1].ok, results[-1].status
    finally:
        producer.close()
    return group


@pytest.mark.benchmark(group="proxy-consume-batch-32")
@pytest.mark.parametrize("client", [JAVA_ROW, PY_ROW, REMOTING_ROW])
def test_consume_batches_of_32(benchmark: Any, bench_cluster: Setup, client: str,
                               request: pytest.FixtureRequest) -> None:
    pid = proxy_pid(bench_cluster)
    if client == JAVA_ROW:
        group = request.getfixturevalue("written_java")
        _report_java(benchmark, BATCH, _once_java(benchmark, lambda: run_java(
            bench_cluster.proxy.address, pid, "read", READ_JAVA_TOPIC, str(READ), str(BATCH), group)))
        return
    written = request.getfixturevalue("written")
    cpu0 = proc_cpu_s(pid)
    if client == REMOTING_ROW:
        run = _once(benchmark, lambda: _remoting_read(bench_cluster.namesrv))
    else:
        run = _once(benchmark, lambda: _grpc_read(written))
    _report(benchmark, client, BATCH, run, None if client == REMOTING_ROW else proc_cpu_s(pid) - cpu0)


# --- an idle consumer's requests, counted at the proxy ----------------------------------


class CallCounter(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts the calls the proxy's gRPC server gets, by method name."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.calls[details.method.rpartition("/")[2]] += 1
        return await continuation(details)


class CountingProxy:
    """The proxy's service (``rmqha.proxy.server.build_service``) on a gRPC server in this
    process, behind a :class:`CallCounter`; on its own thread and asyncio loop."""

    def __init__(self, cluster: Cluster) -> None:
        self.port = free_port()
        self.cfg = load_proxy_config(None, namesrv_addr=";".join(cluster.namesrv_addresses),
                                     rocketmq_cluster_name=cluster.cluster_name,
                                     grpc_server_port=self.port)
        self.counter = CallCounter()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the in-process proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        service, cluster, _ = build_service(self.cfg)
        server = grpc.aio.server(interceptors=[self.counter])
        service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
        server.add_insecure_port(self.cfg.address)
        await server.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await server.stop(1.0)
            await cluster.close()


def _idle_simple(endpoint: str, window_s: float) -> Callable[[], None]:
    """A SimpleConsumer receiving in a loop with nothing to receive; returns its stop."""
    consumer = rocketmq.SimpleConsumer(_configuration(endpoint), "bench_proxy_idle_simple",
                                       {IDLE_TOPIC: rocketmq.FilterExpression()}, await_duration=5)
    consumer.startup()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                consumer.receive(BATCH, 30)
            except ClientException:
                continue  # counted at the proxy all the same: a failing loop is a storm
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(30)
        consumer.shutdown()
    return close


def _idle_push(endpoint: str, window_s: float) -> Callable[[], None]:
    class Listener(rocketmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            return rocketmq.ConsumeResult.SUCCESS

    consumer = rocketmq.PushConsumer(_configuration(endpoint), "bench_proxy_idle_push", Listener(),
                                     {IDLE_TOPIC: rocketmq.FilterExpression()})
    consumer.startup()
    return consumer.shutdown  # type: ignore[no-any-return]


def _idle_java(push: bool) -> Callable[[str, float], Callable[[], None]]:
    """A Java SimpleConsumer in a receive loop (20 s long polls) or a PushConsumer with
    nothing to receive (GrpcBench idle-*); returns its stop once it reported ready."""
    def start(endpoint: str, window_s: float) -> Callable[[], None]:
        home = tempfile.mkdtemp(prefix="bench-java-idle-")
        cmd = java_command("idle-push" if push else "idle-simple", IDLE_TOPIC, str(int(window_s) + 120),
                           f"bench_proxy_idle_java_{'push' if push else 'simple'}")
        cmd.insert(1, f"-Drocketmq.log.root={home}")
        err = Path(home) / "stderr.txt"
        with err.open("w") as err_file:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True,
                                    env={**os.environ, "INTEROP_PROXY": endpoint})
        assert proc.stdout is not None
        for text in proc.stdout:
            if '"ready"' in text:
                break
        else:
            raise AssertionError(f"the Java idle consumer exited {proc.wait()} before it was ready: "
                                 f"{err.read_text()[-3000:]}")

        def close() -> None:
            proc.kill()
            proc.wait(10)
            shutil.rmtree(home, ignore_errors=True)
        return close
    return start


IDLE_KINDS: dict[str, Callable[[str, float], Callable[[], None]]] = {
    "java-simple-consumer": _idle_java(push=False), "java-push-consumer": _idle_java(push=True),
    "simple-consumer": _idle_simple, "push-consumer": _idle_push,
}


@pytest.mark.benchmark(group="proxy-idle-consumer")
@pytest.mark.parametrize("kind", list(IDLE_KINDS))
def test_idle_consumer_request_rate(benchmark: Any, bench_cluster: Setup, kind: str) -> None:
    with CountingProxy(bench_cluster.cluster) as proxy:
        close = IDLE_KINDS[kind](proxy.address, IDLE_WINDOW_S)
        try:
            counted: dict[str, Counter[str]] = {}

            def window() -> None:
                before = Counter(proxy.counter.calls)
                time.sleep(IDLE_WINDOW_S)  # the measurement window itself
                counted["calls"] = Counter(proxy.counter.calls) - before
            benchmark.pedantic(window, rounds=1, iterations=1)
        finally:
            close()
    calls = counted["calls"]
    receive_per_s = calls["ReceiveMessage"] / IDLE_WINDOW_S
    all_per_s = sum(calls.values()) / IDLE_WINDOW_S
    benchmark.extra_info.update({
        "implementation": f"rocketmq5-{kind}", "window_s": IDLE_WINDOW_S,
        "receive_calls_per_s": round(receive_per_s, 3),
        "all_calls_per_s": round(all_per_s, 3),
        "calls": dict(calls), "target_per_s": IDLE_TARGET_PER_S,
        "target_met": all_per_s < IDLE_TARGET_PER_S,
    })
    print(f"\nidle {kind}: {receive_per_s:.2f} ReceiveMessage/s, {all_per_s:.2f} calls/s over "
          f"{IDLE_WINDOW_S:.0f} s (target < {IDLE_TARGET_PER_S:g}); calls: {dict(calls)}")


# --- what one unary call costs the server: grpcio alone, and the proxy ---------------------


FLOOR_CALLS = _n(20_000, 4000)
FLOOR_CONCURRENCY = 64
FLOOR_SERVER = Path(__file__).resolve().parent / "grpc_floor_server.py"


async def _call_many(endpoint: str, call: Callable[[grpc.aio.Channel], Any]) -> None:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        await call(channel)   # warm-up: connection and the server's first-call paths
        todo = iter(range(FLOOR_CALLS))

        async def worker() -> None:
            for _ in todo:
                await call(channel)
        await asyncio.gather(*(worker() for _ in range(FLOOR_CONCURRENCY)))


def _noop_call(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary("/bench.Floor/Echo")(b"x" * 64)


def _query_route_call(channel: grpc.aio.Channel) -> Any:
    request = spb.QueryRouteRequest(topic=pb.Resource(name=PRODUCE_TOPIC), endpoints=pb.Endpoints(
        scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)]))
    return service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
        request, metadata=(("x-mq-client-id", "bench-floor"),))


def _server_cpu_per_call(endpoint: str, pid: int, call: Callable[[grpc.aio.Channel], Any]) -> float:
    loop = event_loop.new_event_loop()
    try:
        cpu0 = proc_cpu_s(pid)
        loop.run_until_complete(_call_many(endpoint, call))
        return (proc_cpu_s(pid) - cpu0) / (FLOOR_CALLS + 1)
    finally:
        loop.close()


@pytest.mark.benchmark(group="proxy-server-cpu-per-call")
@pytest.mark.parametrize("server", ["grpcio-noop", "proxy-QueryRoute"])
def test_server_cpu_per_unary_call(benchmark: Any, bench_cluster: Setup, server: str) -> None:
    """CPU the server process spends per unary call, 64 calls in flight from this process:
    grpcio's own cost (a no-op bytes handler, benches/grpc_floor_server.py) and the proxy's
    cheapest served call (QueryRoute of a cached route: grpcio, protobuf, the proxy's call
    plumbing, no broker round trip).  What a second core buys follows: 1e6 / µs calls per
    second per core."""
    if server == "grpcio-noop":
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(FLOOR_SERVER), str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
            per_call = _server_cpu_per_call(f"127.0.0.1:{port}", proc.pid, _noop_call)
        finally:
            proc.kill()
            proc.wait(10)
    else:
        per_call = _server_cpu_per_call(bench_cluster.proxy.address, proxy_pid(bench_cluster), _query_route_call)
    us = per_call * 1e6
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.extra_info.update({"implementation": server, "calls": FLOOR_CALLS, "concurrency": FLOOR_CONCURRENCY,
                                 "server_cpu_us_per_call": round(us, 1),
                                 "calls_per_core_s": round(1e6 / us) if us > 0 else None})
    print(f"\n{server}: {us:.1f} µs of server CPU per unary call ({FLOOR_CALLS} calls, "
          f"{FLOOR_CONCURRENCY} in flight): at most {1e6 / us if us else 0:,.0f} calls/s per core")
