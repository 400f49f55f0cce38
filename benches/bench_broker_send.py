"""The broker's CPU per send, in process: the plain-send fast lane vs the ordinary path.

A real send path (MessageService on a real CommitLog, no replicas) behind a real
Connection whose transport only collects what is written; one round feeds it ``SENDS``
SEND_MESSAGE_V2 requests of 1 KiB the way a socket delivers them (one read each, then
``PIPELINED`` in one read; or as many SEND_BATCH_MESSAGE requests of 32) and runs the loop
until every answer is written.  So a round
costs what the broker's process spends from the bytes of a request to the bytes of its
answer (decode, checks, append, the group's wait, the answer's encode, the loop turns,
and the consume-queue indexing the send triggers), without a socket or a client.  Speed
is reported, never asserted: compare lanes within one run.
"""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest

from benches.conftest import describe
from rmqha.messaging.context import MessagingConfig
from rmqha.messaging.service import MessageService
from rmqha.net.connection import Connection
from rmqha.net.dispatcher import Dispatcher
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import SERIALIZE_JSON, SERIALIZE_ROCKETMQ, RemotingCommand, encode
from rmqha.protocol.headers import SendHeader
from rmqha.protocol.message import encode_batch_entries
from rmqha.store import CommitLog
from rmqha.testing.recording_transport import RecordingTransport

SENDS = 64
PIPELINED = 32
BODY = b"x" * 1024


def _frames(serialize_type: int, batch: int) -> tuple[list[bytes], bytes]:
    """``SENDS`` reads of one request and one read of ``PIPELINED``; with ``batch`` > 1 each
    request is a SEND_BATCH_MESSAGE of that many messages."""
    def one(i: int) -> bytes:
        props = f"KEYS\x01k{i}\x02UNIQ_KEY\x01AC1100{i:010X}\x02WAIT\x01true\x02"
        ext = SendHeader.fields("pg", "BenchTopic", 0, 1700000000000 + i, 0,
                                "" if batch > 1 else props, batch > 1)
        ext["e"] = str(i % 4)
        if batch > 1:
            body = encode_batch_entries((BODY, props.encode(), 0) for _ in range(batch))
            cmd = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, body)
        else:
            cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, BODY)
        cmd.serialize_type = serialize_type
        return encode(cmd)

    return [one(i) for i in range(SENDS)], b"".join(one(i) for i in range(PIPELINED))


class _Broker:
    def __init__(self, base: Path, fast: bool) -> None:
        self.log = CommitLog(base / "cl", segment_bytes=1 << 26, prefault=False,
                             store_host=("127.0.0.1", 10911))
        self.svc = MessageService(self.log, store_dir=base, config=MessagingConfig(),
                                  broker_name="b", broker_id=0, replication=None)
        self.svc.set_role("master", None)
        d = Dispatcher(self.svc.handlers())
        for code, now in self.svc.immediate_handlers().items():
            d.register_immediate(code, now)
        if fast:
            d.register_plain_send(*self.svc.plain_send_handler())
        self.conn = Connection(d, 64 << 20)
        self.sink = RecordingTransport(keep=False)
        self.conn.connection_made(self.sink)

    async def round(self, singles: list[bytes], pipelined: bytes, answer_bytes: int) -> None:
        want = self.sink.written + answer_bytes
        for frame in singles:
            self.conn.data_received(frame)
            await asyncio.sleep(0)
        self.conn.data_received(pipelined)
        while self.sink.written < want:
            await asyncio.sleep(0)

    def close(self) -> None:
        self.svc.close()
        self.log.close()


@pytest.mark.benchmark(group="broker-send-cpu")
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("serialize", ["json", "binary"])
@pytest.mark.parametrize("lane", ["fast", "ordinary"])
def test_broker_cpu_per_send(benchmark: Any, lane: str, serialize: str, batch: int) -> None:
    describe(benchmark, lane, message_bytes=len(BODY), batch=batch, replicas=1)
    benchmark.extra_info["serialize"] = serialize
    benchmark.extra_info["requests_per_round"] = SENDS + PIPELINED
    singles, pipelined = _frames(SERIALIZE_JSON if serialize == "json" else SERIALIZE_ROCKETMQ,
                                 batch)
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp:
        broker = loop.run_until_complete(_make(Path(tmp), lane == "fast"))
        try:
            # The first round creates the topic and measures the answers' size.
            before = broker.sink.written
            loop.run_until_complete(broker.round(singles, pipelined, 1))
            loop.run_until_complete(asyncio.sleep(0.01))
            answer_bytes = broker.sink.written - before
            benchmark.pedantic(lambda: loop.run_until_complete(
                broker.round(singles, pipelined, answer_bytes)), rounds=30, warmup_rounds=2)
        finally:
            broker.close()
            loop.close()


async def _make(base: Path, fast: bool) -> _Broker:
    return _Broker(base, fast)  # a Connection needs a running loop
