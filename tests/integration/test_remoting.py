"""RocketMQ remoting frames: codec, incremental decoding, server/client behaviour.

Every test runs on both event loops rmqha can run on (rmqha.net.loop): the connection
is a transport protocol, and uvloop's transports call it back in their own order."""
from __future__ import annotations

import asyncio
import json
import logging
import struct

import pytest
from needs import unavailable

from rmqha.net import loop as event_loop
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, RemoteCommandError, RemotingError, RemotingTimeoutError
from rmqha.net.blocking import BlockingRemotingClient
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity
from rmqha.net.connection import DISPATCH_BUDGET, Connection
from rmqha.net.dispatcher import Dispatcher
from rmqha.net.server import RemotingServer
from rmqha.protocol.command import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    decode,
    decode_frame,
    encode,
)


@pytest.fixture(autouse=True, params=[k.value for k in event_loop.LoopKind])
def loop_kind(request, monkeypatch):  # noqa: ANN001, ANN201
    if request.param == "uvloop" and event_loop._uvloop is None:
        unavailable("uvloop (a dependency on this platform) is not installed")
    monkeypatch.setenv(event_loop.ENV, request.param)
    return request.param


def test_encode_layout_matches_rocketmq():
    cmd = RemotingCommand(code=1005, opaque=7, remark="hi", ext_fields={"brokerName": "b"},
                          body=b'{"x":1}')
    data = encode(cmd)
    total, ori = struct.unpack_from(">ii", data)
    assert total == len(data) - 4
    assert ori >> 24 == 0  # JSON serialize type
    header_len = ori & 0xFFFFFF
    header = json.loads(data[8 : 8 + header_len])
    assert header == {"code": 1005, "language": "PYTHON", "version": cmd.version, "opaque": 7,
                      "flag": 0, "remark": "hi", "extFields": {"brokerName": "b"}}
    assert data[8 + header_len :] == b'{"x":1}'
    assert decode(data) == cmd


def test_request_and_response_helpers():
    req = RemotingCommand.request(RequestCode.ELECT_MASTER,
                                  {"brokerId": 3, "designateElect": True, "x": None},
                                  body={"a": [1, 2]})
    assert req.ext_fields == {"brokerId": "3", "designateElect": "true"}
    assert req.json_body() == {"a": [1, 2]}
    resp = req.response(ResponseCode.CONTROLLER_MASTER_STILL_EXIST, "still")
    assert resp.opaque == req.opaque and resp.is_response and not req.is_response
    with pytest.raises(RemoteCommandError) as info:
        resp.check_success(req.code)
    assert info.value.code == 2011 and "still" in str(info.value)
    one = RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, oneway=True)
    assert one.is_oneway and one.flag == FLAG_ONEWAY
    assert RequestCode(1002).name == "CONTROLLER_ELECT_MASTER"
    assert RequestCode.ELECT_MASTER is RequestCode.CONTROLLER_ELECT_MASTER


def test_decoder_accepts_any_chunking_and_numeric_ext_fields():
    # A C++ client sends some header values as JSON numbers: they arrive as strings.
    header = json.dumps({"code": 10, "language": "CPP", "version": 63, "opaque": 5, "flag": 0,
                         "remark": "", "extFields": {"queueId": 3, "topic": "t"}}).encode()
    frame = struct.pack(">ii", 4 + len(header) + 3, len(header)) + header + b"abc"
    cmds = [RemotingCommand.request(1000 + i, {"k": str(i)}, body=bytes(i)) for i in range(20)]
    stream = b"".join(encode(c) for c in cmds) + frame
    for step in (1, 3, 7, 64, len(stream)):
        dec = FrameDecoder()
        out = []
        for i in range(0, len(stream), step):
            out.extend(dec.feed(stream[i : i + step]))
        assert out[:20] == cmds
        assert out[20].ext_fields == {"queueId": "3", "topic": "t"} and out[20].body == b"abc"
        assert dec.buffered == 0


