"""BlockingLink against a scripted remoting server (tests/support/fake_remoting.py): answers are
matched by opaque, stray frames are skipped (a request that wants an answer gets
REQUEST_CODE_NOT_SUPPORTED), and a silent, closing or malformed peer ends the request with
the project's errors within its deadline, closing the socket."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from fake_remoting import FakeConn, FakeServer
from rmqha.client.blocking_link import BlockingLink
from rmqha.client.producer import Producer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, RemotingError, RemotingTimeoutError
from rmqha.testing.local_cluster import free_port
from rmqha.protocol.command import FLAG_ONEWAY, SERIALIZE_ROCKETMQ, RemotingCommand, encode


def echo(conn: FakeConn) -> None:
    """Answer every request SUCCESS with its body and the peer's port in a header field."""
    while (cmd := conn.read()) is not None:
        port = str(conn.sock.getpeername()[1])
        conn.write(encode(cmd.response(ResponseCode.SUCCESS, None, {"port": port}, cmd.body)))


def request(body: bytes = b"ping") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T"}, body)


def test_round_trips_reuse_one_nodelay_connection() -> None:
    with FakeServer(echo) as server, BlockingLink(server.address) as link:
        first = link.request(request(b"one"), 5.0)
        second = link.request(request(b"two"), 5.0)
        assert (first.body, second.body) == (b"one", b"two")
        assert first.is_response and first.code == ResponseCode.SUCCESS
        assert first.ext_fields["port"] == second.ext_fields["port"]
        assert server.connections == 1
        assert link._sock is not None
        assert link._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        # A big request and a big answer cross several sends and recvs.
        big = bytes(range(256)) * 12_000  # 3 MiB
        assert link.request(request(big), 20.0).body == big


def test_binary_header_answers_are_decoded() -> None:
    def binary(conn: FakeConn) -> None:
        while (cmd := conn.read()) is not None:
            resp = cmd.response(ResponseCode.SUCCESS, "ok", {"queueOffset": "7"})
            resp.serialize_type = SERIALIZE_ROCKETMQ
            conn.write(encode(resp))

    with FakeServer(binary) as server, BlockingLink(server.address) as link:
        resp = link.request(request(), 5.0)
        assert (resp.remark, resp.ext_fields) == ("ok", {"queueOffset": "7"})


def test_stray_frames_are_skipped_and_requests_answered_not_supported() -> None:
    answers: list[RemotingCommand] = []

    def chatty(conn: FakeConn) -> None:
        cmd = conn.read()
        assert cmd is not None
        stale = cmd.response(ResponseCode.SUCCESS, "stale")
        stale.opaque = cmd.opaque + 1000  # the answer to some earlier request
        asks = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"x": "1"})
        tells = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {},
                                        oneway=True)
        assert tells.flag & FLAG_ONEWAY
        # All in one write, the real answer split over two more.
        conn.write(encode(stale) + encode(asks) + encode(tells))
        real = encode(cmd.response(ResponseCode.SUCCESS, "real"))
        conn.write(real[:7])
        conn.write(real[7:])
        answer = conn.read()  # the link answers the request that wanted an answer
        assert answer is not None
        answers.append(answer)
        assert answer.opaque == asks.opaque
        echo(conn)

    with FakeServer(chatty) as server, BlockingLink(server.address) as link:
        assert link.request(request(), 5.0).remark == "real"
        assert link.request(request(b"next"), 5.0).body == b"next"  # the link stays usable
        assert server.connections == 1
    assert answers[0].is_response
    assert answers[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert not server.errors


def test_silent_peer_times_out_within_the_deadline_and_the_link_reconnects() -> None:
    answered = threading.Event()

    def silent_once(conn: FakeConn) -> None:
        if not answered.is_set():
            answered.set()
            while conn.read() is not None:
                pass  # reads, never answers
            return
        echo(conn)

    with FakeServer(silent_once) as server, BlockingLink(server.address) as link:
        started = time.monotonic()
        with pytest.raises(RemotingTimeoutError, match="within 0.300s"):
            link.request(request(), 0.3)
        took = time.monotonic() - started
        assert 0.25 <= took < 5.0, took
        assert not link.connected  # a late answer must not meet the next request
        assert link.request(request(b"again"), 5.0).body == b"again"
        assert server.connections == 2


@pytest.mark.parametrize("frame, message", [
    (struct.pack(">i", 0x7FFFFFF0), "frame length 2147483632 outside"),
    (struct.pack(">i", 2), "frame length 2 outside"),
    (struct.pack(">ii", 12, (7 << 24) | 8) + b"{}{}{}{}", "serialize type 7 not supported"),
    (struct.pack(">ii", 12, 8) + b"not json", "header is not JSON"),
])
def test_malformed_answers_close_the_link_with_a_protocol_error(frame: bytes,
                                                                message: str) -> None:
    def bad(conn: FakeConn) -> None:
        if conn.read() is not None:
            conn.write(frame)
            conn.read()  # hold the connection open: the client must not wait for more

    with FakeServer(bad) as server, BlockingLink(server.address) as link:
        started = time.monotonic()
        with pytest.raises(ProtocolError, match=message) as exc:
            link.request(request(), 10.0)
        assert time.monotonic() - started < 5.0
        assert server.address in str(exc.value)
        assert not link.connected


def test_peer_that_closes_or_is_not_there_is_a_remoting_error() -> None:
    def hang_up(conn: FakeConn) -> None:
        conn.read()
        conn.sock.close()

    with FakeServer(hang_up) as server, BlockingLink(server.address) as link:
        with pytest.raises(RemotingError, match="closed by the peer"):
            link.request(request(), 5.0)
        assert not link.connected
    with BlockingLink(f"127.0.0.1:{free_port()}") as nobody:
        with pytest.raises(RemotingError, match="cannot connect"):
            nobody.request(request(), 5.0)


def test_one_way_and_response_commands_are_refused() -> None:
    link = BlockingLink("127.0.0.1:1")
    with pytest.raises(ValueError):
        link.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, oneway=True), 1.0)
    assert not link.connected


