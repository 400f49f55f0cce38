"""The load driver for the Python clients of the JVM peers, speaking the Java driver's line
protocol (``benches/peers/maven/driver``, ``io.rmqha.peers.Load``), each in a child process
of its own (a fault in a C/C++ library aborts the process it runs in; see
tests/integration/test_official_client.py):

- ``rocketmq044 NAMESRV``: the Python ``rocketmq`` 0.4.4 client (RocketMQ's C++ client 1.2
  behind ctypes), the same against RocketMQ 5 and rmqha.  ``send_sync`` is one at a time,
  ``send_batch`` a batch (one request), ``send_async`` under a semaphore of WINDOW the
  window, a ``PullConsumer`` walking every queue from offset 0 reads back.
- ``confluent BOOTSTRAP``: ``confluent-kafka`` (librdkafka) against Kafka, ``acks=all``,
  ``linger.ms=0``.  ``produce`` + ``flush`` is one at a time, 32 ``produce`` + one ``flush``
  a batch (librdkafka packs them into record batches), ``produce`` with at most WINDOW
  undelivered (``poll`` serving the delivery callbacks) the window, a ``Consumer`` assigned
  to partition 0 from the beginning reads back.

``python benches/peers/py_driver.py KIND ADDRESS``, then one command a line on stdin::

    one TOPIC N BYTES | batch TOPIC BATCHES SIZE BYTES | window TOPIC N WINDOW BYTES
    read TOPIC N | until_ok TOPIC BYTES MS | quit

answered with ``ok ELAPSED_NS CPU_NS COUNT [LATENCY_NS ...]`` or ``error TEXT``.  CPU is this
process's (the client library's threads included).
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


class Rocketmq044:
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
            from rocketmq.client import SendStatus

            if result.status != SendStatus.OK:
                failures.append(RuntimeError(f"send answered {result.status!r}"))
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

    def close(self) -> None:
        if self.failed:
            # The C++ 1.2 client may abort in shutdown() after a send that failed every retry.
            os._exit(0)
        self.producer.shutdown()
        self.probe_producer.shutdown()


class Confluent:
    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self.bootstrap = bootstrap
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                                  "message.timeout.ms": 60_000})
        self.failed = False

    def _sync(self, topic: str, body: bytes, count: int, timeout: float = 60.0) -> None:
        """``count`` produces, then flush; raises the first delivery error."""
        errors: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)

        for _ in range(count):
            self.producer.produce(topic, body, on_delivery=delivered)
        left = self.producer.flush(timeout)
        if errors or left:
            raise RuntimeError(f"delivery failed: {errors[:1]!r}, {left} undelivered")

    def one(self, topic: str, n: str, size: str) -> tuple[int, list[int]]:
        body, lat, clock = b"x" * int(size), [], time.perf_counter_ns
        for _ in range(int(n)):
            t0 = clock()
            self._sync(topic, body, 1)
            lat.append(clock() - t0)
        return int(n), lat

    def batch(self, topic: str, batches: str, size: str, nbytes: str) -> tuple[int, list[int]]:
        body, lat, clock = b"x" * int(nbytes), [], time.perf_counter_ns
        for _ in range(int(batches)):
            t0 = clock()
            self._sync(topic, body, int(size))
            lat.append(clock() - t0)
        return int(batches) * int(size), lat

    def window(self, topic: str, n: str, window: str, nbytes: str) -> tuple[int, list[int]]:
        body, limit = b"x" * int(nbytes), int(window)
        state = {"in_flight": 0}
        errors: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            state["in_flight"] -= 1
            if err is not None:
                errors.append(err)

        produce, poll = self.producer.produce, self.producer.poll
        for _ in range(int(n)):
            while state["in_flight"] >= limit and not errors:
                poll(1.0)
            if errors:
                break
            produce(topic, body, on_delivery=delivered)
            state["in_flight"] += 1
        left = self.producer.flush(60)
        if errors or left:
            raise RuntimeError(f"{len(errors)} windowed sends failed, e.g. {errors[:1]!r}; {left} undelivered")
        return int(n), []

    def read(self, topic: str, n: str) -> tuple[int, list[int]]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"read{time.monotonic_ns()}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got, deadline = 0, time.monotonic() + 120
        try:
            while got < int(n) and time.monotonic() < deadline:
                got += sum(1 for m in consumer.consume(num_messages=2000, timeout=2) if m.error() is None)
        finally:
            consumer.close()
        return got, []

    def until_ok(self, topic: str, nbytes: str, ms: str) -> tuple[int, list[int]]:
        # librdkafka retries until message.timeout.ms itself: the first delivery reported
        # is the first send acked after the kill.
        body, deadline = b"x" * int(nbytes), time.monotonic() + int(ms) / 1000
        attempts, last = 0, None
        while time.monotonic() < deadline:
            attempts += 1
            try:
                self._sync(topic, body, 1, max(0.001, deadline - time.monotonic()))
                return attempts, []
            except RuntimeError as exc:
                self.failed, last = True, exc
        raise RuntimeError(f"no send acked within {ms} ms: {last!r}")

    def close(self) -> None:
        self.producer.flush(5)


def serve(driver: Rocketmq044 | Confluent, answer: Callable[[str], None]) -> None:
    commands: dict[str, Callable[..., tuple[int, list[int]]]] = {
        "one": driver.one, "batch": driver.batch, "window": driver.window,
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
    kind, address = sys.argv[1:3]
    driver = Rocketmq044(address) if kind == "rocketmq044" else Confluent(address)
    out.write("ready\n")
    def answer(text: str) -> None:
        out.write(text + "\n")

    serve(driver, answer)
    out.flush()
    driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
