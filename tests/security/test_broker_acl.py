"""RocketMQ ACL 1.0 on a real broker's client port (``aclEnable``, ``plain_acl.yml``).

A name server and a broker run in the test's loop over real sockets; the official client
(PyPI ``rocketmq`` 0.4.4, ``set_session_credentials``) runs in a child process.  Signed with
the right secret it gets SEND_OK; with a wrong secret, without credentials or without the
permission it is refused and nothing is stored.  The negative control sends the same unsigned
request to a broker without ACL: it is stored, so the probe is a real write.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import needs
from test_messaging import Env, create_topic, run

from rmqha.net.client import RemotingClient
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security.signature import sign

DRIVER = Path(__file__).resolve().parent / "test_security_official_client.py"
ACL = """\
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret-1
    defaultTopicPerm: DENY
    topicPerms: [TopicAcl=PUB]
  - accessKey: admin-ak
    secretKey: admin-secret-12
    admin: true
"""


def _official_send(home: Path, namesrv: str, ak: str, sk: str, topic: str) -> dict[str, Any]:
    """What the official client's send_sync gave: {"status": n} or {"error": text}."""
    out = subprocess.run([sys.executable, str(DRIVER), namesrv, ak, sk, topic],
                         capture_output=True, text=True, timeout=90, env={"HOME": str(home),
                                                                          "PATH": "/usr/bin:/bin"})
    lines = out.stdout.strip().splitlines()
    assert lines, f"the driver printed nothing: {out.stderr[-1000:]}"
    return dict(json.loads(lines[-1]))


def _unsigned_send(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG_RAW", "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
        "bornTimestamp": "0", "flag": "0", "properties": "", "reconsumeTimes": "0",
        "unitMode": "false", "batch": "false"}, b"raw probe")


async def _signed_create(addr: str, topic: str) -> RemotingCommand:
    ext = {"topic": topic, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
    ext = sign(ext, None, "admin-ak", "admin-secret-12")
    async with RemotingClient(addr) as c:
        return await c.request(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext))


def test_official_client_signed_sends_and_refusals(tmp_path: Path) -> None:
    needs.module("rocketmq.client", "the official client (rocketmq 0.4.4, dev extra)")
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)

    async def main() -> dict[str, Any]:
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            unsigned = await create_topic(b.address, "TopicAcl", 1)
            signed = await _signed_create(b.address, "TopicAcl")
            before = b.log.max_offset
            async with RemotingClient(b.address) as c:
                raw = await c.request(_unsigned_send("TopicAcl"))
            after_raw = b.log.max_offset
            loop = __import__("asyncio").get_running_loop()
            ok = await loop.run_in_executor(None, _official_send, tmp_path, env.namesrv,
                                            "producer-ak", "producer-secret-1", "TopicAcl")
            after_ok = b.log.max_offset
            lane_ok = b.acl_lane_admitted
            wrong = await loop.run_in_executor(None, _official_send, tmp_path, env.namesrv,
                                               "producer-ak", "not-the-secret", "TopicAcl")
            no_perm = await loop.run_in_executor(None, _official_send, tmp_path, env.namesrv,
                                                 "producer-ak", "producer-secret-1", "TBW102")
            return dict(unsigned=unsigned, signed=signed, raw=raw, before=before,
                        after_raw=after_raw, ok=ok, after_ok=after_ok, wrong=wrong,
                        no_perm=no_perm, end=b.log.max_offset, lane_ok=lane_ok,
                        lane_end=b.acl_lane_admitted)

    r = run(main())
    assert r["unsigned"].code == ResponseCode.SYSTEM_ERROR and "AccessKey" in r["unsigned"].remark
    assert r["signed"].code == ResponseCode.SUCCESS, r["signed"].remark
    assert r["raw"].code == ResponseCode.SYSTEM_ERROR and "AccessKey" in r["raw"].remark
    assert r["after_raw"] == r["before"]
    assert r["ok"] == {"status": 0}, r["ok"]
    assert r["after_ok"] > r["after_raw"]
    assert "error" in r["wrong"], r["wrong"]
    assert "error" in r["no_perm"], r["no_perm"]
    assert r["end"] == r["after_ok"]
    # The signed send was admitted on the plain-send lane (signature checked there); the
    # refused ones were not, and the ordinary check refused them.
    assert r["lane_ok"] >= 1 and r["lane_end"] == r["lane_ok"]


def test_negative_control_unsigned_send_is_stored_without_acl(tmp_path: Path) -> None:
    async def main() -> tuple[RemotingCommand, int, int]:
        async with Env(tmp_path) as env:
            b = await env.broker()
            assert (await create_topic(b.address, "TopicAcl", 1)).code == ResponseCode.SUCCESS
            before = b.log.max_offset
            async with RemotingClient(b.address) as c:
                raw = await c.request(_unsigned_send("TopicAcl"))
            return raw, before, b.log.max_offset

    raw, before, after = run(main())
    assert raw.code == ResponseCode.SUCCESS, raw.remark
    assert after > before