def sent_frame(opaque: int) -> bytes:
    """A plain send's frame as the blocking producer sends it (the send codec's)."""
    req = Producer("127.0.0.1:9", "g").sender.requests.single("T", b"body", None)  # no I/O
    return req.frame(opaque, 1)


def test_send_reads_answers_with_the_codec_and_skips_strays() -> None:
    """BlockingLink.send: the encoded request reaches the peer as the command it encodes;
    the answer comes back as the codec's fields, past stray frames and split reads, and a
    binary-header answer (which the codec leaves alone) gives the same fields."""
    seen: list[RemotingCommand] = []

    def chatty(conn: FakeConn) -> None:
        cmd = conn.read()
        assert cmd is not None
        seen.append(cmd)
        stale = cmd.response(ResponseCode.SUCCESS, "stale", {"queueOffset": "1"})
        stale.opaque = cmd.opaque + 1000
        asks = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"x": "1"})
        conn.write(encode(stale) + encode(asks))
        real = encode(cmd.response(ResponseCode.SUCCESS, None, {
            "msgId": "M", "queueId": "1", "queueOffset": "42", "putStatus": "PUT_OK"}))
        conn.write(real[:7])
        conn.write(real[7:])
        answer = conn.read()
        assert answer is not None and answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        while (cmd := conn.read()) is not None:  # then binary-header answers
            resp = cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE, "slow", {"queueOffset": "7"})
            resp.serialize_type = SERIALIZE_ROCKETMQ
            conn.write(encode(resp))

    with FakeServer(chatty) as server, BlockingLink(server.address) as link:
        assert not link.signs
        assert link.send(sent_frame(11), 11, 5.0) == (
            ResponseCode.SUCCESS, 11, 1, None, "M", "1", "42", "PUT_OK", None)
        assert link.send(sent_frame(12), 12, 5.0) == (
            ResponseCode.SLAVE_NOT_AVAILABLE, 12, 1, "slow", None, None, "7", None, None)
        assert server.connections == 1 and not server.errors
    assert seen[0].code == RequestCode.SEND_MESSAGE_V2 and seen[0].opaque == 11
    assert seen[0].ext_fields["e"] == "1" and seen[0].body == b"body"


@pytest.mark.parametrize("frame, message", [
    (struct.pack(">i", 0x7FFFFFF0), "frame length 2147483632 outside"),
    (struct.pack(">ii", 12, (7 << 24) | 8) + b"{}{}{}{}", "serialize type 7 not supported"),
    (struct.pack(">ii", 12, 8) + b"not json", "header is not JSON"),
])
def test_send_of_a_malformed_answer_closes_the_link(frame: bytes, message: str) -> None:
    def bad(conn: FakeConn) -> None:
        if conn.read() is not None:
            conn.write(frame)
            conn.read()

    with FakeServer(bad) as server, BlockingLink(server.address) as link:
        with pytest.raises(ProtocolError, match=message) as exc:
            link.send(sent_frame(5), 5, 10.0)
        assert server.address in str(exc.value) and not link.connected
