"""What a Java 5.x (and 4.x) client sends in its normal life, built with rmqha.remoting the
way the Java client builds it (RocketMQ's header field names), against a real broker
service on loopback: the lz4 decision by client version, lite pull, offsets for new
groups, and the other consumer requests."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rmqha.client import Message, Producer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import CompressionType, SysFlag, decode_records
from rmqha.protocol.version import MQVersion, java_reads_lz4
from rmqha.net.client import RemotingClient
from rmqha.protocol.command import RemotingCommand
from test_messaging import Env, create_topic, run


def _pull(code: int, topic: str, offset: int, *, version: int = int(MQVersion.V5_1_4),
          language: str = "JAVA", hold_ms: int = 0, group: str = "g") -> RemotingCommand:
    req = RemotingCommand.request(code, {
        "consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": 2 if hold_ms else 0, "commitOffset": 0,
        "suspendTimeoutMillis": hold_ms, "subscription": "*", "subVersion": 0,
        "expressionType": "TAG"})
    req.language, req.version = language, version
    return req


def test_version_ordinals_match_mqversion() -> None:
    # Counted in MQVersion.java's enum (V3_0_0_SNAPSHOT = 0).
    assert (MQVersion.V4_9_4, MQVersion.V5_0_0, MQVersion.V5_1_4) == (401, 413, 441)
    assert not java_reads_lz4(293)  # 4.4.0
    assert not java_reads_lz4(399)  # 4.9.3
    assert java_reads_lz4(401) and java_reads_lz4(413)


@pytest.mark.parametrize("language,version,want", [
    ("JAVA", 293, CompressionType.ZLIB),   # 4.4.0
    ("JAVA", 399, CompressionType.ZLIB),   # 4.9.3: zlib only
    ("JAVA", 401, CompressionType.LZ4),    # 4.9.4 inflates lz4
    ("JAVA", 441, CompressionType.LZ4),    # 5.1.4
    ("CPP", 63, CompressionType.ZLIB),     # the C++ 1.2.3 in the rocketmq wheel
])
def test_pull_body_compression_follows_client_version(
        tmp_path: Path, language: str, version: int, want: CompressionType) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "z", 1)
            body = b"compress me " * 2000
            async with Producer(env.namesrv, compress_over_bytes=1024) as p:
                await p.send("z", Message(body), queue_id=0)
            async with RemotingClient(b.address) as c:
                resp = await c.request(_pull(RequestCode.PULL_MESSAGE, "z", 0,
                                             language=language, version=version))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            (msg,) = decode_records(resp.body)
            assert msg.sys_flag & SysFlag.COMPRESSED
            assert (msg.sys_flag >> 8) & 7 == int(want)
            assert msg.body == body  # decode_records inflates either kind

    run(main())


# --- a Java 5.x DefaultLitePullConsumer's life, request by request ---------------------------

_LITE = 0x10 | 0x4 | 0x2  # PullSysFlag: lite pull, subscription, suspend (no commit flag)


def _java(code: int, ext: dict, body: bytes = b"", *, oneway: bool = False) -> RemotingCommand:
    req = RemotingCommand.request(code, ext, body, oneway=oneway)
    req.language, req.version = "JAVA", int(MQVersion.V5_1_4)
    return req


def _heartbeat(client_id: str, group: str, topic: str) -> bytes:
    return json.dumps({
        "clientID": client_id, "producerDataSet": [],
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
            "subscriptionDataSet": [{"classFilterMode": False, "topic": topic, "subString": "*",
                                     "tagsSet": [], "codeSet": [], "subVersion": 1,
                                     "expressionType": "TAG"}]}],
        "heartbeatFingerprint": 0}).encode()


def _lite_pull(topic: str, qid: int, offset: int, hold_ms: int, group: str = "lite") -> RemotingCommand:
    return _java(RequestCode.LITE_PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": qid, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": _LITE, "commitOffset": 0,
        "suspendTimeoutMillis": hold_ms, "subscription": "*", "subVersion": 1,
        "expressionType": "TAG", "maxMsgBytes": 2147483647})


def test_lite_pull_consumer_life_over_the_wire(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "lite", 2)
            cid = "10.0.0.7@4242#lite"
            async with RemotingClient(b.address) as c, Producer(env.namesrv) as p:
                hb = await c.request(_java(RequestCode.HEART_BEAT, {}, _heartbeat(cid, "lite", "lite")))
                assert hb.code == ResponseCode.SUCCESS, hb.remark
                ids = await c.request(_java(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                            {"consumerGroup": "lite"}))
                assert json.loads(ids.body)["consumerIdList"] == [cid]
                # A new group on an empty queue: QUERY_NOT_FOUND, so the client applies
                # CONSUME_FROM_LAST_OFFSET and asks for the max offset.
                q = await c.request(_java(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": "lite", "topic": "lite", "queueId": 0}))
                assert q.code == ResponseCode.QUERY_NOT_FOUND
                mx = await c.request(_java(RequestCode.GET_MAX_OFFSET, {"topic": "lite", "queueId": 0}))
                assert (mx.code, mx.ext_fields["offset"]) == (ResponseCode.SUCCESS, "0")
                # A held lite pull is answered when a message arrives.
                pending = asyncio.ensure_future(c.request(_lite_pull("lite", 0, 0, 10_000), 20))
                sent = await p.send("lite", Message(b"first", keys="k1"), queue_id=0)
                resp = await pending
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                assert [m.msg_id for m in decode_records(resp.body)] == [sent.msg_id]
                assert resp.ext_fields["nextBeginOffset"] == "1"
                more = [await p.send("lite", Message(b"m%d" % i), queue_id=0) for i in range(5)]
                resp = await c.request(_lite_pull("lite", 0, 1, 0))
                assert [m.msg_id for m in decode_records(resp.body)] == [r.msg_id for r in more]
                end = await c.request(_lite_pull("lite", 0, 6, 0))
                assert end.code == ResponseCode.PULL_NOT_FOUND
                # The lite consumer commits with UPDATE_CONSUMER_OFFSET one-way (no commit
                # flag in its pulls) and reads it back with QUERY_CONSUMER_OFFSET.
                await c.oneway(_java(RequestCode.UPDATE_CONSUMER_OFFSET, {
                    "consumerGroup": "lite", "topic": "lite", "queueId": 0, "commitOffset": 6},
                    oneway=True))
                for _ in range(200):
                    q = await c.request(_java(RequestCode.QUERY_CONSUMER_OFFSET, {
                        "consumerGroup": "lite", "topic": "lite", "queueId": 0}))
                    if q.code == ResponseCode.SUCCESS:
                        break
                    await asyncio.sleep(0.01)
                assert (q.code, q.ext_fields["offset"]) == (ResponseCode.SUCCESS, "6")
                # seek / offsetForTimestamp
                mn = await c.request(_java(RequestCode.GET_MIN_OFFSET, {"topic": "lite", "queueId": 0}))
                assert mn.ext_fields["offset"] == "0"
                ts = await c.request(_java(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {
                    "topic": "lite", "queueId": 0, "timestamp": 0}))
                assert ts.ext_fields["offset"] == "0"
                far = 2**62
                for boundary, want in (("LOWER", "6"), ("UPPER", "5")):
                    ts = await c.request(_java(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {
                        "topic": "lite", "queueId": 0, "timestamp": far, "boundaryType": boundary}))
                    assert ts.ext_fields["offset"] == want, boundary
                stored = b.svc.ctx.store_timestamp(b.svc.index.queue("lite", 0).phys[3])
                ts = await c.request(_java(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {
                    "topic": "lite", "queueId": 0, "timestamp": stored, "boundaryType": "UPPER"}))
                last_same = max(i for i in range(6) if b.svc.ctx.store_timestamp(
                    b.svc.index.queue("lite", 0).phys[i]) == stored)
                assert ts.ext_fields["offset"] == str(last_same)
                # Another new group on this young queue (first message at queue offset 0)
                # gets 0, as RocketMQ answers; unless the client says setZeroIfNotFound=false.
                q = await c.request(_java(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": "other", "topic": "lite", "queueId": 0}))
                assert (q.code, q.ext_fields["offset"]) == (ResponseCode.SUCCESS, "0")
                q = await c.request(_java(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": "other", "topic": "lite", "queueId": 0,
                    "setZeroIfNotFound": "false"}))
                assert q.code == ResponseCode.QUERY_NOT_FOUND
                un = await c.request(_java(RequestCode.UNREGISTER_CLIENT, {
                    "clientID": cid, "consumerGroup": "lite"}))
                assert un.code == ResponseCode.SUCCESS
                ids = await c.request(_java(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                            {"consumerGroup": "lite"}))
                assert ids.code == ResponseCode.SYSTEM_ERROR and "no consumer" in ids.remark

    run(main())


async def _assignment(c: RemotingClient, client_id: str) -> set[tuple[tuple[str, str, int], str]]:
    resp = await c.request(_java(RequestCode.QUERY_ASSIGNMENT, {}, json.dumps({
        "topic": "t", "consumerGroup": "g", "clientId": client_id, "strategyName": "AVG",
        "messageModel": "CLUSTERING"}).encode()))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return {((a["messageQueue"]["topic"], a["messageQueue"]["brokerName"], a["messageQueue"]["queueId"]),
             a["mode"]) for a in json.loads(resp.body).get("messageQueueAssignments", [])}


def test_consumer_mode_requests_get_rocketmq_answers(tmp_path: Path) -> None:

    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            async with RemotingClient(b.address) as c:
                def check(expr_type: str, sub: str) -> RemotingCommand:
                    return _java(RequestCode.CHECK_CLIENT_CONFIG, {}, json.dumps({
                        "clientId": "x", "group": "g", "subscriptionData": {
                            "topic": "t", "subString": sub, "expressionType": expr_type}}).encode())
                ok = await c.request(check("TAG", "a || b"))
                assert ok.code == ResponseCode.SUCCESS
                sql = await c.request(check("SQL92", "a > 1"))
                assert sql.code == ResponseCode.SYSTEM_ERROR and "SQL92" in sql.remark
                # Server-side assignment (tests/integration/test_queue_assignment_cluster.py
                # has the name servers' route and a failover): this broker's own queues.
                await create_topic(b.address, "t", 2)
                hb = await c.request(_java(RequestCode.HEART_BEAT, {}, _heartbeat("x", "g", "t")))
                assert hb.code == ResponseCode.SUCCESS, hb.remark
                assert await _assignment(c, "x") == {(("t", "broker-a", 0), "PULL"),
                                                     (("t", "broker-a", 1), "PULL")}
                pop = await c.request(_java(RequestCode.SET_MESSAGE_REQUEST_MODE, {},
                                            json.dumps({"topic": "t", "consumerGroup": "g",
                                                        "mode": "POP"}).encode()))
                assert pop.code == ResponseCode.SUCCESS, pop.remark
                assert await _assignment(c, "x") == {(("t", "broker-a", -1), "POP")}
                unknown = await c.request(_java(RequestCode.SET_MESSAGE_REQUEST_MODE, {},
                                                json.dumps({"topic": "nope", "consumerGroup": "g",
                                                            "mode": "PULL"}).encode()))
                assert unknown.code == ResponseCode.TOPIC_NOT_EXIST

    run(main())


def test_new_group_on_a_trimmed_queue_gets_query_not_found(tmp_path: Path) -> None:
    """Once retention removed a queue's first messages it is no longer "young": a new group
    gets QUERY_NOT_FOUND (so CONSUME_FROM_LAST_OFFSET starts at the max), while rmqha's own
    consumer (CONSUME_FROM_FIRST_OFFSET) still reads everything that is left."""
    import time

    from test_messaging import consume

    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(file_reserved_hours=0.0)
            await create_topic(b.address, "old", 1)
            async with Producer(env.namesrv) as p:
                for i in range(200):
                    await p.send("old", Message(b"%04d" % i + b"x" * 1000), queue_id=0)
            await b.svc.run_retention(now=time.time() + 60)
            lo = b.svc.index.queue("old", 0).min_offset
            assert lo > 0  # segments went
            async with RemotingClient(b.address) as c:
                q = await c.request(_java(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": "late", "topic": "old", "queueId": 0}))
                assert q.code == ResponseCode.QUERY_NOT_FOUND
            got = await consume(env.namesrv, "late-python", "old", 200 - lo)
            assert sorted(m.queue_offset for m in got) == list(range(lo, 200))

    run(main())
