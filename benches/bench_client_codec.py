"""Client CPU per plain send, in-process (no socket, no broker): the general command path
against the send codec's (compiled and pure twins), one run.

Each round builds the request of one plain 1 KiB ``send`` (UNIQ_KEY, properties, header
values), encodes the attempt's frame, decodes a broker's SUCCESS answer and turns it into
the SendResult, which is what the producer's CPU does per message besides the two system
calls:

- ``command``: ``Sender.command`` + ``rmqha.protocol.command.encode``, the answer through
  ``FrameDecoder`` into a RemotingCommand (the path before the send codec; the asyncio
  producer's and a signed link's still);
- ``cython`` / ``python``: ``send_codec.encode_send`` and ``decode_send_answer`` of the
  twin, one call each (the blocking producer's first attempt).

A second group does the same for a SEND_BATCH_MESSAGE of 32 bodies alone, built entry by
entry on the ``command`` path and by one ``encode_plain_batch`` call on the others (the
twin the producer loaded: the ``python`` row differs from ``cython`` in the frame and the
answer only).

A third group runs the asyncio ``Producer.send`` whole, 100 one after the other per round,
over a connection whose fake transport answers what each write carries in the next loop
turn, in one read (the broker's SUCCESS frame to each send, with its queue id as the
broker answers; no socket): ``frame`` is what the producer does (the first attempt's
frame written at once with ``Connection.send_frame`` and its answer matched to it in one
compiled call), ``command`` what it does when a hook signs (a command encoded, the answer
decoded into one); each on the standard library's loop and on uvloop (what rmqha's own
processes and the peer benchmark run).  A fourth group keeps 256 sends in flight (256
tasks, 2560 sends a round): the writes of a loop turn leave as one, their answers come
back as one read.  The event loop's own turns are in both.  Speed is reported, never
asserted; measure on a quiet machine.
"""
from __future__ import annotations

import asyncio
import itertools
import re
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from benches.conftest import describe
from rmqha._core import load_twin
from rmqha.client.model import MessageQueue, SendResult
from rmqha.client.producer import Producer
from rmqha.client.route import BrokerData, QueueData, TopicRoute
from rmqha.client.send_request import SendRequest, _plain_entry
from rmqha.client.sender import Sender
from rmqha.net import loop as event_loop
from rmqha.net.connection import Connection
from rmqha.protocol import command
from rmqha.protocol.command import VERSION, FrameDecoder, RemotingCommand, encode
from rmqha.protocol.message import new_uniq_keys

BODY = b"x" * 1024
TOPIC = "BenchTopic"
MQ = MessageQueue(TOPIC, "broker-a", 2)
PATHS = ("command", "cython", "python")


def _answer(opaque: int) -> bytes:
    """A broker's SUCCESS answer to a send (with its total length), as rmqha's broker
    writes it."""
    return encode(RemotingCommand(0, opaque=opaque).reply(0, None, {
        "msgId": "7F00000100002A9F0000000000001234,7F00000100002A9F0000000000001634",
        "queueId": "2", "queueOffset": "1234", "putStatus": "PUT_OK",
        "commitLogOffset": "4660"}))


def _round(path: str, build: Callable[[Sender], SendRequest]) -> Callable[[], list[SendResult]]:
    """One send's client CPU by ``path`` (see the module docstring)."""
    sender = Producer("127.0.0.1:9", "bench_group").sender  # never connects
    answer = _answer(7)
    if path == "command":
        decoder = FrameDecoder()

        def by_command() -> list[SendResult]:
            req = build(sender)
            cmd = sender.command(req, MQ)
            cmd.opaque = 7
            encode(cmd)
            (resp,) = decoder.feed(answer)
            return _results(sender, resp, req)

        return by_command
    codec = load_twin("send_codec", path)
    frame = answer[4:]

    def by_codec() -> list[SendResult]:
        req = build(sender)
        codec.encode_send(req.code, 7, VERSION, req.group, req.topic, req.sys_flag,
                          req.born_ms, req.flag, req.properties, req.batch, MQ.queue_id,
                          req.body)
        resp = codec.decode_send_answer(frame)
        assert resp is not None
        return _results(sender, resp, req)

    return by_codec


def _results(sender: Sender, resp: Any, req: SendRequest) -> list[SendResult]:
    tried = sender.attempts()
    tried.made = 1
    results = sender.answer(resp, "127.0.0.1:10911", MQ, req, tried)
    assert results is not None
    return results


def _single(sender: Sender) -> SendRequest:
    return sender.requests.single(TOPIC, BODY, None)


def _batch(sender: Sender) -> SendRequest:
    """32 bodies alone: one ``encode_plain_batch`` call (the loaded twin)."""
    return next(sender.requests.batches(TOPIC, [BODY] * 32, None))


def _batch_by_entries(sender: Sender) -> SendRequest:
    """The same chunk entry by entry (the path before ``encode_plain_batch``)."""
    uids = new_uniq_keys(32)
    return sender.requests.chunk(TOPIC, [_plain_entry(BODY, 0, uid)[0] for uid in uids],
                                 uids, None)


@pytest.mark.benchmark(group="client-send-codec-plain-1KiB")
@pytest.mark.parametrize("path", PATHS)
def test_plain_send(benchmark: Any, path: str) -> None:
    describe(benchmark, path, message_bytes=len(BODY), batch=1)
    results = benchmark.pedantic(_round(path, _single), iterations=1000, rounds=50,
                                 warmup_rounds=2)
    assert results[0].ok and results[0].queue_offset == 1234


