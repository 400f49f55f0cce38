"""The broker's plain-send fast lane answers as the ordinary path does, byte for byte.

Two real send paths (MessageService on a real CommitLog) behind real Connections whose
transport records what they write: one with the fast lane (plain sends parsed from their
frames, no command made), one without.  The same reads go to both, mixing plain sends
(JSON and binary, V1 and V2) with what is not plain (a new topic, a delay, a one-way send,
another request, refusals), and both must write the same bytes and store the same
records, with the fast lane taking the plain ones.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_send_groups import ScriptedReplication

from rmqha.broker.acl_guard import acl_guard
from rmqha.messaging.context import MessagingConfig
from rmqha.messaging.service import MessageService
from rmqha.net.connection import Connection
from rmqha.net.dispatcher import Dispatcher
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import (
    FLAG_ONEWAY,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCommand,
    encode,
)
from rmqha.protocol.headers import SendHeader
from rmqha.protocol.message import BatchItem, encode_batch
from rmqha.security.signature import sign
from rmqha.store import CommitLog
from rmqha.testing.recording_transport import RecordingTransport


class Side:
    """A send path behind a connection, with or without the fast lane."""

    def __init__(self, base: Path, fast: bool, replication: Any = None,
                 guard: Callable[..., None] | None = None, runs: bool = False,
                 **cfg: Any) -> None:
        self.log = CommitLog(base / "cl", segment_bytes=1 << 22, prefault=False,
                             store_host=("127.0.0.1", 10911))
        self.svc = MessageService(self.log, store_dir=base, config=MessagingConfig(**cfg),
                                  broker_name="b", broker_id=0, replication=replication)
        self.svc.set_role("master", None)
        d = Dispatcher(self.svc.handlers())
        d.guard = guard
        for code, now in self.svc.immediate_handlers().items():
            d.register_immediate(code, now)
        self.taken = 0
        if fast:
            plain, refuse = self.svc.plain_send_handler()

            def counted(send: Any, conn: Any) -> bool:
                taken = plain(send, conn)
                self.taken += taken
                return taken

            d.register_plain_send(counted, refuse)
        self.run_calls: list[int] = []
        if runs:
            many = self.svc.plain_sends_handler()

            def counted_runs(sends: Any, conn: Any) -> int:
                taken = many(sends, conn)
                self.taken += taken
                self.run_calls.append(len(sends))
                return taken

            d.register_plain_sends(counted_runs)
        self.conn = Connection(d, 1 << 20)
        self.transport = RecordingTransport()
        self.conn.connection_made(self.transport)

    def records(self) -> list[tuple[Any, ...]]:
        """What was stored, but the times the broker stamps."""
        return [(m.topic, m.queue_id, m.queue_offset, m.body, m.properties, m.flag, m.sys_flag,
                 m.born_timestamp) for m in self.log.iter_messages()]

    def close(self) -> None:
        self.svc.close()
        self.log.close()


def send(i: int, topic: str = "T", *, binary: bool = False, v1: bool = False,
         props: str = "", oneway: bool = False, queue_id: int = -1) -> bytes:
    h = SendHeader("pg", topic, queue_id, 0, 1700000000000 + i, i % 3,
                   props or f"KEYS\x01k{i}\x02UNIQ_KEY\x01U{i:08d}\x02", 0, False)
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE if v1 else RequestCode.SEND_MESSAGE_V2,
                          opaque=1000 + i, ext_fields=h.build(v2=not v1), body=b"m%d" % i)
    if binary:
        cmd.serialize_type = SERIALIZE_ROCKETMQ
    if oneway:
        cmd.flag |= FLAG_ONEWAY
    return encode(cmd)


def batch(i: int, n: int, *, binary: bool = False, delay: bool = False) -> bytes:
    """A SEND_BATCH_MESSAGE of ``n`` messages (one asking for a delay: refused)."""
    items = [BatchItem(b"b%d-%d" % (i, k), {"KEYS": f"k{k}", "UNIQ_KEY": f"B{i}-{k}"}, k % 2)
             for k in range(n)]
    if delay:
        items[-1].properties["DELAY"] = "2"
    h = SendHeader("pg", "T", i % 4, 0, 1700000000000 + i, 0, "", 0, True)
    cmd = RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, opaque=1000 + i,
                          ext_fields=h.build(), body=encode_batch(items))
    if binary:
        cmd.serialize_type = SERIALIZE_ROCKETMQ
    return encode(cmd)


def other(i: int) -> bytes:
    return encode(RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=1000 + i,
                                  ext_fields={"topic": "T", "queueId": "0"}))


def reads() -> list[bytes]:
    """Reads of one connection: pipelined, single, plain and not."""
    out = [send(0, queue_id=0), send(1, binary=True, queue_id=1),  # T is created by the first
           send(2, v1=True) + send(3, binary=True, v1=True) + other(4) + send(5, "New5")
           + send(6, props="DELAY\x012\x02") + send(7, oneway=True) + send(8, binary=True),
           send(9, "bad/topic") + send(10, "RMQ_SYS_TRANS_HALF_TOPIC") + send(11)]
    out += [send(i, binary=bool(i % 2), queue_id=i % 4) for i in range(12, 40)]
    out.append(b"".join(send(i, "T" if i % 5 else "U", binary=bool(i % 3)) for i in range(40, 80)))
    out += [batch(80, 5), batch(81, 3, binary=True) + send(82) + batch(83, 2, delay=True)
            + batch(84, 1)]
    return out


async def feed(side: Side, data: list[bytes]) -> None:
    for chunk in data:
        # Split a read at an odd place too: a frame may arrive in pieces.
        cut = len(chunk) // 3
        side.conn.data_received(chunk[:cut])
        side.conn.data_received(chunk[cut:])
        for _ in range(3):
            await asyncio.sleep(0)
    await asyncio.sleep(0.05)


def in_loop(make: Callable[[], tuple[Side, ...]],
            script: Callable[[tuple[Side, ...]], Any]) -> tuple[Side, ...]:
    """Sides made in a running loop (connections need one), ``script(sides)`` run, closed."""
    async def main() -> tuple[Side, ...]:
        sides = make()
        try:
            await script(sides)
        finally:
            for side in sides:
                side.close()
        return sides

    return asyncio.run(main())


def run_both(tmp_path: Path, data: list[bytes], runs: bool = False,
             **kw: Any) -> tuple[Side, ...]:
    async def script(sides: tuple[Side, ...]) -> None:
        for side in sides:
            random.seed(29)  # a send without a queue gets a random one: the same on both
            await feed(side, data)

    return in_loop(lambda: (Side(tmp_path / "fast", True, runs=runs, **kw),
                            Side(tmp_path / "slow", False, **kw)), script)


def answers(side: Side) -> list[RemotingCommand]:
    return FrameDecoder().feed(bytes(side.transport.out))


@pytest.mark.parametrize("runs", [False, True], ids=["one-by-one", "runs"])
def test_the_fast_lane_writes_the_ordinary_paths_bytes(tmp_path: Path, runs: bool) -> None:
    """One send per call, or a read's back-to-back plain sends in one call (the runs)."""
    fast, slow = run_both(tmp_path, reads(), runs=runs)
    assert fast.transport.out == slow.transport.out
    # Runs: a pipelined read's sends went in few calls (the read is fed in two pieces).
    assert bool(fast.run_calls) == runs and (not runs or max(fast.run_calls) >= 16)
    assert fast.conn.in_flight == 0
    assert fast.records() == slow.records()
    # The fast lane took the plain sends to existing topics (all but the first to T and U,
    # which create them, and what is not plain or refused).
    assert fast.taken >= 60 and slow.taken == 0
    got = answers(fast)
    codes = {a.opaque - 1000: a.code for a in got}
    assert codes[9] == ResponseCode.MESSAGE_ILLEGAL and codes[10] == ResponseCode.NO_PERMISSION
    assert codes[4] == ResponseCode.SUCCESS and 7 not in codes  # one-way: no answer
    # Stored sends answer in order (a refusal answers at once, ahead of its group's wait).
    assert [a.opaque for a in got if a.opaque >= 1012 and a.code == ResponseCode.SUCCESS] == [
        o for o in range(1012, 1085) if o != 1083]
    assert codes[83] == ResponseCode.MESSAGE_ILLEGAL  # a batch with a delay
    assert all(a.code == ResponseCode.SUCCESS for a in got if 1011 <= a.opaque != 1083)
    assert len(next(a for a in got if a.opaque == 1080).ext_fields["msgId"].split(",")) == 5


