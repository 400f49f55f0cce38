"""Auto-batching: concurrent ``Producer.send`` calls to one topic travel as one batch.

The opt-in ``Producer(auto_batch=True)``, after RocketMQ 5's ``autoBatch`` producer
(``ProduceAccumulator``).  Sends of one topic made in the same event-loop turn (256
coroutines each awaiting its own send, say) are held until the end of that turn, then go
as one SEND_BATCH_MESSAGE per ``max_bytes`` (one queue for the whole batch, retried as
a unit); each caller still gets its own :class:`~rmqha.client.model.SendResult` (its
message id, the batch's queue, its own queue offset) or the batch's SendError.  A send
alone in its turn goes as the plain single send it would have been, so nothing waits:
RocketMQ's accumulator holds messages up to ``batchMaxDelayMs`` (10 ms) instead, which
a loop turn makes unnecessary here.

What is never batched: sends to a chosen queue, delayed sends, transactional ones, and
bodies over the producer's ``compress_over_bytes`` (they travel compressed, alone).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rmqha.client.model import Message, SendResult
from rmqha.client.send_request import BatchEntry, SendRequest
from rmqha.client.sender import Sender
from rmqha.protocol.message import new_uniq_key

#: RocketMQ's default ``batchMaxBytes``.
DEFAULT_MAX_BYTES = 32 * 1024


@dataclass
class _Held:
    """The sends of one topic held in this loop turn: each message with its batch entry
    and id, made when it was sent (so its size is exact and nothing is built twice)."""

    messages: list[tuple[Message, BatchEntry, str]] = field(default_factory=list)
    waiters: list[asyncio.Future[SendResult]] = field(default_factory=list)
    size: int = 0


class SendAccumulator:
    """Holds a producer's sends per topic until the end of the loop turn; ``sender``
    builds and sends what it releases."""

    def __init__(self, sender: Sender, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"auto_batch_max_bytes must be positive, got {max_bytes}")
        self.sender = sender
        self.max_bytes = max_bytes
        self._held: dict[str, _Held] = {}
        #: The sends in flight (a task the loop only holds weakly must be held here).
        self._sending: set[asyncio.Future[list[SendResult]]] = set()
        #: Batches sent and the messages they carried (a batch of one counts as one).
        self.batches = 0
        self.messages = 0

    def accepts(self, msg: Message) -> bool:
        """Whether a message may share a batch: brokers refuse delayed messages in batches,
        and a body over ``compress_over_bytes`` travels compressed, alone."""
        over = self.sender.requests.compress_over_bytes
        return ((over < 0 or len(msg.body) <= over)
                and not any(k == "DELAY" or k.startswith("TIMER_") for k in msg.properties))

    def send(self, topic: str, msg: Message) -> asyncio.Future[SendResult]:
        """The future of ``msg``'s result; the send leaves at the end of this turn, or at
        once when the topic's held sends reach ``max_bytes``."""
        loop = asyncio.get_running_loop()
        # A plain message's entry comes from a template; its size counts the property
        # pairs generously for non-ASCII, as send_batch's chunks do.
        entry, uid, size = self.sender.requests.batch_entry(msg, new_uniq_key())
        held = self._held.get(topic)
        if held is not None and held.size + size > self.max_bytes:
            self._release(topic, held)
            held = None
        if held is None:
            held = self._held[topic] = _Held()
            loop.call_soon(self._release, topic, held)
        fut: asyncio.Future[SendResult] = loop.create_future()
        held.messages.append((msg, entry, uid))
        held.waiters.append(fut)
        held.size += size
        return fut

    def _release(self, topic: str, held: _Held) -> None:
        if self._held.get(topic) is not held:
            return  # already released when it filled up
        del self._held[topic]
        req = self._request(topic, held)
        self.batches += 1
        self.messages += len(held.messages)
        task = asyncio.ensure_future(self.sender.send(req))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(lambda t: _settle(t, held.waiters))

    def _request(self, topic: str, held: _Held) -> SendRequest:
        """A single send for a message alone in its turn, else one SEND_BATCH_MESSAGE."""
        requests = self.sender.requests
        if len(held.messages) == 1:
            msg, (_, properties, _), uid = held.messages[0]
            return requests.encoded(topic, msg, properties.decode("utf-8"), uid, None)
        return requests.chunk(topic, [entry for _, entry, _ in held.messages],
                              [uid for _, _, uid in held.messages], None)


def _settle(task: asyncio.Future[list[SendResult]],
            waiters: list[asyncio.Future[SendResult]]) -> None:
    if task.cancelled():
        for w in waiters:
            w.cancel()
        return
    exc = task.exception()
    if exc is not None:
        for w in waiters:
            if not w.done():
                w.set_exception(exc)
        return
    for w, result in zip(waiters, task.result()):
        if not w.done():
            w.set_result(result)
