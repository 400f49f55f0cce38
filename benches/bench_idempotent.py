"""The idempotent producer's cost on the send path: acked 1 KiB sends, idempotence on vs off.

Issue 40.1 allows idempotence at most 5% of the send path.  Both rows run in one cluster
(controller, name server and one broker, real processes on loopback), one after the other
over the same topic, so they differ only by the option:

- ``idempotence-off``: ordinary sends, which the broker takes on its plain-send lane;
- ``idempotence-on``: each send carries a producer id and a per-queue sequence, so the
  broker takes it on the ordinary path, checks the producer table and records its
  placement; the client binds it to its queue first (at most five in flight per queue).

The load is ``BlockingProducer.send`` from ``THREADS`` threads (each its own producer, as
the chaos suite sends), so the client's cost is in the figure too.  ``RMQHA_BENCH_QUICK=1``
makes it CI-sized; speed is reported in ``extra_info``, never asserted: compare the two rows
of one run.
"""
from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benches.conftest import QUICK, describe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

MESSAGE_BYTES = 1024
THREADS = 4
SENDS_PER_THREAD = 500 if QUICK else 5000
TOPIC = "BenchIdempotent"


@pytest.fixture(scope="module")
def one_broker() -> Any:
    from cluster import Cluster

    with tempfile.TemporaryDirectory(prefix="bench-idempotent-") as tmp, Cluster(Path(tmp)) as c:
        c.start_controllers(1)
        c.start_namesrv()
        c.start_group("broker-a", 1, segment_bytes=64 << 20, log_level="WARNING")
        c.wait_for(lambda: c.route("TBW102") is not None, what="TBW102 route")
        yield c


def _sends(namesrv: list[str], idempotent: bool, count: int) -> float:
    """``THREADS`` threads each sending ``count`` acked messages; the seconds it took."""
    from rmqha.client import BlockingProducer

    body = b"x" * MESSAGE_BYTES
    errors: list[BaseException] = []
    with BlockingProducer(namesrv, group=f"bench-idem-{idempotent}", idempotent=idempotent,
                          compress_over_bytes=1 << 30) as p:
        assert p.send(TOPIC, body).ok  # the route is cached before the clock starts

        def worker() -> None:
            try:
                for _ in range(count):
                    if not p.send(TOPIC, body).ok:
                        raise AssertionError("a send was not acknowledged")
            except BaseException as exc:  # noqa: BLE001 - re-raised in the benchmark's thread
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(THREADS)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


@pytest.mark.benchmark(group="produce-idempotence-1KiB")
@pytest.mark.parametrize("idempotent", [False, True], ids=["idempotence-off", "idempotence-on"])
def test_produce_idempotence(benchmark: Any, one_broker: Any, idempotent: bool) -> None:
    out: dict[str, float] = {}

    def once() -> None:
        out["elapsed"] = _sends(one_broker.namesrv_addresses, idempotent, SENDS_PER_THREAD)

    benchmark.pedantic(once, rounds=1, iterations=1)
    messages = THREADS * SENDS_PER_THREAD
    describe(benchmark, f"idempotence-{'on' if idempotent else 'off'}", message_bytes=MESSAGE_BYTES,
             batch=1, replicas=1, threads=THREADS, messages=messages,
             messages_per_s=round(messages / out["elapsed"], 1))