@pytest.mark.parametrize(
    "frame, reason",
    [
        (struct.pack(">i", 2) + b"xx", "outside"),
        (struct.pack(">i", 1 << 30), "outside"),
        (struct.pack(">ii", 8, 100) + b"abcd", "exceeds"),
        (struct.pack(">ii", 7, 3) + b"{x}", "not JSON"),
        (struct.pack(">ii", 6, 2) + b"[]", "not an object"),
        (struct.pack(">ii", 4 + 12, 12) + b'{"code":"a"}', "integer"),
        (struct.pack(">ii", 4 + 2, (2 << 24) | 2) + b"{}", "serialize type"),
        # RocketMQ's binary header (serialize type 1), cut short or lying about its lengths
        (struct.pack(">ii", 4 + 2, (1 << 24) | 2) + b"{}", "shorter than its fixed part"),
        (struct.pack(">ii", 4 + 21, (1 << 24) | 21) + struct.pack(">hbhiiii", 10, 3, 0, 1, 0, 99, 0),
         "remark of 99 bytes exceeds"),
        (struct.pack(">ii", 4 + 21, (1 << 24) | 21) + struct.pack(">hbhiiii", 10, 3, 0, 1, 0, 0, 50),
         "extFields of 50 bytes exceed"),
        (struct.pack(">ii", 4 + 25, (1 << 24) | 25)
         + struct.pack(">hbhiiiih", 10, 3, 0, 1, 0, 0, 4, 9) + b"ab", "key of 9 bytes exceeds"),
        (struct.pack(">ii", 4 + 22, (1 << 24) | 22)
         + struct.pack(">hbhiii", 10, 3, 0, 1, 0, 1) + b"\xff" + struct.pack(">i", 0), "not UTF-8"),
    ],
)
def test_decoder_rejects_malformed(frame, reason):
    with pytest.raises(ProtocolError, match=reason):
        FrameDecoder(max_frame_bytes=1 << 20).feed(frame)


async def _echo(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, "echo", {"got": cmd.ext_fields.get("v", "")},
                        cmd.body)


