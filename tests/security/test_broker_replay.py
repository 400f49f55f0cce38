"""The brokers' replay window on ACL 1.0 requests (issue 37, point 3), on real processes.

One controller, one name server and two brokers with ``aclEnable`` over plaintext:
``broker-a`` as shipped (requests without a signed time taken, as RocketMQ takes them) and
``broker-b`` with ``acl_require_signed_time``.  Requests are built and signed here and
sent as raw frames (:mod:`security_wire`): what someone who captured one can send again.

- A request rmqha's client signed (``RmqhaTime`` and ``RmqhaNonce`` inside the signature)
  is taken once; the same bytes again are refused as a replay and store nothing, on the
  send fast lane (a frame signed in place) and on the ordinary path alike.
- One signed more than 5 minutes off the broker's clock, or with a time that is no time,
  is refused; two identical requests of a client (two equal heartbeats) are both taken,
  since each has its own nonce.
- Negative control: the same request signed the RocketMQ way (no stamp) is taken twice by
  ``broker-a`` (the window cannot tell it from its replay: the broker's start-up warning
  says so) and refused by ``broker-b``.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from security_wire import RawClient

from rmqha._core import load
from rmqha.broker.acl_guard import acl_guard
from rmqha.client import BlockingProducer, Message, Producer, SendStatus
from rmqha.net.client_security import ClientSecurity, Credentials
from rmqha.net.server import RemotingServer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import VERSION, RemotingCommand, decode_frame
from rmqha.security.replay import NONCE_FIELD, TIME_FIELD, ReplayWindow, stamp
from rmqha.security.signature import sign
from rmqha.testing.local_cluster import Cluster

TOPIC = "TopicReplay"
ACL = """\
accounts:
  - accessKey: app-access
    secretKey: app-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [TopicReplay=PUB|SUB]
    groupPerms: [g-replay=SUB]
  - accessKey: admin-access
    secretKey: admin-secret-1
    admin: true
"""
APP = Credentials("app-access", "app-secret-1")
ADMIN = Credentials("admin-access", "admin-secret-1")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("replay")
    acl = base / "plain_acl.yml"
    acl.write_text(ACL)
    with Cluster(base / "cluster") as c:
        c.client_security = ClientSecurity(None, ADMIN.sign)
        # Generous waits: a loaded two-core machine starts a process in tens of seconds.
        c.wait_controllers(c.start_controllers(1, wait=False), 90)
        ns = c.start_namesrv(wait=False)
        c.wait_for(lambda: ns.listens(ns.address), 90, what="the name server listening", process=ns)
        c.a = c.start_broker("broker-a", wait=False, acl_enable=True, acl_file=str(acl))
        c.b = c.start_broker("broker-b", wait=False, acl_enable=True, acl_file=str(acl),
                             acl_require_signed_time=True)
        for broker in (c.a, c.b):
            c.wait_broker_up(broker, 90)
            c.wait_role(broker, "master", 90)
            c.wait_for(lambda b=broker: _create_topic(b.address), 60, what=f"{TOPIC} created on {broker.name}",
                       process=broker)
        c.wait_for(lambda: c.route(TOPIC) is not None and len(c.route(TOPIC)["brokerDatas"]) == 2,
                   what="both brokers in the topic's route")
        yield c


def _create_topic(address: str) -> bool:
    """Whether the topic was created (a master still settling answers an error: asked again)."""
    created = _ask(address, _signed(ADMIN, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}))
    return created.code == ResponseCode.SUCCESS


def _signed(creds: Credentials, code: int, ext: dict[str, str], body: bytes = b"") -> RemotingCommand:
    cmd = RemotingCommand.request(code, ext, body)
    creds.sign(cmd)
    return cmd


def _rocketmq_signed(code: int, ext: dict[str, str], body: bytes = b"") -> RemotingCommand:
    """Signed as RocketMQ's AclClientRPCHook signs: no time, no nonce."""
    return RemotingCommand.request(code, sign(ext, body, APP.access_key, APP.secret_key), body)


