"""Gets send requests stored: which queue and broker each attempt goes to, and the retries.

A send is retried, with a fresh route and a bounded exponential backoff, when the broker
refuses the write (slave or fenced broker, too few in-sync replicas, busy), when the
connection is lost, or when it times out; a refused write names the master's address,
which the next attempt goes to directly.  Answers that mean "stored but not yet safe"
(FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT) are not retried: they come back as the result's
status.  A topic nobody has created yet is sent to TBW102's brokers, as RocketMQ's clients
do (brokers with auto-create on make it at the first send).

:class:`Sender` is what the producer's pieces share: ``Producer`` and the auto-batching
accumulator hand it requests (:meth:`Sender.send`), transactions ask it for routes, and
``BlockingProducer`` makes a first attempt over a blocking socket with
:meth:`Sender.cached_target`, :meth:`Sender.command` and :meth:`Sender.answer`, then hands
the same request and what that attempt learned (:class:`Attempts`) to :meth:`Sender.send`.

Its own attempts are the request's frame in one send codec call
(:meth:`SendRequest.frame`), the answer's fields read from the frame in one call.  A
send's first attempt waits for nothing but its answer when it can (:meth:`Sender.send`):
the cached route's next queue (its master looked up once per route), the open connection
to it, the frame written at once (``Connection.send_frame``) and the future of its answer
awaited, which the connection completes with the answer's fields from the compiled call
that reads them off the read, matched by opaque: no coroutine below the sender's, one
timer per connection.  Whatever would wait (no cached route, no connection yet, a full
write buffer) and every retry go the general way, over ``request_frame``.  With ACL
credentials the frame is signed in place (:meth:`Credentials.sign_send_frame`: the bytes
signing its command gives); only another hook, or credentials that cannot sign in place,
make attempts go as commands.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from rmqha._core import load
from rmqha._core.send_codec_py import Answer
from rmqha.client.blocking_link import answer_of
from rmqha.client.idempotence import Idempotence
from rmqha.client.model import MessageQueue, SendResult, SendStatus
from rmqha.client.route import ClientSession, QueueData, TopicRoute
from rmqha.client.send_request import RequestBuilder, SendRequest
from rmqha.errors import (
    ClientError,
    ProtocolError,
    RemotingError,
    RemotingTimeoutError,
    SendError,
    SequenceGapError,
    TopicNotFoundError,
)
from rmqha.net.connection import Connection
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.command import RemotingCommand, decode_frame, next_opaque
from rmqha.protocol.headers import SEND_V2_QUEUE_ID
from rmqha.protocol.idempotence import parse_gap
from rmqha.protocol.topics import DEFAULT_TOPIC

_STATUS: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
#: The client send codec (compiled unless disabled): an answer's fields in one call.
_CODEC = load("send_codec")
#: Broker answers after which another attempt (maybe elsewhere) can succeed.
_RETRYABLE = {
    ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.NO_PERMISSION, ResponseCode.TOPIC_NOT_EXIST, ResponseCode.GO_AWAY,
}


# "... the master of broker-a is 127.0.0.1:10911": how a refusal may name the master when
# it carries no masterAddress field.
_MASTER_REMARK = re.compile(r"\bmaster\b.*\bis (\d{1,3}(?:\.\d{1,3}){3}:\d{1,5})\b")


def _master_in_remark(remark: str) -> str:
    m = _MASTER_REMARK.search(remark)
    return m.group(1) if m else ""


def answer_of_frame(frame: bytes) -> Answer:
    """A send answer's fields from its frame (without its length): one call of the send
    codec, or (a header it does not read, e.g. binary) the frame decoded whole."""
    answer = _CODEC.decode_send_answer(frame)
    return answer if answer is not None else answer_of(decode_frame(frame))


@dataclass
class Attempts:
    """What the attempts of one send learned so far: how many were made, where the next
    one goes (a master a slave named, away from a broker that failed) and the last
    failure, which a SendError reports.  BlockingProducer's first attempt, made over a
    blocking socket, hands it to the retry loop, which counts that attempt and follows it."""

    deadline: float
    #: Attempts counted so far (the retry loop counts one that found no route too).
    made: int = 0
    #: A broker group not to pick again if another one can take the message.
    avoid: str | None = None
    #: The address the next attempt goes to (a master a refusal named).
    redirect: str | None = None
    #: Ask the name server for the route again before the next attempt.
    refresh: bool = False
    #: A refusal that no other attempt can change: stop.
    final: bool = False
    last_code: int | None = None
    last_status: str = ""
    last_error: str = ""
    #: An idempotent send's last "stored, not confirmed" results (retried; the result if
    #: no later attempt gets SEND_OK).
    unconfirmed: list[SendResult] | None = None

    def no_route(self, exc: ClientError) -> None:
        self.last_error, self.last_status, self.refresh = str(exc), "NO_ROUTE", True

    def lost(self, exc: RemotingError | ProtocolError, broker_name: str) -> None:
        """No answer (timeout, lost connection, malformed frame).  A timed-out send may
        have been stored: the retry keeps the UNIQ_KEYs, so readers can drop the duplicate."""
        timed_out = isinstance(exc, RemotingTimeoutError)
        self.last_error, self.last_status = str(exc), "TIMEOUT" if timed_out else "CONNECTION"
        self.refresh, self.avoid = True, broker_name

    def refused(self, answer: Answer, addr: str, broker_name: str) -> None:
        """An answer that is not a send status (see ``_STATUS``)."""
        code, remark = answer.code, answer.remark or ""
        self.last_code, self.last_error = code, remark
        self.last_status = answer.put_status or ""
        if code not in _RETRYABLE:
            self.final = True
            return
        self.refresh = True
        master = answer.master_address or _master_in_remark(remark)
        if master and master != addr:
            self.redirect = master  # a slave named its master: go there directly
        else:
            self.avoid = broker_name

    def error(self, topic: str) -> SendError:
        gap = parse_gap(self.last_error) if self.last_code == ResponseCode.PRODUCER_SEQUENCE_GAP else None
        if gap is not None:
            producer, queue, expected, got = gap
            return SequenceGapError(f"send to {topic} refused after {self.made} attempt(s): "
                                    f"{self.last_error}", producer=producer, queue=queue,
                                    expected=expected, got=got, code=self.last_code)
        return SendError(
            f"send to {topic} failed after {self.made} attempt(s): "
            f"{self.last_status or self.last_code} {self.last_error}".strip(),
            self.last_code, self.last_status)


class Sender:
    """Routes, queue choice and retries of one producer (see the module docstring)."""

    def __init__(self, session: ClientSession, requests: RequestBuilder, *,
                 send_timeout_s: float, max_attempts: int, backoff_s: float,
                 max_backoff_s: float, retry_deadline_s: float,
                 idempotence: Idempotence | None = None) -> None:
        self.session = session
        #: The producer id and per-queue sequences of an idempotent producer.
        self.idempotence = idempotence
        #: Builds the requests this sender sends (the accumulator and transactions use it).
        self.requests = requests
        self.send_timeout_s = send_timeout_s
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retry_deadline_s = retry_deadline_s
        self._counter = 0
        security = session.security
        #: Whether a hook signs requests; then attempts go as frames signed in place by
        #: ``_signer`` when it can, else as commands the hook signs.
        self._signed = security is not None and security.rpc_hook is not None
        self._signer = security.frame_signer if security is not None else None
        #: topic -> (the TBW102 route it was derived from, the derived route)
        self._fallback_routes: dict[str, tuple[TopicRoute, TopicRoute]] = {}

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route; for a topic nobody has yet, TBW102's brokers (as RocketMQ
        clients do), where brokers with auto-create on make it at the first send."""
        try:
            return await self.session.route(topic, refresh=refresh)
        except TopicNotFoundError:
            fallback = await self.session.route(DEFAULT_TOPIC, refresh=refresh)
            cached = self._fallback_routes.get(topic)
            if cached is not None and cached[0] is fallback:
                return cached[1]  # built from the same TBW102 route: reuse its queue list
            queues = [QueueData(q.broker_name, min(4, q.read_queue_nums),
                                min(4, q.write_queue_nums), q.perm)
                      for q in fallback.queue_datas]
            route = TopicRoute(topic, queues, fallback.broker_datas, fallback.fetched_at)
            self._fallback_routes[topic] = (fallback, route)
            return route

    def _pick(self, route: TopicRoute, avoid: str | None,
              queue_id: int | None) -> MessageQueue:
        queues = route.publish_queues()
        if not queues:
            raise ClientError(f"topic {route.topic} has no writable queue with a master")
        if queue_id is not None:
            for q in queues:
                if q.queue_id == queue_id and q.broker_name != avoid:
                    return q
            for q in queues:
                if q.queue_id == queue_id:
                    return q
        self._counter += 1
        for i in range(len(queues)):
            q = queues[(self._counter + i) % len(queues)]
            if q.broker_name != avoid:
                return q
        return queues[self._counter % len(queues)]

    def attempts(self) -> Attempts:
        """The state of a new send: its retry deadline starts now."""
        return Attempts(time.monotonic() + self.retry_deadline_s)

    def _target(self, route: TopicRoute, req: SendRequest,
                tried: Attempts) -> tuple[str, MessageQueue]:
        """Where the next attempt goes: a queue of the route, at its master or at the
        address the last refusal named.  ClientError if the route has no writable queue
        (or, for a bound idempotent send, its group has no master now)."""
        if req.ticket is not None:
            return self._bound_target(route, req, tried)
        mq = self._pick(route, tried.avoid, req.queue_id)
        addr = tried.redirect or route.broker_datas[mq.broker_name].master
        tried.redirect = None
        assert addr is not None  # publish_queues() holds only groups with a master
        return addr, mq

    @staticmethod
    def _bound_target(route: TopicRoute, req: SendRequest,
                      tried: Attempts) -> tuple[str, MessageQueue]:
        """A bound idempotent send's queue, at its group's master now (a failover moves it)."""
        assert req.ticket is not None
        mq = req.ticket.queue
        data = route.broker_datas.get(mq.broker_name)
        addr = tried.redirect or (data.master if data is not None else None)
        tried.redirect = None
        if not addr:
            raise ClientError(f"broker group {mq.broker_name} of {req.topic} queue {mq.queue_id} "
                              f"has no master right now (an idempotent send stays on its queue)")
        return addr, mq

    def bind_now(self, req: SendRequest) -> bool:
        """Bind an idempotent request to a queue of the cached route and its next sequence
        without waiting; False when that would wait (no fresh route, a full window)."""
        if not req.idempotent or req.ticket is not None:
            return True
        assert self.idempotence is not None
        route = self.session.fresh_route(req.topic)
        if route is None:
            return False
        try:
            mq = self._pick(route, None, req.queue_id)
        except ClientError:
            return False
        ticket = self.idempotence.try_claim(mq)
        if ticket is None:
            return False
        req.bind(ticket)
        return True

    async def _bind(self, req: SendRequest, tried: Attempts) -> None:
        """:meth:`bind_now`, waiting for a route (until the retry deadline) or a slot."""
        assert self.idempotence is not None
        delay = self.backoff_s
        while not self.bind_now(req):
            try:
                mq = self._pick(await self.route(req.topic, tried.refresh), None, req.queue_id)
            except ClientError as exc:
                if time.monotonic() + delay > tried.deadline:
                    raise
                tried.no_route(exc)
                await asyncio.sleep(delay)
                delay = min(self.max_backoff_s, delay * 2)
                continue
            req.bind(await self.idempotence.claim(mq))

    def release(self, req: SendRequest, *, answered: bool) -> None:
        """A bound idempotent send ended, with a result or without (see
        :meth:`Idempotence.release`); nothing for any other send."""
        if req.ticket is not None and self.idempotence is not None:
            self.idempotence.release(req.ticket, answered=answered)

    def cached_target(self, req: SendRequest,
                      tried: Attempts) -> tuple[str, MessageQueue] | None:
        """Where the next attempt goes by the cached route, without I/O; None if the route
        is not cached, stale or without a writable queue (:meth:`send` asks the name server)."""
        route = self.session.fresh_route(req.topic)
        if route is None:
            return None
        try:
            return self._target(route, req, tried)
        except ClientError:
            return None

    @staticmethod
    def command(req: SendRequest, mq: MessageQueue) -> RemotingCommand:
        """The request of one attempt, to queue ``mq``, as a command (for a transport that
        encodes commands, or a hook that signs them; :meth:`SendRequest.frame` is the same
        request encoded)."""
        # A fresh header dict per attempt, handed over as is: every value is a str.
        return RemotingCommand(code=req.code, opaque=next_opaque(),
                               ext_fields={**req.header, SEND_V2_QUEUE_ID: str(mq.queue_id)},
                               body=req.body)

    def frame(self, req: SendRequest, mq: MessageQueue, opaque: int) -> bytes | None:
        """The frame of one attempt, to queue ``mq``, signed in place when requests are
        signed; None when only the signing hook can sign it (:meth:`command`)."""
        if not self._signed:
            return req.frame(opaque, mq.queue_id)
        if self._signer is None:
            return None
        return self._signer.sign_send_frame(
            req.frame(opaque, mq.queue_id),
            {**req.header, SEND_V2_QUEUE_ID: str(mq.queue_id)}, req.body)

    def answer(self, resp: RemotingCommand | Answer, addr: str, mq: MessageQueue,
               req: SendRequest, tried: Attempts) -> list[SendResult] | None:
        """The results if the answer (a command, or the send codec's decoded fields) is a
        send status; else None, with the refusal noted in ``tried`` (``tried.final`` when
        no retry can help)."""
        answer = resp if type(resp) is Answer else answer_of(resp)  # type: ignore[arg-type]
        status = _STATUS.get(answer.code)
        if status is not None:
            results = self._results(answer, status, mq, req.uniq_keys, tried.made)
            if req.ticket is None or status is SendStatus.SEND_OK:
                return results
            # Stored, not confirmed: a retry of an idempotent send is safe, and the broker
            # answers it once the original's copies are known again.
            tried.unconfirmed, tried.last_status = results, status.value
            tried.last_code, tried.last_error = answer.code, answer.remark or ""
            return None
        tried.refused(answer, addr, mq.broker_name)
        if (answer.code == ResponseCode.PRODUCER_SEQUENCE_GAP and req.ticket is not None
                and self.idempotence is not None and self.idempotence.earlier_in_flight(req.ticket)):
            tried.final = False  # an earlier send of the queue is on its way: it may close the gap
        return None

    def send(self, req: SendRequest,
             tried: Attempts | None = None) -> Coroutine[Any, Any, list[SendResult]]:
        """Attempts until one is answered with a send status; SendError after a refusal
        no retry can change, ``max_attempts`` or ``retry_deadline_s``.  ``tried`` carries
        on from attempts made elsewhere (BlockingProducer's first one).  The coroutine of
        the way it takes (no coroutine of its own in between: one frame less a send)."""
        return self._send_bound(req, tried) if req.idempotent else self._send(req, tried)

    async def _send_bound(self, req: SendRequest, tried: Attempts | None) -> list[SendResult]:
        """An idempotent send: bound to its queue and sequence, then :meth:`_send`; the
        ticket released however it ends."""
        answered = False
        try:
            if not self.bind_now(req):  # else the first attempt can go without waiting
                tried = tried or self.attempts()
                await self._bind(req, tried)
            results = await self._send(req, tried)
            answered = True
            return results
        finally:
            self.release(req, answered=answered)

    async def _send(self, req: SendRequest, tried: Attempts | None) -> list[SendResult]:
        if tried is not None:
            return await self._retry(req, tried)
        deadline = time.monotonic() + self.retry_deadline_s
        first = self._first_attempt(req)
        if first is None:
            return await self._retry(req, Attempts(deadline))
        fut, conn, opaque, addr, mq = first
        try:
            answer = await fut
            if type(answer) is bytes:  # a header the compiled read leaves alone
                answer = answer_of_frame(answer)
        except (RemotingError, ProtocolError) as exc:
            tried = Attempts(deadline, made=1)
            await self._lost(exc, addr, mq, tried)
            return await self._retry(req, tried)
        except asyncio.CancelledError:
            conn.forget(opaque)
            raise
        status = _STATUS.get(answer.code)
        if status is not None and (req.ticket is None or status is SendStatus.SEND_OK):
            return self._results(answer, status, mq, req.uniq_keys, 1)
        tried = Attempts(deadline, made=1)
        results = self.answer(answer, addr, mq, req, tried)
        if results is not None:
            return results
        if tried.final:
            raise tried.error(req.topic)
        return await self._retry(req, tried)

    async def _retry(self, req: SendRequest, tried: Attempts) -> list[SendResult]:
        """:meth:`send`'s attempts after ``tried``, each the general way."""
        for attempt in range(tried.made + 1, self.max_attempts + 1):
            tried.made = attempt
            if attempt > 1:
                delay = min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 2)))
                if time.monotonic() + delay > tried.deadline:
                    break
                await asyncio.sleep(delay)
            try:
                route = None if tried.refresh else self.session.fresh_route(req.topic)
                if route is None:
                    route = await self.route(req.topic, tried.refresh)
                addr, mq = self._target(route, req, tried)
            except ClientError as exc:
                tried.no_route(exc)
                continue
            try:
                opaque = next_opaque()
                frame = self.frame(req, mq, opaque)
                if frame is None:  # the signing hook needs the command
                    resp: RemotingCommand | Answer = await self.session.request(
                        addr, self.command(req, mq), self.send_timeout_s)
                else:  # the frame in one call, its answer read in one call
                    resp = answer_of_frame(await self.session.request_frame(
                        addr, frame, opaque, self.send_timeout_s, signed=self._signed))
            except (RemotingError, ProtocolError) as exc:
                tried.lost(exc, mq.broker_name)  # request_frame closed a timed-out link
                continue
            results = self.answer(resp, addr, mq, req, tried)
            if results is not None:
                return results
            if tried.final:
                raise tried.error(req.topic)
        if tried.unconfirmed is not None:
            return tried.unconfirmed  # still not confirmed: the status says so, as without retries
        raise tried.error(req.topic)

    def _first_attempt(self, req: SendRequest) -> tuple[
            asyncio.Future[Any], Connection, int, str, MessageQueue] | None:
        """A send's first attempt made without waiting (see the module docstring): the
        future of its answer, the connection, its opaque, where it went; None when some
        of it would wait or a hook must sign a command (the retry loop makes it then)."""
        route = self.session.fresh_route(req.topic)
        if route is None or (self._signed and self._signer is None):
            return None
        if req.queue_id is None:
            targets = route.publish_targets()
            if not targets:
                return None
            self._counter += 1  # the queue _pick() takes
            mq, addr = targets[self._counter % len(targets)]
        else:
            try:
                addr, mq = self._target(route, req, Attempts(0.0))
            except ClientError:
                return None
        conn = self.session.connected(addr)
        if conn is None or conn.write_paused:
            if req.queue_id is None:
                self._counter -= 1  # the retry loop's _pick() takes that queue again
            return None
        opaque = next_opaque()
        frame = self.frame(req, mq, opaque) if self._signed else req.frame(opaque, mq.queue_id)
        assert frame is not None  # only a hook without a frame signer makes none
        try:
            return conn.send_frame(frame, opaque, self.send_timeout_s), conn, opaque, addr, mq
        except RemotingError:
            return None  # closed under us: nothing left, the retry loop connects again

    async def _lost(self, exc: RemotingError | ProtocolError, addr: str, mq: MessageQueue,
                    tried: Attempts) -> None:
        """A first attempt got no answer: a timed-out link is closed (as
        ``request_frame`` closes it), and the attempts avoid that broker."""
        if isinstance(exc, RemotingTimeoutError):
            await self.session.timed_out(addr)
        tried.lost(exc, mq.broker_name)

    def _results(self, answer: Answer, status: SendStatus, mq: MessageQueue,
                 uniq_keys: list[str], attempts: int) -> list[SendResult]:
        queue_id_text, offset_text = answer.queue_id, answer.queue_offset
        try:
            queue_id = mq.queue_id if queue_id_text is None else int(queue_id_text)
            first = int(offset_text)  # type: ignore[arg-type]  # None: TypeError
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"send response without queueOffset: queueId={queue_id_text!r} "
                                f"queueOffset={offset_text!r}") from exc
        ids = (answer.msg_id or "").split(",")
        # The picked queue itself unless the broker stored elsewhere (a frozen dataclass
        # costs a microsecond to make, on every send).
        queue = mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
        if len(uniq_keys) == 1:
            return [SendResult(status, uniq_keys[0], ids[0], queue, first, attempts)]
        return [
            SendResult(status, uid, ids[i] if i < len(ids) else "", queue, first + i, attempts)
            for i, uid in enumerate(uniq_keys)
        ]

