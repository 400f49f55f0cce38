"""rmqha beside Apache RocketMQ 5 and Apache Kafka, each row one client against one system
(``bench_peers.py --jvm-peers``, the ``jvm-peers-table`` of docs/benchmarks.md).

The same client drives rmqha and RocketMQ in a row: RocketMQ's Java remoting client
(rocketmq-client 5.5.0, through the Java driver) and the Python ``rocketmq`` 0.4.4 (C++
client 1.2).  Kafka runs with its Java client and with ``confluent-kafka``; its rows are set
against rmqha with the Java remoting client and with rmqha's own Python client.  Every
client runs in a driver process of its own (:mod:`peers.load_driver`) that measures each
workload around the client's own calls.

A :class:`Target` is a running group and how to kill and heal its leader; targets of one
kind share one cluster (:class:`Clusters`: one rmqha cluster, one RocketMQ 5 cluster, one
Kafka cluster whatever the clients), so only clients differ between the rows of a system.
Failovers run last, one system after another: each heals the group first (restarts the
broker the previous one killed and waits until all three are in sync again), kills the
master or partition leader with SIGKILL and times the first acknowledged send.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from peers.base import Measurement, PeerSystem, wait_until
from peers.jvm import KAFKA_VERSION, ROCKETMQ_VERSION, Heap
from peers.kafka_cluster import TOPICS as KAFKA_TOPICS
from peers.kafka_cluster import KafkaCluster
from peers.load_driver import DriverError, LoadDriver, confluent_driver, java_driver, rocketmq044_driver
from peers.rmqha_system import TOPICS as RMQHA_TOPICS
from peers.rmqha_system import RmqhaSystem
from peers.rocketmq_cluster import RocketmqCluster

#: How long the failover probe waits for an acknowledged send after the kill.
FAILOVER_DEADLINE_S = 60.0
#: min.insync.replicas=3 with one node of three down acknowledges nothing: shown, briefly.
NO_QUORUM_DEADLINE_S = 15.0
#: Topic of the RocketMQ 5 cluster (8 queues on its one broker group, as rmqha's Bench3).
ROCKETMQ_TOPIC = "Bench3"


class Clusters:
    """The clusters the driven systems share: each started on first use, all stopped at
    the end (:meth:`stop`)."""

    def __init__(self, workdir: Path, heaps: Mapping[str, Heap], rmqha: RmqhaSystem | None = None) -> None:
        self.workdir = workdir
        self.heaps = heaps
        self._rmqha = rmqha
        self._own_rmqha = False
        self._rocketmq: RocketmqCluster | None = None
        self._kafka: KafkaCluster | None = None

    def rmqha(self) -> RmqhaSystem:
        if self._rmqha is None:
            self._rmqha = RmqhaSystem(copies=(3,))
            self._own_rmqha = True
            self._rmqha.start_on_free_ports(self.workdir / "rmqha")
        return self._rmqha

    def rocketmq(self) -> RocketmqCluster:
        if self._rocketmq is None:
            self._rocketmq = RocketmqCluster(self.workdir / "rocketmq", self.heaps)
            self._rocketmq.start()
            self._rocketmq.create_topic(ROCKETMQ_TOPIC)
        return self._rocketmq

    def kafka(self) -> KafkaCluster:
        if self._kafka is None:
            self._kafka = KafkaCluster(self.workdir / "kafka", self.heaps)
            self._kafka.start()
        return self._kafka

    def stop(self) -> None:
        for stop in ([self._rocketmq.stop] if self._rocketmq else []) + (
                [self._kafka.stop] if self._kafka else []) + (
                [self._rmqha.stop] if self._rmqha and self._own_rmqha else []):
            stop()
        self._rocketmq = self._kafka = None


class Target(ABC):
    """One group a client writes to: its address, topic, leader kill and heal."""

    system: str = "?"

    @abstractmethod
    def address(self) -> str: ...

    @abstractmethod
    def topic(self) -> str: ...

    @abstractmethod
    def heal(self) -> None:
        """Restart whatever an earlier failover killed; wait until three are in sync."""

    @abstractmethod
    def kill_leader(self) -> str:
        """SIGKILL the master / partition leader; what was killed."""


@dataclass
class RmqhaTarget(Target):
    clusters: Clusters
    system: str = "rmqha"

    def address(self) -> str:
        c = self.clusters.rmqha().cluster
        assert c is not None
        return c.namesrv_addresses[0]

    def topic(self) -> str:
        return RMQHA_TOPICS[3]

    def heal(self) -> None:
        c = self.clusters.rmqha().cluster
        assert c is not None
        for proc in c.brokers:
            if not proc.alive:
                proc.restart()
                c.wait_broker_up(proc, 120)
        c.wait_for(lambda: (info := c.replica_info("broker-a")) is not None
                   and len(info.sync_state_set) == 3 and c.master_of("broker-a") is not None,
                   120, what="three brokers of broker-a in sync")

    def kill_leader(self) -> str:
        c = self.clusters.rmqha().cluster
        assert c is not None
        master = wait_until(lambda: c.master_of("broker-a"), 30, "the master of broker-a")
        master.kill()
        return master.name


@dataclass
class RocketmqTarget(Target):
    clusters: Clusters
    system: str = f"RocketMQ {ROCKETMQ_VERSION}"

    def address(self) -> str:
        return self.clusters.rocketmq().namesrv_address

    def topic(self) -> str:
        return ROCKETMQ_TOPIC

    def heal(self) -> None:
        c = self.clusters.rocketmq()
        for name, proc in c.brokers.items():
            if not proc.alive:
                c.restart(name)
        c.wait_in_sync(180)

    def kill_leader(self) -> str:
        c = self.clusters.rocketmq()
        name = wait_until(c.master, 30, "the master of the RocketMQ group")
        c.brokers[name].kill()
        return name


@dataclass
class KafkaTarget(Target):
    clusters: Clusters
    min_isr: int = 3

    @property
    def system(self) -> str:  # type: ignore[override]
        return f"Kafka {KAFKA_VERSION}, min.insync.replicas={self.min_isr}"

    def address(self) -> str:
        return self.clusters.kafka().bootstrap

    def topic(self) -> str:
        return KAFKA_TOPICS[self.min_isr]

    def heal(self) -> None:
        c = self.clusters.kafka()
        for node, proc in c.nodes.items():
            if not proc.alive:
                c.restart(node)
        for topic in KAFKA_TOPICS.values():
            c.wait_isr(topic, 3, 180)

    def kill_leader(self) -> str:
        c = self.clusters.kafka()
        leader = c.wait_isr(self.topic(), 3, 60)
        c.nodes[leader].kill()
        return c.nodes[leader].name


#: Each client: its label, how it publishes, and how its driver starts.
@dataclass(frozen=True)
class Client:
    label: str
    publishes: str
    start: Callable[[str, Path, Heap], LoadDriver]


REMOTING_JAVA = Client(
    f"RocketMQ remoting client {ROCKETMQ_VERSION} (Java)",
    "DefaultMQProducer: send() / send(batch of 32, one request) / send(msg, callback) under a "
    "semaphore; DefaultLitePullConsumer reads back",
    lambda address, log, heap: java_driver("rocketmq", address, heap, log))
ROCKETMQ_044 = Client(
    "rocketmq 0.4.4 (Python, C++ client 1.2)",
    "send_sync / send_batch(32, one request) / send_async under a semaphore; PullConsumer reads back",
    lambda address, log, heap: rocketmq044_driver(address, log))
KAFKA_JAVA = Client(
    f"kafka-clients {KAFKA_VERSION} (Java)",
    "KafkaProducer acks=all linger.ms=0: send().get() / 32 send() then get() / send(callback) "
    "under a semaphore; KafkaConsumer reads back",
    lambda address, log, heap: java_driver("kafka", address, heap, log))
CONFLUENT = Client(
    "confluent-kafka (Python, librdkafka)",
    "Producer acks=all linger.ms=0: produce+flush / 32 produce then flush / produce with at most "
    "256 undelivered; Consumer reads back",
    lambda address, log, heap: confluent_driver(address, log))


class DrivenSystem(PeerSystem):
    """One client against one target, through its driver process."""

    def __init__(self, name: str, target: Target, client: Client, baseline: str,
                 client_heap: Heap, failover_deadline_s: float = FAILOVER_DEADLINE_S) -> None:
        self.name = name
        self.target = target
        self.client = client
        self.baseline = baseline
        self.client_heap = client_heap
        self.failover_deadline_s = failover_deadline_s
        self.driver: LoadDriver | None = None

    def start(self, workdir: Path) -> None:
        self.driver = self.client.start(self.target.address(), workdir / "driver.log", self.client_heap)
        self.driver.run("one", self.target.topic(), 1, 16)  # warm-up: routes, connections

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.close()
            self.driver = None

    def measure(self, workload: str, messages: int, param: int, body_bytes: int) -> Measurement:
        """One workload through the driver: its own clock and CPU time."""
        assert self.driver is not None
        topic = self.target.topic()
        if workload == "one at a time":
            a = self.driver.run("one", topic, messages, body_bytes)
        elif workload == "batch of 32":
            a = self.driver.run("batch", topic, messages // param, param, body_bytes)
        elif workload == "window of 256":
            a = self.driver.run("window", topic, messages, param, body_bytes)
        elif workload == "read back":
            a = self.driver.run("read", topic, messages)
        else:
            raise ValueError(workload)
        return Measurement(self.name, workload, 3, a.count, a.elapsed_s, a.cpu_s, a.latencies_s)

    # The PeerSystem workloads, for callers that time from outside.
    def one_at_a_time(self, copies: int, n: int, body: bytes) -> list[float]:
        return self.measure("one at a time", n, 1, len(body)).latencies_s

    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        return self.measure("batch of 32", n_batches * size, size, len(body)).latencies_s

    def window(self, copies: int, n: int, window: int, body: bytes) -> None:
        self.measure("window of 256", n, window, len(body))

    def read_back(self, copies: int, n: int) -> int:
        return self.measure("read back", n, 0, 0).messages

    def failover(self, body: bytes) -> float | None:
        """Heal, send once, SIGKILL the leader, time the first acknowledged send; None when
        none is acknowledged before the deadline (Kafka with min.insync.replicas=3)."""
        assert self.driver is not None
        self.target.heal()
        topic = self.target.topic()
        # One acknowledged send first; a client may still hold the route it had before the
        # heal (the C++ client refreshes every 30 s), so it gets the probe's deadline.
        self.driver.run("until_ok", topic, len(body), int(FAILOVER_DEADLINE_S * 1000))
        self.target.kill_leader()
        killed = time.perf_counter()
        try:
            self.driver.run("until_ok", topic, len(body), int(self.failover_deadline_s * 1000))
        except DriverError as exc:
            if "no send acked" in str(exc):
                return None
            raise
        return time.perf_counter() - killed


def rmqha_failover(system: RmqhaSystem, target: RmqhaTarget, body: bytes) -> float | None:
    """The native client's failover on the shared rmqha cluster, healed first like the rest."""
    target.heal()
    return system.failover(body)


