"""BlockingProducer's first attempt over a blocking socket, against real brokers.

A thread with a cached route sends without running its asyncio loop; whatever that
attempt does not settle goes to the retry loop with the same request (UNIQ_KEYs) and what
the attempt learned: a slave's refusal redirects to the master it names, a killed master
fails over, a stopped broker times out and the send lands on another group, a malformed
or over-long answer closes the socket with a clear error.  Non-retryable refusals raise
SendError as the asyncio Producer does.  Each thread has its own links; close() and the
clean-up of ended threads close them.

Cluster: broker-a (one broker; SIGSTOPped by one test), broker-b (master + slave).
Topic "Fast" lives on broker-b, "Spread" on both groups.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster import BrokerProc, Cluster
from fake_remoting import FakeConn, FakeServer
from rmqha.client import (BlockingConsumer, BlockingProducer, Message, Producer, ReceivedMessage,
                          SendStatus)
from rmqha.client.blocking_link import BlockingLink, answer_of
from rmqha.client.route import BrokerData, QueueData, TopicRoute
from rmqha.net.client_security import ClientSecurity
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, RemotingError, SendError
from rmqha.protocol.message import Prop, decode_properties
from rmqha.protocol.command import RemotingCommand, decode, decode_frame
from rmqha._core.send_codec_py import ANSWER_FIELDS

SEND_CODES = (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)


@dataclass
class Attempt:
    addr: str
    cmd: RemotingCommand
    outcome: RemotingCommand | RemotingError | ProtocolError

    @property
    def uniq_key(self) -> str:
        return decode_properties(self.cmd.ext_fields["i"])[Prop.UNIQ_KEY]


class Spy:
    """Records this thread's attempts: ``fast`` over blocking links, ``looped`` by the
    retry loop (sends only, not route lookups), and counts its loop's runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, producer: BlockingProducer) -> None:
        self.fast: list[Attempt] = []
        self.looped: list[Attempt] = []
        self.loop_runs = 0
        mine = producer._loop.this_thread()
        assert mine is not None
        real_link_request = BlockingLink.request

        def link_request(link: BlockingLink, cmd: RemotingCommand,
                         timeout: float) -> RemotingCommand:
            try:
                resp = real_link_request(link, cmd, timeout)
            except (RemotingError, ProtocolError) as exc:
                self.fast.append(Attempt(link.addr, cmd, exc))
                raise
            self.fast.append(Attempt(link.addr, cmd, resp))
            return resp

        monkeypatch.setattr(BlockingLink, "request", link_request)
        real_link_send = BlockingLink.send

        def link_send(link: BlockingLink, frame: bytes, opaque: int, timeout: float) -> Any:
            """The encoded path (SendRequest.frame, the send codec's answer), recorded as
            the commands the frames decode to."""
            cmd = decode(frame)
            assert cmd.opaque == opaque
            try:
                answer = real_link_send(link, frame, opaque, timeout)
            except (RemotingError, ProtocolError) as exc:
                self.fast.append(Attempt(link.addr, cmd, exc))
                raise
            code, opaque, flag, remark, *values = answer
            ext = {k: v for k, v in zip(ANSWER_FIELDS, values) if v is not None}
            self.fast.append(Attempt(link.addr, cmd, RemotingCommand(
                code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext)))
            return answer

        monkeypatch.setattr(BlockingLink, "send", link_send)
        session = mine.producer.session
        real_session_request = session.request

        async def session_request(addr: str, cmd: RemotingCommand,
                                  timeout: float | None = None) -> RemotingCommand:
            if cmd.code not in SEND_CODES:
                return await real_session_request(addr, cmd, timeout)
            try:
                resp = await real_session_request(addr, cmd, timeout)
            except RemotingError as exc:
                self.looped.append(Attempt(addr, cmd, exc))
                raise
            self.looped.append(Attempt(addr, cmd, resp))
            return resp

        monkeypatch.setattr(session, "request", session_request)
        real_session_request_frame = session.request_frame

        async def session_request_frame(addr: str, frame: bytes, opaque: int,
                                        timeout: float | None = None, *,
                                        signed: bool = False) -> bytes:
            cmd = decode(frame)  # every frame sent encoded is a send
            assert cmd.code in SEND_CODES and cmd.opaque == opaque
            try:
                answer = await real_session_request_frame(addr, frame, opaque, timeout,
                                                          signed=signed)
            except RemotingError as exc:
                self.looped.append(Attempt(addr, cmd, exc))
                raise
            self.looped.append(Attempt(addr, cmd, decode_frame(answer)))
            return answer

        monkeypatch.setattr(session, "request_frame", session_request_frame)
        real_run = mine.loop.run_until_complete

        def run(future: Any) -> Any:
            self.loop_runs += 1
            return real_run(future)

        monkeypatch.setattr(mine.loop, "run_until_complete", run)


