"""RocketMQ 5's gRPC Java client (rocketmq-client-java 5.1.0) through ``rmqha proxy``.

The proxy needs the ``proxy`` extra, which cannot share ``.venv`` with the dev extra's
``rocketmq`` 0.4.4: these tests run from ``.venv`` and start the proxy process with
``.venv-rmq5``'s Python (``make test-interop`` builds it).  The cluster is the interop one in
its plaintext mode (the cluster secret); TLS and credentials through the proxy,
transactions and a master kill are not covered here yet (docs/compatibility.md).

``io.rmqha.interop.grpc.GrpcSendReceive`` sends with the client's Producer and receives and
acks with its SimpleConsumer (``push``: a PushConsumer's listener); the test checks every
sent id came back, a FIFO group's messages in send order and delayed ones not before their
delivery time.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from interop_cluster import Grants, InteropCluster, Mode, start_interop_cluster
from interop_support import CLASSES, CLASSPATH_FILE, java, json_lines

from rmqha.testing.local_proxy import ProxyProc, start_proxy

ROOT = Path(__file__).resolve().parents[2]
PROXY_PYTHON = ROOT / ".venv-rmq5" / "bin" / "python"


def grpc_classpath() -> str:
    """The drivers and the shaded client jar alone: its ``apache.rocketmq.v2`` classes are
    built on its shaded gRPC, and the remoting client's ``rocketmq-proto`` (the same class
    names on plain gRPC) must not come first on the class path."""
    jars = [j for j in CLASSPATH_FILE.read_text().strip().split(os.pathsep) if "rocketmq-client-java" in j]
    assert jars, f"rocketmq-client-java is not on {CLASSPATH_FILE}"
    return os.pathsep.join([str(CLASSES), *jars])


def run_grpc_driver(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [java(), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", grpc_classpath(),
           "io.rmqha.interop.grpc.GrpcSendReceive", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InteropCluster, ProxyProc]]:
    if not PROXY_PYTHON.exists():
        raise AssertionError(f"{PROXY_PYTHON} is missing: `make test-interop` builds .venv-rmq5 first")
    base = tmp_path_factory.mktemp("grpc-plaintext")
    cluster, security, brokers = start_interop_cluster(base, Mode.PLAINTEXT, Grants())
    target = InteropCluster(Mode.PLAINTEXT, cluster, base, security, brokers)
    try:
        proxy = start_proxy(cluster, timeout=90, python=str(PROXY_PYTHON),
                            min_invisible_time_mills_for_recv=1000, route_ttl_ms=3000)
        yield target, proxy
    finally:
        cluster.stop_all()
    assert not cluster.leftovers(), cluster.leftovers()


@pytest.mark.parametrize("kind, message_type", [("normal", "NORMAL"), ("fifo", "FIFO"), ("delay", "DELAY"),
                                                ("push", "NORMAL")])
def test_producer_and_simple_consumer(proxied: tuple[InteropCluster, ProxyProc], kind: str,
                                      message_type: str) -> None:
    target, proxy = proxied
    topic, group = f"grpc-{kind}", f"grpc-{kind}-group"
    target.create_topic(topic, 4, attributes=f"+message.type={message_type}")
    if kind == "fifo":
        target.create_group(group, consume_message_orderly=True)
    out = run_grpc_driver(kind, topic, group, "8", timeout=180,
                          env={"INTEROP_PROXY": proxy.address, "HOME": str(target.base_dir)})
    lines = json_lines(out.stdout)
    sent = [line["sent"] for line in lines if "index" in line]
    received = [line for line in lines if "body" in line]
    assert len(sent) == 8 and {r["received"] for r in received} == set(sent), out.stdout
    assert lines[-1]["done"] is True, out.stdout
    if kind == "fifo":
        group_order = [r["received"] for r in received if r["messageGroup"] == "group-1"]
        assert group_order[:8] == sent, out.stdout     # one message group: in send order
    if kind == "delay":
        due = {line["sent"]: line["due"] for line in lines if "index" in line}
        assert all(r["at"] >= due[r["received"]] for r in received), out.stdout   # never before its time
