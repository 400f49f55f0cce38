"""What a Java 5.x (and 4.x) client sends in its normal life, built with rmqha.remoting the
way the Java client builds it (RocketMQ's header field names), against a real broker
service on loopback: the lz4 decision by client version, lite pull, offsets for new
groups, and the other consumer requests."""
from __future__ import annotations

from pathlib import Path

import pytest

from rmqha.client import Message, Producer
from rmqha.codes import RequestCode, ResponseCode
from rmqha.messaging.message import CompressionType, SysFlag, decode_records
from rmqha.mq_version import MQVersion, java_reads_lz4
from rmqha.remoting import RemotingClient, RemotingCommand
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