def test_refusals_go_the_ordinary_way(tmp_path: Path) -> None:
    """A broker that is not master, and a topic a send may not create, answer as today."""
    data = [send(0, "Existing")]
    fast, slow = run_both(tmp_path, data, auto_create_topic_enable=False)
    assert fast.transport.out == slow.transport.out and fast.taken == 0
    assert answers(fast)[0].code == ResponseCode.TOPIC_NOT_EXIST

    async def script(sides: tuple[Side, ...]) -> None:
        for side in sides:
            side.svc.set_role("slave", "127.0.0.1:1")
            await feed(side, [send(1, "TBW102"), send(2, binary=True)])

    sides = in_loop(lambda: (Side(tmp_path / "f2", True), Side(tmp_path / "s2", False)), script)
    assert sides[0].transport.out == sides[1].transport.out and sides[0].taken == 0
    assert {a.code for a in answers(sides[0])} == {ResponseCode.SERVICE_NOT_AVAILABLE}


def test_a_failing_run_handler_closes_the_link(tmp_path: Path) -> None:
    """Which sends of a run a raising handler stored is unknown: the link closes (its
    client retries) rather than answer them twice or never."""
    def broken(sends: Any, conn: Any) -> int:
        raise RuntimeError("boom")

    async def script(sides: tuple[Side, ...]) -> None:
        sides[0].conn._dispatcher.register_plain_sends(broken)  # type: ignore[union-attr]
        await feed(sides[0], [send(0, queue_id=0) + send(1, queue_id=0)])

    (side,) = in_loop(lambda: (Side(tmp_path, True),), script)
    assert side.conn.closed and side.conn.close_reason == "plain sends handler failed"
    assert answers(side) == []


