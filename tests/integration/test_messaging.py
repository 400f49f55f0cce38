"""Messaging layer against a real CommitLog, a real RemotingServer and a real name server.

Everything here runs in one process on loopback: a :class:`LocalBroker` is the commitlog,
the MessageService and a RemotingServer serving its handlers, registered with an
in-process NameServer exactly as the broker process registers (REGISTER_BROKER with the
service's topic configs).  Multi-process and failover tests are in
``test_messaging_cluster.py``.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from cluster import free_port
from rmqha.client import Consumer, Message, Producer, SendStatus
from rmqha.client.admin import TopicAdmin
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.store import CommitLog
from rmqha.errors import ClientError, ProtocolError, SendError
from rmqha.store.consume_queue import ConsumeQueueIndex
from rmqha.protocol.message import (
    BatchItem,
    CompressionType,
    DecompressError,
    Prop,
    SysFlag,
    compress,
    decode_batch,
    decode_properties,
    decode_records,
    decompress,
    encode_batch,
    encode_properties,
    new_uniq_key,
    offset_msg_id,
    parse_offset_msg_id,
    parse_subscription,
    tag_hash,
)
from rmqha.messaging.service import MessageService, MessagingConfig
from rmqha.messaging.state import STATE_TOPIC
from rmqha.metrics import MetricsRegistry
from rmqha.namesrv.config import NamesrvConfig
from rmqha.namesrv.server import NameServer
from rmqha.broker.acl_guard import acl_guard
from rmqha.net.client import RemotingClient
from rmqha.net.server import RemotingServer
from rmqha.protocol.command import RemotingCommand

SEGMENT = 64 * 1024


# --- codec ---------------------------------------------------------------------------------


def test_properties_keep_their_order_and_skip_empty_values() -> None:
    """One codec (RocketMQ's MessageDecoder): pairs in the map's order, a pair with an
    empty value left out, since every RocketMQ reader drops it."""
    raw = encode_properties({"b": "2", "a": "1", "empty": ""})
    assert raw == b"b\x012\x02a\x011\x02"
    assert encode_properties([("b", "2"), ("a", "1"), ("empty", "")]) == raw  # pairs, in order
    assert decode_properties(raw) == decode_properties(raw.decode()) == {"b": "2", "a": "1"}
    # string2messageProperties drops pairs without a name, a value or a separator; the
    # value runs to the next \x02, so it keeps any further \x01 (the last pair needs no
    # closing \x02).
    assert decode_properties("a\x011\x02junk\x02\x01x\x02k\x01\x02") == {"a": "1"}
    assert decode_properties("a\x011\x012\x02a\x013\x02b\x014") == {"a": "3", "b": "4"}
    assert decode_properties("a\x011\x012\x02") == {"a": "1\x012"}
    assert decode_properties(b"") == decode_properties(None) == {}


def test_tag_hash_is_java_string_hashcode() -> None:
    assert tag_hash("TagA") == 2598919
    assert tag_hash("") == 0
    # Overflow wraps like a Java int.
    long_tag = "a-long-tag-name-that-overflows"
    assert tag_hash(long_tag) == _java_hash(long_tag)
    assert parse_subscription("TagA || TagB") == frozenset({"TagA", "TagB"})
    assert parse_subscription("*") is None


def _java_hash(s: str) -> int:
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize("kind", [CompressionType.LZ4, CompressionType.ZLIB])
def test_compression_round_trip_and_flag(kind: CompressionType) -> None:
    body = b"hello rmqha " * 1000
    data, flag = compress(body, kind)
    assert flag & SysFlag.COMPRESSED
    assert (flag >> 8) & 0x7 == int(kind)
    assert len(data) < len(body)
    assert decompress(data, flag) == body


def test_zlib_with_type_bits_zero_is_read_as_zlib() -> None:
    """Older clients (C++ 1.2.x) set only bit 0: that means zlib."""
    body = b"x" * 5000
    assert decompress(zlib.compress(body, 5), int(SysFlag.COMPRESSED)) == body


def test_broken_body_reports_its_offset() -> None:
    data, flag = compress(b"y" * 10000, CompressionType.LZ4)
    with pytest.raises(DecompressError) as exc:
        decompress(data[:20] + b"\x00" * 20, flag, offset=4242)
    assert exc.value.offset == 4242 and "4242" in str(exc.value)


def test_batch_round_trip_and_bad_lengths() -> None:
    items = [BatchItem(b"a" * i, {"UNIQ_KEY": f"K{i}", "TAGS": "t"}, i) for i in range(5)]
    raw = encode_batch(items)
    back = decode_batch(raw)
    assert [(b.body, b.properties, b.flag) for b in back] == [
        (i.body, i.properties, i.flag) for i in items]
    with pytest.raises(ProtocolError):
        decode_batch(raw[:-3])
    with pytest.raises(ProtocolError):
        decode_batch(struct.pack(">i", 10**6) + raw[4:])


def test_message_ids() -> None:
    mid = offset_msg_id("127.0.0.1:10911", 123456789)
    assert len(mid) == 32 and mid == mid.upper()
    assert parse_offset_msg_id(mid) == ("127.0.0.1:10911", 123456789)
    keys = {new_uniq_key() for _ in range(1000)}
    assert len(keys) == 1000 and all(len(k) == 32 for k in keys)


# --- index ---------------------------------------------------------------------------------


@pytest.fixture
def commitlog(tmp_path: Path):
    log = CommitLog(tmp_path / "cl", segment_bytes=SEGMENT, prefault=False)
    try:
        yield log
    finally:
        log.close()


def test_index_stops_at_confirm_offset_and_follows_truncation(commitlog: CommitLog,
                                                              tmp_path: Path) -> None:
    placed = [commitlog.append("T", b"m%d" % i, i % 2, {"TAGS": "A" if i % 3 else "B"})
              for i in range(10)]
    idx = ConsumeQueueIndex(tmp_path / "cq")
    confirm = placed[5][0]  # records 0..4 confirmed
    idx.advance(commitlog, confirm)
    q0, q1 = idx.queue("T", 0), idx.queue("T", 1)
    assert (q0.max_offset, q1.max_offset) == (3, 2)
    entry = q0.get(1)
    assert entry.commit_offset == placed[2][0] and entry.size == placed[2][1]
    assert entry.tag_hash == tag_hash("A")
    idx.advance(commitlog, commitlog.max_offset)
    assert (q0.max_offset, q1.max_offset) == (5, 5)
    # A slave cut its log at record 7: the index forgets 7, 8, 9.
    commitlog.truncate(placed[7][0])
    idx.truncate(placed[7][0])
    assert (q0.max_offset, q1.max_offset) == (4, 3)
    assert idx.indexed_offset == placed[7][0]
    commitlog.append("T", b"new", 1)
    idx.advance(commitlog, commitlog.max_offset)
    assert q1.max_offset == 4 and q1.get(3).commit_offset == placed[7][0]


def test_index_crosses_segments_and_trims(commitlog: CommitLog, tmp_path: Path) -> None:
    body = b"z" * 3000
    for _ in range(60):  # ~3 segments of 64 KiB, with blank records at their ends
        commitlog.append("T", body, 0)
    idx = ConsumeQueueIndex(tmp_path / "cq", units_per_file=16)
    idx.advance(commitlog, commitlog.max_offset)
    q = idx.queue("T", 0)
    assert q.max_offset == 60 and q.min_offset == 0
    first_seg_end = commitlog.segment_end(0)
    commitlog.delete_segments_before(first_seg_end)
    idx.trim_below(commitlog.min_offset)
    assert q.min_offset > 0 and q.max_offset == 60
    assert q.get(q.min_offset).commit_offset >= first_seg_end


# --- a broker in this process ----------------------------------------------------------------


class LocalBroker:
    """CommitLog + MessageService + RemotingServer, registered with a name server."""

    def __init__(self, base: Path, name: str, namesrv: str | None, *, broker_id: int = 0,
                 role: str = "master", master_address: str | None = None,
                 ns_id: int | None = None, immediate: bool = True, acl_file: Path | None = None,
                 tls: Any = None, links: Any = None, **cfg: Any) -> None:
        self.base = base
        #: The client port's TlsSettings and the name-server link's ClientSecurity.
        self.tls, self.links = tls, links
        #: plain_acl.yml guarding the client port as the broker process's aclEnable does.
        self.acl_file = acl_file
        #: Sends taken without a task (as the broker process registers them), or only
        #: through the task-based handler.
        self.immediate = immediate
        self.name = name
        self.namesrv = namesrv
        self.broker_id = broker_id
        self.role = role
        self.master_address = master_address
        #: The id registered with the name server (default: 0 for a master).
        self.ns_id = ns_id if ns_id is not None else (0 if role == "master" else broker_id)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        #: The address published in the name server (a proxy in front of us, say).
        self.ns_address: str | None = None
        self.cfg = MessagingConfig(broker_address=self.address, **cfg)
        self.store = base / f"{name}-{broker_id}-{self.port}"
        self.log: CommitLog | None = None
        self.svc: MessageService | None = None
        self.server: RemotingServer | None = None
        self._ns: RemotingClient | None = None
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.acl_lane_admitted = 0

    async def start(self) -> LocalBroker:
        self.log = CommitLog(self.store / "commitlog", segment_bytes=SEGMENT, prefault=False,
                             store_host=("127.0.0.1", self.port), flush=self.cfg.flush)
        self.metrics = MetricsRegistry()
        self.svc = MessageService(self.log, store_dir=self.store, config=self.cfg,
                                  broker_name=self.name, broker_id=self.broker_id,
                                  replication=None, on_topics_changed=self._changed,
                                  metrics=self.metrics)
        self.svc.set_role(self.role, self.master_address)
        self.server = RemotingServer("127.0.0.1", self.port, self.svc.handlers(), tls=self.tls)
        if self.acl_file is not None:
            guard = acl_guard(self.acl_file)
            guard.protect(self.server, self.svc)  # as the broker process does
            self.server.dispatcher.plain_guard = self._counted_lane(guard.plain)
        if self.immediate:
            for code, now in self.svc.immediate_handlers().items():
                self.server.register_immediate(code, now)
            self.server.dispatcher.register_plain_send(*self.svc.plain_send_handler())
        await self.server.start()
        if self.namesrv:
            self._ns = RemotingClient(self.namesrv, security=self.links)
            self._kick = asyncio.Event()
            await self.register()
            self._task = asyncio.get_running_loop().create_task(self._register_loop())
        return self

    def _counted_lane(self, plain: Any) -> Any:
        """The ACL's plain-send check, counting what it admits (``acl_lane_admitted``)."""
        def counted(send: Any, conn: Any) -> bool:
            admitted = bool(plain(send, conn))
            self.acl_lane_admitted += admitted
            return admitted

        return counted

    def _changed(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def _register_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            await self.register()

    async def register(self) -> None:
        body = {"topicConfigSerializeWrapper": {
            "topicConfigTable": self.svc.topic_configs(),
            "dataVersion": {"timestamp": 0, "counter": 0, "stateVersion": 1}},
            "filterServerList": []}
        resp = await self._ns.request(RemotingCommand.request(RequestCode.REGISTER_BROKER, {
            "brokerName": self.name, "brokerAddr": self.ns_address or self.address,
            "clusterName": "c",
            "haServerAddr": "", "brokerId": self.ns_id,
            "masterEpoch": 1}, body))
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._ns is not None:
            await self._ns.close()
        if self.server is not None:
            await self.server.stop()
        if self.svc is not None:
            self.svc.close()
        if self.log is not None:
            self.log.close()


class Env:
    """A name server plus local brokers, all stopped at the end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ns: NameServer | None = None
        self.brokers: list[LocalBroker] = []

    async def __aenter__(self) -> Env:
        self.ns = NameServer(NamesrvConfig(listen_port=free_port(), drop_on_disconnect=False))
        await self.ns.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for b in self.brokers:
            await b.stop()
        await self.ns.stop()

    @property
    def namesrv(self) -> str:
        return self.ns.address

    async def broker(self, name: str = "broker-a", **kw: Any) -> LocalBroker:
        b = LocalBroker(self.base, name, self.namesrv, **kw)
        self.brokers.append(b)
        return await b.start()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def create_topic(addr: str, topic: str, queues: int, **extra: Any) -> RemotingCommand:
    async with RemotingClient(addr) as c:
        return await c.request(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
            **extra}))


async def consume(namesrv: str, group: str, topic: str, want: int, timeout: float = 15.0,
                  **kw: Any) -> list[Any]:
    got: list[Any] = []
    async with Consumer(namesrv, group, topic, **kw) as c:
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            got += await c.poll(0.5)
        await c.commit()
    return got


def test_produce_consume_single_batch_and_compressed(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            assert (await create_topic(b.address, "orders", 4)).code == ResponseCode.SUCCESS
            async with Producer(env.namesrv, compress_over_bytes=4096) as p:
                singles = [await p.send("orders", Message(b"s%d" % i, tags="A", keys=f"k{i}"))
                           for i in range(10)]
                big = await p.send("orders", Message(b"B" * 100_000, tags="A"))
                batch = await p.send_batch("orders", [Message(b"b%d" % i, tags="A")
                                                      for i in range(32)])
            assert all(r.status is SendStatus.SEND_OK for r in singles + [big] + batch)
            assert len({r.queue.queue_id for r in singles}) == 4  # spread over queues
            assert len(batch) == 32 and len({r.queue for r in batch}) == 1
            assert [r.queue_offset for r in batch] == list(range(batch[0].queue_offset,
                                                                 batch[0].queue_offset + 32))
            # The big body is stored compressed with lz4 marked in sysFlag bits 8-10.
            rec = b.log.read_message(_commit_offset(big.offset_msg_id))
            assert rec.sys_flag & SysFlag.COMPRESSED and (rec.sys_flag >> 8) & 7 == 1
            assert len(rec.body) < 10_000
            got = await consume(env.namesrv, "g1", "orders", 43)
            by_id = {m.msg_id: m for m in got}
            reg = b.metrics.registry
            assert reg.get_sample_value("rmqha_messaging_messages_stored_total") == 43
            assert reg.get_sample_value("rmqha_messaging_messages_served_total") >= 43
            assert reg.get_sample_value("rmqha_messaging_send_latency_seconds_count",
                                        {"status": "PUT_OK"}) == 12  # 11 sends, 1 batch
            sent = singles + [big] + batch
            assert len(got) == 43 and set(by_id) == {r.msg_id for r in sent}
            assert by_id[big.msg_id].body == b"B" * 100_000
            assert by_id[singles[3].msg_id].keys == "k3"
            assert all(m.decompress_error is None for m in got)

    run(main())


def _commit_offset(offset_msg_id_: str) -> int:
    return parse_offset_msg_id(offset_msg_id_)[1]


def test_long_poll_wakes_on_arrival_and_offsets_answers(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "lp", 1)
            async with RemotingClient(b.address) as c, Producer(env.namesrv) as p:
                def pull(offset: int, hold_ms: int) -> RemotingCommand:
                    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
                        "consumerGroup": "g", "topic": "lp", "queueId": 0, "queueOffset": offset,
                        "maxMsgNums": 32, "sysFlag": 6, "commitOffset": 0,
                        "suspendTimeoutMillis": hold_ms, "subscription": "*"})
                started = time.monotonic()
                pending = asyncio.ensure_future(c.request(pull(0, 10_000), 20))
                await asyncio.sleep(0.3)
                assert not pending.done()  # held, not answered at once
                sent = await p.send("lp", b"wake up")
                resp = await pending
                waited = time.monotonic() - started
                assert resp.code == ResponseCode.SUCCESS and waited < 5
                msgs = decode_records(resp.body)
                assert [m.body for m in msgs] == [b"wake up"]
                assert msgs[0].msg_id == sent.msg_id
                assert resp.ext_fields["nextBeginOffset"] == "1"
                assert resp.ext_fields["suggestWhichBrokerId"] == "0"
                # Past the end: PULL_OFFSET_MOVED with the max; the end itself: NOT_FOUND.
                far = await c.request(pull(50, 0), 5)
                assert far.code == ResponseCode.PULL_OFFSET_MOVED
                assert far.ext_fields["nextBeginOffset"] == "1"
                end = await c.request(pull(1, 200), 5)
                assert end.code == ResponseCode.PULL_NOT_FOUND
                assert end.ext_fields["nextBeginOffset"] == "1"
                # Offsets: a new group starts at 0 (SUCCESS "0", not QUERY_NOT_FOUND).
                q = await c.request(RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": "new", "topic": "lp", "queueId": 0}))
                assert (q.code, q.ext_fields["offset"]) == (0, "0")
                mx = await c.request(RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                             {"topic": "lp", "queueId": 0}))
                assert mx.ext_fields["offset"] == "1"

    run(main())


def test_consumer_resumes_where_it_stopped(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "resume", 2)
            async with Producer(env.namesrv) as p:
                first = await p.send_batch("resume", [b"a%d" % i for i in range(20)], queue_id=0)
                first += await p.send_batch("resume", [b"b%d" % i for i in range(20)], queue_id=1)
            got = await consume(env.namesrv, "grp", "resume", 40)
            assert {m.msg_id for m in got} == {r.msg_id for r in first}
            async with Producer(env.namesrv) as p:
                second = await p.send_batch("resume", [b"c%d" % i for i in range(10)])
            again = await consume(env.namesrv, "grp", "resume", 10)
            assert {m.msg_id for m in again} == {r.msg_id for r in second}

    run(main())


def test_min_in_sync_replicas_refuses_and_writes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(min_in_sync_replicas=2)
            before = b.log.max_offset
            async with Producer(env.namesrv, max_attempts=2, backoff_s=0.01) as p:
                with pytest.raises(SendError) as exc:
                    await p.send("TBW102", b"never stored")
            assert exc.value.status == "IN_SYNC_REPLICAS_NOT_ENOUGH"
            assert b.log.max_offset == before

    run(main())


def test_refused_write_on_slave_redirects_to_master(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            master = LocalBroker(tmp_path, "broker-a", None)
            env.brokers.append(master)
            await master.start()
            # The name server still lists the slave as the group's master (a stale route).
            slave = await env.broker("broker-a", broker_id=1, role="slave", ns_id=0,
                                     master_address=master.address)
            async with RemotingClient(slave.address) as c:
                resp = await c.request(RemotingCommand.request(RequestCode.SEND_MESSAGE, {
                    "producerGroup": "p", "topic": "x", "queueId": 0, "sysFlag": 0,
                    "bornTimestamp": "0", "flag": 0, "properties": "", "reconsumeTimes": "0",
                    "unitMode": "0", "batch": "0"}, b"body"))
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert resp.ext_fields["masterAddress"] == master.address
            assert slave.log.max_offset == 0
            async with Producer(env.namesrv) as p:
                r = await p.send("TBW102", b"to the master")
            assert r.ok and r.attempts == 2
            assert master.log.read_message(_commit_offset(r.offset_msg_id)).body == b"to the master"

    run(main())


def test_topic_create_and_delete_reach_routes(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            # A topic nobody created: the producer goes through TBW102's route and the
            # broker (auto-create on) makes it with the default 4 queues.
            async with Producer(env.namesrv) as p:
                assert (await p.send("fresh", b"first")).ok
            fresh = await _route_when(env, "fresh", lambda r: r is not None)
            assert fresh["queueDatas"][0]["writeQueueNums"] == 4
            assert (await create_topic(b.address, "t8", 8)).code == ResponseCode.SUCCESS
            route = await _route_when(env, "t8", lambda r: r is not None)
            assert route["queueDatas"][0]["writeQueueNums"] == 8
            async with RemotingClient(b.address) as c:
                bad = await c.request(RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_TOPIC,
                    {"topic": "bad topic!", "readQueueNums": 1}))
                assert bad.code != ResponseCode.SUCCESS
                resp = await c.request(RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER,
                                                               {"topic": "t8"}))
                assert resp.code == ResponseCode.SUCCESS
            await _route_when(env, "t8", lambda r: r is None)
            assert "t8" not in b.svc.topic_configs()

    run(main())


async def _route_when(env: Env, topic: str, pred: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    async with RemotingClient(env.namesrv) as c:
        while True:
            resp = await c.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                           {"topic": topic}))
            route = resp.json_body() if resp.code == ResponseCode.SUCCESS else None
            if pred(route):
                return route
            assert time.monotonic() < deadline, f"route of {topic} never matched: {route}"
            await asyncio.sleep(0.05)


def test_state_survives_restart_and_retention(tmp_path: Path) -> None:
    """Topics and committed offsets live in the state log: a restart rebuilds them, and
    retention writes a checkpoint before deleting the segments that held them."""
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(file_reserved_hours=1)
            await create_topic(b.address, "keep", 2)
            async with Producer(env.namesrv) as p:
                await p.send_batch("keep", [b"x" * 2000 for _ in range(10)], queue_id=0)
            got = await consume(env.namesrv, "cg", "keep", 10)
            assert len(got) == 10
            async with Producer(env.namesrv) as p:
                for _ in range(4):  # fill a few 64 KiB segments
                    await p.send_batch("keep", [b"y" * 2000 for _ in range(25)], queue_id=1)
            segments = sorted(Path(b.log.directory).glob("0" * 5 + "*"))
            assert len(segments) >= 3
            old = time.time() - 2 * 3600
            for seg in segments:
                os.utime(seg, (old, old))
            trimmed: list[int] = []
            b.svc.on_segments_deleted = trimmed.append  # the broker trims its epoch map here
            new_min = await b.svc.run_retention()
            assert new_min > 0 and b.log.min_offset == new_min and trimmed == [new_min]
            # The active segment is never deleted, however old.
            assert b.log.max_offset > new_min
            q0 = b.svc.index.queue("keep", 0)
            assert q0.min_offset == q0.max_offset == 10  # its records were all deleted
            # Restart on the same store: topics and offsets come back from the log.
            store, port = b.store, b.port
            await b.stop()
            env.brokers.remove(b)
            log = CommitLog(store / "commitlog", segment_bytes=SEGMENT, prefault=False)
            try:
                svc = MessageService(log, store_dir=store, config=b.cfg, broker_name="broker-a",
                                     broker_id=0, replication=None)
                assert svc.topics.get("keep").read_queue_nums == 2
                assert svc.state.offsets.get("cg", "keep", 0) == 10
                assert svc.index.queue("keep", 1).max_offset == 100
                assert svc.index.queue("keep", 1).min_offset > 0
                svc.close()
            finally:
                log.close()
            assert port

    run(main())


def test_garbage_frame_and_unknown_code_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "g", 1)
            before = (b.log.max_offset, b.svc.topic_configs())
            async with RemotingClient(b.address) as c:
                resp = await c.request(RemotingCommand.request(4242, {"x": "y"}, b"junk"))
                assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
                # The same connection still works.
                ok = await c.request(RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                             {"topic": "g", "queueId": 0}))
                assert ok.code == ResponseCode.SUCCESS
                # Malformed requests of known codes get an error, not a crash.
                bad = await c.request(RemotingCommand.request(RequestCode.PULL_MESSAGE, {}))
                assert bad.code != ResponseCode.SUCCESS
                bad = await c.request(RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {
                    "b": "g", "e": "0", "m": "true"}, b"\x00\x00\x00\x05garbage"))
                assert bad.code == ResponseCode.MESSAGE_ILLEGAL
            for junk in (b"\x00\x00\x00\x08\x00\x00\x00\x99{notjson", b"\xff\xff\xff\xff" * 4,
                         os.urandom(256)):
                with socket.create_connection(("127.0.0.1", b.port), timeout=2) as s:
                    s.sendall(junk)
                    s.settimeout(0.5)
                    try:
                        s.recv(1)
                    except (TimeoutError, ConnectionError):
                        pass  # closed or silent: either way nothing was stored
            assert (b.log.max_offset, b.svc.topic_configs()) == before
            async with Producer(env.namesrv) as p:
                assert (await p.send("g", b"still fine")).ok

    run(main())


def test_heartbeat_consumer_list_locks_and_send_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            # Retries wait delay level 3 + reconsumeTimes: short levels keep the test quick.
            b = await env.broker(message_delay_level="50ms 50ms 200ms 200ms",
                                 timer_precision_ms=50)
            await create_topic(b.address, "sb", 1)
            async with Producer(env.namesrv) as p:
                sent = await p.send("sb", Message(b"retry me", tags="T"))
            hb = {"clientID": "123-127.0.0.1@DEFAULT",
                  "consumerDataSet": [{"consumeFromWhere": 0, "consumeType": 1,
                                       "groupName": "CG", "messageModel": 1,
                                       "subscriptionDataSet": [
                                           {"subString": "*", "subVersion": "1", "topic": "sb"}]}]}
            async with RemotingClient(b.address) as c:
                r = await c.request(RemotingCommand.request(RequestCode.HEART_BEAT, None,
                                                            json.dumps(hb) + "\n"))
                assert r.code == ResponseCode.SUCCESS
                r = await c.request(RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                            {"consumerGroup": "CG"}))
                assert r.json_body() == {"consumerIdList": ["123-127.0.0.1@DEFAULT"]}
                mq = {"topic": "sb", "brokerName": "broker-a", "queueId": 0}
                lock = {"clientId": "123-127.0.0.1@DEFAULT", "consumerGroup": "CG", "mqSet": [mq]}
                r = await c.request(RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, None, lock))
                assert r.json_body()["lockOKMQSet"] == [mq]
                other = dict(lock, clientId="other")
                r = await c.request(RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, None, other))
                assert r.json_body()["lockOKMQSet"] == []
                r = await c.request(RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
                    "group": "CG", "delayLevel": 0, "offset": _commit_offset(sent.offset_msg_id)}))
                assert r.code == ResponseCode.SUCCESS
            scheduled = b.svc.index.queue("SCHEDULE_TOPIC_XXXX", 2)  # level 3
            assert scheduled is not None and scheduled.max_offset == 1
            # "Not before its delay" is judged on the stored timestamps below, not by looking
            # for the queue now: under load the 200 ms may pass before this line runs.
            deadline = time.monotonic() + 10
            while (b.svc.index.queue("%RETRY%CG", 0) is None
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.02)
            retry = b.svc.index.queue("%RETRY%CG", 0)
            assert retry is not None and retry.max_offset == 1
            msg = b.log.read_message(retry.get(0).commit_offset)
            assert msg.store_timestamp >= b.log.read_message(
                scheduled.get(0).commit_offset).store_timestamp + 200
            assert msg.body == b"retry me" and msg.reconsume_times == 1
            assert msg.properties[Prop.RETRY_TOPIC] == "sb"
            assert msg.properties[Prop.UNIQ_KEY] == sent.msg_id
            assert "%RETRY%CG" in b.svc.topic_configs()

    run(main())


def test_two_broker_groups_share_a_topic(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.broker("broker-a")
            await env.broker("broker-b")
            await env.broker("broker-c")
            async with TopicAdmin(env.namesrv) as admin:
                changes = await admin.create_topic("spread", 2, groups=["broker-a", "broker-b"])
                assert [(c.broker_name, c.ok) for c in changes] == [("broker-a", True),
                                                                   ("broker-b", True)]
                with pytest.raises(ClientError):
                    await admin.create_topic("spread", 2, groups=["broker-x"])
            await _route_when(env, "spread", lambda r: r is not None and len(r["queueDatas"]) == 2)
            async with Producer(env.namesrv) as p:
                sent = [await p.send("spread", b"m%d" % i) for i in range(20)]
            assert {r.queue.broker_name for r in sent} == {"broker-a", "broker-b"}
            got = await consume(env.namesrv, "spread-g", "spread", 20)
            assert {m.msg_id for m in got} == {r.msg_id for r in sent}
            assert {m.broker_name for m in got} == {"broker-a", "broker-b"}

    run(main())


def test_state_topic_is_internal(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            async with RemotingClient(b.address) as c:
                r = await c.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
                    "a": "p", "b": STATE_TOPIC, "e": 0, "f": 0, "m": "false"}, b"{}"))
            assert r.code == ResponseCode.NO_PERMISSION
            assert STATE_TOPIC not in b.svc.topic_configs()

    run(main())


def test_group_members_share_queues_and_consume_each_message_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "shared", 6)
            async with Producer(env.namesrv) as p:
                sent = [await p.send("shared", b"m%d" % i) for i in range(60)]
            c1 = await Consumer(env.namesrv, "team", "shared", rebalance_interval_s=0.5).start()
            c2 = await Consumer(env.namesrv, "team", "shared", rebalance_interval_s=0.5).start()
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    a1, a2 = set(c1.assignment()), set(c2.assignment())
                    if a1 and a2 and not a1 & a2 and len(a1 | a2) == 6:
                        break
                    await asyncio.sleep(0.1)
                assert len(a1) == len(a2) == 3 and not a1 & a2
                got: list[Any] = []
                while len(got) < 60 and time.monotonic() < deadline + 10:
                    got += await c1.poll(0.2) + await c2.poll(0.2)
                ids = [m.msg_id for m in got]
                assert sorted(ids) == sorted(r.msg_id for r in sent)
            finally:
                await c1.close()
                await c2.close()

    run(main())


def test_body_that_does_not_decompress_is_delivered_with_its_offset(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "broken", 1)
            lz4_flag = int(SysFlag.COMPRESSED) | (int(CompressionType.LZ4) << 8)
            async with RemotingClient(b.address) as c:
                resp = await c.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
                    "a": "p", "b": "broken", "e": 0, "f": lz4_flag, "g": 1, "h": 0,
                    "i": "UNIQ_KEY\x01BROKEN1\x02", "m": "false"}, b"not lz4 at all"))
                assert resp.code == ResponseCode.SUCCESS
            offset = int(resp.ext_fields["commitLogOffset"])
            got = await consume(env.namesrv, "bg", "broken", 1)
            assert len(got) == 1 and got[0].msg_id == "BROKEN1"
            assert got[0].body == b"not lz4 at all"
            assert got[0].decompress_error and str(offset) in got[0].decompress_error

    run(main())


@pytest.mark.parametrize("mode", ["blackhole", "close"])
def test_producer_retries_timeouts_and_lost_connections(tmp_path: Path, mode: str) -> None:
    """Clients reach the broker through a proxy that is cut: a blackholed link times out, a
    closed one is refused; the send is retried (same UNIQ_KEY) until the link is back."""
    from tcp_proxy import TcpProxy

    async def main() -> None:
        async with Env(tmp_path) as env:
            b = LocalBroker(tmp_path, "broker-a", env.namesrv)
            env.brokers.append(b)
            with TcpProxy("127.0.0.1", b.port) as proxy:
                b.ns_address = f"127.0.0.1:{proxy.port}"
                await b.start()
                await create_topic(b.address, "flaky", 1)
                await b.register()
                async with Producer(env.namesrv, send_timeout_s=0.3, max_backoff_s=0.2) as p:
                    assert (await p.send("flaky", b"before")).ok
                    proxy.cut(mode)
                    sending = asyncio.ensure_future(p.send("flaky", b"during the cut"))
                    await asyncio.sleep(1.0)
                    assert not sending.done()
                    proxy.restore()
                    r = await asyncio.wait_for(sending, 15)
                assert r.ok and r.attempts > 1
                q = b.svc.index.queue("flaky", 0)
                bodies = [b.log.read_message(q.get(i).commit_offset).body
                          for i in range(q.min_offset, q.max_offset)]
                # Nothing crossed the cut link, so the retried message is stored once.
                assert bodies == [b"before", b"during the cut"]

    run(main())


def test_flush_sync_answers_after_the_fsync(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(flush="sync")
            await create_topic(b.address, "durable", 2)
            async with Producer(env.namesrv) as p:
                flushes_before = b.log.flush_count
                results = await asyncio.gather(*(p.send_batch("durable", [b"d" * 100] * 8)
                                                 for _ in range(6)))
                for rs in results:
                    end = max(_commit_offset(r.offset_msg_id) for r in rs)
                    assert all(r.ok for r in rs)
                    # Acknowledged means on disk: the flushed offset covers the record.
                    assert b.log.flushed_offset > end
                # Group commit: a batch shares its fsync (48 messages, at most one per batch).
                assert b.log.flush_count - flushes_before <= 6
                # Single sends in flight together share the fsync of their loop turn.
                flushes_before = b.log.flush_count
                singles = await asyncio.gather(*(p.send("durable", b"s" * 100) for _ in range(64)))
                assert all(r.ok for r in singles)
                assert b.log.flushed_offset > max(_commit_offset(r.offset_msg_id) for r in singles)
                assert b.log.flush_count - flushes_before < 64

    run(main())


@pytest.mark.parametrize("immediate", [True, False], ids=["immediate", "task"])
def test_flush_sync_send_whose_fsync_fails_is_not_acknowledged(tmp_path: Path,
                                                               immediate: bool) -> None:
    """A failed group commit answers SYSTEM_ERROR (a retryable refusal), never SEND_OK, on
    both send paths; the next fsync that works acknowledges again."""
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(flush="sync", immediate=immediate)
            await create_topic(b.address, "durable", 1)
            async with Producer(env.namesrv, max_attempts=1) as p:
                assert (await p.send("durable", b"ok")).ok
                real = b.log.sync_now

                def failing() -> int:
                    raise OSError(5, "Input/output error")

                b.log.sync_now = failing
                try:
                    with pytest.raises(SendError) as info:
                        await p.send("durable", b"not on disk")
                    assert info.value.code == ResponseCode.SYSTEM_ERROR
                    assert "FLUSH_DISK_FAILED" in str(info.value)
                finally:
                    b.log.sync_now = real
                assert (await p.send("durable", b"ok again")).ok

    run(main())


def test_master_address_is_read_from_a_refusal_remark() -> None:
    """The broker's own write guard names the master in its remark only."""
    from rmqha.client.sender import _master_in_remark

    remark = "broker 127.0.0.1:4000 is a slave; the master of broker-a is 127.0.0.1:10911"
    assert _master_in_remark(remark) == "127.0.0.1:10911"
    assert _master_in_remark("broker 127.0.0.1:4000 is fenced: its role is not confirmed") == ""


def test_topics_file_seeds_an_empty_log(tmp_path: Path) -> None:
    """topics.json (RocketMQ's topicConfigTable layout) seeds a store whose log holds no
    state yet; as master the broker logs it, so it replicates from then on."""
    store = tmp_path / "store"
    (store / "messaging").mkdir(parents=True)
    table = {"topicConfigTable": {"seeded": {"topicName": "seeded", "readQueueNums": 3,
                                             "writeQueueNums": 3, "perm": 6}}}
    (store / "messaging" / "topics.json").write_text(json.dumps(table))
    log = CommitLog(store / "commitlog", segment_bytes=SEGMENT, prefault=False)
    try:
        svc = MessageService(log, store_dir=store, config=MessagingConfig(), broker_name="b",
                             broker_id=0, replication=None)
        assert svc.topics.get("seeded").write_queue_nums == 3
        assert log.max_offset == 0
        asyncio.run(_as_master(svc))
        assert log.max_offset > 0  # the checkpoint record
        svc.close()
        again = MessageService(log, store_dir=tmp_path / "other", config=MessagingConfig(),
                               broker_name="b", broker_id=0, replication=None)
        assert again.topics.get("seeded").read_queue_nums == 3  # from the log alone
        again.close()
    finally:
        log.close()


async def _as_master(svc: MessageService) -> None:
    svc.set_role("master")


def test_tag_subscription_filters_on_the_broker(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "tagged", 1)
            async with Producer(env.namesrv) as p:
                sent = [await p.send("tagged", Message(b"%d" % i, tags="A" if i % 3 else "B"))
                        for i in range(31)]  # the last one (30) is a B
            want = {r.msg_id for i, r in enumerate(sent) if i % 3}
            got = await consume(env.namesrv, "only-a", "tagged", len(want), tags="A || C")
            assert {m.msg_id for m in got} == want and {m.tags for m in got} == {"A"}
            # The group's offset moved past the B messages too, the last one included.
            assert b.svc.state.offsets.get("only-a", "tagged", 0) == 31

    run(main())


def test_slave_index_waits_for_the_confirm_offset(tmp_path: Path) -> None:
    """On a slave the log fills through replication and the index follows the confirm
    offset: a pull for data in the log but not yet confirmed is held, not answered with
    OFFSET_MOVED, and the confirm callback wakes it."""
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(role="slave", master_address="127.0.0.1:1")
            for i in range(3):  # what HA replication would have written
                b.log.append("T", b"r%d" % i, 0)
            async with RemotingClient(b.address) as c:
                def pull(offset: int) -> RemotingCommand:
                    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
                        "consumerGroup": "g", "topic": "T", "queueId": 0,
                        "queueOffset": offset, "maxMsgNums": 32, "sysFlag": 6,
                        "suspendTimeoutMillis": 5000, "subscription": "*"})
                first = asyncio.ensure_future(c.request(pull(0), 10))
                third = asyncio.ensure_future(c.request(pull(2), 10))
                await asyncio.sleep(0.3)
                assert not first.done() and not third.done()
                assert b.svc.index.queue("T", 0) is None  # nothing confirmed yet
                b.svc.on_confirm_offset(b.log.max_offset)
                r0, r2 = await first, await third
            assert r0.code == r2.code == ResponseCode.SUCCESS
            assert [m.body for m in decode_records(r0.body)] == [b"r0", b"r1", b"r2"]
            assert [m.body for m in decode_records(r2.body)] == [b"r2"]

    run(main())