def make_driven(names: list[str], clusters: Clusters, client_heap: Heap) -> dict[str, DrivenSystem]:
    """The driven systems named (see :data:`DRIVEN`), on the shared clusters."""
    rmqha, rocketmq = RmqhaTarget(clusters), RocketmqTarget(clusters)
    kafka = {3: KafkaTarget(clusters, 3), 2: KafkaTarget(clusters, 2)}
    table: dict[str, tuple[Target, Client, str, float]] = {
        "rmqha-java": (rmqha, REMOTING_JAVA, "rmqha", FAILOVER_DEADLINE_S),
        "rocketmq-java": (rocketmq, REMOTING_JAVA, "rmqha-java", FAILOVER_DEADLINE_S),
        "rmqha-py044": (rmqha, ROCKETMQ_044, "rmqha", FAILOVER_DEADLINE_S),
        "rocketmq-py044": (rocketmq, ROCKETMQ_044, "rmqha-py044", FAILOVER_DEADLINE_S),
        "kafka3-java": (kafka[3], KAFKA_JAVA, "rmqha-java", NO_QUORUM_DEADLINE_S),
        "kafka2-java": (kafka[2], KAFKA_JAVA, "rmqha-java", FAILOVER_DEADLINE_S),
        "kafka3-confluent": (kafka[3], CONFLUENT, "rmqha", NO_QUORUM_DEADLINE_S),
        "kafka2-confluent": (kafka[2], CONFLUENT, "rmqha", FAILOVER_DEADLINE_S),
    }
    out = {}
    for name in names:
        if name not in table:
            raise SystemExit(f"unknown JVM-peer system {name!r}; known: {', '.join(DRIVEN)}")
        target, client, baseline, deadline = table[name]
        out[name] = DrivenSystem(name, target, client, baseline, client_heap, deadline)
    return out


#: Every driven system, in table order.
DRIVEN = ("rmqha-java", "rocketmq-java", "rmqha-py044", "rocketmq-py044",
          "kafka3-java", "kafka2-java", "kafka3-confluent", "kafka2-confluent")
