"""Controller group on loopback: committed events/s, commit latency, leader failover.

Three real controller processes (``rmqha.testing.controllers``).  Each timed write is an
APPLY_BROKER_ID with a fresh id, i.e. one validated, Raft-committed and applied event,
answered after apply, sent by a ControllerClient from this process.  Implementations:
``rmqha-fast`` (rmqha's pysyncobj settings with the pipelining guard, the log and vote
fsynced before they are acted on), ``rmqha-fast-no-fsync`` (the same without fsync: the
cost of durability), ``pysyncobj`` (pysyncobj's own algorithm at its default timing: 100 ms
append batching) and ``pysyncobj-tuned`` (the same at a 2 ms append period and tick, as
``bench_produce`` tunes pysyncobj), measured in the same run.

Failover: SIGKILL the leader, then time until the first write commits on the new leader
(the client finds it through GET_METADATA_INFO / NOT_LEADER answers).

Run: ``.venv/bin/python -m pytest benches/bench_controller.py --benchmark-only``
(``RMQHA_BENCH_QUICK=1`` for fewer rounds).
"""
from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import pytest

from benches.conftest import QUICK
from rmqha.controller.client import BlockingControllerClient, ControllerClient
from rmqha.testing.controllers import ControllerGroup

MODES = {
    # The default: fast commits with the log and vote fsynced before they are acted on.
    "rmqha-fast": {"raft_fast": True},
    # The same without fsync (pysyncobj's own behaviour): what durability costs.
    "rmqha-fast-no-fsync": {"raft_fast": True, "raft_durable": False},
    # pysyncobj's own algorithm at its default timing (100 ms append period, 50 ms tick)...
    "pysyncobj": {"raft_fast": False, "raft_min_timeout": 400, "raft_max_timeout": 1400,
                  "raft_heartbeat_interval": 100},
    # ...and tuned as benches/bench_produce.py tunes it (PYSYNCOBJ_TUNING: append period
    # and tick 2 ms; its 4 MiB socket buffers do not matter for events of a few hundred bytes).
    "pysyncobj-tuned": {"raft_fast": False, "raft_min_timeout": 400, "raft_max_timeout": 1400,
                        "raft_heartbeat_interval": 2},
}


def _percentile(data: list[float], q: float) -> float:
    ordered = sorted(data)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@pytest.fixture(params=list(MODES), scope="module")
def cluster(request, tmp_path_factory):
    mode = request.param
    group = ControllerGroup(tmp_path_factory.mktemp(f"bench-{mode}"), 3, settings=MODES[mode])
    client = None
    try:
        group.start()
        client = BlockingControllerClient(group.addresses, request_timeout=5, cluster_secret=group.secret)
        yield mode, group, client
    finally:
        if client is not None:
            client.close()
        group.stop()


_ids = itertools.count(1)


def _write(client: BlockingControllerClient, name: str) -> None:
    broker_id = client.get_next_broker_id("bench", name)
    client.apply_broker_id("bench", name, broker_id, f"127.0.0.1:{broker_id};{broker_id}")


@pytest.mark.benchmark(group="controller-commit")
def test_commit_latency(benchmark, cluster):
    mode, group, client = cluster
    latencies: list[float] = []
    count = itertools.count()

    def one_event() -> None:
        # Timed: the APPLY_BROKER_ID round trip only (the id lookup is a read).  A new
        # broker group every 4 ids keeps groups the size real ones have.
        name = f"commit-{mode}-{next(count) // 4}"
        broker_id = client.get_next_broker_id("bench", name)
        started = time.perf_counter()
        client.apply_broker_id("bench", name, broker_id, f"127.0.0.1:{broker_id};x")
        latencies.append(time.perf_counter() - started)

    rounds = (30 if QUICK else 100) if mode == "pysyncobj" else (200 if QUICK else 2000)
    _write(client, f"warm-{mode}")  # warm: leader barrier, connections
    benchmark.pedantic(one_event, rounds=rounds, iterations=1, warmup_rounds=0)
    p50, p99 = _percentile(latencies, 0.50), _percentile(latencies, 0.99)
    benchmark.extra_info.update({
        "implementation": mode, "replicas": 3, "batch": 1, "message_bytes": 0,
        "events_per_s": round(len(latencies) / sum(latencies), 1),
        "commit_p50_ms": round(p50 * 1000, 3), "commit_p99_ms": round(p99 * 1000, 3),
        "commit_mean_ms": round(statistics.fmean(latencies) * 1000, 3),
    })


@pytest.mark.benchmark(group="controller-throughput")
def test_concurrent_writers_throughput(benchmark, cluster):
    """16 writers (one connection each) committing as fast as answers come back; the
    leader validates them in order and group-commits what queued up."""
    mode, group, _ = cluster
    writers = 16
    per_writer = (8 if QUICK else 20) if mode == "pysyncobj" else (48 if QUICK else 240)
    run_no = itertools.count()

    async def run() -> float:
        tag = next(run_no)
        clients = [ControllerClient(group.addresses, request_timeout=10, cluster_secret=group.secret)
                   for _ in range(writers)]
        try:
            async def writer(w: int) -> None:
                c = clients[w]
                for i in range(per_writer):
                    # 4 ids per broker group, as real groups are small.
                    await c.apply_broker_id("bench", f"tp-{mode}-{tag}-{w}-{i // 4}", i % 4 + 1,
                                            f"127.0.0.1:{i};{w}")
            await clients[0].find_leader()
            started = time.perf_counter()
            await asyncio.gather(*(writer(w) for w in range(writers)))
            return time.perf_counter() - started
        finally:
            for c in clients:
                await c.close()

    elapsed: list[float] = []
    benchmark.pedantic(lambda: elapsed.append(asyncio.run(run())), rounds=2 if QUICK else 3,
                       iterations=1)
    events = writers * per_writer
    benchmark.extra_info.update({
        "implementation": mode, "replicas": 3, "batch": writers, "message_bytes": 0,
        "events_per_round": events,
        "events_per_s": round(events / statistics.median(elapsed), 1),
    })


@pytest.mark.benchmark(group="controller-failover")
def test_leader_kill_to_first_commit(benchmark, cluster):
    mode, group, client = cluster
    name = f"failover-{mode}"
    state: dict[str, int] = {}
    samples: list[float] = []

    def setup():
        killed = state.get("killed")
        if killed is not None:
            group.restart(killed)
        group.wait_leader()
        _write(client, name)  # the client knows the current leader
        state["leader"] = group.wait_leader()
        return (), {}

    def kill_and_write() -> None:
        started = time.perf_counter()
        group.kill(state["leader"])
        state["killed"] = state["leader"]
        _write(client, name)
        samples.append(time.perf_counter() - started)

    benchmark.pedantic(kill_and_write, setup=setup, rounds=2 if QUICK else 4, iterations=1)
    group.restart(state["killed"])
    benchmark.extra_info.update({
        "implementation": mode, "replicas": 3, "batch": 1, "message_bytes": 0,
        "failover_ms_each": [round(s * 1000, 1) for s in samples],
    })