async def _consume_a_topic_created_after_the_consumer(env: Env, topic: str) -> list[Any]:
    """A consumer subscribed before its topic exists (no route yet), then the topic's first
    sends: what the consumer gets within 3 s (its heartbeat and rebalance are 30 s away)."""
    got: list[Any] = []
    async with Consumer(env.namesrv, "late-group", topic, heartbeat_interval_s=30.0,
                        rebalance_interval_s=30.0) as c:
        await c.poll(0.2)  # started, found no route
        async with Producer(env.namesrv) as p:
            await p.send(topic, b"first")
        deadline = time.monotonic() + 3.0
        while not got and time.monotonic() < deadline:
            got += await c.poll(0.2)
    return got


def test_a_consumer_started_before_its_topic_has_a_route_reads_it_soon(tmp_path: Path) -> None:
    async def main() -> list[Any]:
        async with Env(tmp_path) as env:
            await env.broker()
            return await _consume_a_topic_created_after_the_consumer(env, "late-topic")

    got = run(main())
    assert [m.body for m in got] == [b"first"]


def test_negative_control_without_route_retries_the_late_topic_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_retry(self: Consumer) -> None:
        return None

    monkeypatch.setattr(Consumer, "_retry_missing_routes", no_retry)

    async def main() -> list[Any]:
        async with Env(tmp_path) as env:
            await env.broker()
            return await _consume_a_topic_created_after_the_consumer(env, "late-topic")

    assert run(main()) == []
