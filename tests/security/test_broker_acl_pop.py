"""Pop consumption through a broker with RocketMQ ACL 1.0 on (``aclEnable``).

A name server and a broker run in the test's loop over real sockets; every request is
signed (``Credentials.sign`` as the RPC hook, as rmqha's clients sign).  An account with
only PUB on the topic and group is refused POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_
INVISIBLETIME and BATCH_ACK_MESSAGE and changes nothing; the account with SUB pops and
acks.  Subscription group changes are refused to all but the admin account.  The negative
control pops unsigned from a broker without ACL: the probe itself delivers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from test_messaging import Env, LocalBroker, run
from test_pop import ack, batch_ack, change, in_flight, pop, send_raw

from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, Credentials
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand

TOPIC, GROUP = "PopAclTopic", "PopAclGroup"
ACL = f"""\
accounts:
  - accessKey: admin-ak
    secretKey: admin-secret-12
    admin: true
  - accessKey: consumer-ak
    secretKey: consumer-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [{TOPIC}=SUB]
    groupPerms: [{GROUP}=SUB]
  - accessKey: publisher-ak
    secretKey: publisher-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [{TOPIC}=PUB]
    groupPerms: [{GROUP}=PUB]
"""


def _client(addr: str, ak: str | None = None, sk: str = "") -> RemotingClient:
    security = None if ak is None else ClientSecurity(rpc_hook=Credentials(ak, sk).sign)
    return RemotingClient(addr, security=security)


async def _prepare(b: LocalBroker, n: int) -> None:
    """The topic and ``n`` messages in queue 0, as the admin account."""
    async with _client(b.address, "admin-ak", "admin-secret-12") as admin:
        created = await admin.request(RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": TOPIC, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}))
        assert created.code == ResponseCode.SUCCESS, created.remark
        for i in range(n):
            sent = await send_raw(admin, TOPIC, b"m%d" % i)
            assert sent.code == ResponseCode.SUCCESS, sent.remark


async def _update_group(c: RemotingClient) -> RemotingCommand:
    return await c.request(RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "%s"}' % GROUP.encode()))


def test_pop_needs_sub_on_topic_and_group(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)

    async def main() -> dict[str, Any]:
        r: dict[str, Any] = {}
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            await _prepare(b, 2)
            async with _client(b.address) as anon, \
                    _client(b.address, "publisher-ak", "publisher-secret-1") as pub, \
                    _client(b.address, "consumer-ak", "consumer-secret-1") as sub:
                r["unsigned"], _ = await pop(anon, GROUP, TOPIC)
                r["pub_pop"], _ = await pop(pub, GROUP, TOPIC)
                r["other_group"], _ = await pop(sub, "SomeOtherGroup", TOPIC)
                r["in_flight_refused"] = in_flight(b)
                r["pop"], msgs = await pop(sub, GROUP, TOPIC, n=2)
                r["popped"] = [m.body for m in msgs]
                r["pub_ack"] = await ack(pub, GROUP, msgs[0])
                r["pub_change"] = await change(pub, GROUP, msgs[0], 60_000)
                r["pub_batch"] = await batch_ack(pub, GROUP, msgs)
                r["in_flight_after_pub"] = in_flight(b)
                r["ack"] = await ack(sub, GROUP, msgs[0])
                r["batch"] = await batch_ack(sub, GROUP, msgs[1:])
                r["in_flight_end"] = in_flight(b)
                r["sub_group_update"] = await _update_group(sub)
            async with _client(b.address, "admin-ak", "admin-secret-12") as admin:
                r["admin_group_update"] = await _update_group(admin)
        return r

    r = run(main())
    assert r["unsigned"].code == ResponseCode.SYSTEM_ERROR and "AccessKey" in r["unsigned"].remark
    assert r["pub_pop"].code == ResponseCode.SYSTEM_ERROR
    assert f"no SUB permission for topic:{TOPIC}" in r["pub_pop"].remark
    assert r["other_group"].code == ResponseCode.SYSTEM_ERROR
    assert "no SUB default permission for group:SomeOtherGroup" in r["other_group"].remark
    assert r["in_flight_refused"] == 0
    assert r["pop"].code == ResponseCode.SUCCESS, r["pop"].remark
    assert sorted(r["popped"]) == [b"m0", b"m1"]
    for key in ("pub_ack", "pub_change", "pub_batch"):
        assert r[key].code == ResponseCode.SYSTEM_ERROR, (key, r[key].remark)
        assert "has no SUB permission" in r[key].remark, (key, r[key].remark)
    assert r["in_flight_after_pub"] == 2
    assert r["ack"].code == ResponseCode.SUCCESS, r["ack"].remark
    assert r["batch"].code == ResponseCode.SUCCESS, r["batch"].remark
    assert r["in_flight_end"] == 0
    assert r["sub_group_update"].code == ResponseCode.SYSTEM_ERROR
    assert "needs an admin account" in r["sub_group_update"].remark
    assert r["admin_group_update"].code == ResponseCode.SUCCESS, r["admin_group_update"].remark


def test_negative_control_unsigned_pop_delivers_without_acl(tmp_path: Path) -> None:
    async def main() -> tuple[RemotingCommand, list[bytes]]:
        async with Env(tmp_path) as env:
            b = await env.broker()
            async with _client(b.address) as anon:
                created = await anon.request(RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_TOPIC,
                    {"topic": TOPIC, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}))
                assert created.code == ResponseCode.SUCCESS, created.remark
                assert (await send_raw(anon, TOPIC, b"m0")).code == ResponseCode.SUCCESS
                resp, msgs = await pop(anon, GROUP, TOPIC)
            return resp, [m.body for m in msgs]

    resp, bodies = run(main())
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert bodies == [b"m0"]