def create_topic(cluster: Cluster, broker: BrokerProc, topic: str, queues: int) -> None:
    resp = cluster.request(broker.address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6})
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def wait_route(cluster: Cluster, topic: str, groups: int) -> None:
    cluster.wait_for(
        lambda: (r := cluster.route(topic)) is not None and len(r["queueDatas"]) >= groups
        and all("0" in b["brokerAddrs"] for b in r["brokerDatas"]),
        what=f"a route for {topic} over {groups} group(s)")


def read_back(cluster: Cluster, group: str, topic: str, want: set[str],
              timeout: float = 40.0) -> dict[str, ReceivedMessage]:
    got: dict[str, ReceivedMessage] = {}
    with BlockingConsumer(cluster.namesrv_addresses, group, topic,
                          rebalance_interval_s=2.0) as c:
        deadline = time.monotonic() + timeout
        while not want <= set(got) and time.monotonic() < deadline:
            for m in c.poll(0.5):
                got.setdefault(m.msg_id, m)
    return got


def stale_route(producer: BlockingProducer, topic: str, group: str, master: str) -> None:
    """Make this thread's cached route of ``topic`` name ``master`` as the master of
    ``group`` (as a route fetched before a failover would)."""
    mine = producer._loop.this_thread()
    assert mine is not None
    route = mine.producer.session.fresh_route(topic)
    assert route is not None, "send once first: the route is cached by the retry loop"
    brokers = dict(route.broker_datas)
    brokers[group] = BrokerData(brokers[group].cluster, group, {0: master})
    mine.producer.session._routes[topic] = TopicRoute(topic, route.queue_datas, brokers)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("blocking-producer")) as c:
        c.start_controllers(1)
        c.start_namesrv()
        (a,) = c.start_group("broker-a", 1)
        b_master, _ = c.start_group("broker-b", 2, in_sync=True)
        create_topic(c, b_master, "Fast", 4)
        create_topic(c, a, "Spread", 4)
        create_topic(c, b_master, "Spread", 4)
        wait_route(c, "Fast", 1)
        wait_route(c, "Spread", 2)
        yield c


def group_brokers(cluster: Cluster, group: str) -> tuple[BrokerProc, list[BrokerProc]]:
    master = cluster.master_of(group)
    assert master is not None
    return master, [b for b in cluster.brokers if b.group == group and b is not master]


