"""A real cluster with an ``rmqha proxy`` process in front, and RocketMQ 5's official
Python client (``rocketmq-python-client``) pointed at it.

:func:`start_cluster` starts a name server hosting a controller and one broker group (a
master and a slave, in sync) with timers for tests (pops revived without backoff,
transactions checked back after a second); :func:`start_proxy` a proxy process
(:mod:`rmqha.testing.local_proxy`) with the tests' settings, tracked by the cluster like
its other processes (killed when it closes).
:func:`create_topic` and :func:`update_group` are mqadmin's updateTopic (with RocketMQ 5's
``message.type``) and updateSubGroup against every master.  The client factories return
started clients; :func:`closing` shuts them down at the end of a ``with`` block.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cluster import FAST_BROKER, Cluster

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.testing import local_proxy
from rmqha.testing.local_proxy import ProxyProc

#: Brokers for proxy tests: expired pops go back to the group at once, open transactions
#: are checked back after a second.
PROXY_BROKER: dict[str, Any] = {
    **FAST_BROKER,
    "pop_revive_backoff": False,
    "pop_revive_interval_ms": 200,
    "transaction_timeout_ms": 1000,
    "transaction_check_interval_ms": 500,
    "log_level": "INFO",
}
#: A proxy that lets tests use short invisible times and announces producers every second.
PROXY_DEFAULTS: dict[str, Any] = {
    "min_invisible_time_mills_for_recv": 1000,
    "grpc_client_consumer_min_long_polling_timeout_millis": 1000,
    "transaction_heartbeat_period_second": 1,
    "route_ttl_ms": 3000,
    "metadata_ttl_ms": 1000,
    "log_level": "DEBUG",
}


def start_cluster(base: Path, *, replicas: int = 2, **broker: Any) -> Cluster:
    cluster = Cluster(base, broker_defaults={**PROXY_BROKER, **broker})
    try:
        cluster.start_namesrv_with_controller()
        cluster.start_group("broker-a", replicas, in_sync=replicas > 1)
    except BaseException:
        cluster.close()
        raise
    return cluster


def start_proxy(cluster: Cluster, **overrides: Any) -> ProxyProc:
    return local_proxy.start_proxy(cluster, **{**PROXY_DEFAULTS, **overrides})


def masters(cluster: Cluster) -> list[str]:
    groups = sorted({b.group for b in cluster.brokers})
    return [m.address for g in groups if (m := cluster.master_of(g)) is not None]


def create_topic(cluster: Cluster, topic: str, message_type: str | None = "NORMAL",
                 queues: int = 4, perm: int = 6) -> None:
    """updateTopic on every master, then wait until the name server routes it."""
    ext: dict[str, Any] = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
                           "writeQueueNums": queues, "perm": perm, "topicFilterType": "SINGLE_TAG",
                           "topicSysFlag": 0, "order": "false"}
    if message_type is not None:
        ext["attributes"] = f"+message.type={message_type}"
    for addr in masters(cluster):
        resp = cluster.request(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    cluster.wait_for(lambda: cluster.route(topic) is not None, what=f"a route of {topic}")


def update_group(cluster: Cluster, group: str, *, orderly: bool = False,
                 retry_max_times: int = 16) -> None:
    body = {"groupName": group, "consumeMessageOrderly": orderly, "retryMaxTimes": retry_max_times}
    for addr in masters(cluster):
        resp = cluster.request(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body)
        assert resp.code == ResponseCode.SUCCESS, resp.remark


# --- the official client --------------------------------------------------------------------


def configuration(proxy: ProxyProc, ak: str = "", sk: str = "", timeout: int = 5) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(proxy.address, Credentials(ak, sk), request_timeout=timeout)


def producer(proxy: ProxyProc, topics: list[str], checker: Any = None, **creds: Any) -> Any:
    from rocketmq import Producer

    p = Producer(configuration(proxy, **creds), topics, checker)
    p.startup()
    return p


def simple_consumer(proxy: ProxyProc, group: str, topic: str, await_s: int = 2,
                    tag: str = "*", **creds: Any) -> Any:
    from rocketmq import FilterExpression, SimpleConsumer

    c = SimpleConsumer(configuration(proxy, **creds), group, {topic: FilterExpression(tag)},
                       await_duration=await_s)
    c.startup()
    return c


def push_consumer(proxy: ProxyProc, group: str, topic: str, listener: Any, threads: int = 4) -> Any:
    from rocketmq import FilterExpression, PushConsumer

    c = PushConsumer(configuration(proxy), group, listener, {topic: FilterExpression()},
                     consumption_thread_count=threads)
    c.startup()
    return c


def message(topic: str, body: bytes, *, tag: str | None = None, keys: list[str] | None = None,
            group: str | None = None, deliver_at_s: int | None = None,
            properties: dict[str, str] | None = None) -> Any:
    from rocketmq import Message

    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for key in keys or ():
        m.keys = key
    if group:
        m.message_group = group
    if deliver_at_s is not None:
        m.delivery_timestamp = deliver_at_s
    for k, v in (properties or {}).items():
        m.add_property(k, v)
    return m


@contextlib.contextmanager
def closing(*clients: Any) -> Iterator[None]:
    try:
        yield
    finally:
        for c in clients:
            with contextlib.suppress(Exception):  # a client already shut down, or half started
                c.shutdown()


def receive_until(consumer: Any, want: Callable[[list[Any]], bool], *, invisible_s: int = 10,
                  batch: int = 16, timeout_s: float = 20.0, ack: bool = True) -> list[Any]:
    """Receive (and ack) until ``want(all received)`` holds or the deadline passes."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not want(got) and time.monotonic() < deadline:
        for m in consumer.receive(batch, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got