def test_a_send_failing_in_a_run_answers_system_error(tmp_path: Path) -> None:
    """A bug on one send of a run answers it SYSTEM_ERROR; the run goes on.  (A bug
    while a run is prepared leaves its sends one by one, where the bug is met again.)"""
    async def script(sides: tuple[Side, ...]) -> None:
        svc = sides[0].svc._send  # type: ignore[attr-defined]
        take = svc._take_plain
        queues = svc._run_queues

        def flaky(send: Any, conn: Any, group: Any) -> bool:
            if send[1] == 1001:
                raise RuntimeError("boom")
            return bool(take(send, conn, group))

        def flaky_run(sends: Any, start: int, group: Any) -> Any:
            if any(s[1] == 1001 for s in sends[start:]):
                raise RuntimeError("boom")
            return queues(sends, start, group)

        svc._take_plain = flaky
        svc._run_queues = flaky_run
        await feed(sides[0], [send(0, queue_id=0), send(1, queue_id=0) + send(2, queue_id=0)])

    (side,) = in_loop(lambda: (Side(tmp_path, True, runs=True),), script)
    got = {a.opaque: a for a in answers(side)}
    assert got[1001].code == ResponseCode.SYSTEM_ERROR and got[1001].remark == "RuntimeError: boom"
    assert got[1000].code == got[1002].code == ResponseCode.SUCCESS
    assert not side.conn.closed and side.conn.in_flight == 0


@pytest.mark.parametrize("runs", [False, True], ids=["one-by-one", "runs"])
def test_a_replica_timeout_is_answered_as_today(tmp_path: Path, runs: bool) -> None:
    """The non-SUCCESS answer of a send the fast lane took (made by the ordinary encoder)."""
    repls = (ScriptedReplication(), ScriptedReplication())
    warm = [send(0, queue_id=0)]
    data = [send(1, queue_id=1) + send(2, binary=True, queue_id=2), send(3, binary=True, queue_id=3)]

    async def script(sides: tuple[Side, ...]) -> None:
        for side, repl in zip(sides, repls):
            await feed(side, warm)
            repl.waits.pop()[1](True)
            await feed(side, data)
            for _end, done in list(repl.waits[:1]):
                done(False)  # the first group times out
            for _end, done in list(repl.waits[1:]):
                done(True)
            await asyncio.sleep(0.01)

    sides = in_loop(lambda: (Side(tmp_path / "f", True, replication=repls[0], runs=runs),
                             Side(tmp_path / "s", False, replication=repls[1])), script)
    assert sides[0].transport.out == sides[1].transport.out
    assert sides[0].taken == 3
    got = answers(sides[0])
    assert [a.ext_fields["putStatus"] for a in got] == ["PUT_OK", "FLUSH_SLAVE_TIMEOUT",
                                                        "FLUSH_SLAVE_TIMEOUT", "PUT_OK"]
    assert got[1].remark and got[1].remark.startswith("FLUSH_SLAVE_TIMEOUT: stored at")