def _ask(address: str, *cmds: RemotingCommand) -> RemotingCommand:
    with RawClient(address) as client:
        answers = [client.request(cmd) for cmd in cmds]
    return answers[-1]


def _send(born: int = 0) -> dict[str, str]:
    return {"producerGroup": "PG_REPLAY", "topic": TOPIC, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": str(born),
            "flag": "0", "properties": "", "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}


def _max_offset(address: str) -> int:
    answer = _ask(address, _signed(APP, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"}))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return int(answer.ext_fields["offset"])


def _refused(answer: RemotingCommand, why: str) -> None:
    assert answer.code == ResponseCode.SYSTEM_ERROR and not answer.body, (answer.code, answer.remark)
    assert why in (answer.remark or ""), answer.remark


def test_a_stamped_send_is_taken_once(live: Cluster) -> None:
    for broker in (live.a, live.b):
        cmd = _signed(APP, RequestCode.SEND_MESSAGE, _send(), b"once")
        assert {TIME_FIELD, NONCE_FIELD} <= set(cmd.ext_fields)
        before = _max_offset(broker.address)
        with RawClient(broker.address) as client:
            first = client.request(cmd)
            assert first.code == ResponseCode.SUCCESS, first.remark
            _refused(client.request(cmd), "is a replay")
        _refused(_ask(broker.address, cmd), "is a replay")  # another connection: the same
        assert _max_offset(broker.address) == before + 1


def test_a_frame_signed_in_place_is_taken_once(live: Cluster) -> None:
    """The blocking producer's path: the send codec's frame signed without a command;
    the broker checks it on its fast lane."""
    frame = load("send_codec").encode_send(310, 4242, VERSION, "PG_REPLAY", TOPIC, 0, 1700000000123, 0,
                                           "", False, 0, b"in place")
    cmd = decode_frame(frame[4:])
    signed = APP.sign_send_frame(frame, cmd.ext_fields, cmd.body)
    assert signed is not None and TIME_FIELD.encode() in signed
    before = _max_offset(live.b.address)
    with RawClient(live.b.address) as client:
        first = client.request_bytes(signed, 4242)
        assert first.code == ResponseCode.SUCCESS, first.remark
        _refused(client.request_bytes(signed, 4242), "is a replay")
    assert _max_offset(live.b.address) == before + 1


def test_a_stamped_read_is_taken_once(live: Cluster) -> None:
    cmd = _signed(APP, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    assert _ask(live.a.address, cmd).code == ResponseCode.SUCCESS
    _refused(_ask(live.a.address, cmd), "is a replay")


@pytest.mark.parametrize(("offset_ms", "why"), [
    (-301_000, "301 s behind the broker's clock"),
    (301_000, "301 s ahead of the broker's clock"),
    (-3 * 365 * 86_400_000, "behind the broker's clock"),
])
def test_a_time_outside_the_window_is_refused(live: Cluster, offset_ms: int, why: str) -> None:
    creds = Credentials(APP.access_key, APP.secret_key,
                        stamper=lambda: stamp(int(time.time() * 1000) + offset_ms))
    before = _max_offset(live.a.address)
    _refused(_ask(live.a.address, _signed(creds, RequestCode.SEND_MESSAGE, _send(), b"late")), why)
    assert _max_offset(live.a.address) == before


def test_a_time_that_is_no_time_is_refused(live: Cluster) -> None:
    creds = Credentials(APP.access_key, APP.secret_key,
                        stamper=lambda: {TIME_FIELD: "yesterday", NONCE_FIELD: "00"})
    _refused(_ask(live.a.address, _signed(creds, RequestCode.SEND_MESSAGE, _send(), b"x")), "is not a time")


def test_identical_requests_of_a_client_are_each_taken(live: Cluster) -> None:
    body = json.dumps({"clientID": "replay-client", "producerDataSet": [{"groupName": "PG_REPLAY"}],
                       "consumerDataSet": []}).encode()
    for broker in (live.a, live.b):
        with RawClient(broker.address) as client:
            for _ in range(3):  # the same heartbeat every 30 s: the nonce tells them apart
                answer = client.request(_signed(APP, RequestCode.HEART_BEAT, {}, body))
                assert answer.code == ResponseCode.SUCCESS, answer.remark


def test_rmqha_producers_send_the_same_message_twice(live: Cluster) -> None:
    """rmqha's own producers (async: commands; blocking: frames signed in place) against
    the broker that refuses requests without a signed time."""
    namesrv = live.namesrv_addresses[0]
    creds: dict[str, Any] = {"access_key": APP.access_key, "secret_key": APP.secret_key}

    async def send_async() -> list[SendStatus]:
        async with Producer(namesrv, **creds) as p:
            return [(await p.send(TOPIC, Message(b"same"))).status for _ in range(4)]

    assert asyncio.run(send_async()) == [SendStatus.SEND_OK] * 4
    with BlockingProducer(namesrv, **creds) as bp:
        assert [bp.send(TOPIC, Message(b"same")).status for _ in range(4)] == [SendStatus.SEND_OK] * 4


def test_rocketmq_signed_requests_are_taken_twice_unless_a_time_is_required(live: Cluster) -> None:
    """The negative control: without a stamp the window sees nothing to refuse."""
    cmd = _rocketmq_signed(RequestCode.SEND_MESSAGE, _send(), b"stock")
    assert TIME_FIELD not in cmd.ext_fields
    before = _max_offset(live.a.address)
    for _ in range(2):
        answer = _ask(live.a.address, cmd)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert _max_offset(live.a.address) == before + 2  # a replay of it is a second message
    before_b = _max_offset(live.b.address)
    _refused(_ask(live.b.address, cmd), "carries no signed RmqhaTime")
    assert _max_offset(live.b.address) == before_b


def test_the_start_up_warning_says_what_is_replayable(live: Cluster) -> None:
    log_a, log_b = (Path(b.log_path).read_text(errors="replace") for b in (live.a, live.b))
    assert "a request of a RocketMQ client (no signed RmqhaTime) can be replayed" in log_a
    assert "requests without a signed RmqhaTime are refused" in log_b


def test_a_send_the_fast_lane_admitted_but_did_not_take_is_not_checked_twice(tmp_path: Path) -> None:
    """A plain send the lane admits but its handler leaves (a new master waiting for its
    first lease, a slave) goes the ordinary way without a second check: the window would
    call its own first check a replay.  A real server port in this process, the broker's
    guard; the replay of the same frame is still refused (negative control)."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    guard = acl_guard(acl, replay=ReplayWindow())
    taken: list[int] = []

    async def ordinary(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        taken.append(cmd.opaque)
        return cmd.response(ResponseCode.SUCCESS, "taken the ordinary way")

    async def main() -> list[RemotingCommand]:
        server = RemotingServer(handler={310: ordinary})
        server.dispatcher.guard = guard
        server.dispatcher.plain_guard = guard.plain
        server.dispatcher.register_plain_send(lambda send, conn: False, ())  # never takes one
        async with server:
            frame = load("send_codec").encode_send(310, 99, VERSION, "PG_REPLAY", TOPIC, 0, 1, 0, "", False, 0,
                                                   b"left by the lane")
            signed = APP.sign_send_frame(frame, decode_frame(frame[4:]).ext_fields, b"left by the lane")
            assert signed is not None
            loop = asyncio.get_running_loop()

            def both() -> list[RemotingCommand]:
                with RawClient(server.address) as client:
                    return [client.request_bytes(signed, 99), client.request_bytes(signed, 99)]
            return await loop.run_in_executor(None, both)

    first, again = asyncio.run(main())
    assert first.code == ResponseCode.SUCCESS, first.remark
    _refused(again, "is a replay")
    assert taken == [99]
