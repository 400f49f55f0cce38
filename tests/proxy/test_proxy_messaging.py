"""RocketMQ 5's official Python client against rmqha through ``rmqha proxy`` (real processes):
normal, FIFO, delayed and transactional sends; SimpleConsumer receive / ack / change
invisible / redelivery; PushConsumer; FIFO order under concurrent consumers; and the
status codes of refused requests, with raw gRPC calls where the client would refuse first.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from typing import Any

import grpc
import pytest
from proxy_harness import (
    closing,
    create_topic,
    message,
    producer,
    push_consumer,
    receive_until,
    simple_consumer,
    update_group,
)
from rocketmq import ConsumeResult, MessageListener, TransactionChecker, TransactionResolution
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

CODE = pb.Code


def stub_call(proxy: Any, method: str, request: Any, **metadata: str) -> Any:
    """One raw gRPC call as a client would make it (the client checks some things first);
    a server stream is read whole."""
    with grpc.insecure_channel(proxy.address) as channel:
        meta = [("x-mq-client-id", "raw-test-client"), *metadata.items()]
        answer = getattr(MessagingServiceStub(channel), method)(request, metadata=meta, timeout=10)
        return list(answer) if method == "ReceiveMessage" else answer


def raw_message(topic: str, body: bytes = b"x", **system: Any) -> Any:
    m = pb.Message(body=body)
    m.topic.name = topic
    m.system_properties.message_id = system.pop("message_id", "RAW0001")
    m.system_properties.message_type = system.pop("message_type", pb.MessageType.NORMAL)
    for key, value in system.items():
        setattr(m.system_properties, key, value)
    return m


def raw_send(proxy: Any, msg: Any) -> Any:
    return stub_call(proxy, "SendMessage", spb.SendMessageRequest(messages=[msg]))


# --- sends and receives ------------------------------------------------------------------------


def test_normal_send_receive_ack(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_normal")
    p = producer(proxy, ["p_normal"])
    c = simple_consumer(proxy, "g_normal", "p_normal")
    with closing(p, c):
        sent = [p.send(message("p_normal", f"m{i}".encode(), tag="t", keys=[f"k{i}"],
                               properties={"color": "red"})) for i in range(6)]
        assert len({r.message_id for r in sent}) == 6
        got = receive_until(c, lambda g: len(g) >= 6)
        assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(6)]
        first = next(m for m in got if m.body == b"m0")
        assert first.tag == "t" and first.keys == {"k0"} and first.properties["color"] == "red"
        assert {m.message_id for m in got} == {r.message_id for r in sent}
        # Acked: nothing comes again.
        assert c.receive(16, 2) == []


def test_tag_filter(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_tags")
    p = producer(proxy, ["p_tags"])
    c = simple_consumer(proxy, "g_tags", "p_tags", tag="keep")
    with closing(p, c):
        for tag in ("keep", "drop", "keep"):
            p.send(message("p_tags", tag.encode(), tag=tag))
        got = receive_until(c, lambda g: len(g) >= 2)
        assert [m.body for m in got] == [b"keep", b"keep"]


def test_change_invisible_and_redelivery(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_redeliver")
    p = producer(proxy, ["p_redeliver"])
    c = simple_consumer(proxy, "g_redeliver", "p_redeliver")
    with closing(p, c):
        p.send(message("p_redeliver", b"again"))
        first = receive_until(c, lambda g: len(g) >= 1, invisible_s=1, ack=False)
        assert [m.delivery_attempt for m in first] == [1]
        # Not acked: visible again after its invisible time, one attempt more.
        second = receive_until(c, lambda g: len(g) >= 1, invisible_s=30, ack=False)
        assert [m.body for m in second] == [b"again"] and second[0].delivery_attempt == 2
        # A longer invisible time keeps it away; the renewed handle acks it.
        c.change_invisible_duration(second[0], 30)
        assert c.receive(4, 30) == []
        c.ack(second[0])
        # The first handle is stale: the proxy answers INVALID_RECEIPT_HANDLE.
        stale = stub_call(proxy, "AckMessage", spb.AckMessageRequest(
            group=pb.Resource(name="g_redeliver"), topic=pb.Resource(name="p_redeliver"),
            entries=[spb.AckMessageEntry(message_id=first[0].message_id,
                                         receipt_handle=first[0].receipt_handle)]))
        assert stale.status.code == CODE.INVALID_RECEIPT_HANDLE


def test_delay_message(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_delay", "DELAY")
    p = producer(proxy, ["p_delay"])
    c = simple_consumer(proxy, "g_delay", "p_delay", await_s=1)
    with closing(p, c):
        due = int(time.time()) + 3
        p.send(message("p_delay", b"later", deliver_at_s=due))
        assert c.receive(4, 10) == []  # not before its time
        got = receive_until(c, lambda g: len(g) >= 1)
        assert [m.body for m in got] == [b"later"]
        assert time.time() >= due - 0.5


def test_fifo_order_per_group_under_concurrent_consumers(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_fifo", "FIFO")
    update_group(cluster, "g_fifo", orderly=True)
    p = producer(proxy, ["p_fifo"])
    consumers = [simple_consumer(proxy, "g_fifo", "p_fifo", await_s=1) for _ in range(3)]
    seen: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()
    with closing(p, *consumers):
        for i in range(10):
            for group in ("A", "B", "C"):
                p.send(message("p_fifo", f"{group}{i}".encode(), group=group))

        def consume(c: Any) -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and sum(map(len, seen.values())) < 30:
                for m in c.receive(4, 10):
                    with lock:  # acked before the next of its group can be popped
                        seen[m.message_group].append(int(m.body[1:]))
                    c.ack(m)

        threads = [threading.Thread(target=consume, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert {g: seq for g, seq in seen.items()} == {g: list(range(10)) for g in "ABC"}


def test_push_consumer(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_push")
    done: list[bytes] = []
    failed_once: set[bytes] = set()

    class Listener(MessageListener):
        def consume(self, m: Any) -> ConsumeResult:
            if m.body == b"m3" and m.body not in failed_once:
                failed_once.add(m.body)  # a failure: the proxy delivers it again
                return ConsumeResult.FAILURE
            done.append(m.body)
            return ConsumeResult.SUCCESS

    p = producer(proxy, ["p_push"])
    c = push_consumer(proxy, "g_push", "p_push", Listener())
    with closing(p, c):
        for i in range(8):
            p.send(message("p_push", f"m{i}".encode()))
        cluster.wait_for(lambda: len(set(done)) == 8, timeout=30, what="8 messages consumed")
    assert sorted(set(done)) == [f"m{i}".encode() for i in range(8)] and failed_once == {b"m3"}


# --- transactions ------------------------------------------------------------------------------


class Checker(TransactionChecker):
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.checked: list[str] = []

    def check(self, message: Any) -> Any:
        self.checked.append(message.message_id)
        return self.answer


def test_transaction_commit_and_rollback(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_txn", "TRANSACTION")
    # Check-backs (a second after the send here) answer "unknown": the client decides.
    p = producer(proxy, ["p_txn"], Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED))
    c = simple_consumer(proxy, "g_txn", "p_txn", await_s=1)
    with closing(p, c):
        kept = p.begin_transaction()
        p.send(message("p_txn", b"commit-me"), kept)
        dropped = p.begin_transaction()
        p.send(message("p_txn", b"roll-me-back"), dropped)
        assert c.receive(4, 10) == []  # half messages are not visible
        kept.commit()
        dropped.rollback()
        got = receive_until(c, lambda g: len(g) >= 1, timeout_s=10)
        assert [m.body for m in got] == [b"commit-me"]
        assert c.receive(4, 10) == []


CRASHING_PRODUCER = textwrap.dedent("""
    import os, sys
    sys.path[:0] = {paths!r}
    from proxy_harness import message, producer
    from rocketmq import TransactionChecker, TransactionResolution

    class Never(TransactionChecker):
        def check(self, m):
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED

    class Proxy:
        address = {address!r}

    p = producer(Proxy(), ["p_check"], Never())
    txn = p.begin_transaction()
    p.send(message("p_check", b"decided-by-check"), txn)
    print("SENT", flush=True)
    os._exit(0)  # a crash: no commit, no goodbye
