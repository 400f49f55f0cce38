"""The JVM peers of ``make bench-peers`` at tiny size: real RocketMQ 5 (name server with the
controller embedded, three brokers in controller mode) and real Kafka 4 (KRaft, three nodes),
driven by the same driver processes the benchmark uses, 100 messages per workload and one
leader kill each.  This proves the harness without producing a figure.

Run by ``make test-peers-smoke`` (after ``make peers-jars``), not by ``make test``: the root
conftest ignores this folder unless it is named on the command line.  Heaps are the tests'
(``TEST_HEAPS``: brokers 256 MiB); a full start takes a minute or two on a loaded machine.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

from peers.driven import Clusters, DrivenSystem, make_driven  # noqa: E402
from peers.jvm import TEST_HEAPS, build  # noqa: E402

N = 100
BODY = 1024
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    build()
    c = Clusters(tmp_path_factory.mktemp("jvm-peers"), TEST_HEAPS)
    try:
        yield c
    finally:
        c.stop()


BATCHES = 3


def _drive(system: DrivenSystem, workdir: Path) -> int:
    """Every produce workload at N messages (batches: BATCHES of 32); how many were acknowledged."""
    system.start(workdir)
    sent = 1  # the warm-up send of start()
    for workload, param in (("one at a time", 1), ("batch of 32", 32), ("window of 256", 256)):
        n = N if workload != "batch of 32" else 32 * BATCHES
        m = system.measure(workload, n, param, BODY)
        assert m.messages == n and not m.note, (workload, m)
        assert m.elapsed_s > 0 and m.client_cpu_s >= 0, m
        if workload != "window of 256":
            assert len(m.latencies_s) == (n if param == 1 else n // param), (workload, len(m.latencies_s))
        sent += n
    return sent


def _read_all(system: DrivenSystem, at_least: int) -> int:
    m = system.measure("read back", at_least, 0, 0)
    return m.messages


def test_rocketmq5_controller_mode_driven_by_java_and_rocketmq044(clusters: Clusters, tmp_path: Path) -> None:
    systems = make_driven(["rocketmq-java", "rocketmq-py044"], clusters, TEST_HEAPS["client"])
    cluster = clusters.rocketmq()
    state = cluster.replica_state()
    assert state is not None and len(state.sync_state_set) == 3, state  # all three in sync: 3 copies
    acked = 0
    try:
        for name, system in systems.items():
            acked += _drive(system, tmp_path / name)
        # RocketMQ 5 stores each batch of rocketmq 0.4.4 as ONE message: the C++ 1.2 client
        # sends SEND_BATCH_MESSAGE without the header's `batch` field, and 5.x decides on that
        # field, not on the request code (SendMessageProcessor), so its 32 entries stay one
        # opaque body.  rmqha decides on the code and stores 32 (issue 36, part 2).
        acked -= (32 - 1) * BATCHES
        for system in systems.values():
            assert _read_all(system, acked) == acked
        java = systems["rocketmq-java"]
        master_before = cluster.master()
        seconds = java.failover(b"x" * BODY)
        assert seconds is not None and 0 < seconds < 60, seconds
        acked += 2  # failover(): one send before the kill, the first acked one after
        after = cluster.wait_in_sync(60, size=2)
        assert cluster.master() not in (None, master_before), (master_before, after)
        # No acknowledged message lost: the new master serves every one (a fresh group reads
        # from the first offset of every queue).
        assert _read_all(java, acked) >= acked
        # The C++ client finds the new master too, by its own route refresh (every 30 s: its
        # sends answer "No route info" until then), within the probe's minute.
        py044 = systems["rocketmq-py044"].driver
        assert py044 is not None
        assert int(py044.raw("until_ok", "Bench3", BODY, 60_000)[3]) >= 1
    finally:
        for system in systems.values():
            system.stop()


def test_kafka4_kraft_driven_by_java_and_confluent(clusters: Clusters, tmp_path: Path) -> None:
    systems = make_driven(["kafka2-java", "kafka3-confluent", "kafka3-java"], clusters, TEST_HEAPS["client"])
    kafka = clusters.kafka()
    try:
        acked = {2: _drive(systems["kafka2-java"], tmp_path / "k2j"),
                 3: _drive(systems["kafka3-confluent"], tmp_path / "k3c")}
        systems["kafka3-java"].start(tmp_path / "k3j")
        acked[3] += 1
        assert _read_all(systems["kafka2-java"], acked[2]) >= acked[2]
        assert _read_all(systems["kafka3-confluent"], acked[3]) >= acked[3]
        # min.insync.replicas=3 with its leader killed acknowledges nothing: the failover
        # probe's negative control (no ack reported, not a time).
        assert systems["kafka3-java"].failover(b"x" * BODY) is None
        assert sum(proc.alive for proc in kafka.nodes.values()) == 2
        # min.insync.replicas=2: failover() restarts the killed node, waits for ISR 3, kills
        # the partition's leader and times the first acknowledged send.
        seconds = systems["kafka2-java"].failover(b"x" * BODY)
        assert seconds is not None and 0 < seconds < 60, seconds
        leader, isr = kafka.partition("bench2")
        assert leader >= 0 and kafka.nodes[leader].alive and isr == 2, (leader, isr)
        assert _read_all(systems["kafka2-java"], acked[2] + 2) >= acked[2] + 2
    finally:
        for system in systems.values():
            system.stop()
