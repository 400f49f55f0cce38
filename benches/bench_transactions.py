"""Transactional and delayed messages on one broker process (controller, name server,
broker: real processes on loopback).

- ``test_send_transactional_vs_plain``: sequential sends of 1 KiB messages, plain vs
  ``send_transaction`` committing each (a prepared send, then END_TRANSACTION: two round
  trips and three records), in alternating blocks; the median block rate of each and
  their ratio;
- ``test_delayed_delivery``: timer messages (``deliver_at``) due over one second or all
  at once,
  reported as delivery throughput and lateness p50/p99 (store time on the real topic
  minus the due time; never negative: delivery is never early).  The scheduler ticks every
  ``timer_precision_ms`` (here 10 ms), which bounds the lateness from below.

Speed is reported in ``extra_info`` and printed, never asserted.
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import QUICK, describe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

MESSAGE_BYTES = 1024
SENDS = 300 if QUICK else 1500
DELAYED = 1000 if QUICK else 5000


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


class _Broker:
    """One broker group of one, with a topic; ``namesrv`` for the clients."""

    def __init__(self, namesrv: list[str]) -> None:
        self.namesrv = namesrv


def _in_env(main: Any, topic: str, **cfg: Any) -> Any:
    from cluster import Cluster

    from rmqha.protocol.codes import RequestCode

    with tempfile.TemporaryDirectory(prefix="rmqha-bench-txn-") as tmp, Cluster(Path(tmp)) as c:
        c.start_controllers(1)
        c.start_namesrv()
        b = c.start_broker("broker-a", segment_bytes=64 << 20, log_level="WARNING", **cfg)
        c.wait_for(lambda: c.broker_role(b) == "master", what="a master")
        resp = c.request(b.address, RequestCode.UPDATE_AND_CREATE_TOPIC,
                         {"topic": topic, "readQueueNums": 4, "writeQueueNums": 4})
        assert resp.code == 0, resp.remark
        c.wait_for(lambda: c.route(topic) is not None, what="route")
        return asyncio.run(main(_Broker(c.namesrv_addresses)))


def test_send_transactional_vs_plain(benchmark: Any) -> None:
    from rmqha.client import LocalTransactionState, Producer

    commit = LocalTransactionState.COMMIT_MESSAGE
    body = b"x" * MESSAGE_BYTES

    async def main(env: Any) -> dict[str, float]:
        async with Producer(env.namesrv, "PG_BENCH") as p:
            p.set_transaction_check_listener(lambda m: commit)
            await p.send("bench-tx", body)
            await p.send_transaction("bench-tx", body, lambda m, a: commit)
            # Alternating blocks, so a busy neighbour slows both kinds alike; the median
            # block rate of each kind is reported.
            plain_rates: list[float] = []
            txn_rates: list[float] = []
            block = max(1, SENDS // 10)
            for _ in range(10):
                t = time.perf_counter()
                for _ in range(block):
                    await p.send("bench-tx", body)
                plain_rates.append(block / (time.perf_counter() - t))
                t = time.perf_counter()
                for _ in range(block):
                    await p.send_transaction("bench-tx", body, lambda m, a: commit)
                txn_rates.append(block / (time.perf_counter() - t))
            plain, txn = _pct(plain_rates, 0.5), _pct(txn_rates, 0.5)
        return {"plain_per_s": round(plain, 1), "transactional_per_s": round(txn, 1),
                "transactional_over_plain": round(txn / plain, 3)}

    result: dict[str, float] = {}

    def run() -> None:
        result.update(_in_env(main, "bench-tx"))

    benchmark.pedantic(run, rounds=1, iterations=1)
    describe(benchmark, "rmqha-1-broker", message_bytes=MESSAGE_BYTES, batch=1, replicas=1,
             messages=SENDS, **result)
    print(f"\nsequential sends of {MESSAGE_BYTES} B: plain {result['plain_per_s']}/s, "
          f"transactional {result['transactional_per_s']}/s "
          f"(ratio {result['transactional_over_plain']})")


@pytest.mark.parametrize("window_ms", [1000, 0])
def test_delayed_delivery(benchmark: Any, window_ms: int) -> None:
    """``window_ms`` 1000: due evenly over a second (does delivery keep up?); 0: all due
    at once (how fast does the scheduler write them?)."""
    from rmqha.client import Consumer, Producer

    body = b"x" * MESSAGE_BYTES

    async def main(env: Any) -> dict[str, float]:
        due: dict[str, int] = {}
        async with Producer(env.namesrv, "PG_BENCH_DELAY") as p:
            start = int(time.time() * 1000) + 2000  # after every send is in
            pending = []
            for i in range(DELAYED):
                at = start + (i * window_ms) // DELAYED
                pending.append((at, p.send("bench-delay", body, deliver_at=at)))
                if len(pending) == 64:
                    for at_, r in zip([a for a, _ in pending],
                                      await asyncio.gather(*(c for _, c in pending))):
                        due[r.msg_id] = at_
                    pending = []
            for at_, r in zip([a for a, _ in pending],
                              await asyncio.gather(*(c for _, c in pending))):
                due[r.msg_id] = at_
        late: list[float] = []
        stored: list[int] = []
        async with Consumer(env.namesrv, "CG_BENCH_DELAY", "bench-delay") as c:
            deadline = time.monotonic() + 60
            seen: set[str] = set()
            while len(seen) < len(due) and time.monotonic() < deadline:
                for m in await c.poll(0.5):
                    if m.msg_id in due and m.msg_id not in seen:
                        seen.add(m.msg_id)
                        late.append(m.store_timestamp - due[m.msg_id])
                        stored.append(m.store_timestamp)
        span_s = max(1e-3, (max(stored) - min(stored)) / 1000.0) if stored else float("nan")
        return {"delivered": len(late), "lateness_p50_ms": _pct(late, 0.5),
                "lateness_p99_ms": _pct(late, 0.99), "lateness_min_ms": min(late),
                "delivered_per_s": round(len(late) / span_s, 1)}

    result: dict[str, float] = {}

    def run() -> None:
        result.update(_in_env(main, "bench-delay", timer_precision_ms=10))

    benchmark.pedantic(run, rounds=1, iterations=1)
    describe(benchmark, "rmqha-1-broker", message_bytes=MESSAGE_BYTES, batch=1, replicas=1,
             messages=DELAYED, window_ms=window_ms, **result)
    print(f"\n{result['delivered']} timer messages due over {window_ms} ms: delivered "
          f"{result['delivered_per_s']}/s, lateness p50 {result['lateness_p50_ms']} ms "
          f"p99 {result['lateness_p99_ms']} ms (min {result['lateness_min_ms']} ms)")
