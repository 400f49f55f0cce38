"""The producer for synchronous code: :class:`BlockingProducer`.

Each sending thread gets its own :class:`~rmqha.client.producer.Producer` (connections,
route cache) and asyncio loop, and in a thread that runs no loop a send's first attempt
goes over a blocking socket (:class:`~rmqha.client.blocking_link.BlockingLink`) when the
topic's route is cached: no loop runs for a message answered with a send status, which is
nearly all of them (driving a loop with ``run_until_complete`` cost ~200 us of client CPU a
send).  That attempt's frame is one call of the compiled send codec and its answer is read
by one more (``rmqha._core.send_codec``), unless requests are signed (ACL), which needs the
command.  Any other outcome (no cached route, a refusal, a timeout, a lost connection) hands
the same request, UNIQ_KEYs included, and what the attempt learned to the producer's
:class:`~rmqha.client.sender.Sender` on the thread's loop; a refusal no retry can help
raises SendError at once, as it does there.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmqha._core.send_codec_py import Answer
from rmqha.client.blocking_link import BlockingLink
from rmqha.client.model import Message, SendResult
from rmqha.client.producer import Producer
from rmqha.client.send_request import RequestBuilder, SendRequest
from rmqha.client.sender import Sender
from rmqha.client.transaction import CheckListener, LocalTransaction, TransactionSendResult
from rmqha.errors import ClientError, ProtocolError, RemotingError
from rmqha.net import loop as event_loop
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand, next_opaque
from rmqha.protocol.headers import SEND_V2_QUEUE_ID


@dataclass(eq=False)
class _ThreadProducer:
    """One sending thread's own loop, :class:`Producer` (its connections and route cache)
    and blocking links (one :class:`BlockingLink` per broker address)."""

    loop: asyncio.AbstractEventLoop
    producer: Producer
    #: Held by the owner while it sends and by whoever closes this (close() from another
    #: thread waits for the send in progress).
    lock: threading.Lock = field(default_factory=threading.Lock)
    links: dict[str, BlockingLink] = field(default_factory=dict)
    closed: bool = False
    #: The producer's sender and request builder, looked up once.
    sender: Sender = field(init=False)
    requests: RequestBuilder = field(init=False)

    def __post_init__(self) -> None:
        self.sender = self.producer.sender
        self.requests = self.sender.requests

    def send(self, requests: Iterable[SendRequest]) -> list[SendResult]:
        """Send each request in turn (the caller's thread is the owner)."""
        results: list[SendResult] = []
        with self.lock:
            if self.closed:
                raise ClientError("producer is closed")
            for req in requests:
                results += self._send_one(req)
        return results

    def _send_one(self, req: SendRequest) -> list[SendResult]:
        """:meth:`_attempts`; an idempotent send is bound to its queue and sequence by the
        cached route first (else the sender's loop binds it), its ticket released however
        the send ends."""
        if not req.idempotent:
            return self._attempts(req, True)
        answered = False
        try:
            results = self._attempts(req, self.sender.bind_now(req))
            answered = True
            return results
        finally:
            self.sender.release(req, answered=answered)

    def _attempts(self, req: SendRequest, blocking: bool) -> list[SendResult]:
        """The first attempt over a blocking link when the route is cached and fresh (and
        ``blocking``); the answer is used as the sender's retry loop uses it, and anything
        but a send status leaves the rest to that loop, run on this thread's loop with what
        the attempt learned."""
        sender = self.sender
        tried = sender.attempts()
        target = sender.cached_target(req, tried) if blocking else None
        if target is not None:
            addr, mq = target
            tried.made = 1
            link = self.links.get(addr)
            if link is None:
                link = self.links[addr] = BlockingLink(addr, security=sender.session.security)
            try:
                opaque = next_opaque()
                frame: bytes | None = req.frame(opaque, mq.queue_id)
                if link.signs and frame:  # signed in place when it can be
                    frame = link.signed(frame, {**req.header, SEND_V2_QUEUE_ID: str(mq.queue_id)},
                                        req.body)
                if frame is None:  # the signing hook needs the command
                    resp: RemotingCommand | Answer = link.request(sender.command(req, mq),
                                                                  sender.send_timeout_s)
                else:  # one compiled call each way
                    resp = link.send(frame, opaque, sender.send_timeout_s)
            except (RemotingError, ProtocolError) as exc:
                del self.links[addr]  # it closed its socket; a dead master's goes for good
                tried.lost(exc, mq.broker_name)
            else:
                results = sender.answer(resp, addr, mq, req, tried)
                if results is not None:
                    return results
                if tried.final:
                    raise tried.error(req.topic)
        return self.loop.run_until_complete(sender.send(req, tried))

    def close(self, timeout: float = 10.0) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            links, self.links = list(self.links.values()), {}
            for link in links:
                link.close()
            try:
                self.loop.run_until_complete(asyncio.wait_for(self.producer.close(), timeout))
            finally:
                self.loop.close()


class _ThreadLoops:
    """Runs a BlockingProducer's sends on the calling thread, with no other thread involved.

    Each thread that sends gets a :class:`_ThreadProducer`: a private loop and
    :class:`Producer` (its own connections and route cache) and blocking links.  A send
    whose route is cached makes its first attempt over a blocking socket (see
    :class:`_ThreadProducer`); the rest (route lookups, retries) runs on the thread's loop,
    driven with ``run_until_complete`` in that thread.  Either way a send costs no hop to
    another thread and back (two wake-ups, 0.1-0.2 ms on a busy machine).  Between calls
    nothing runs: what arrives meanwhile (a closed connection, a late answer) is handled
    at the next call, and a dead connection fails over as any lost connection does.  The
    producers of threads that ended are closed when a new thread starts sending (and all
    of them by :meth:`close`).  A thread that already runs an asyncio loop cannot block
    inside it, and transactions need a loop that always runs: those calls (all calls,
    once a transaction was used) go through one shared loop thread.
    """

    def __init__(self, make: Callable[[], Producer]) -> None:
        self._make = make
        self._local = threading.local()
        self._all: list[_ThreadProducer] = []
        self._all_lock = threading.Lock()
        #: the thread each entry of _all belongs to (an ended thread's entry is closed)
        self._owners: dict[threading.Thread, _ThreadProducer] = {}
        self._fallback: EventLoopThread | None = None
        self._fallback_producer: Producer | None = None
        self._pinned = False
        self._closed = False

    def _own(self) -> _ThreadProducer:
        mine: _ThreadProducer | None = getattr(self._local, "mine", None)
        if mine is None:
            if self._closed:
                raise ClientError("producer is closed")
            loop = event_loop.new_call_loop()
            mine = _ThreadProducer(loop, loop.run_until_complete(self._created()))
            with self._all_lock:
                gone = [e for t, e in self._owners.items() if not t.is_alive()]
                for e in gone:
                    self._all.remove(e)
                self._owners = {t: e for t, e in self._owners.items() if t.is_alive()}
                self._all.append(mine)
                self._owners[threading.current_thread()] = mine
            self._local.mine = mine
            for e in gone:  # threads that sent once and ended: free their connections
                e.close()
        return mine

    async def _created(self) -> Producer:
        return self._make()

    @staticmethod
    def _in_async_thread() -> bool:
        # asyncio's own lookup (exported by asyncio.events): get_running_loop() would
        # raise and catch a RuntimeError on every send of a thread without a loop.
        return asyncio._get_running_loop() is not None

    def _shared(self) -> tuple[EventLoopThread, Producer]:
        if self._closed:
            raise ClientError("producer is closed")
        with self._all_lock:
            if self._fallback is None:
                self._fallback = EventLoopThread("rmqha-producer")
                self._fallback_producer = self._fallback.run(self._created())
        assert self._fallback_producer is not None
        return self._fallback, self._fallback_producer

    def pin_shared(self) -> None:
        """From now on every call goes through the shared loop thread: transactions need a
        loop that always runs (heartbeats, the broker's check-backs between calls)."""
        self._shared()
        self._pinned = True

    def this_thread(self) -> _ThreadProducer | None:
        """This thread's own producer; None when its calls go through the shared loop
        thread instead (:meth:`run_shared`): in a thread that runs a loop, or once pinned."""
        if self._closed:
            raise ClientError("producer is closed")
        if self._pinned or self._in_async_thread():
            return None
        return self._own()

    @property
    def shared_producer(self) -> Producer:
        """The Producer of the shared loop thread (started on first use)."""
        return self._shared()[1]

    def run_shared(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` (made from :attr:`shared_producer`) on the shared loop thread and
        return its result."""
        if self._closed:
            if inspect.iscoroutine(coro):
                coro.close()  # never awaited: say so quietly, not with a RuntimeWarning
            raise ClientError("producer is closed")
        return self._shared()[0].run(coro, timeout)

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        with self._all_lock:
            owned, self._all = self._all, []
            self._owners.clear()
            fallback, self._fallback = self._fallback, None
            fallback_producer, self._fallback_producer = self._fallback_producer, None
        for mine in owned:
            mine.close(timeout)
        if fallback is not None:
            try:
                if fallback_producer is not None:
                    fallback.run(fallback_producer.close(), timeout)
            finally:
                fallback.stop()


class BlockingProducer:
    """The producer for synchronous code.

    Each sending thread has its own connections and route cache and sends in place (see
    :class:`_ThreadLoops`), so one message costs no thread hop; threads send
    concurrently.  A message whose topic route is cached goes out over a blocking socket
    (no event loop runs); when that first attempt is not answered with a send status,
    the retries run on the thread's own asyncio loop, with the same UNIQ_KEYs.  Results,
    retries and errors are those of :class:`Producer`.
    """

    def __init__(self, namesrv: str | list[str], group: str = "rmqha_producer",
                 **options: Any) -> None:
        # Made once here so bad options fail in the constructor, not at the first send.
        Producer(namesrv, group, **options)
        self._loop = _ThreadLoops(lambda: Producer(namesrv, group, **options))

    def send(self, topic: str, message: Message | bytes | str, *,
             queue_id: int | None = None, delay_level: int | None = None,
             deliver_at: int | None = None) -> SendResult:
        """See :meth:`Producer.send`."""
        mine = self._loop.this_thread()
        if mine is None:
            return self._loop.run_shared(self._loop.shared_producer.send(
                topic, message, queue_id=queue_id, delay_level=delay_level,
                deliver_at=deliver_at))
        req = mine.requests.single(topic, message, queue_id, delay_level, deliver_at)
        return mine.send((req,))[0]

    def send_batch(self, topic: str, messages: Sequence[Message | bytes | str], *,
                   queue_id: int | None = None) -> list[SendResult]:
        """See :meth:`Producer.send_batch`."""
        mine = self._loop.this_thread()
        if mine is None:
            return self._loop.run_shared(self._loop.shared_producer.send_batch(
                topic, messages, queue_id=queue_id))
        return mine.send(mine.requests.batches(topic, messages, queue_id))

    def send_transaction(self, topic: str, message: Message | bytes | str,
                         local_transaction: LocalTransaction, arg: Any = None, *,
                         queue_id: int | None = None) -> TransactionSendResult:
        self._loop.pin_shared()
        return self._loop.run_shared(self._loop.shared_producer.send_transaction(
            topic, message, local_transaction, arg, queue_id=queue_id))

    def set_transaction_check_listener(self, check: CheckListener, *,
                                       topics: Sequence[str] = ()) -> None:
        self._loop.pin_shared()
        producer = self._loop.shared_producer

        async def register() -> None:
            producer.set_transaction_check_listener(check, topics=topics)

        self._loop.run_shared(register())

    def close(self) -> None:
        self._loop.close()

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