def test_sends_with_a_cached_route_run_no_loop(cluster: Cluster,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with BlockingProducer(cluster.namesrv_addresses) as p:
        first = p.send("Fast", b"first")  # no route cached yet: the retry loop fetches it
        assert first.ok and first.attempts == 1
        spy = Spy(monkeypatch, p)
        singles = [p.send("Fast", Message(b"m%d" % i, tags="t", keys=f"k{i}"))
                   for i in range(20)]
        batch = p.send_batch("Fast", [b"b%d" % i for i in range(10)])
        assert spy.loop_runs == 0
        assert len(spy.fast) == 21 and not spy.looped
        assert all(isinstance(a.outcome, RemotingCommand) for a in spy.fast)
    results = singles + batch
    assert all(r.ok and r.attempts == 1 for r in results)
    assert {r.queue.queue_id for r in singles} == {0, 1, 2, 3}  # round robin, as before
    assert [a.uniq_key for a in spy.fast[:20]] == [r.msg_id for r in singles]
    assert len({r.msg_id for r in results}) == 30
    got = read_back(cluster, "fast-readers", "Fast", {r.msg_id for r in results})
    for i, r in enumerate(singles):
        m = got[r.msg_id]
        assert (m.body, m.properties.get(Prop.TAGS), m.properties.get(Prop.KEYS)) == \
            (b"m%d" % i, "t", f"k{i}")
        assert (m.queue_id, m.queue_offset) == (r.queue.queue_id, r.queue_offset)
    assert sorted(got[r.msg_id].body for r in batch) == sorted(b"b%d" % i for i in range(10))


def test_a_property_value_ending_in_nul_is_stored_and_replicated(cluster: Cluster) -> None:
    """Recovery and a slave's receive check read a record whose last byte is 0 as one whose
    tail never came.  A property value ending in NUL is no such record (the properties
    close with their separator after it): the master stores it, the in-sync slave takes
    it, and it reads back intact, as a value ending in "a" does."""
    master, (slave,) = group_brokers(cluster, "broker-b")
    values = ["ends in \x00", "ends in a"]
    with BlockingProducer(cluster.namesrv_addresses) as p:
        sent = [p.send("Fast", Message(b"nul-%d" % i, properties={"note": v}))
                for i, v in enumerate(values)]
    assert [r.status for r in sent] == [SendStatus.SEND_OK] * 2
    cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"]
                     == cluster.broker_status(master)["maxOffset"], what="the slave took both")
    got = read_back(cluster, "nul-readers", "Fast", {r.msg_id for r in sent})
    assert [(got[r.msg_id].body, got[r.msg_id].properties["note"]) for r in sent] == \
        [(b"nul-0", values[0]), (b"nul-1", values[1])]


