"""The asyncio producer's first attempt (``Sender._first_attempt`` over
``Connection.send_frame``) against scripted brokers: fake transports that answer each
written send as a broker would (or not at all), no socket.

What it must keep of the general path: the queue each send goes to (round robin, as
``_pick`` takes them), the request bytes, a refusal naming the master followed there, a
timeout closing that link and retried on another broker, a lost connection retried, a
cancelled send forgotten; and the connection's side: answers in one read matched by
opaque (at most DISPATCH_BUDGET a loop turn, in order with the requests among them),
answers split over reads, timeouts on one timer.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from rmqha.client.producer import Producer
from rmqha.client.route import BrokerData, QueueData, TopicRoute
from rmqha.client.send_request import SendRequest
from rmqha.client.sender import Sender
from rmqha.errors import RemotingError, RemotingTimeoutError, SendError
from rmqha.net.connection import DISPATCH_BUDGET, Connection
from rmqha.net.dispatcher import Dispatcher
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode,
)

TOPIC = "FirstAttempt"
A, B, A2 = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10912"

#: ``script(request, conn) -> answer | None``: a broker's answer to a request (None: none).
Script = Callable[[RemotingCommand, "ScriptedTransport"], "RemotingCommand | None"]


def stored(req: RemotingCommand, *_: Any) -> RemotingCommand:
    """SUCCESS for the queue the request names, at offset = its opaque."""
    return req.response(ResponseCode.SUCCESS, None, {
        "msgId": "7F000001000027AF0000000000000100", "queueId": req.ext_fields["e"],
        "queueOffset": str(req.opaque), "putStatus": "PUT_OK"})


class ScriptedTransport(asyncio.Transport):
    """Keeps what is written; the script's answers to it come back in one read in the
    next loop turn."""

    def __init__(self, conn: Connection, addr: str, script: Script) -> None:
        super().__init__()
        self.conn, self.addr, self.script = conn, addr, script
        self.requests: list[RemotingCommand] = []
        self.writes: list[bytes] = []
        self.reading = True
        self._decoder = FrameDecoder()
        self._loop = asyncio.get_running_loop()

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        answers = []
        for req in self._decoder.feed(bytes(data)):
            self.requests.append(req)
            answer = self.script(req, self)
            if answer is not None:
                answer.opaque = req.opaque
                answers.append(encode(answer))
        if answers:
            self._loop.call_soon(self.conn.data_received, b"".join(answers))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self._loop.call_soon(self.conn.connection_lost, None)


def connect(producer: Producer, addr: str, script: Script) -> ScriptedTransport:
    conn = Connection(Dispatcher(), DEFAULT_MAX_FRAME_BYTES, name=addr)
    transport = ScriptedTransport(conn, addr, script)
    conn.connection_made(transport)
    producer.session.client(addr)._conn = conn
    return transport


def producer_of(groups: dict[str, str], **options: Any) -> Producer:
    """A producer whose route of TOPIC (fresh for long) has 4 queues on each group."""
    producer = Producer("127.0.0.1:9", "first-attempt", **options)
    producer.session._routes[TOPIC] = TopicRoute(
        TOPIC, [QueueData(name, 4, 4, 6) for name in groups],
        {name: BrokerData("c", name, {0: addr}) for name, addr in groups.items()},
        fetched_at=time.monotonic() + 1e6)
    return producer


def test_sends_go_round_robin_as_the_general_path_picks_and_writes_them() -> None:
    async def main() -> None:
        producer = producer_of({"broker-a": A, "broker-b": B})
        wires = {addr: connect(producer, addr, stored) for addr in (A, B)}
        built: list[SendRequest] = []
        single = producer.sender.requests.single

        def keep(*args: Any) -> SendRequest:
            built.append(single(*args))
            return built[-1]

        producer.sender.requests.single = keep  # type: ignore[method-assign]
        results = [await producer.send(TOPIC, b"m%d" % i) for i in range(10)]
        # The queues _pick() takes from a counter at the same place.
        twin = producer_of({"broker-a": A, "broker-b": B}).sender
        route = twin.session.fresh_route(TOPIC)
        assert route is not None
        want = [twin._pick(route, None, None) for _ in range(10)]
        assert [r.queue for r in results] == want
        assert all(r.attempts == 1 and r.ok for r in results)
        written = {req.opaque: frame for w in wires.values()  # one frame a write here
                   for req, frame in zip(w.requests, w.writes)}
        assert len(written) == 10
        for result, req in zip(results, built):
            # The bytes the general path writes for the command of this request.
            general = Sender.command(req, result.queue)
            general.opaque = result.queue_offset  # the script answers with the opaque
            assert written[result.queue_offset] == encode(general)
            assert result.msg_id == req.uniq_keys[0]
        # Negative control: another queue is other bytes.
        other = Sender.command(built[0], want[1])
        other.opaque = results[0].queue_offset
        assert written[results[0].queue_offset] != encode(other)
        # An explicit queue goes there.
        explicit = await producer.send(TOPIC, b"q", queue_id=3)
        assert explicit.queue.queue_id == 3 and explicit.attempts == 1
        await producer.close()
        # Sends a hook must sign (commands, the general way), and sends that must
        # connect first, take the same queues.
        for prepare in (signed_by_a_hook, not_connected):
            producer = producer_of({"broker-a": A, "broker-b": B})
            prepare(producer)
            results = [await producer.send(TOPIC, b"m%d" % i) for i in range(10)]
            assert [r.queue for r in results] == want and all(r.ok for r in results)
            await producer.close()

    def signed_by_a_hook(producer: Producer) -> None:
        for addr in (A, B):
            connect(producer, addr, stored)
        producer.sender._signed = True  # as with a hook that signs commands only

    def not_connected(producer: Producer) -> None:
        for addr in (A, B):
            conn = connect(producer, addr, stored).conn
            client = producer.session.client(addr)
            client._conn = None

            async def dial(client: Any = client, conn: Connection = conn) -> Connection:
                client._conn = conn  # connected at its first send
                return conn

            client.connection = dial  # type: ignore[method-assign]

    asyncio.run(main())


def test_a_refusal_naming_the_master_is_followed_there() -> None:
    def slave(req: RemotingCommand, *_: Any) -> RemotingCommand:
        return req.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                            f"broker-a is a slave; the master of broker-a is {A2}",
                            {"masterAddress": A2})

    async def main() -> None:
        producer = producer_of({"broker-a": A}, backoff_s=0.0)
        wires = {A: connect(producer, A, slave), A2: connect(producer, A2, stored)}
        result = await producer.send(TOPIC, b"x")
        assert result.ok and result.attempts == 2
        assert [len(wires[A].requests), len(wires[A2].requests)] == [1, 1]
        assert wires[A].requests[0].ext_fields["i"] == wires[A2].requests[0].ext_fields["i"]
        await producer.close()

    asyncio.run(main())


def test_a_final_refusal_is_a_send_error_after_one_attempt() -> None:
    def refuse(req: RemotingCommand, *_: Any) -> RemotingCommand:
        return req.response(ResponseCode.MESSAGE_ILLEGAL, "too big")

    async def main() -> None:
        producer = producer_of({"broker-a": A})
        wire = connect(producer, A, refuse)
        with pytest.raises(SendError, match="after 1 attempt.*too big"):
            await producer.send(TOPIC, b"x")
        assert len(wire.requests) == 1
        await producer.close()

    asyncio.run(main())


def test_a_timeout_closes_that_link_and_the_retry_goes_elsewhere() -> None:
    async def main() -> None:
        producer = producer_of({"broker-a": A, "broker-b": B}, send_timeout_s=0.05,
                               backoff_s=0.0)
        silent = connect(producer, A, lambda req, t: None)
        answering = connect(producer, B, stored)
        producer.sender._counter = -1  # the first send picks broker-a's first queue
        result = await producer.send(TOPIC, b"x")
        assert result.ok and result.attempts == 2 and result.queue.broker_name == "broker-b"
        assert len(silent.requests) == 1 and len(answering.requests) == 1
        assert silent.conn.closed and producer.session.connected(A) is None
        conn = answering.conn
        assert not conn._sends and not conn._deadlines
        await producer.close()

    asyncio.run(main())


def test_a_lost_connection_is_retried_and_a_cancelled_send_forgotten() -> None:
    async def main() -> None:
        producer = producer_of({"broker-a": A, "broker-b": B}, backoff_s=0.0)
        held = connect(producer, A, lambda req, t: None)
        connect(producer, B, stored)
        producer.sender._counter = -1
        sending = asyncio.ensure_future(producer.send(TOPIC, b"x"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(held.conn._sends) == 1
        held.conn.connection_lost(ConnectionResetError("reset by the test"))
        result = await sending
        assert result.ok and result.attempts == 2 and result.queue.broker_name == "broker-b"
        # A cancelled send leaves nothing behind on its connection.
        held = connect(producer, A, lambda req, t: None)
        producer.sender._counter = -1
        sending = asyncio.ensure_future(producer.send(TOPIC, b"y"))
        await asyncio.sleep(0)
        assert len(held.conn._sends) == 1 and len(held.conn._deadlines) == 1
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert not held.conn._sends and not held.conn._deadlines
        await producer.close()

    asyncio.run(main())


# --- the connection's side ------------------------------------------------------------------


#: A request frame the connection tests write (what it asks does not matter there).
NOTHING = encode(RemotingCommand.request(RequestCode.HEART_BEAT))


def answer_frame(opaque: int) -> bytes:
    return encode(stored(RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque,
                                         ext_fields={"e": "1"})))


def test_a_read_of_many_answers_is_matched_a_budget_a_turn_in_order() -> None:
    """Answers beyond DISPATCH_BUDGET in one read wait for the next turn (reading paused
    meanwhile); a request among them is dispatched in its place; an answer split over
    reads comes back as its frame (the general decoder's), which the sender reads."""
    async def main() -> None:
        order: list[str] = []

        async def on_request(cmd: RemotingCommand, conn: Connection) -> None:
            order.append("request")

        conn = Connection(Dispatcher({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: on_request}),
                          DEFAULT_MAX_FRAME_BYTES, name="broker")
        transport = ScriptedTransport(conn, "broker", lambda req, t: None)
        conn.connection_made(transport)
        n = DISPATCH_BUDGET + 8
        futures = [conn.send_frame(NOTHING, o, 5.0) for o in range(1, n + 1)]
        for o, fut in enumerate(futures, 1):
            fut.add_done_callback(lambda f, o=o: order.append(f"answer {o}"))
        request = encode(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED))
        frames = [answer_frame(o) for o in range(1, n + 1)]
        frames.insert(DISPATCH_BUDGET + 4, request)
        conn.data_received(b"".join(frames))
        assert sum(f.done() for f in futures) == DISPATCH_BUDGET and not transport.reading
        await asyncio.sleep(0.01)
        assert all(f.done() for f in futures) and transport.reading
        assert order == [f"answer {o}" for o in range(1, DISPATCH_BUDGET + 5)] + [
            "request"] + [f"answer {o}" for o in range(DISPATCH_BUDGET + 5, n + 1)]
        assert futures[0].result() == (0, 1, 1, None, "7F000001000027AF0000000000000100",
                                       "1", "1", "PUT_OK", None)
        assert not conn._sends and not conn._deadlines
        # Split over two reads: the general decoder hands back the frame.
        fut = conn.send_frame(NOTHING, 77, 5.0)
        whole = answer_frame(77)
        conn.data_received(whole[:10])
        conn.data_received(whole[10:])
        assert fut.result() == whole[4:] and not conn._sends and not conn._deadlines
        # Negative control: an answer nobody waits for is not matched to anything.
        fut = conn.send_frame(NOTHING, 78, 5.0)
        conn.data_received(answer_frame(79))
        assert not fut.done() and list(conn._sends) == [78]
        conn.forget(78)
        await conn.close()

    asyncio.run(main())


def test_send_frame_times_out_and_fails_on_close() -> None:
    async def main() -> None:
        conn = Connection(None, DEFAULT_MAX_FRAME_BYTES, name="broker")
        conn.connection_made(ScriptedTransport(conn, "broker", lambda req, t: None))
        quick = conn.send_frame(NOTHING, 1, 0.02)
        slow = conn.send_frame(NOTHING, 2, 5.0)
        with pytest.raises(RemotingTimeoutError, match="opaque 1"):
            await quick
        assert list(conn._sends) == [2] and list(conn._deadlines) == [2]
        conn.data_received(answer_frame(1))  # late: dropped, nothing matched
        assert not slow.done()
        await conn.close("closed by the test")
        with pytest.raises(RemotingError, match="closed by the test"):
            await slow
        with pytest.raises(RemotingError, match="closed"):
            conn.send_frame(NOTHING, 3, 5.0)

    asyncio.run(main())


def test_answers_decode_as_the_general_decoder_reads_them() -> None:
    frame = answer_frame(5)
    cmd = decode_frame(frame[4:])
    assert (cmd.opaque, cmd.ext_fields["queueOffset"]) == (5, "5")
