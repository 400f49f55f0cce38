"""A real Apache Kafka 4 cluster in KRaft mode on loopback, from the jars ``benches/peers/maven``
pins (Kafka 4.1.1).

Three nodes, each broker and controller at once (``process.roles=broker,controller``, a
static three-voter quorum), each a ``kafka.Kafka`` JVM with its own generated
``server.properties``, log dir and log4j2 log, its storage formatted first with
``kafka.tools.StorageTool format`` (the class behind ``kafka-storage.sh`` in 4.x) under one
random cluster id.  Topics have one partition replicated three times (one leader and two
followers, as one master and two slaves serve a RocketMQ broker group) and
``min.insync.replicas`` 3 or 2 (:data:`TOPICS`); with ``acks=all`` the leader answers once
every in-sync replica has the record, so both give three copies while all three are up,
and only the 2 topic keeps accepting writes with one node down.  Kafka's default flush:
none per record (the page cache; replication is the durability).

Topics are made, and a partition's leader asked for, through the Java driver's Admin client
(``Load kafka ...``).
"""
from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from peers.base import free_port, wait_port
from peers.jvm import Heap, JvmProc
from peers.load_driver import LoadDriver, java_driver

KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
#: Topic name by min.insync.replicas (replication factor 3 for both).
TOPICS = {3: "bench3", 2: "bench2"}
LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = warn
logger.apache.name = org.apache.kafka
logger.apache.level = warn
"""


def cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaCluster:
    """Three combined broker/controller nodes; the Admin client of one Java driver."""

    def __init__(self, workdir: Path, heaps: Mapping[str, Heap], client_heap: Heap | None = None) -> None:
        self.workdir = workdir
        self.heap = heaps["kafka"]
        self.client_heap = client_heap or heaps["client"]
        self.nodes: dict[int, JvmProc] = {}
        self.broker_ports: dict[int, int] = {}
        self.admin: LoadDriver | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.broker_ports.values())

    def start(self, timeout: float = 180.0) -> None:
        ids = [1, 2, 3]
        self.broker_ports = {i: free_port() for i in ids}
        controller_ports = {i: free_port() for i in ids}
        voters = ",".join(f"{i}@127.0.0.1:{controller_ports[i]}" for i in ids)
        cid = cluster_id()
        for i in ids:
            node = self.workdir / f"kafka-{i}"
            props = node / "server.properties"
            node.mkdir(parents=True, exist_ok=True)
            props.write_text("".join(f"{k}={v}\n" for k, v in {
                "process.roles": "broker,controller",
                "node.id": i,
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_ports[i]},"
                             f"CONTROLLER://127.0.0.1:{controller_ports[i]}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_ports[i]}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": node / "data",
                "num.partitions": 1,
                "default.replication.factor": 3,
                "min.insync.replicas": 2,
                "offsets.topic.replication.factor": 3,
                "transaction.state.log.replication.factor": 3,
                "transaction.state.log.min.isr": 2,
                "group.initial.rebalance.delay.ms": 0,
                "auto.create.topics.enable": "false",
            }.items()))
            (node / "log4j2.properties").write_text(LOG4J2.format(log=node / "server.log"))
            sysprops = {"log4j2.configurationFile": str(node / "log4j2.properties"),
                        "kafka.logs.dir": str(node)}
            fmt = JvmProc(f"kafka-{i}-format", "kafka", STORAGE_TOOL,
                          ["format", "-t", cid, "-c", str(props)], self.client_heap,
                          node / "format.out", system_properties=sysprops).start()
            assert fmt.proc is not None
            if fmt.proc.wait(120) != 0:
                raise RuntimeError(f"kafka-storage format of node {i} failed:\n{fmt.log_tail()}")
            self.nodes[i] = JvmProc(f"kafka-{i}", "kafka", KAFKA_MAIN, [str(props)], self.heap,
                                    node / "kafka.out", system_properties=sysprops)
        for proc in self.nodes.values():
            proc.start()
        for i, proc in self.nodes.items():
            wait_port(self.broker_ports[i], timeout, f"Kafka node {i}", proc.proc, proc.log)
        self.admin = java_driver("kafka", self.bootstrap, self.client_heap,
                                 self.workdir / "admin" / "admin.err")
        deadline = time.monotonic() + timeout
        for min_isr, topic in TOPICS.items():
            while True:  # the brokers register with the quorum a moment after listening
                try:
                    self.admin.raw("create", self.bootstrap, topic, 1, 3, min_isr)
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            self.wait_isr(topic, 3, timeout)

    def partition(self, topic: str) -> tuple[int, int]:
        """(leader node id or -1, ISR size) of the topic's partition."""
        assert self.admin is not None
        words = self.admin.raw("partition", self.bootstrap, topic)
        return int(words[3]), int(words[4])

    def wait_isr(self, topic: str, size: int, timeout: float = 120.0) -> int:
        """Until the partition has a leader and ``size`` in-sync replicas; the leader."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                leader, isr = last = self.partition(topic)
            except RuntimeError as exc:
                last = exc
            else:
                if leader >= 0 and isr == size and self.nodes[leader].alive:
                    return leader
            time.sleep(0.2)
        raise TimeoutError(f"{topic} not at ISR {size} within {timeout:g}s; last: {last!r}\n"
                           + "\n".join(f"--- {p.name}\n{p.log_tail(10)}" for p in self.nodes.values()))

    def restart(self, node: int, timeout: float = 180.0) -> None:
        proc = self.nodes[node]
        proc.start()
        wait_port(self.broker_ports[node], timeout, f"Kafka node {node}", proc.proc, proc.log)

    def stop(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        for proc in self.nodes.values():
            proc.kill()