""")


def test_transaction_check_back_after_producer_crash(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_check", "TRANSACTION")
    c = simple_consumer(proxy, "g_check", "p_check", await_s=1)
    with closing(c):
        here = str(__import__("pathlib").Path(__file__).parent)
        script = CRASHING_PRODUCER.format(paths=[here, here + "/../support"], address=proxy.address)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert "SENT" in out.stdout, out.stderr[-2000:]
        assert c.receive(4, 10) == []
        # A new producer of the topic is asked over Telemetry and commits.
        checker = Checker(TransactionResolution.COMMIT)
        p = producer(proxy, ["p_check"], checker)
        with closing(p):
            got = receive_until(c, lambda g: len(g) >= 1, timeout_s=20)
        assert [m.body for m in got] == [b"decided-by-check"] and len(checker.checked) >= 1


# --- refusals, as RocketMQ's proxy answers them -------------------------------------------------


def test_send_refusals(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_refuse")
    create_topic(cluster, "p_readonly", perm=4)
    assert raw_send(proxy, raw_message("no_such_topic")).status.code == CODE.TOPIC_NOT_FOUND
    assert raw_send(proxy, raw_message("bad topic!")).status.code == CODE.ILLEGAL_TOPIC
    assert raw_send(proxy, raw_message("TBW102")).status.code == CODE.ILLEGAL_TOPIC
    assert raw_send(proxy, raw_message("p_readonly")).status.code == CODE.FORBIDDEN
    big = raw_message("p_refuse", b"x" * (4 * 1024 * 1024 + 1))
    assert raw_send(proxy, big).status.code == CODE.MESSAGE_BODY_TOO_LARGE
    assert raw_send(proxy, raw_message("p_refuse", b"")).status.code == CODE.MESSAGE_BODY_EMPTY
    assert raw_send(proxy, raw_message("p_refuse", tag="a|b")).status.code == CODE.ILLEGAL_MESSAGE_TAG
    fifo = raw_message("p_refuse", message_group="g1", message_type=pb.MessageType.FIFO)
    assert raw_send(proxy, fifo).status.code == CODE.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    bad = raw_message("p_refuse")
    bad.user_properties["UNIQ_KEY"] = "mine"
    assert raw_send(proxy, bad).status.code == CODE.ILLEGAL_MESSAGE_PROPERTY_KEY
    # None of them stored anything: a consumer finds no message.
    c = simple_consumer(proxy, "g_refuse", "p_refuse", await_s=1)
    with closing(c):
        assert c.receive(16, 10) == []


def test_other_refusals(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_other")
    route = stub_call(proxy, "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="nope_topic")))
    assert route.status.code == CODE.TOPIC_NOT_FOUND
    ack = stub_call(proxy, "AckMessage", spb.AckMessageRequest(
        group=pb.Resource(name="g_other"), topic=pb.Resource(name="p_other"),
        entries=[spb.AckMessageEntry(message_id="x", receipt_handle="not a handle")]))
    assert ack.status.code == CODE.INVALID_RECEIPT_HANDLE
    end = stub_call(proxy, "EndTransaction", spb.EndTransactionRequest(
        topic=pb.Resource(name="p_other"), message_id="x", transaction_id="forged",
        resolution=pb.TransactionResolution.COMMIT))
    assert end.status.code == CODE.INVALID_TRANSACTION_ID
    short = spb.ReceiveMessageRequest(group=pb.Resource(name="g_other"), batch_size=1)
    short.message_queue.topic.name = "p_other"
    short.invisible_duration.FromMilliseconds(10)
    answers = stub_call(proxy, "ReceiveMessage", short)
    assert answers[0].status.code == CODE.ILLEGAL_INVISIBLE_TIME
    with grpc.insecure_channel(proxy.address) as channel:  # no client id
        resp = MessagingServiceStub(channel).QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name="p_other")), timeout=10)
    assert resp.status.code == CODE.CLIENT_ID_REQUIRED


def test_route_points_at_the_proxy(proxied: Any) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_route", "FIFO", queues=3)
    request = spb.QueryRouteRequest(topic=pb.Resource(name="p_route"))
    request.endpoints.scheme = pb.AddressScheme.IPv4
    request.endpoints.addresses.add(host="127.0.0.1", port=1)
    resp = stub_call(proxy, "QueryRoute", request)
    assert resp.status.code == CODE.OK
    port = int(proxy.address.rpartition(":")[2])
    assert [(q.broker.name, q.broker.id, q.id) for q in resp.message_queues] == [
        ("broker-a", 0, 0), ("broker-a", 0, 1), ("broker-a", 0, 2)]
    assert {(a.host, a.port) for q in resp.message_queues for a in q.broker.endpoints.addresses} == {
        ("127.0.0.1", port)}
    assert {tuple(q.accept_message_types) for q in resp.message_queues} == {(pb.MessageType.FIFO,)}


def test_idle_receive_is_held(proxied: Any) -> None:
    """An idle consumer's receive waits its polling time at the broker: a handful of
    requests in a few seconds, not a storm."""
    cluster, proxy = proxied
    create_topic(cluster, "p_idle")
    c = simple_consumer(proxy, "g_idle", "p_idle", await_s=2)
    with closing(c):
        started = time.monotonic()
        calls = 0
        while time.monotonic() - started < 4:
            assert c.receive(4, 10) == []
            calls += 1
    assert 1 <= calls <= 3, calls


@pytest.mark.parametrize("kind", ["publishing", "nothing"])
def test_telemetry_settings(proxied: Any, kind: str) -> None:
    cluster, proxy = proxied
    create_topic(cluster, "p_settings")
    command = spb.TelemetryCommand()
    if kind == "publishing":
        command.settings.client_type = pb.ClientType.PRODUCER
        command.settings.publishing.topics.add(name="p_settings")
    else:
        command.settings.client_type = pb.ClientType.PRODUCER
    with grpc.insecure_channel(proxy.address) as channel:
        stream = MessagingServiceStub(channel).Telemetry(
            iter([command]), metadata=[("x-mq-client-id", f"settings-{kind}")], timeout=10)
        if kind == "nothing":
            with pytest.raises(grpc.RpcError) as info:
                next(stream)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            return
        answer = next(stream)
    assert answer.status.code == CODE.OK
    assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert answer.settings.backoff_policy.max_attempts == 3
