"""RocketMQ 5's gRPC Java client (rocketmq-client-java 5.1.0) through ``rmqha proxy``, in both
interop modes (plaintext; TLS to the proxy with the application's credentials, the cluster
behind it on mutual TLS and ACL: :mod:`grpc_side`).

- ``io.rmqha.interop.grpc.GrpcSendReceive`` sends with the client's Producer and receives
  and acks with its SimpleConsumer (``push``: a PushConsumer's listener); every sent id
  comes back, a FIFO group's messages in send order, delayed ones not before their time;
- ``GrpcTransaction``: commit / rollback at once; and a producer JVM SIGKILLed with its
  transactions open, whose check-backs a second producer's TransactionChecker answers;
  what is delivered is read back with rmqha's own consumer (exactly the commits);
- ``GrpcFailover``: a Producer and a SimpleConsumer (or a PushConsumer) in one JVM while
  the master is SIGKILLed: every acknowledged message is received, the JVM is not restarted;
- negative control: in tls-acl the same client without credentials is refused and stores
  nothing (in plaintext it is served).
"""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from grpc_side import Proxied, start_proxied
from interop_cluster import Grants, InteropCluster, Mode
from interop_support import json_lines
from rmqha_side import read_topic
from test_producer_features import read_until

KINDS = [("normal", "NORMAL"), ("fifo", "FIFO"), ("delay", "DELAY"), ("push", "NORMAL")]
TX_TOPIC, TX_CHECK_TOPIC, FAILOVER_TOPIC, REFUSED_TOPIC = "grpc-tx", "grpc-tx-check", "grpc-failover", "grpc-refused"
READER = "grpc-reader"
FAILOVER_GROUP = "grpc-failover-group"
#: The failover test's consumers: each its own topic and group.
FAILOVER_CONSUMERS = ("simple", "push")


@pytest.fixture(scope="module")
def interop_grants() -> Grants:
    topics = {f"grpc-{kind}": "PUB|SUB" for kind, _ in KINDS}
    topics.update({t: "PUB|SUB" for t in (TX_TOPIC, TX_CHECK_TOPIC, REFUSED_TOPIC)})
    topics.update({f"{FAILOVER_TOPIC}-{c}": "PUB|SUB" for c in FAILOVER_CONSUMERS})
    return Grants(topics=topics, groups=[*(f"grpc-{kind}-group" for kind, _ in KINDS), READER,
                                         *(f"{FAILOVER_GROUP}-{c}" for c in FAILOVER_CONSUMERS)])


@pytest.fixture(scope="module")
def proxied(interop_cluster: InteropCluster) -> Iterator[Proxied]:
    yield start_proxied(interop_cluster)   # stopped with the cluster's processes


@pytest.mark.parametrize("kind, message_type", KINDS)
def test_producer_and_consumers(proxied: Proxied, kind: str, message_type: str) -> None:
    topic, group = f"grpc-{kind}", f"grpc-{kind}-group"
    proxied.ic.create_topic(topic, 4, attributes=f"+message.type={message_type}")
    if kind == "fifo":
        proxied.ic.create_group(group, consume_message_orderly=True)
    out = proxied.run("GrpcSendReceive", kind, topic, group, "8")
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


def bodies(topic: str, proxied: Proxied, expect: int) -> list[str]:
    return sorted(s.body for s in read_topic(proxied.ic, topic, READER, expect, settle_s=2.0))


def test_transaction_commit_and_rollback(proxied: Proxied) -> None:
    proxied.ic.create_topic(TX_TOPIC, 4, attributes="+message.type=TRANSACTION")
    out = proxied.run("GrpcTransaction", "end", TX_TOPIC, "txend", "10")
    sent = [line for line in json_lines(out.stdout) if "sent" in line]
    assert [s["ending"] for s in sent] == ["COMMIT", "ROLLBACK"] * 5, out.stdout
    assert bodies(TX_TOPIC, proxied, 5) == sorted(f"body-txend-{i}" for i in range(0, 10, 2))