@pytest.mark.parametrize("guarded", [False, True], ids=["no-guard", "guard"])
def test_a_guard_sees_every_send(tmp_path: Path, guarded: bool) -> None:
    """With a guard (the ACL check) every send is a command the guard reads first."""
    seen: list[int] = []

    def guard(cmd: RemotingCommand, conn: Any) -> None:
        seen.append(cmd.opaque)

    async def script(sides: tuple[Side, ...]) -> None:
        await feed(sides[0], [send(0), send(1) + send(2, binary=True)])

    (side,) = in_loop(lambda: (Side(tmp_path, True, guard=guard if guarded else None),), script)
    if guarded:
        assert seen == [1000, 1001, 1002] and side.taken == 0
    else:
        assert seen == [] and side.taken == 2


def test_a_failing_plain_send_handler_answers_system_error_and_keeps_the_link(
        tmp_path: Path) -> None:
    def broken(send: Any, conn: Any) -> bool:
        if send[1] == 1001:
            raise RuntimeError("boom")
        return False  # the others go the ordinary way

    async def script(sides: tuple[Side, ...]) -> None:
        sides[0].conn._dispatcher.register_plain_send(broken, ())  # type: ignore[union-attr]
        await feed(sides[0], [send(0, queue_id=0), send(1, queue_id=0) + send(2, queue_id=0)])

    (side,) = in_loop(lambda: (Side(tmp_path, True),), script)
    got = {a.opaque: a for a in answers(side)}
    assert got[1001].code == ResponseCode.SYSTEM_ERROR and got[1001].remark == "RuntimeError: boom"
    assert got[1000].code == got[1002].code == ResponseCode.SUCCESS
    assert not side.conn.closed and side.conn.in_flight == 0


# --- RocketMQ ACL 1.0: signed plain sends on the lane ---------------------------------------

ACL = """\
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret-1
    defaultTopicPerm: DENY
    topicPerms: [T=PUB, U=SUB]
  - accessKey: admin-ak
    secretKey: admin-secret-12
    admin: true
  - accessKey: near-ak
    secretKey: near-secret-12
    whiteRemoteAddress: 127.0.0.*
"""


def signed(i: int, topic: str = "T", ak: str = "producer-ak", sk: str = "producer-secret-1",
           *, binary: bool = False, v1: bool = False, sign_body: bytes | None = None) -> bytes:
    """A send signed as the official clients sign (``sign_body``: sign another body)."""
    h = SendHeader("pg", topic, i % 4, 0, 1700000000000 + i, 0, f"UNIQ_KEY\x01S{i:08d}\x02",
                   0, False)
    body = b"s%d" % i
    ext = sign({**h.build(v2=not v1), "OnsChannel": "ALIYUN"},
               body if sign_body is None else sign_body, ak, sk)
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE if v1 else RequestCode.SEND_MESSAGE_V2,
                          opaque=1000 + i, ext_fields=ext, body=body)
    if binary:
        cmd.serialize_type = SERIALIZE_ROCKETMQ
    return encode(cmd)


class AclSide(Side):
    """A broker side with the ACL guard, and (``lane``) its plain-send check."""

    def __init__(self, base: Path, lane: bool, acl_file: Path) -> None:
        self.guard = acl_guard(acl_file, recheck_interval_s=0)
        super().__init__(base, True, guard=self.guard)
        self.admitted = 0
        if lane:
            def plain(send: Any, conn: Any) -> bool:
                ok = self.guard.plain(send, conn)
                self.admitted += ok
                return ok

            self.conn._dispatcher.plain_guard = plain  # type: ignore[union-attr]
            self.conn = Connection(self.conn._dispatcher, 1 << 20)  # type: ignore[arg-type]
            self.conn.connection_made(self.transport)


def acl_reads() -> list[bytes]:
    """Signed sends the lane admits, and what it must leave to the ordinary check."""
    make_t = signed(0, ak="admin-ak", sk="admin-secret-12")  # creates T (admin: any topic)
    make_u = signed(1, "U", ak="admin-ak", sk="admin-secret-12")
    good = [signed(i, binary=bool(i % 2), v1=i % 3 == 0) for i in range(2, 12)]
    refused = [
        signed(12, sk="not-the-secret-1"),  # a wrong signature
        signed(13, sign_body=b"another body"),  # signed over another body
        signed(14, ak="nobody-ak", sk="producer-secret-1"),  # no such account
        signed(15, "U"),  # SUB only on U
        signed(16, "TBW102"),  # the default: DENY
        send(17),  # unsigned
    ]
    near = signed(18, sk="near-secret-12", ak="near-ak")  # whiteRemoteAddress: no signature
    return [make_t, make_u, b"".join(good[:5])] + good[5:] + [b"".join(refused), near,
                                                               signed(19, "U", "admin-ak",
                                                                      "admin-secret-12"),
                                                               signed_batch(20),
                                                               signed_batch(21, "U")]


