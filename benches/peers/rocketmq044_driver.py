"""The load driver for the Python ``rocketmq`` 0.4.4 client (RocketMQ's C++ client 1.2 behind
ctypes), speaking the Java driver's line protocol (``benches/peers/maven/driver``,
``io.rmqha.peers.Load``): the same client against RocketMQ 5 and rmqha, in a child process
of its own because a fault in the C++ library aborts the process it runs in (see
tests/integration/test_official_client.py).

``python benches/peers/rocketmq044_driver.py NAMESRV``, then one command a line on stdin::

    one TOPIC N BYTES | batch TOPIC BATCHES SIZE BYTES | window TOPIC N WINDOW BYTES
    read TOPIC N | until_ok TOPIC BYTES MS | quit

answered with ``ok ELAPSED_NS CPU_NS COUNT [LATENCY_NS ...]`` or ``error TEXT``.  CPU is this
process's (the C++ client's threads included).  ``send_sync`` is one at a time,
``send_batch`` a batch (one request), ``send_async`` with a semaphore of WINDOW the window,
and a ``PullConsumer`` walking every queue from offset 0 reads back.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: Send timeout (ms) of the producer; the failover probe's own is shorter.
SEND_TIMEOUT_MS = 10_000
PROBE_TIMEOUT_MS = 1_000


class Driver:
    def __init__(self, namesrv: str) -> None:
        from rocketmq.client import Producer

        self.namesrv = namesrv
        self.producer = Producer(f"bench_py044_{os.getpid()}", timeout=SEND_TIMEOUT_MS)
        self.producer.set_namesrv_addr(namesrv)
        self.producer.start()
        self.probe_producer = Producer(f"bench_py044_probe_{os.getpid()}", timeout=PROBE_TIMEOUT_MS)
        self.probe_producer.set_namesrv_addr(namesrv)
        self.probe_producer.start()
        self.failed = False

    @staticmethod
    def message(topic: str, body: bytes) -> Any:
        from rocketmq.client import Message

        msg = Message(topic)
        msg.set_body(body)
        return msg

    @staticmethod
    def check(result: Any) -> None:
        from rocketmq.client import SendStatus

        if result.status != SendStatus.OK:
            raise RuntimeError(f"send answered {result.status!r}")

    def one(self, topic: str, n: str, size: str) -> tuple[int, list[int]]:
        body, lat = b"x" * int(size), []
        clock, send = time.perf_counter_ns, self.producer.send_sync
        for _ in range(int(n)):
            t0 = clock()
            self.check(send(self.message(topic, body)))
            lat.append(clock() - t0)
        return int(n), lat

    def batch(self, topic: str, batches: str, size: str, nbytes: str) -> tuple[int, list[int]]:
        body, lat = b"x" * int(nbytes), []
        clock = time.perf_counter_ns
        for _ in range(int(batches)):
            msgs = [self.message(topic, body) for _ in range(int(size))]
            t0 = clock()
            self.check(self.producer.send_batch(msgs))
            lat.append(clock() - t0)
        return int(batches) * int(size), lat

    def window(self, topic: str, n: str, window: str, nbytes: str) -> tuple[int, list[int]]:
        body, free = b"x" * int(nbytes), threading.Semaphore(int(window))
        failures: list[BaseException] = []

        def ok(result: Any) -> None:
            free.release()

        def failed(exc: BaseException) -> None:
            failures.append(exc)
            free.release()

        for _ in range(int(n)):
            if failures:
                break
            free.acquire()
            self.producer.send_async(self.message(topic, body), ok, failed)
        for _ in range(int(window)):  # every send answered
            free.acquire()
        if failures:
            raise RuntimeError(f"{len(failures)} windowed sends failed, e.g. {failures[0]!r}")
        return int(n), []

    def read(self, topic: str, n: str) -> tuple[int, list[int]]:
        from rocketmq.client import PullConsumer

        consumer = PullConsumer(f"bench_read_py044_{time.monotonic_ns()}")
        consumer.offset_table = {}  # the binding keeps offsets in a class attribute
        consumer.set_namesrv_addr(self.namesrv)
        consumer.start()
        got, deadline = 0, time.monotonic() + 120
        try:
            while got < int(n) and time.monotonic() < deadline:
                for _ in consumer.pull(topic, max_num=32):
                    got += 1
        finally:
            consumer.shutdown()
        return got, []

    def until_ok(self, topic: str, nbytes: str, ms: str) -> tuple[int, list[int]]:
        body, deadline = b"x" * int(nbytes), time.monotonic() + int(ms) / 1000
        attempts, last = 0, None
        while time.monotonic() < deadline:
            attempts += 1
            try:
                self.check(self.probe_producer.send_sync(self.message(topic, body)))
                return attempts, []
            except Exception as exc:  # noqa: BLE001 - the binding raises its own kinds
                self.failed, last = True, exc
                time.sleep(0.005)
        raise RuntimeError(f"no send acked within {ms} ms: {last!r}")


def serve(driver: Driver, answer: Callable[[str], None]) -> None:
    commands = {"one": driver.one, "batch": driver.batch, "window": driver.window,
                "read": driver.read, "until_ok": driver.until_ok}
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        cpu0, t0 = time.process_time_ns(), time.perf_counter_ns()
        try:
            count, lat = commands[words[0]](*words[1:])
        except Exception as exc:  # noqa: BLE001 - every failure is answered, not raised
            answer(f"error {type(exc).__name__}: {exc}".replace("\n", " "))
            continue
        elapsed, cpu = time.perf_counter_ns() - t0, time.process_time_ns() - cpu0
        answer(" ".join(["ok", str(elapsed), str(cpu), str(count), *map(str, lat)]))


def main() -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the C++ client may print: answers keep stdout to themselves
    driver = Driver(sys.argv[1])
    out.write("ready\n")
    serve(driver, lambda text: out.write(text + "\n"))
    out.flush()
    if driver.failed:
        # The C++ 1.2 client may abort in shutdown() after a send that failed every retry.
        os._exit(0)
    driver.producer.shutdown()
    driver.probe_producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