def test_a_slave_named_by_a_stale_route_redirects_to_its_master(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    master, (slave,) = group_brokers(cluster, "broker-b")
    with BlockingProducer(cluster.namesrv_addresses) as p:
        assert p.send("Fast", b"warm").ok
        stale_route(p, "Fast", "broker-b", slave.address)
        spy = Spy(monkeypatch, p)
        r = p.send("Fast", b"via the slave")
        assert r.ok and r.attempts == 2
        (fast,) = spy.fast
        assert fast.addr == slave.address
        assert isinstance(fast.outcome, RemotingCommand)
        assert fast.outcome.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert fast.outcome.ext_fields["masterAddress"] == master.address
        (retry,) = spy.looped
        assert retry.addr == master.address  # straight to the master the slave named
        assert retry.uniq_key == fast.uniq_key == r.msg_id
        assert retry.cmd.ext_fields["g"] == fast.cmd.ext_fields["g"]  # the same request
        # The retry refreshed the route: the next send is fast again, at the master.
        again = p.send("Fast", b"after")
        assert again.ok and again.attempts == 1
        assert spy.fast[-1].addr == master.address and len(spy.looped) == 1


def test_non_retryable_refusal_raises_as_the_async_producer_does(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    far = int(time.time() * 1000) + 10 * 365 * 86_400_000  # past timer_max_delay_s

    async def with_async_producer() -> SendError:
        async with Producer(cluster.namesrv_addresses) as ap:
            with pytest.raises(SendError) as exc:
                await ap.send("Fast", b"too late", deliver_at=far)
            return exc.value

    expected = asyncio.run(with_async_producer())
    with BlockingProducer(cluster.namesrv_addresses) as p:
        assert p.send("Fast", b"warm").ok
        spy = Spy(monkeypatch, p)
        with pytest.raises(SendError) as exc:
            p.send("Fast", b"too late", deliver_at=far)
        assert spy.loop_runs == 0 and len(spy.fast) == 1
    assert exc.value.code == expected.code == ResponseCode.MESSAGE_ILLEGAL
    assert exc.value.status == expected.status
    assert str(exc.value).startswith("send to Fast failed after 1 attempt(s): ")
    assert str(expected).startswith("send to Fast failed after 1 attempt(s): ")


def test_a_broker_that_stops_answering_times_out_then_another_group_takes_it(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    a_master, _ = group_brokers(cluster, "broker-a")
    with BlockingProducer(cluster.namesrv_addresses, send_timeout_s=0.5) as p:
        assert p.send("Spread", b"warm").ok
        spy = Spy(monkeypatch, p)
        a_master.pause()  # SIGSTOP: the kernel still takes the bytes, nobody answers
        try:
            started = time.monotonic()
            r = p.send("Spread", b"while broker-a is stopped", queue_id=0)
            took = time.monotonic() - started
        finally:
            a_master.resume()
        assert r.ok and r.attempts == 2
        assert r.queue.broker_name == "broker-b"
        (fast,) = spy.fast
        assert fast.addr == a_master.address
        assert isinstance(fast.outcome, RemotingError) and "within 0.500s" in str(fast.outcome)
        assert 0.45 <= took < 10.0, took
        (retry,) = spy.looped
        assert retry.uniq_key == fast.uniq_key == r.msg_id  # it may be stored twice: one id
        mine = p._loop.this_thread()
        assert mine is not None and a_master.address not in mine.links


def malformed_broker(frame: bytes) -> FakeServer:
    def serve(conn: FakeConn) -> None:
        if conn.read() is not None:
            conn.write(frame)
            conn.read()  # hold the connection: the client must not wait for the rest

    return FakeServer(serve)


@pytest.mark.parametrize("frame, message", [
    (b"\x7f\xff\xff\xf0", "frame length 2147483632 outside"),
    (b"\x00\x00\x00\x0c\x00\x00\x00\x08not json", "header is not JSON"),
])
def test_a_malformed_answer_closes_the_link_and_falls_back(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch, frame: bytes, message: str) -> None:
    master, _ = group_brokers(cluster, "broker-b")
    with malformed_broker(frame) as fake:
        with BlockingProducer(cluster.namesrv_addresses, send_timeout_s=30.0) as p:
            assert p.send("Fast", b"warm").ok
            stale_route(p, "Fast", "broker-b", fake.address)
            spy = Spy(monkeypatch, p)
            started = time.monotonic()
            r = p.send("Fast", b"to a broken broker first")
            assert time.monotonic() - started < 10.0  # not the 30 s timeout: no hang
            assert r.ok and r.attempts == 2
            (fast,) = spy.fast
            assert isinstance(fast.outcome, ProtocolError)
            assert message in str(fast.outcome) and fake.address in str(fast.outcome)
            (retry,) = spy.looped
            assert retry.addr == master.address and retry.uniq_key == r.msg_id
        # With no attempt left the send fails with that error.
        with BlockingProducer(cluster.namesrv_addresses, max_attempts=1) as p:
            assert p.send("Fast", b"warm").ok
            stale_route(p, "Fast", "broker-b", fake.address)
            with pytest.raises(SendError, match=message) as exc:
                p.send("Fast", b"nowhere to go")
            assert exc.value.status == "CONNECTION"
        sent = [c for c in fake.commands if c.code == RequestCode.SEND_MESSAGE_V2]
        assert len(sent) == 2


def test_threads_have_their_own_links_and_close_closes_them(cluster: Cluster) -> None:
    p = BlockingProducer(cluster.namesrv_addresses)
    both = threading.Barrier(3)
    seen: dict[str, tuple[Any, list[BlockingLink], set[int]]] = {}
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            assert p.send("Fast", b"warm").ok
            for i in range(8):
                assert p.send("Fast", b"t%d" % i).attempts == 1
            mine = p._loop.this_thread()
            assert mine is not None
            links = list(mine.links.values())
            ports = {link._sock.getsockname()[1] for link in links if link._sock is not None}
            seen[threading.current_thread().name] = (mine, links, ports)
            both.wait(30)  # all alive at once: none reuses another's sender
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    try:
        threads = [threading.Thread(target=sender, name=f"s{i}") for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        senders = [s for s, _, _ in seen.values()]
        assert len({id(s) for s in senders}) == 3
        all_links = [link for _, links, _ in seen.values() for link in links]
        assert all_links and len({id(link) for link in all_links}) == len(all_links)
        ports = [port for _, _, ps in seen.values() for port in ps]
        assert len(ports) == len(set(ports)) >= 3  # a socket each
        # A new thread's first send frees the senders of the ended ones, links included.
        late = threading.Thread(target=sender, name="late")
        both = threading.Barrier(1)
        late.start()
        late.join(60)
        assert not errors, errors
        assert all(s.closed for s in senders)
        assert not any(link.connected for link in all_links)
        late_links = seen["late"][1]
        assert late_links and all(link.connected for link in late_links)
    finally:
        p.close()
    assert seen["late"][0].closed and not any(link.connected for link in late_links)


@pytest.fixture
def failover_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.start_controllers(1)
        c.start_namesrv()
        master, _ = c.start_group("broker-a", 2, in_sync=True)
        create_topic(c, master, "Failover", 4)
        wait_route(c, "Failover", 1)
        yield c


def test_master_killed_between_two_sends_fails_over_with_the_same_id(
        failover_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    c = failover_cluster
    old, (slave,) = group_brokers(c, "broker-a")
    with BlockingProducer(c.namesrv_addresses, retry_deadline_s=30.0,
                          max_backoff_s=0.5) as p:
        assert p.send("Failover", b"before").ok
        spy = Spy(monkeypatch, p)
        assert p.send("Failover", b"fast").attempts == 1
        old.kill()  # SIGKILL
        r = p.send("Failover", b"after the kill")
        assert r.ok and r.attempts >= 2
        fast = spy.fast[-1]
        assert fast.addr == old.address and isinstance(fast.outcome, RemotingError)
        assert spy.looped and {a.uniq_key for a in spy.looped} == {fast.uniq_key}
        assert r.msg_id == fast.uniq_key
        assert spy.looped[-1].addr == slave.address  # the new master
        assert c.master_of("broker-a") is slave
        nxt = p.send("Failover", b"next")
        assert nxt.ok and nxt.attempts == 1 and spy.fast[-1].addr == slave.address
    got = read_back(c, "failover-readers", "Failover", {r.msg_id, nxt.msg_id})
    assert got[r.msg_id].body == b"after the kill" and got[nxt.msg_id].body == b"next"


class RecordingLink:
    """A stand-in for a BlockingLink: records which entry point an attempt used."""

    def __init__(self, signs: bool, in_place: bool = False) -> None:
        self.signs = signs
        #: Whether it signs a frame in place (credentials) or only a command (another hook).
        self.in_place = in_place
        self.calls: list[str] = []
        answer = RemotingCommand(0, opaque=0).reply(ResponseCode.SUCCESS, None, {
            "msgId": "M", "queueId": "0", "queueOffset": "5"})
        self.answer = answer

    def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        self.calls.append("request")
        assert isinstance(cmd, RemotingCommand)
        self.answer.opaque = cmd.opaque
        return self.answer

    def signed(self, frame: bytes, ext_fields: Any, body: bytes) -> bytes | None:
        self.calls.append("signed")
        return frame if self.in_place else None

    def send(self, frame: bytes, opaque: int, timeout: float) -> Any:
        self.calls.append("send")
        self.answer.opaque = opaque
        return answer_of(self.answer)

    def close(self) -> None:
        self.calls.append("close")


@pytest.mark.parametrize("signs, in_place, used", [
    (False, False, ["send"]), (True, False, ["signed", "request"]),
    (True, True, ["signed", "send"])])
def test_a_signing_link_gets_the_command_and_others_the_frame(signs: bool, in_place: bool,
                                                              used: list[str]) -> None:
    """The first attempt goes through the send codec unless the link signs requests with
    a hook that needs the command (its credentials sign the frame in place); no broker
    involved (the route is put in the cache)."""
    with BlockingProducer("127.0.0.1:9") as p:  # never connects
        mine = p._loop.this_thread()
        assert mine is not None
        mine.sender.session._routes["T"] = TopicRoute(
            "T", [QueueData("b", 1, 1, 6)], {"b": BrokerData("c", "b", {0: "127.0.0.1:9"})},
            time.monotonic())
        link = RecordingLink(signs, in_place)
        mine.links["127.0.0.1:9"] = link  # type: ignore[assignment]
        r = p.send("T", b"x")
    assert r.ok and r.queue_offset == 5 and r.offset_msg_id == "M"
    assert link.calls == [*used, "close"]
    assert BlockingLink("127.0.0.1:9").signs is False
    assert BlockingLink("127.0.0.1:9", security=ClientSecurity(None, lambda cmd: None)).signs
