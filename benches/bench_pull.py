"""The read path in one process: a pull answer assembled on the broker and decoded on the
client (``rmqha._core.pull_answer``), compiled vs pure twin.

The log holds 8 queues of 1 KiB messages sent round robin (so a queue's records are not
contiguous in the log, as with single sends), each with UNIQ_KEY and TAGS.  One round of
the broker case is ``PullPath._try_pull`` for 256 messages of one queue (units looked up,
checked against their records, CRCs checked, records copied, the answer command built); one
round of the client case decodes that answer's body into ``ReceivedMessage`` objects.
Messages/s = 256 / mean time.
"""
from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from benches.conftest import describe
from rmqha._core import load_twin
from rmqha.messaging.context import MessagingConfig
from rmqha.messaging.pull_path import PullPath
from rmqha.protocol import message as message_mod
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import PullHeader
from rmqha.protocol.message import ReceivedMessage, new_uniq_key
from rmqha.store import CommitLog
from rmqha.store import consume_queue as cq
from rmqha.store.consume_queue import ConsumeQueueIndex

QUEUES = 8
PULL = 256
BODY = b"x" * 1024


@pytest.fixture(scope="module")
def pull_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PullPath]:
    root = Path(tmp_path_factory.mktemp("pull"))
    log = CommitLog(root / "cl", segment_bytes=64 << 20, prefault=False)
    for i in range(QUEUES * PULL):
        log.append("BenchTopic", BODY, i % QUEUES, {"UNIQ_KEY": new_uniq_key(), "TAGS": "TagA"})
    index = ConsumeQueueIndex(root / "cq")
    index.advance(log, log.max_offset)
    ctx = types.SimpleNamespace(index=index, log=log, config=MessagingConfig(), metrics=None,
                                broker_name="b", broker_id=0, closed=False)
    try:
        yield PullPath(ctx, lambda *a, **k: None)  # type: ignore[arg-type]
    finally:
        index.close()
        log.close()


def _pull(pp: PullPath) -> RemotingCommand:
    cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
    cmd.language = "PYTHON"
    h = PullHeader(consumer_group="g", topic="BenchTopic", queue_id=0, queue_offset=0,
                   max_msg_nums=PULL, sys_flag=0, commit_offset=0, suspend_timeout_ms=0,
                   subscription="*")
    answer = pp._try_pull(cmd, h, PULL, None)
    assert answer is not None and answer.code == ResponseCode.SUCCESS
    return answer


@pytest.mark.benchmark(group="pull-broker-answer")
@pytest.mark.parametrize("impl", ["cython", "python"])
def test_broker_answer(benchmark, pull_path: PullPath, impl: str,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    describe(benchmark, impl, message_bytes=len(BODY), batch=PULL, op="pull_answer",
             records_per_round=PULL)
    monkeypatch.setattr(cq, "_pull_answer", load_twin("pull_answer", impl))
    answer = benchmark(_pull, pull_path)
    assert answer.ext_fields["nextBeginOffset"] == str(PULL)


@pytest.mark.benchmark(group="pull-client-decode")
@pytest.mark.parametrize("impl", ["cython", "python"])
def test_client_decode(benchmark, pull_path: PullPath, impl: str) -> None:
    describe(benchmark, impl, message_bytes=len(BODY), batch=PULL, op="decode_pull_body",
             records_per_round=PULL)
    body = bytes(_pull(pull_path).body or b"")
    mod = load_twin("pull_answer", impl)
    msgs = benchmark(mod.decode, body, "broker-a", ReceivedMessage, message_mod._inflate, 1 << 20)
    assert len(msgs) == PULL and msgs[-1].body == BODY