@pytest.mark.benchmark(group="client-send-codec-batch-32x1KiB")
@pytest.mark.parametrize("path", PATHS)
def test_batch_send(benchmark: Any, path: str) -> None:
    describe(benchmark, path, message_bytes=len(BODY), batch=32)
    build = _batch_by_entries if path == "command" else _batch
    results = benchmark.pedantic(_round(path, build), iterations=50, rounds=50,
                                 warmup_rounds=2)
    assert len(results) == 32 and results[31].queue_offset == 1234 + 31


# --- the asyncio Producer, whole ---------------------------------------------------------

BROKER = "127.0.0.1:10911"
#: A broker's answer with a ten-digit opaque, which the fake transport puts in its place.
_TEN_DIGITS = 1_000_000_000
#: A send request's opaque and queue id (its V2 header's "e"), read in its header alone.
_REQUEST = re.compile(rb'"opaque":(\d+),.*"e":"(\d+)"')
_LENGTHS = struct.Struct(">ii")


def _answer_to(queue_id: bytes) -> tuple[bytes, int]:
    """A SUCCESS answer to a send to ``queue_id`` and where its ten-digit opaque is."""
    answer = _answer(_TEN_DIGITS).replace(b'"queueId":"2"', b'"queueId":"%s"' % queue_id)
    answer = struct.pack(">i", len(answer) - 4) + answer[4:]  # the queue id's length
    return answer, answer.index(b"%d" % _TEN_DIGITS)


class _AnsweringTransport(asyncio.Transport):
    """Answers the sends of every write with SUCCESS frames carrying their opaques and
    queue ids, in one read in the next loop turn (a real transport's read of them would
    be an epoll wake-up later)."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._answers: dict[bytes, tuple[bytes, int]] = {}

    def write(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        answers = []
        pos = 0
        while pos < len(data):  # frame by frame, each header read alone (not the body)
            total, header = _LENGTHS.unpack_from(data, pos)
            m = _REQUEST.search(data, pos + 8, pos + 8 + header)
            pos += 4 + total
            assert m is not None
            queue_id = m.group(2)
            if queue_id not in self._answers:
                self._answers[queue_id] = _answer_to(queue_id)
            answer, at = self._answers[queue_id]
            answers.append(answer[:at] + m.group(1) + answer[at + 10:])
        self._loop.call_soon(self._conn.data_received, b"".join(answers))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 10911) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def _answered_producer(signed: bool) -> Producer:
    """A producer with a cached route to one broker whose connection answers at once."""
    producer = Producer("127.0.0.1:9", "bench_group")
    session = producer.session
    session._routes[TOPIC] = TopicRoute(
        TOPIC, [QueueData("broker-a", 4, 4, 6)], {"broker-a": BrokerData("c", "broker-a", {0: BROKER})},
        fetched_at=time.monotonic() + 1e6)
    conn = Connection(None, command.DEFAULT_MAX_FRAME_BYTES, name=BROKER)
    conn.connection_made(_AnsweringTransport(conn))
    session.client(BROKER)._conn = conn
    producer.sender._signed = signed  # as with a hook: commands, answers decoded whole
    return producer


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        pytest.importorskip("uvloop")
        return event_loop.new_event_loop()
    return asyncio.new_event_loop()


@pytest.mark.benchmark(group="client-asyncio-producer-plain-1KiB-x100")
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("path", ["frame", "command"])
def test_asyncio_producer_send(benchmark: Any, path: str, loop_kind: str) -> None:
    describe(benchmark, f"asyncio-{path}-{loop_kind}", message_bytes=len(BODY), batch=1)
    # Ten-digit opaques from here on: the answer template fits every one.
    command._opaque_counter = itertools.count(_TEN_DIGITS)
    loop = _new_loop(loop_kind)
    try:
        producer = loop.run_until_complete(_answered_producer(path == "command"))

        async def hundred() -> SendResult:
            for _ in range(100):
                result = await producer.send(TOPIC, BODY)
            return result

        result = benchmark.pedantic(lambda: loop.run_until_complete(hundred()), rounds=20,
                                    warmup_rounds=1)
    finally:
        loop.close()
    assert result.ok and result.queue_offset == 1234


@pytest.mark.benchmark(group="client-asyncio-producer-plain-1KiB-256-in-flight")
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_asyncio_producer_window(benchmark: Any, loop_kind: str) -> None:
    describe(benchmark, f"asyncio-frame-{loop_kind}", message_bytes=len(BODY), batch=1)
    command._opaque_counter = itertools.count(_TEN_DIGITS)
    loop = _new_loop(loop_kind)
    try:
        producer = loop.run_until_complete(_answered_producer(False))

        async def window() -> list[SendResult]:
            async def sender() -> SendResult:
                for _ in range(10):
                    result = await producer.send(TOPIC, BODY)
                return result

            return await asyncio.gather(*(sender() for _ in range(256)))

        results = benchmark.pedantic(lambda: loop.run_until_complete(window()), rounds=10,
                                     warmup_rounds=1)
    finally:
        loop.close()
    assert all(r.ok and r.queue_offset == 1234 for r in results)
