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
answer only).  Speed is
reported, never asserted; measure on a quiet machine.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from benches.conftest import describe
from rmqha._core import load_twin
from rmqha.client.model import MessageQueue, SendResult
from rmqha.client.producer import Producer
from rmqha.client.send_request import SendRequest, _plain_entry
from rmqha.client.sender import Sender
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
