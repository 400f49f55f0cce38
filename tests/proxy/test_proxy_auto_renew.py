"""Auto-renew with RocketMQ 5's PushConsumer (which receives with ``auto_renew`` and never
extends a message itself), through real proxies with a 2 s invisible time for such
receives: a listener slower than that gets each message once and its ack or nack (with
the handle it got) succeeds; a proxy with ``enableProxyAutoRenew=false`` delivers the same messages
again meanwhile (the negative control); renewing stops after ``renewMaxTimeMillis``; a
consumer process killed while it works on a message gets it delivered again to another
consumer soon after, not after a renewal."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proxy_harness import closing, configuration, create_topic, message, producer, start_cluster, start_proxy
from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

INVISIBLE_MS = 2000
SLOW_S = 4.5  # more than twice the invisible time
RENEWING = {"default_invisible_time_mills": INVISIBLE_MS, "renew_ahead_time_millis": 1000,
            "renew_schedule_period_millis": 100, "invisible_time_millis_when_clear": 200}


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any, Any]]:
    """A cluster, a proxy that renews, one that does not, and one that renews 1.5 s at a
    time for 2.5 s at most."""
    cluster = start_cluster(Path(tmp_path_factory.mktemp("renew")), replicas=1)
    with cluster:
        renewing = start_proxy(cluster, **RENEWING)
        plain = start_proxy(cluster, **RENEWING, enable_proxy_auto_renew=False)
        capped = start_proxy(cluster, **RENEWING, renew_slice_time_millis=1500, renew_max_time_millis=2500)
        yield cluster, renewing, plain, capped


class Seen:
    """What the consumers of a test got and how their acks and nacks ended."""

    def __init__(self, fail_once: frozenset[bytes] = frozenset()) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[tuple[str, bytes, int]] = []
        self.acks: list[tuple[bytes, str | None]] = []
        self.nacks: list[tuple[bytes, str | None]] = []
        self.fail_once = set(fail_once)

    def times(self) -> collections.Counter[bytes]:
        with self.lock:
            return collections.Counter(body for _, body, _ in self.deliveries)


def slow_consumer(proxy: Any, name: str, group: str, topic: str, seen: Seen) -> Any:
    """A started PushConsumer whose listener takes SLOW_S per message, its acks recorded."""

    class Listener(MessageListener):
        def consume(self, m: Any) -> ConsumeResult:
            with seen.lock:
                seen.deliveries.append((name, m.body, m.delivery_attempt))
                fail = m.body in seen.fail_once
                seen.fail_once.discard(m.body)
            time.sleep(SLOW_S)  # the work the invisible time must outlast
            return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS

    def recorded(outcomes: list[tuple[bytes, str | None]], settle: Any, m: Any, *args: Any) -> None:
        try:
            settle(m, *args)
        except Exception as exc:
            with seen.lock:
                outcomes.append((m.body, repr(exc)))
            raise
        with seen.lock:
            outcomes.append((m.body, None))

    class Recording(PushConsumer):  # type: ignore[misc]
        def _ack(self, m: Any) -> None:
            recorded(seen.acks, super()._ack, m)

        def _change_invisible_duration(self, m: Any, seconds: Any) -> None:
            recorded(seen.nacks, super()._change_invisible_duration, m, seconds)

    c = Recording(configuration(proxy), group, Listener(), {topic: FilterExpression()},
                  consumption_thread_count=4)
    c.startup()
    return c


def test_slow_listener_gets_each_message_once(proxies: Any) -> None:
    cluster, proxy, _, _ = proxies
    create_topic(cluster, "r_slow")
    seen = Seen(fail_once=frozenset({b"s2"}))
    bodies = [f"s{i}".encode() for i in range(3)]
    p = producer(proxy, ["r_slow"])
    a = slow_consumer(proxy, "a", "g_slow", "r_slow", seen)
    b = slow_consumer(proxy, "b", "g_slow", "r_slow", seen)
    with closing(p, a, b):
        for body in bodies:
            p.send(message("r_slow", body))
        cluster.wait_for(lambda: len(seen.acks) >= 3, timeout=40, what="3 acks")
    # Each listener outlived the invisible time twice over: without renewal the other
    # consumer (or this one) would have had the message again meanwhile.  s2 failed once:
    # the client's nack (a change with the handle it got) was taken, and s2 came back once.
    assert seen.times() == {b"s0": 1, b"s1": 1, b"s2": 2}, seen.deliveries
    assert sorted(seen.acks) == [(body, None) for body in bodies]
    assert seen.nacks == [(b"s2", None)]
    assert sorted(attempt for _, body, attempt in seen.deliveries if body == b"s2") == [1, 2]


def test_without_renewal_the_message_comes_again(proxies: Any) -> None:
    cluster, _, plain, _ = proxies
    create_topic(cluster, "r_plain")
    seen = Seen()
    p = producer(plain, ["r_plain"])
    a = slow_consumer(plain, "a", "g_plain", "r_plain", seen)
    b = slow_consumer(plain, "b", "g_plain", "r_plain", seen)
    with closing(p, a, b):
        p.send(message("r_plain", b"n0"))
        cluster.wait_for(lambda: seen.times()[b"n0"] >= 2, timeout=30,
                         what="n0 delivered again while its first listener works")
        cluster.wait_for(lambda: seen.acks, timeout=30, what="the first ack")
    # The first listener's ack came after the invisible time: the broker refused it.
    assert seen.acks[0][0] == b"n0" and "INVALID_RECEIPT_HANDLE" in str(seen.acks[0][1]), seen.acks


def test_renewing_stops_after_the_max_time(proxies: Any) -> None:
    cluster, _, _, capped = proxies
    create_topic(cluster, "r_max")
    seen = Seen()
    p = producer(capped, ["r_max"])
    a = slow_consumer(capped, "a", "g_max", "r_max", seen)
    b = slow_consumer(capped, "b", "g_max", "r_max", seen)
    with closing(p, a, b):
        p.send(message("r_max", b"x0"))
        # Renewed past its 2 s invisible time, then handed back at 2.5 s: delivered again
        # while the first listener (4.5 s) still works, whose ack is then refused.
        cluster.wait_for(lambda: seen.times()[b"x0"] >= 2, timeout=20, what="x0 delivered again")
        cluster.wait_for(lambda: seen.acks, timeout=20, what="the first ack")
    assert capped.log_contains("renewed ('g_max'") and capped.log_contains("after renewMaxTimeMillis")
    assert [attempt for _, _, attempt in seen.deliveries[:2]] == [1, 2]
    assert seen.acks[0][0] == b"x0" and "INVALID_RECEIPT_HANDLE" in str(seen.acks[0][1]), seen.acks


DYING_CONSUMER = textwrap.dedent("""
    import sys, threading
    from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression,
                          MessageListener, PushConsumer)

    class Listener(MessageListener):
        def consume(self, m):
            print("got", m.body.decode(), flush=True)
            threading.Event().wait()  # works on it until killed
            return ConsumeResult.SUCCESS

    endpoint, group, topic = sys.argv[1:4]
    PushConsumer(ClientConfiguration(endpoint, Credentials(), request_timeout=5), group, Listener(),
                 {topic: FilterExpression()}, consumption_thread_count=2).startup()
    print("started", flush=True)
    threading.Event().wait()