def test_server_client_roundtrip_unknown_code_and_oneway():
    async def main() -> None:
        oneways: list[RemotingCommand] = []
        got_oneway = asyncio.Event()

        async def oneway_handler(cmd: RemotingCommand, conn: Connection) -> None:
            oneways.append(cmd)
            got_oneway.set()
            return None

        async def slow(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            await asyncio.sleep(0.3)
            return cmd.response()

        server = RemotingServer("127.0.0.1", 0, {1: _echo, 904: oneway_handler, 2: slow})
        async with server:
            async with RemotingClient(server.address) as client:
                resp = await client.request(RemotingCommand.request(1, {"v": "x"}, b"pay"), 2)
                assert (resp.code, resp.remark, resp.ext_fields, resp.body) == (
                    0, "echo", {"got": "x"}, b"pay")
                # Unknown code: RocketMQ's answer, connection kept.
                resp = await client.request(RemotingCommand.request(4242), 2)
                assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
                assert "4242" in resp.remark
                assert client.connected
                # Replies come as they are ready: a slow request does not block a fast one.
                slow_task = asyncio.ensure_future(client.request(RemotingCommand.request(2), 2))
                fast = await client.request(RemotingCommand.request(1, {"v": "f"}), 2)
                assert fast.ext_fields == {"got": "f"} and not slow_task.done()
                assert (await slow_task).code == 0
                await client.oneway(RemotingCommand.request(904, {"brokerId": "1"}))
                await asyncio.wait_for(got_oneway.wait(), 2)
                assert oneways[0].ext_fields == {"brokerId": "1"}
                with pytest.raises(RemotingTimeoutError):
                    await client.request(RemotingCommand.request(2), 0.05)

    event_loop.run(main())


def test_immediate_handlers_answer_now_later_or_leave_it_to_the_task():
    """A code's immediate handler runs in the turn that decoded the request: it answers at
    once, from a later callback (answers of one turn leave in one write), or declines and
    the ordinary handler's task answers; a failing one answers SYSTEM_ERROR."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        later: list[tuple[Connection, RemotingCommand]] = []
        tasks_seen: list[int] = []

        def now(cmd: RemotingCommand, conn: Connection) -> bool:
            mode = cmd.ext_fields.get("mode")
            if mode == "now":
                assert conn.in_flight == 1
                conn.answer(cmd, cmd.response(remark="now"))
                return True
            if mode == "later":
                later.append((conn, cmd))
                if len(later) == 3:  # all three answered from one callback
                    def answer_all() -> None:
                        for c, r in later:
                            c.answer(r, r.response(remark="later " + r.ext_fields["i"]))
                    loop.call_soon(answer_all)
                return True
            if mode == "boom":
                raise ValueError("bad handler")
            return False

        async def task_handler(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            tasks_seen.append(cmd.opaque)
            return cmd.response(remark="task")

        server = RemotingServer("127.0.0.1", 0, {7: task_handler})
        server.register_immediate(7, now)
        async with server:
            async with RemotingClient(server.address) as client:
                resp = await client.request(RemotingCommand.request(7, {"mode": "now"}), 2)
                assert (resp.code, resp.remark) == (0, "now") and not tasks_seen
                resps = await asyncio.gather(*(
                    client.request(RemotingCommand.request(7, {"mode": "later", "i": str(i)}), 2)
                    for i in range(3)))
                assert [r.remark for r in resps] == ["later 0", "later 1", "later 2"]
                resp = await client.request(RemotingCommand.request(7, {"mode": "task"}), 2)
                assert resp.remark == "task" and len(tasks_seen) == 1
                resp = await client.request(RemotingCommand.request(7, {"mode": "boom"}), 2)
                assert resp.code == ResponseCode.SYSTEM_ERROR and "bad handler" in resp.remark
                # The connection counts nothing in flight once all are answered.
                assert [c.in_flight for c in server.connections] == [0]
    event_loop.run(main())


class _StubTransport:
    """A transport that records what the connection does with it."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.paused: list[bool] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_extra_info(self, name: str) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def pause_reading(self) -> None:
        self.paused.append(True)

    def resume_reading(self) -> None:
        self.paused.append(False)

    def close(self) -> None:
        pass


def _recording_connection(seen: list[str], ask_at: tuple[str, ...]) -> tuple[Connection, _StubTransport]:
    """A connection whose immediate handler notes each command's "i", and after the
    ones in ``ask_at`` asks for an "end" note once the dispatch is over."""
    dispatcher = Dispatcher()

    def now(cmd: RemotingCommand, conn: Connection) -> bool:
        seen.append(cmd.ext_fields["i"])
        if cmd.ext_fields["i"] in ask_at:
            conn.at_end_of_dispatch(lambda: seen.append("end"))
        return True

    dispatcher.register_immediate(7, now)
    conn = Connection(dispatcher, 1 << 20)
    transport = _StubTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def test_end_of_dispatch_callbacks_run_once_the_reads_commands_are_dispatched():
    """What an immediate handler asks for with at_end_of_dispatch runs after every command of
    that read (the sends of one read share one wait for replicas), once per read; outside a
    dispatch it runs at once."""
    async def main() -> None:
        seen: list[str] = []
        conn, _ = _recording_connection(seen, ("0", "3"))  # the first of each read asks
        frames = [encode(RemotingCommand.request(7, {"i": str(i)})) for i in range(5)]
        conn.data_received(b"".join(frames[:3]))
        assert seen == ["0", "1", "2", "end"]
        # A read that ends inside a frame dispatches what is whole; the rest comes later.
        conn.data_received(frames[3] + frames[4][:5])
        assert seen[4:] == ["3", "end"]
        conn.data_received(frames[4][5:])
        assert seen[6:] == ["4"]
        ran: list[int] = []
        conn.at_end_of_dispatch(lambda: ran.append(1))
        assert ran == [1]
    event_loop.run(main())


def test_a_long_read_is_dispatched_a_budget_per_loop_turn():
    """A read of more than DISPATCH_BUDGET commands is dispatched that many per loop turn,
    in order, each part with its own end-of-dispatch callbacks; reading pauses until the
    backlog is gone, and what arrives meanwhile queues behind it."""
    async def main() -> None:
        budget = DISPATCH_BUDGET
        n = 2 * budget + 5
        seen: list[str] = []
        starts = tuple(str(i) for i in range(0, n + 1, budget))
        conn, transport = _recording_connection(seen, starts)
        frames = [encode(RemotingCommand.request(7, {"i": str(i)})) for i in range(n + 1)]
        conn.data_received(b"".join(frames[:n]))
        assert seen == [str(i) for i in range(budget)] + ["end"]
        assert transport.paused == [True]
        conn.data_received(frames[n])  # a later read waits behind the backlog
        assert len(seen) == budget + 1
        await asyncio.sleep(0)
        assert seen[budget + 1:] == [str(i) for i in range(budget, 2 * budget)] + ["end"]
        await asyncio.sleep(0)
        assert seen[2 * budget + 2:] == [str(i) for i in range(2 * budget, n + 1)] + ["end"]
        assert transport.paused == [True, False]
        await asyncio.sleep(0)
        assert len(seen) == n + 4  # nothing dispatched twice
    event_loop.run(main())


def test_handler_errors_become_responses():
    async def boom(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        raise RuntimeError("kaboom")

    async def refuse(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        raise RemoteCommandError(ResponseCode.NO_PERMISSION, "token needed")

    async def main() -> None:
        async with RemotingServer("127.0.0.1", 0, {1: boom, 2: refuse}) as server:
            async with RemotingClient(server.address) as client:
                r1 = await client.request(RemotingCommand.request(1), 2)
                assert r1.code == ResponseCode.SYSTEM_ERROR and "kaboom" in r1.remark
                r2 = await client.request(RemotingCommand.request(2), 2)
                assert (r2.code, r2.remark) == (16, "token needed")

    event_loop.run(main())


def test_malformed_frame_closes_only_that_connection(caplog):
    async def main() -> None:
        async with RemotingServer("127.0.0.1", 0, {1: _echo}, max_frame_bytes=4096) as server:
            async with RemotingClient(server.address) as good:
                assert (await good.request(RemotingCommand.request(1), 2)).code == 0
                for bad in (struct.pack(">i", 1 << 20) + b"x" * 16,  # over the frame limit
                            struct.pack(">ii", 9, 5) + b"{nope"):  # header not JSON
                    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                    writer.write(bad)
                    await writer.drain()
                    assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by server
                    writer.close()
                # The other connection is untouched.
                assert (await good.request(RemotingCommand.request(1, {"v": "y"}), 2)).ext_fields == {"got": "y"}

    with caplog.at_level(logging.WARNING, logger="rmqha.net.connection"):
        event_loop.run(main())
    reasons = [r.getMessage() for r in caplog.records if "malformed frame" in r.getMessage()]
    assert any("outside" in m for m in reasons) and any("not JSON" in m for m in reasons)


def test_server_initiated_request_and_close_callback():
    async def main() -> None:
        conns: list[Connection] = []
        closed = asyncio.Event()

        async def hello(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            conns.append(conn)
            conn.add_close_callback(lambda c: closed.set())
            return cmd.response()

        async def client_side(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            return cmd.response(ResponseCode.SUCCESS, "client answered",
                                {"role": cmd.ext_fields["masterEpoch"]})

        async with RemotingServer("127.0.0.1", 0, {1: hello}) as server:
            client = RemotingClient(server.address, handler={1008: client_side})
            await client.request(RemotingCommand.request(1), 2)
            resp = await conns[0].request(
                RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, {"masterEpoch": 4}), 2)
            assert (resp.remark, resp.ext_fields) == ("client answered", {"role": "4"})
            await client.close()
            await asyncio.wait_for(closed.wait(), 2)
            assert conns[0].closed
            # The client reconnects on the next request.
            assert (await client.request(RemotingCommand.request(1), 2)).code == 0
            await client.close()

    event_loop.run(main())


def test_client_errors_when_nothing_listens(port_factory):
    async def main() -> None:
        client = RemotingClient(f"127.0.0.1:{port_factory()}", connect_timeout=1)
        with pytest.raises(RemotingError, match="cannot connect"):
            await client.request(RemotingCommand.request(1), 1)

    event_loop.run(main())


def test_blocking_client():
    from rmqha.net.loop import EventLoopThread

    loop = EventLoopThread("test-server")
    server = RemotingServer("127.0.0.1", 0, {1: _echo})
    try:
        loop.run(server.start(), 5)
        with BlockingRemotingClient(server.address) as client:
            resp = client.request(RemotingCommand.request(1, {"v": "blocking"}), 2)
            assert resp.ext_fields == {"got": "blocking"} and resp.flag & FLAG_RESPONSE
            client.oneway(RemotingCommand.request(1))
    finally:
        loop.run(server.stop(), 5)
        loop.stop()


def test_a_peer_stalled_inside_a_frame_is_dropped_but_an_idle_one_is_not(caplog):
    """A frame started and never finished holds a buffer: the server drops that peer after
    ``frame_read_timeout``; a peer idle between frames keeps its connection."""
    async def main() -> None:
        async with RemotingServer("127.0.0.1", 0, {1: _echo}, frame_read_timeout=0.3) as server:
            async with RemotingClient(server.address) as idle:
                assert (await idle.request(RemotingCommand.request(1), 2)).code == 0
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(struct.pack(">ii", 200, 20) + b'{"code":')  # 16 of 204 bytes
                await writer.drain()
                started = asyncio.get_running_loop().time()
                assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
                assert asyncio.get_running_loop().time() - started >= 0.25
                writer.close()
                # The idle connection saw far more than the timeout pass between frames.
                assert idle.connected
                assert (await idle.request(RemotingCommand.request(1, {"v": "z"}), 2)).ext_fields == {"got": "z"}

    with caplog.at_level(logging.WARNING, logger="rmqha.net.connection"):
        event_loop.run(main())
    assert any("stalled inside a frame: 16 bytes" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


# --- RocketMQ's binary header (serialize type 1) ------------------------------------------


def _binary_frame(code: int, opaque: int, ext: dict[str, str], body: bytes = b"") -> bytes:
    """A request laid out by hand as RocketMQSerializable writes it (independent of encode)."""
    entries = b"".join(struct.pack(">h", len(k)) + k.encode() + struct.pack(">i", len(v)) + v.encode()
                       for k, v in ext.items())
    header = struct.pack(">hbhiii", code, 0, 475, opaque, 0, 0) + struct.pack(">i", len(entries)) + entries
    return struct.pack(">ii", 4 + len(header) + len(body), (1 << 24) | len(header)) + header + body


def test_binary_header_roundtrip_and_layout():
    cmd = RemotingCommand(code=310, language="JAVA", version=475, opaque=9, flag=0, remark="r\u00e9",
                          ext_fields={"topic": "T", "queueId": "3"}, body=b"xyz",
                          serialize_type=1)
    data = encode(cmd)
    assert struct.unpack_from(">i", data, 4)[0] >> 24 == 1
    assert decode(data) == cmd
    # Byte for byte what RocketMQSerializable writes for the same command.
    remark = "r\u00e9".encode()
    entries = (struct.pack(">h", 5) + b"topic" + struct.pack(">i", 1) + b"T"
               + struct.pack(">h", 7) + b"queueId" + struct.pack(">i", 1) + b"3")
    header = (struct.pack(">hbhii", 310, 0, 475, 9, 0) + struct.pack(">i", len(remark)) + remark
              + struct.pack(">i", len(entries)) + entries)
    assert data == struct.pack(">ii", 4 + len(header) + 3, (1 << 24) | len(header)) + header + b"xyz"
    # Empty values read back as absent, as Java reads them as null.
    assert decode(_binary_frame(1, 1, {"a": "", "b": "x"})).ext_fields == {"b": "x"}


def test_binary_request_to_a_real_name_server_is_answered_in_binary(tmp_path):
    """A client speaking RocketMQ's binary header (rocketmq.serialize.type=ROCKETMQ) asks a
    real name server process for a route over a plain socket and gets a binary answer."""
    import socket
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cluster import Cluster

    with Cluster(tmp_path) as c:
        ns = c.start_namesrv()
        host, _, port = ns.address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(_binary_frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 77, {"topic": "NoSuchTopic"}))
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
                chunk = s.recv(65536)
                assert chunk, "connection closed before a full response"
                buf += chunk
    assert struct.unpack_from(">i", buf, 4)[0] >> 24 == 1, "answer not in the binary header"
    resp = decode(buf)
    assert resp.serialize_type == 1
    assert resp.opaque == 77 and resp.flag & FLAG_RESPONSE
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in (resp.remark or "")


def test_a_bytes_header_field_is_refused_not_sent_as_its_repr() -> None:
    """str(b"x") is "b'x'": a header built from encoded bytes would carry that text."""
    with pytest.raises(ProtocolError, match="bytes; decode it to str first"):
        RemotingCommand.request(RequestCode.SEND_MESSAGE, {"properties": b"TAGS\x01a\x02"})
    ok = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"properties": "TAGS\x01a\x02"})
    assert ok.ext_fields["properties"] == "TAGS\x01a\x02"


def test_request_frame_gets_its_answer_undecoded_and_fails_as_request_does(caplog):
    """A request sent encoded (request_frame) gets its response's frame back as it came;
    a request made the ordinary way beside it still gets a command.  An answer with
    another opaque is dropped and the request times out; a late answer is dropped; a
    close fails what waits (negative controls: what request() does today)."""
    async def main() -> None:
        async def slow(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            await asyncio.sleep(0.3)
            return cmd.response(ResponseCode.SUCCESS, "late")

        def stray(cmd: RemotingCommand, conn: Connection) -> bool:
            wrong = cmd.response(ResponseCode.SUCCESS, "stray")
            wrong.opaque = cmd.opaque + 1000
            conn.answer_frame(encode(wrong))
            return True

        async with RemotingServer("127.0.0.1", 0, {1: _echo, 2: slow}) as server:
            server.register_immediate(3, stray)
            async with RemotingClient(server.address) as client:
                req = RemotingCommand.request(1, {"v": "x"}, b"pay" * 1000)
                plain = RemotingCommand.request(1, {"v": "y"})
                raw, resp = await asyncio.gather(
                    client.request_frame(encode(req), req.opaque, 2), client.request(plain, 2))
                want = req.response(ResponseCode.SUCCESS, "echo", {"got": "x"}, req.body)
                assert raw == encode(want)[4:] and type(raw) is bytes
                assert (resp.opaque, resp.ext_fields) == (plain.opaque, {"got": "y"})
                with caplog.at_level(logging.DEBUG, logger="rmqha.net.connection"):
                    req = RemotingCommand.request(3)
                    with pytest.raises(RemotingTimeoutError, match=f"opaque {req.opaque}"):
                        await client.request_frame(encode(req), req.opaque, 0.2)
                    req = RemotingCommand.request(2)
                    with pytest.raises(RemotingTimeoutError):
                        await client.request_frame(encode(req), req.opaque, 0.05)
                    await asyncio.sleep(0.4)  # the late answer arrives, and is dropped
                assert "unknown opaque" in caplog.text
                conn = await client.connection()
                assert not conn.closed and not conn._raw and not conn._deadlines
                req = RemotingCommand.request(1, {"v": "z"})
                got = decode_frame(await client.request_frame(encode(req), req.opaque, 2))
                assert (got.opaque, got.ext_fields) == (req.opaque, {"got": "z"})
                req = RemotingCommand.request(2)
                waiting = asyncio.ensure_future(client.request_frame(encode(req), req.opaque, 5))
                await asyncio.sleep(0.05)
                await conn.close("closed by the test")
                with pytest.raises(RemotingError, match="closed by the test"):
                    await waiting

    event_loop.run(main())


def test_request_frame_refuses_when_a_hook_must_sign() -> None:
    async def main() -> None:
        client = RemotingClient("127.0.0.1:1", security=ClientSecurity(rpc_hook=lambda cmd: None))
        with pytest.raises(ValueError, match="signed"):
            await client.request_frame(b"", 1, 1)

    event_loop.run(main())
