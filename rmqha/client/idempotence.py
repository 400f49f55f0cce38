"""The idempotent producer's side: a producer id and a per-queue sequence on each send.

``Producer(idempotent=True)`` (and ``BlockingProducer``) bind each ordinary send and batch
to one queue of one broker group on its first attempt and give it the next sequence of
that queue (:class:`Idempotence`); the request carries both as properties
(:mod:`rmqha.protocol.idempotence`) on every attempt, and every retry goes to the same
queue of the same group (its master, whichever broker that is after a failover), so the
broker answers a retry with the original's result instead of storing it again
(:mod:`rmqha.messaging.producer_state`).  Since a retry is safe, an idempotent send is
also retried after FLUSH_SLAVE_TIMEOUT and FLUSH_DISK_TIMEOUT (the broker waits for the
original's copies again), until SEND_OK or the retry deadline; then the last status is
the result, as without idempotence.

Why the rules:

* **At most** :data:`~rmqha.protocol.idempotence.WINDOW` **(5) sequences in flight per
  queue** (a sixth send to the queue waits for a slot): the broker keeps the last five
  results of each producer and queue, so a retry always finds its original.
* **A generation per queue.**  The producer id is 128 random bits (hex) and the queue's
  generation, ``<hex>-<generation>``.  A send that ends without a result (its outcome
  unknown, or refused for good) leaves the broker expecting its sequence, so the queue
  starts a new generation (a new id, sequences from 0) for the sends that follow: a
  broker takes an id it does not know at any sequence.  Sends of the old generation still
  in flight behind it meet a gap and fail with SequenceGapError (nothing of them stored).
* **A gap is retried only behind an earlier send still in flight** (two sends of one
  queue can reach the broker out of order when the first is retried); otherwise it is
  SequenceGapError naming producer, queue, expected and got: a send of this producer to
  that queue is missing (e.g. one answered FLUSH_SLAVE_TIMEOUT whose only copy was lost in
  a failover).  The queue starts a new generation, so the next send goes through.

Delayed and transactional sends are not idempotent (the broker stores them elsewhere
first): they travel as without this option.
"""
from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

from rmqha.protocol.idempotence import WINDOW, Claim
from rmqha.protocol.route import MessageQueue


@dataclass
class _QueueSeq:
    """One queue's sequences: the generation, the next sequence, those in flight, and the
    sends waiting for a slot in the window."""

    generation: int = 0
    next: int = 0
    in_flight: set[int] = field(default_factory=set)
    waiting: list[asyncio.Future[None]] = field(default_factory=list)

    def has_room(self) -> bool:
        return not self.in_flight or self.next - min(self.in_flight) < WINDOW


@dataclass
class Ticket:
    """One send's claim on its queue, held from binding until the send ends."""

    queue: MessageQueue
    generation: int
    claim: Claim
    done: bool = False


class Idempotence:
    """One producer's id and per-queue sequences (see the module docstring)."""

    def __init__(self) -> None:
        self.base = secrets.token_hex(16)
        self._queues: dict[tuple[str, str, int], _QueueSeq] = {}

    def _queue(self, mq: MessageQueue) -> _QueueSeq:
        key = (mq.topic, mq.broker_name, mq.queue_id)
        seqs = self._queues.get(key)
        if seqs is None:
            seqs = self._queues[key] = _QueueSeq()
        return seqs

    def try_claim(self, mq: MessageQueue) -> Ticket | None:
        """The next sequence of ``mq``, or None while its window is full."""
        seqs = self._queue(mq)
        if not seqs.has_room():
            return None
        seq = seqs.next
        seqs.next += 1
        seqs.in_flight.add(seq)
        return Ticket(mq, seqs.generation, Claim(f"{self.base}-{seqs.generation}", seq))

    async def claim(self, mq: MessageQueue) -> Ticket:
        """:meth:`try_claim`, waiting for a slot in the window."""
        while True:
            ticket = self.try_claim(mq)
            if ticket is not None:
                return ticket
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue(mq).waiting.append(fut)
            await fut

    def earlier_in_flight(self, ticket: Ticket) -> bool:
        """Whether a send of the same generation with a smaller sequence is in flight (a
        gap behind it may close: retry)."""
        seqs = self._queue(ticket.queue)
        return (seqs.generation == ticket.generation
                and any(s < ticket.claim.seq for s in seqs.in_flight))

    def release(self, ticket: Ticket, *, answered: bool) -> None:
        """The send ended: with a result (``answered``), or without one (its sequence may
        be missing at the broker: the queue starts a new generation).  Once per ticket."""
        if ticket.done:
            return
        ticket.done = True
        seqs = self._queue(ticket.queue)
        if seqs.generation == ticket.generation:
            seqs.in_flight.discard(ticket.claim.seq)
            if not answered:
                seqs.generation += 1
                seqs.next = 0
                seqs.in_flight.clear()
        waiting, seqs.waiting = seqs.waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)