def test_transaction_checked_back_after_the_producer_dies(proxied: Proxied) -> None:
    """The first producer JVM leaves 6 transactions open and is SIGKILLed; the proxy hands the
    brokers' check-backs to a second producer of the topic, whose TransactionChecker
    answers (even COMMIT, odd ROLLBACK): exactly the commits are delivered."""
    n = 6
    proxied.ic.create_topic(TX_CHECK_TOPIC, 4, attributes="+message.type=TRANSACTION")
    hang = proxied.start("GrpcTransaction", "hang", TX_CHECK_TOPIC, "txcheck", str(n))
    try:
        lines = read_until(hang, lambda line: line.get("ready") is True, 120)
    finally:
        hang.send_signal(signal.SIGKILL)
        hang.wait(10)
    assert len([line for line in lines if "sent" in line]) == n, lines
    checker = proxied.run("GrpcTransaction", "check", TX_CHECK_TOPIC, "txcheck", str(n), "90")
    checks = [line for line in json_lines(checker.stdout) if line.get("checkedBy") == "check"]
    assert {c["key"] for c in checks} == {f"key-txcheck-{i}" for i in range(n)}, checker.stdout
    assert bodies(TX_CHECK_TOPIC, proxied, n // 2) == sorted(f"body-txcheck-{i}" for i in range(0, n, 2))


def test_unsigned_client_is_refused_and_stores_nothing(proxied: Proxied) -> None:
    """Negative control: in tls-acl the same driver without the account fails at the proxy
    and the topic stays empty; in plaintext (no ACL) the same unsigned driver is served,
    so the refusal is the account's doing."""
    proxied.ic.create_topic(REFUSED_TOPIC, 4, attributes="+message.type=NORMAL")
    out = proxied.run("GrpcSendReceive", "normal", REFUSED_TOPIC, "grpc-normal-group", "1", signed=False,
                      check=False)
    sent = [line for line in json_lines(out.stdout) if "index" in line]
    if proxied.ic.mode is Mode.PLAINTEXT:
        assert out.returncode == 0 and len(sent) == 1, out.stdout
        return
    assert out.returncode != 0 and not sent, out.stdout
    assert "UNAUTHORIZED" in out.stderr or "401" in out.stderr or "auth" in out.stderr.lower(), out.stderr[-2000:]
    assert read_topic(proxied.ic, REFUSED_TOPIC, READER, 1, timeout=5.0) == []


FAILOVER_COUNT, KILL_AFTER = 300, 80


@pytest.mark.parametrize("consumer", FAILOVER_CONSUMERS)
def test_clients_ride_through_a_master_sigkill(proxied: Proxied, consumer: str) -> None:
    """A Producer (one send at a time, 20 ms apart) and a SimpleConsumer (or a PushConsumer)
    in one JVM; once 80 sends are acknowledged the master gets SIGKILL.  The same JVM goes
    on: every message the producer saw acknowledged is received (at least once), and some
    were acknowledged after the kill (by the new master)."""
    ic = proxied.ic
    topic, group = f"{FAILOVER_TOPIC}-{consumer}", f"{FAILOVER_GROUP}-{consumer}"
    ic.create_topic(topic, 4, attributes="+message.type=NORMAL")
    proc = proxied.start("GrpcFailover", topic, group, str(FAILOVER_COUNT), "20", consumer)
    try:
        lines = read_until(proc, SentCounter(KILL_AFTER), 120)
        killed, new = ic.kill_master()
        killed_at = time.time() * 1000
        rest, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        ic.heal()
    lines += json_lines(rest)
    acked = {line["sent"] for line in lines if "sent" in line}
    received = [line["received"] for line in lines if "body" in line]   # deliveries (not the done line)
    errors = [line for line in lines if "error" in line]
    after = [line for line in lines if "sent" in line and line["at"] > killed_at]
    missing = acked - set(received)
    print(f"grpc failover ({ic.mode.value}, {consumer} consumer): {len(acked)} acknowledged ({len(after)} after "
          f"the kill, by {new.name}), {len(errors)} sends failed after the client's retries, "
          f"{len(received)} deliveries ({len(received) - len(set(received))} repeated), receive errors "
          f"{sum('receiveError' in line for line in lines)}, ack errors {sum('ackError' in line for line in lines)}: "
          f"{[line['ackError'] for line in lines if 'ackError' in line][:3]}")
    assert not missing, f"{len(missing)} acknowledged messages never received: {sorted(missing)[:3]}"
    assert lines[-1].get("done") is True and proc.returncode == 0, lines[-5:]
    assert after, f"nothing acknowledged after the kill of {killed.name}: {errors[-3:]}"
    assert len(acked) + len(errors) == FAILOVER_COUNT, (len(acked), len(errors))


class SentCounter:
    """True at the n-th acknowledged send it is shown."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, line: dict[str, object]) -> bool:
        self.seen += "sent" in line
        return self.seen == self.n
