"""Sends that arrive in one read wait for their replicas as one group.

The broker's immediate send handler stores each send of a read as it is decoded, then
waits once, for the end of the last, and answers them all.  These tests drive the real
SendPath (MessageService on a real CommitLog) through a connection stand-in whose reads
are explicit, with a scripted replication standing in for the HA master's acks, and then
a real broker over a real socket with a whole pipeline of sends written at once.
"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rmqha.net import loop as event_loop
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.messaging.context import MessagingConfig
from rmqha.messaging.service import MessageService
from rmqha.protocol.command import FrameDecoder, RemotingCommand, encode
from rmqha.store import CommitLog
from test_messaging import Env


class ScriptedReplication:
    """The Replication protocol with acks the test hands out (``acked``)."""

    def __init__(self) -> None:
        self.acked = 0
        self.waits: list[tuple[int, Callable[[bool], None]]] = []
        self.pushes = 0
        #: defer_push calls not yet ended by a push_now (must be 0 after every read).
        self.deferred = 0

    def sync_state_set_size(self) -> int:
        return 3

    def push_now(self) -> None:
        self.pushes += 1
        self.deferred = 0

    def defer_push(self) -> None:
        self.deferred += 1

    async def wait_for_copies(self, end_offset: int, timeout_s: float) -> bool:
        return end_offset <= self.acked

    def when_copies(self, end_offset: int, timeout_s: float,
                    done: Callable[[bool], None]) -> None:
        self.waits.append((end_offset, done))

    def copies_held(self, end_offset: int) -> bool:
        return end_offset <= self.acked

    def acknowledged(self) -> None:
        return None

    def confirm_offset(self) -> int:
        return self.acked

    def copies_of(self, offset: int) -> int:
        return 3 if offset <= self.acked else 1

    def holds_master_lease(self) -> bool:
        return True

    def awaiting_first_lease(self) -> bool:
        return False

    async def wait_for_first_lease(self) -> None:
        return None


class ReadConn:
    """A connection stand-in whose reads the test opens and closes."""

    peer = "127.0.0.1:4000"
    in_flight = 2

    def __init__(self) -> None:
        self.answers: list[tuple[RemotingCommand, RemotingCommand]] = []
        #: What a handler raised (the real connection answers SYSTEM_ERROR for it).
        self.errors: list[Exception] = []
        self._end: list[Callable[[], None]] | None = None

    def read(self, handler: Callable[[RemotingCommand, Any], bool],
             cmds: list[RemotingCommand]) -> None:
        self._end = []
        try:
            for cmd in cmds:
                try:
                    assert handler(cmd, self)
                except RuntimeError as exc:
                    self.errors.append(exc)
        finally:
            callbacks, self._end = self._end, None
            for cb in callbacks:
                cb()

    def at_end_of_dispatch(self, cb: Callable[[], None]) -> None:
        if self._end is None:
            cb()
        else:
            self._end.append(cb)

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        self.answers.append((request, response))


def _send(topic: str, body: bytes, queue_id: int = 0) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": topic, "queueId": str(queue_id), "sysFlag": "0",
        "bornTimestamp": "1700000000000", "flag": "0", "properties": "",
        "reconsumeTimes": "0"}, body)


@pytest.fixture
def service(tmp_path: Path):
    log = CommitLog(tmp_path / "cl", segment_bytes=1 << 20, prefault=False)
    repl = ScriptedReplication()
    svc = MessageService(log, store_dir=tmp_path, config=MessagingConfig(), broker_name="b",
                         broker_id=0, replication=repl)
    svc.set_role("master")
    try:
        yield svc, repl
    finally:
        svc.close()
        log.close()


def _status(resp: RemotingCommand) -> str:
    return resp.ext_fields["putStatus"]


def test_one_read_waits_once_for_its_last_send(service) -> None:
    svc, repl = service

    async def main() -> None:
        handler = svc.immediate_handlers()[RequestCode.SEND_MESSAGE]
        conn = ReadConn()
        # Two topics in one read (one created on first use), three queues.
        cmds = [_send("A", b"a0", 0), _send("B", b"b0", 1), _send("A", b"a1", 2)]
        conn.read(handler, cmds)
        assert repl.pushes >= 1
        assert len(repl.waits) == 1 and not conn.answers
        end, done = repl.waits[0]
        assert end == svc.log.max_offset  # the end of the read's last send
        repl.acked = end
        done(True)
        assert [req.opaque for req, _ in conn.answers] == [c.opaque for c in cmds]
        assert [_status(r) for _, r in conn.answers] == ["PUT_OK"] * 3
        offsets = [int(r.ext_fields["commitLogOffset"]) for _, r in conn.answers]
        assert offsets == sorted(offsets) and len(set(offsets)) == 3
        assert [r.ext_fields["queueId"] for _, r in conn.answers] == ["0", "1", "2"]
        # The next read is a group of its own.
        conn.read(handler, [_send("A", b"a2", 0)])
        assert len(repl.waits) == 2 and repl.waits[1][0] == svc.log.max_offset

    event_loop.run(main())


def test_a_group_that_falls_short_answers_each_send_by_its_own_copies(service) -> None:
    """The wait for the group's end timed out: a send of the group the replicas do hold
    is answered PUT_OK, the rest FLUSH_SLAVE_TIMEOUT, never the other way round."""
    svc, repl = service

    async def main() -> None:
        handler = svc.immediate_handlers()[RequestCode.SEND_MESSAGE]
        conn = ReadConn()
        conn.read(handler, [_send("A", bytes([i]) * 100) for i in range(3)])
        assert len(conn.answers) == 0 and len(repl.waits) == 1
        # The replicas hold the first send only.
        first = next(m for m in svc.log.iter_messages() if m.topic == "A")
        repl.acked = first.physical_offset + first.size
        repl.waits[0][1](False)
        statuses = [_status(r) for _, r in conn.answers]
        assert statuses == ["PUT_OK", "FLUSH_SLAVE_TIMEOUT", "FLUSH_SLAVE_TIMEOUT"]
        codes = [r.code for _, r in conn.answers]
        assert codes[0] == ResponseCode.SUCCESS and ResponseCode.SUCCESS not in codes[1:]

    event_loop.run(main())


def test_a_refused_send_in_a_read_does_not_hold_the_others(service) -> None:
    svc, repl = service

    async def main() -> None:
        handler = svc.immediate_handlers()[RequestCode.SEND_MESSAGE]
        conn = ReadConn()
        cmds = [_send("A", b"ok"), _send("bad topic!", b"no"), _send("A", b"ok2")]
        conn.read(handler, cmds)
        # The refusal is answered at once; the two stored sends wait as one.
        assert [req.opaque for req, _ in conn.answers] == [cmds[1].opaque]
        assert conn.answers[0][1].code == ResponseCode.MESSAGE_ILLEGAL
        assert "bad topic!" in (conn.answers[0][1].remark or "")
        assert len(repl.waits) == 1
        repl.acked = repl.waits[0][0]
        repl.waits[0][1](True)
        assert [req.opaque for req, _ in conn.answers[1:]] == [cmds[0].opaque, cmds[2].opaque]

    event_loop.run(main())


def test_every_deferred_push_is_ended_by_a_push_in_the_same_read(service) -> None:
    """A group defers the HA wake of its appends (defer_push) and pushes at its close:
    also a group whose only send was refused, or the appends of later turns would wait
    for a wake nobody queued."""
    svc, repl = service

    async def main() -> None:
        handler = svc.immediate_handlers()[RequestCode.SEND_MESSAGE]
        conn = ReadConn()
        conn.read(handler, [_send("A", b"ok")])
        assert repl.deferred == 0 and repl.pushes == 1
        conn.read(handler, [_send("bad topic!", b"no")])
        assert conn.answers[-1][1].code == ResponseCode.MESSAGE_ILLEGAL
        assert repl.deferred == 0 and repl.pushes == 2
        # Negative control: a group still open holds its deferral.
        opened = svc._send._open_group(conn)
        assert opened is not None and repl.deferred == 1
        svc._send._close_group(opened)
        assert repl.deferred == 0

    event_loop.run(main())


def test_a_pipeline_written_at_once_is_answered_send_by_send(tmp_path: Path) -> None:
    """A real broker and a raw socket: 200 sends in one write, read in however many reads
    the kernel makes of it, each answered once with its own consecutive queue offset."""
    n = 200

    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            host, port = b.address.rsplit(":", 1)
            cmds = [_send("piped", b"%05d" % i + b"x" * 1000) for i in range(n)]
            loop = asyncio.get_running_loop()
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.setblocking(False)
                await loop.sock_sendall(sock, b"".join(encode(c) for c in cmds))
                decoder = FrameDecoder()
                got: list[RemotingCommand] = []
                while len(got) < n:
                    data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
                    assert data, "the broker closed the connection"
                    got += decoder.feed(data)
            by_opaque = {r.opaque: r for r in got}
            assert len(by_opaque) == n
            assert all(by_opaque[c.opaque].code == ResponseCode.SUCCESS for c in cmds)
            queue_offsets = [int(by_opaque[c.opaque].ext_fields["queueOffset"]) for c in cmds]
            assert queue_offsets == list(range(n))

    event_loop.run(main())


def test_a_send_that_fails_unexpectedly_leaves_no_group_open(service, monkeypatch) -> None:
    """A handler bug in the first send of a dispatch (the connection answers it
    SYSTEM_ERROR) must not leave its group open: the connection's next sends would join
    a group nobody waits for and never be answered."""
    svc, repl = service
    send_path = svc._send
    real_store = send_path._store

    def store(send: Any, conn: Any, grouped: bool = False) -> Any:
        if send.rows and send.rows[0][0] == b"boom":
            raise RuntimeError("a bug")
        return real_store(send, conn, grouped)

    monkeypatch.setattr(send_path, "_store", store)

    async def main() -> None:
        handler = svc.immediate_handlers()[RequestCode.SEND_MESSAGE]
        conn = ReadConn()
        conn.read(handler, [_send("A", b"boom")])
        assert [str(e) for e in conn.errors] == ["a bug"] and not repl.waits
        conn.read(handler, [_send("A", b"fine")])
        assert len(repl.waits) == 1
        repl.acked = repl.waits[0][0]
        repl.waits[0][1](True)
        assert [_status(r) for _, r in conn.answers] == ["PUT_OK"]

    event_loop.run(main())