""")


def test_killed_consumer_messages_come_again(proxies: Any, tmp_path: Path) -> None:
    cluster, proxy, _, _ = proxies
    create_topic(cluster, "r_die")
    out = tmp_path / "dying.out"
    with out.open("w") as sink:
        child = subprocess.Popen([sys.executable, "-c", DYING_CONSUMER, proxy.address, "g_die", "r_die"],
                                 stdout=sink, stderr=subprocess.STDOUT, env=os.environ.copy())
    seen = Seen()
    p = producer(proxy, ["r_die"])
    try:
        cluster.wait_for(lambda: "started" in out.read_text(), timeout=30, what="the dying consumer started")
        p.send(message("r_die", b"k0"))
        cluster.wait_for(lambda: "got k0" in out.read_text(), timeout=30, what="k0 at the dying consumer")
        got_at = time.monotonic()
        other = slow_consumer(proxy, "other", "g_die", "r_die", seen)
        with closing(other):
            # Held past its invisible time (and the revive after it) while its consumer
            # lives: the proxy renewed it.
            cluster.wait_for(lambda: proxy.log_contains("renewed ('g_die'"), timeout=10,
                             what="a renewal of k0")
            time.sleep(max(0.0, got_at + 2.5 * INVISIBLE_MS / 1000 - time.monotonic()))
            assert seen.times()[b"k0"] == 0, seen.deliveries
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            # Its Telemetry stream closed: handed back at once, not after the renewal's minute.
            cluster.wait_for(lambda: seen.times()[b"k0"] == 1, timeout=15, what="k0 delivered again")
            cluster.wait_for(lambda: seen.acks, timeout=15, what="k0 acked by the other consumer")
            # Attempt 2, or 3 when the pop the killed consumer had waiting took it first (the
            # proxy hands such a pop's messages back at once).
            assert seen.acks == [(b"k0", None)] and seen.deliveries[0][2] in (2, 3), seen.deliveries
    finally:
        p.shutdown()
        if child.poll() is None:
            child.kill()
            child.wait(10)