def signed_batch(i: int, topic: str = "T") -> bytes:
    """A SEND_BATCH_MESSAGE of three, signed as ``producer-ak`` (PUB on T, SUB on U)."""
    items = [BatchItem(b"sb%d-%d" % (i, k), {"UNIQ_KEY": f"SB{i}-{k}"}, 0) for k in range(3)]
    h = SendHeader("pg", topic, 1, 0, 1700000000000 + i, 0, "", 0, True)
    body = encode_batch(items)
    return encode(RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, opaque=1000 + i,
                                  ext_fields=sign(h.build(), body, "producer-ak",
                                                  "producer-secret-1"), body=body))


def test_signed_sends_are_checked_on_the_lane_as_the_guard_checks_them(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)

    async def script(sides: tuple[Side, ...]) -> None:
        for side in sides:
            random.seed(29)
            await feed(side, acl_reads())

    fast, slow = in_loop(lambda: (AclSide(tmp_path / "fast", True, acl),
                                  AclSide(tmp_path / "slow", False, acl)), script)
    # The same answers and records as the guard alone (today's path), byte for byte.
    assert fast.transport.out == slow.transport.out
    assert fast.records() == slow.records()
    got = {a.opaque - 1000: a for a in answers(fast)}
    assert all(got[i].code == ResponseCode.SUCCESS for i in (*range(12), 18, 19, 20))
    assert "no PUB permission for topic:U" in got[21].remark  # a batch, refused as a send
    for i in range(12, 18):
        assert got[i].code == ResponseCode.SYSTEM_ERROR, (i, got[i].remark)
    assert "check signature failed" in got[12].remark and "check signature" in got[13].remark
    assert "no ACL account" in got[14].remark and "no PUB permission for topic:U" in got[15].remark
    assert "no PUB default permission" in got[16].remark and "no AccessKey" in got[17].remark
    # The lane admitted the good ones and the white-address one, and no refused one (the
    # two that created their topics went on the ordinary way); without it every send went
    # to the guard.
    assert fast.admitted == 15 and fast.taken == 13 and slow.admitted == 0 and slow.taken == 0


def test_a_reloaded_acl_file_takes_effect_on_the_lane(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)

    async def script(sides: tuple[Side, ...]) -> None:
        (side,) = sides
        await feed(side, [signed(0, ak="admin-ak", sk="admin-secret-12"), signed(1), signed(2)])
        acl.write_text(ACL.replace("T=PUB", "T=SUB, V=PUB"))  # PUB on T revoked
        await feed(side, [signed(3)])
        acl.write_text(ACL.replace("producer-secret-1", "producer-secret-2"))  # T=PUB again
        await feed(side, [signed(4), signed(5, sk="producer-secret-2")])

    (side,) = in_loop(lambda: (AclSide(tmp_path, True, acl),), script)
    got = {a.opaque - 1000: a for a in answers(side)}
    assert got[1].code == got[2].code == ResponseCode.SUCCESS
    assert got[3].code == ResponseCode.SYSTEM_ERROR and "no PUB permission" in got[3].remark
    assert got[4].code == ResponseCode.SYSTEM_ERROR and "signature" in got[4].remark
    assert got[5].code == ResponseCode.SUCCESS
    # 0 (an admin's, creating T), 1, 2 and 5: the grants of the old file were not kept.
    assert side.admitted == 4


class _BracketLayer:
    """A frame layer that seals each frame in brackets (and decodes nothing)."""

    buffered = 0
    raw_answers: Any = ()

    def feed(self, data: bytes) -> list[Any]:
        return []

    def seal(self, frame: bytes) -> bytes:
        return b"[" + frame + b"]"


@pytest.mark.parametrize("layer", [False, True], ids=["plain", "sealed"])
def test_an_answer_chunk_is_sealed_frame_by_frame(layer: bool) -> None:
    """A run's answers come as one chunk; a frame layer still seals each frame alone."""
    frames = [encode(RemotingCommand(0, opaque=i, flag=1, ext_fields={"k": "v" * i}))
              for i in range(3)]

    async def main() -> bytes:
        conn = Connection(Dispatcher({}), 1 << 20)
        transport = RecordingTransport()
        conn.connection_made(transport)
        if layer:
            conn.use_layer(_BracketLayer())
        conn.answer_chunk(b"".join(frames), len(frames))
        for _ in range(3):
            await asyncio.sleep(0)
        return bytes(transport.out)

    out = asyncio.run(main())
    if layer:
        assert out == b"".join(b"[" + f + b"]" for f in frames)
    else:
        assert out == b"".join(frames)
