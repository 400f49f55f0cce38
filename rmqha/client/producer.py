"""rmqha's producer: send single messages and batches to the masters a topic's route names.

Every message gets a ``UNIQ_KEY`` before the first attempt, so a send retried after a
timeout or a lost connection (which may have been stored) carries the same id and
readers can drop the duplicate.  A send is retried, with a fresh route and a bounded
exponential backoff, when the broker refuses the write (slave or fenced broker, too few
in-sync replicas, busy), when the connection is lost, or when it times out; a refused
write names the master's address, which the next attempt goes to directly.  Answers
that mean "stored but not yet safe" (FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT) are not
retried: they come back as the result's status.  Single bodies over ``compress_over_bytes``
are compressed with lz4 and marked in sysFlag as RocketMQ 5 marks it; batches travel
uncompressed, as RocketMQ's clients send them (the broker would have to inflate a
compressed batch before storing it: 10-25% less throughput for the CPU it saves on the
wire), unless ``compress_batches`` asks for the whole batch body to be compressed.

:class:`Producer` is asyncio's.  :class:`BlockingProducer` gives each sending thread its
own Producer (connections, route cache) and asyncio loop, and in a thread that runs no
loop makes a send's first attempt over a blocking socket
(:class:`~rmqha.client.blocking_link.BlockingLink`) when the topic's route is cached:
no loop runs for a message answered with a send status, which is nearly all of them
(driving a loop with ``run_until_complete`` cost ~200 us of client CPU a send).  Any
other outcome (no cached route, a refusal, a timeout, a lost connection) hands the same
request, UNIQ_KEYs included, and what the attempt learned to the retry loop on the
thread's loop; a refusal no retry can help raises SendError at once, as it does there.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmqha.net import loop as event_loop
from rmqha.client.accumulator import DEFAULT_MAX_BYTES as DEFAULT_AUTO_BATCH_BYTES
from rmqha.client.accumulator import SendAccumulator, batchable
from rmqha.client.blocking_link import BlockingLink
from rmqha.client.model import Message, MessageQueue, SendResult, SendStatus
from rmqha.client.route import ClientSession, QueueData, TopicRoute
from rmqha.client.transaction import (
    CheckListener,
    LocalTransaction,
    TransactionSendResult,
    TransactionSupport,
    delay_properties,
)
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import (
    ClientError,
    ProtocolError,
    RemotingError,
    RemotingTimeoutError,
    SendError,
    TopicNotFoundError,
)
from rmqha.protocol.message import (
    DEFAULT_COMPRESS_OVER_BYTES,
    CompressionType,
    Prop,
    compress,
    encode_batch_entries,
    encode_properties,
    new_uniq_key,
    new_uniq_keys,
)
from rmqha.protocol.topics import DEFAULT_TOPIC
from rmqha.net.client_security import ClientSecurity, TlsOption
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand, next_opaque

log = logging.getLogger(__name__)

_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
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


#: A batch entry: the body, its encoded properties and its flag.
_BatchEntry = tuple[bytes, bytes, int]
#: The encoded properties of a message with none of its own, split where its UNIQ_KEY
#: goes: made by encode_properties, so the shortcut writes the same bytes.
_PLAIN_PROPS: tuple[str, str] = tuple(  # type: ignore[assignment]
    encode_properties({Prop.UNIQ_KEY: "\x00", Prop.WAIT: "true"}).split("\x00"))


def _is_plain(msg: Message) -> bool:
    """No properties of its own: what it carries is its id and WAIT (:func:`_plain_properties`)."""
    return not (msg.properties or msg.tags or msg.keys)


def _plain_properties(uid: str) -> str:
    """The encoded properties of a plain message: nothing to build, sort or check."""
    return f"{_PLAIN_PROPS[0]}{uid}{_PLAIN_PROPS[1]}"


def _plain_entry(body: bytes, flag: int, uid: str) -> tuple[_BatchEntry, int]:
    """The batch entry of a plain message and its size as
    :meth:`Producer._batch_entry` counts a message with properties of its own."""
    props = _plain_properties(uid)
    return (body, props.encode(), flag), 22 + len(body) + 4 * len(props)


def _as_message(m: Message | bytes | str) -> Message:
    if isinstance(m, Message):
        return m
    if isinstance(m, str):
        return Message(m.encode("utf-8"))
    return Message(bytes(m))


@dataclass
class _SendRequest:
    """One send request as every attempt sends it: the header (UNIQ_KEYs and born
    timestamp included) and body are built once, so a retry carries the same ids."""

    topic: str
    code: int
    #: SendMessageRequestHeaderV2 by its short names, every value the string it travels
    #: as; the queue id ("e") is added per attempt.
    header: dict[str, str]
    body: bytes
    uniq_keys: list[str]
    queue_id: int | None


@dataclass
class _Attempts:
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

    def no_route(self, exc: ClientError) -> None:
        self.last_error, self.last_status, self.refresh = str(exc), "NO_ROUTE", True

    def lost(self, exc: RemotingError | ProtocolError, broker_name: str) -> None:
        """No answer (timeout, lost connection, malformed frame).  A timed-out send may
        have been stored: the retry keeps the UNIQ_KEYs, so readers can drop the duplicate."""
        timed_out = isinstance(exc, RemotingTimeoutError)
        self.last_error, self.last_status = str(exc), "TIMEOUT" if timed_out else "CONNECTION"
        self.refresh, self.avoid = True, broker_name

    def refused(self, resp: RemotingCommand, addr: str, broker_name: str) -> None:
        """An answer that is not a send status (see ``_STATUS``)."""
        self.last_code, self.last_error = resp.code, resp.remark or ""
        self.last_status = resp.ext_fields.get("putStatus", "")
        if resp.code not in _RETRYABLE:
            self.final = True
            return
        self.refresh = True
        master = resp.ext_fields.get("masterAddress", "") or _master_in_remark(resp.remark or "")
        if master and master != addr:
            self.redirect = master  # a slave named its master: go there directly
        else:
            self.avoid = broker_name

    def error(self, topic: str) -> SendError:
        return SendError(
            f"send to {topic} failed after {self.made} attempt(s): "
            f"{self.last_status or self.last_code} {self.last_error}".strip(),
            self.last_code, self.last_status)


class Producer:
    """Asyncio producer.  Use ``async with Producer(...) as p`` or ``start()``/``close()``."""

    def __init__(
        self,
        namesrv: str | list[str],
        group: str = "rmqha_producer",
        *,
        send_timeout_s: float = 3.0,
        max_attempts: int = 64,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        retry_deadline_s: float = 30.0,
        compress_over_bytes: int = DEFAULT_COMPRESS_OVER_BYTES,
        compression: CompressionType = CompressionType.LZ4,
        max_batch_bytes: int = 4 * 1024 * 1024,
        compress_batches: bool = False,
        auto_batch: bool = False,
        auto_batch_max_bytes: int = DEFAULT_AUTO_BATCH_BYTES,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: TlsOption = None,
    ) -> None:
        self.group = group
        self.session = ClientSession(namesrv, rpc_timeout_s=send_timeout_s, security=ClientSecurity.from_options(
            access_key=access_key, secret_key=secret_key, tls=tls))
        self.send_timeout_s = send_timeout_s
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retry_deadline_s = retry_deadline_s
        self.compress_over_bytes = compress_over_bytes
        self.compression = compression
        self.max_batch_bytes = max_batch_bytes
        self.compress_batches = compress_batches
        self._counter = 0
        #: topic -> (the TBW102 route it was derived from, the derived route)
        self._fallback_routes: dict[str, tuple[TopicRoute, TopicRoute]] = {}
        self._txn: TransactionSupport | None = None
        #: Holds concurrent sends until the end of the loop turn (``auto_batch``).
        self.accumulator = (SendAccumulator(self, auto_batch_max_bytes) if auto_batch
                            else None)

    async def start(self) -> Producer:
        return self

    async def close(self) -> None:
        if self._txn is not None:
            await self._txn.close()
        await self.session.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- public API ---------------------------------------------------------------------

    async def send(self, topic: str, message: Message | bytes | str, *,
                   queue_id: int | None = None, delay_level: int | None = None,
                   deliver_at: int | None = None) -> SendResult:
        """Send one message; returns its result or raises SendError after the retries.

        ``delay_level`` (1..N of the broker's ``message_delay_level``) or ``deliver_at``
        (epoch ms) hold the message back until then.  With ``auto_batch`` a plain send
        goes in one batch with the other sends to the topic made in this loop turn (see
        :mod:`rmqha.client.accumulator`)."""
        acc = self.accumulator
        if (acc is not None and queue_id is None and delay_level is None
                and deliver_at is None):
            msg = _as_message(message)
            if ((self.compress_over_bytes < 0 or len(msg.body) <= self.compress_over_bytes)
                    and batchable(msg)):
                return await acc.send(topic, msg)
        req = self._single_request(topic, message, queue_id, delay_level, deliver_at)
        return (await self._send_with_retries(req))[0]

    async def send_batch(self, topic: str, messages: Sequence[Message | bytes | str], *,
                         queue_id: int | None = None) -> list[SendResult]:
        """Send messages as batches (one queue per batch); one result per message, in order."""
        results: list[SendResult] = []
        for req in self._batch_requests(topic, messages, queue_id):
            results += await self._send_with_retries(req)
        return results

    async def send_transaction(self, topic: str, message: Message | bytes | str,
                               local_transaction: LocalTransaction, arg: Any = None, *,
                               queue_id: int | None = None) -> TransactionSendResult:
        """Send a prepared message, run ``local_transaction(message, arg)`` and commit or
        roll back by what it returns (see :mod:`rmqha.client.transaction`)."""
        return await self._transactions().send(topic, _as_message(message), local_transaction,
                                               arg, queue_id)

    def set_transaction_check_listener(self, check: CheckListener, *,
                                       topics: Sequence[str] = ()) -> None:
        """``check(message) -> LocalTransactionState`` answers the broker's check-backs;
        ``topics`` start heartbeats to their brokers now (call it from the event loop)."""
        self._transactions().set_check_listener(check, topics)

    def _transactions(self) -> TransactionSupport:
        if self._txn is None:
            self._txn = TransactionSupport(self)
        return self._txn

    # --- internals ----------------------------------------------------------------------

    def _properties(self, msg: Message, uid: str | None = None) -> dict[str, str]:
        props = dict(msg.properties)
        if msg.tags:
            props[Prop.TAGS] = msg.tags
        if msg.keys:
            props[Prop.KEYS] = msg.keys
        if Prop.UNIQ_KEY not in props:
            props[Prop.UNIQ_KEY] = uid or new_uniq_key()
        props[Prop.WAIT] = "true"
        return props

    def _header(self, topic: str, sys_flag: int, flag: int, properties: str,
                batch: bool) -> dict[str, str]:
        """SendMessageRequestHeaderV2 (short names) as the strings it travels as, so
        encoding converts nothing; the queue id ("e") is set per attempt."""
        return {
            "a": self.group, "b": topic, "c": "TBW102", "d": "4", "f": str(sys_flag),
            "g": str(time.time_ns() // 1_000_000), "h": str(flag), "i": properties,
            "j": "0", "k": "false", "m": "true" if batch else "false",
        }

    def _single_request(self, topic: str, message: Message | bytes | str,
                        queue_id: int | None, delay_level: int | None = None,
                        deliver_at: int | None = None) -> _SendRequest:
        """The request of :meth:`send` (BlockingProducer builds it the same way)."""
        msg = _as_message(message)
        if delay_level is None and deliver_at is None and _is_plain(msg):
            uid = new_uniq_key()
            return self._encoded_request(topic, msg, _plain_properties(uid), uid, queue_id)
        props = self._properties(msg)
        if delay_level is not None or deliver_at is not None:
            delay_properties(props, delay_level, deliver_at)
        return self._message_request(topic, msg, props, queue_id)

    def _message_request(self, topic: str, msg: Message, props: dict[str, str],
                         queue_id: int | None, sys_flag: int = 0) -> _SendRequest:
        """SEND_MESSAGE_V2 of one message with these properties (a transaction's prepared
        message adds its own properties and ``sys_flag``); the body is compressed when
        over ``compress_over_bytes``."""
        return self._encoded_request(topic, msg, encode_properties(props), props[Prop.UNIQ_KEY],
                                     queue_id, sys_flag)

    def _encoded_request(self, topic: str, msg: Message, properties: str, uid: str,
                         queue_id: int | None, sys_flag: int = 0) -> _SendRequest:
        """:meth:`_message_request` with the properties encoded already."""
        body = msg.body
        if self.compress_over_bytes >= 0 and len(body) > self.compress_over_bytes:
            body, compressed = compress(body, self.compression)
            sys_flag |= compressed
        header = self._header(topic, sys_flag, msg.flag, properties, False)
        return _SendRequest(topic, RequestCode.SEND_MESSAGE_V2, header, body, [uid], queue_id)

    def _batch_requests(self, topic: str, messages: Sequence[Message | bytes | str],
                        queue_id: int | None) -> Iterator[_SendRequest]:
        """The SEND_BATCH_MESSAGE requests of :meth:`send_batch`: one per chunk of at most
        ``max_batch_bytes``, each built when the one before it was sent."""
        # Every item checked before the first chunk leaves; a body alone stays as it is.
        msgs = [m if type(m) is bytes else _as_message(m) for m in messages]
        chunk: list[_BatchEntry] = []
        uids: list[str] = []
        size = 0
        for m, uid in zip(msgs, new_uniq_keys(len(msgs))):
            if type(m) is bytes:
                entry, item_size = _plain_entry(m, 0, uid)  # no Message made for a body alone
            else:
                entry, uid, item_size = self._batch_entry(m, uid)
            if chunk and size + item_size > self.max_batch_bytes:
                yield self._chunk_request(topic, chunk, uids, queue_id)
                chunk, uids, size = [], [], 0
            chunk.append(entry)
            uids.append(uid)
            size += item_size
        if chunk:
            yield self._chunk_request(topic, chunk, uids, queue_id)

    def _batch_entry(self, msg: Message, uid: str) -> tuple[_BatchEntry, str, int]:
        """``msg`` as a batch entry, the UNIQ_KEY it carries (``uid`` unless the message
        names its own) and the upper bound of its encoded size that chunks are cut by
        (header, body, the property pairs counted four bytes a character)."""
        if _is_plain(msg):
            entry, size = _plain_entry(msg.body, msg.flag, uid)
            return entry, uid, size
        props = self._properties(msg, uid)
        size = 22 + len(msg.body) + sum(len(k) + len(v) + 2 for k, v in props.items()) * 4
        entry = (msg.body, encode_properties(props).encode("utf-8"), msg.flag)
        return entry, props[Prop.UNIQ_KEY], size

    def _chunk_request(self, topic: str, chunk: list[_BatchEntry], uids: list[str],
                       queue_id: int | None) -> _SendRequest:
        body = encode_batch_entries(chunk)
        sys_flag = 0
        if (self.compress_batches and self.compress_over_bytes >= 0
                and len(body) > self.compress_over_bytes):
            # The whole batch travels compressed; the broker inflates it before storing.
            body, sys_flag = compress(body, self.compression)
        header = self._header(topic, sys_flag, 0, encode_properties({Prop.WAIT: "true"}), True)
        return _SendRequest(topic, RequestCode.SEND_BATCH_MESSAGE, header, body, uids, queue_id)

    async def _route(self, topic: str, refresh: bool) -> TopicRoute:
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

    def _attempts(self) -> _Attempts:
        """The state of a new send: its retry deadline starts now."""
        return _Attempts(time.monotonic() + self.retry_deadline_s)

    def _target(self, route: TopicRoute, req: _SendRequest,
                tried: _Attempts) -> tuple[str, MessageQueue]:
        """Where the next attempt goes: a queue of the route, at its master or at the
        address the last refusal named.  ClientError if the route has no writable queue."""
        mq = self._pick(route, tried.avoid, req.queue_id)
        addr = tried.redirect or route.broker_datas[mq.broker_name].master
        tried.redirect = None
        assert addr is not None  # publish_queues() holds only groups with a master
        return addr, mq

    def _cached_target(self, req: _SendRequest,
                       tried: _Attempts) -> tuple[str, MessageQueue] | None:
        """:meth:`_target` on the cached route, without I/O; None if the route is not
        cached, stale or without a writable queue (the retry loop asks the name server)."""
        route = self.session.fresh_route(req.topic)
        if route is None:
            return None
        try:
            return self._target(route, req, tried)
        except ClientError:
            return None

    @staticmethod
    def _command(req: _SendRequest, mq: MessageQueue) -> RemotingCommand:
        # A fresh header dict per attempt, handed over as is: every value is a str.
        return RemotingCommand(code=req.code, opaque=next_opaque(),
                               ext_fields={**req.header, "e": str(mq.queue_id)}, body=req.body)

    def _answer(self, resp: RemotingCommand, addr: str, mq: MessageQueue, req: _SendRequest,
                tried: _Attempts) -> list[SendResult] | None:
        """The results if ``resp`` is a send status; else None, with the refusal noted in
        ``tried`` (``tried.final`` when no retry can help)."""
        status = _STATUS.get(resp.code)
        if status is not None:
            return self._results(resp, status, mq, req.uniq_keys, tried.made)
        tried.refused(resp, addr, mq.broker_name)
        return None

    async def _send_with_retries(self, req: _SendRequest,
                                 tried: _Attempts | None = None) -> list[SendResult]:
        """Attempts until one is answered with a send status; SendError after a refusal
        no retry can change, ``max_attempts`` or ``retry_deadline_s``.  ``tried`` carries
        on from attempts made elsewhere (BlockingProducer's first one)."""
        if tried is None:
            tried = self._attempts()
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
                    route = await self._route(req.topic, tried.refresh)
                addr, mq = self._target(route, req, tried)
            except ClientError as exc:
                tried.no_route(exc)
                continue
            try:
                resp = await self.session.request(addr, self._command(req, mq),
                                                  self.send_timeout_s)
            except RemotingError as exc:
                tried.lost(exc, mq.broker_name)
                continue
            results = self._answer(resp, addr, mq, req, tried)
            if results is not None:
                return results
            if tried.final:
                break
        raise tried.error(req.topic)

    def _results(self, resp: RemotingCommand, status: SendStatus, mq: MessageQueue,
                 uniq_keys: list[str], attempts: int) -> list[SendResult]:
        ext = resp.ext_fields
        try:
            queue_id = int(ext.get("queueId", mq.queue_id))
            first = int(ext["queueOffset"])
        except (KeyError, ValueError) as exc:
            raise ProtocolError(f"send response without queueOffset: {ext}") from exc
        ids = ext.get("msgId", "").split(",")
        # The picked queue itself unless the broker stored elsewhere (a frozen dataclass
        # costs a microsecond to make, on every send).
        queue = mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
        return [
            SendResult(status, uid, ids[i] if i < len(ids) else "", queue, first + i, attempts)
            for i, uid in enumerate(uniq_keys)
        ]


@dataclass(eq=False)
class _ThreadSender:
    """One sending thread's own loop, :class:`Producer` (its connections and route cache)
    and blocking links (one :class:`BlockingLink` per broker address)."""

    loop: asyncio.AbstractEventLoop
    producer: Producer
    #: Held by the owner while it sends and by whoever closes this (close() from another
    #: thread waits for the send in progress).
    lock: threading.Lock = field(default_factory=threading.Lock)
    links: dict[str, BlockingLink] = field(default_factory=dict)
    closed: bool = False

    def send(self, requests: Iterable[_SendRequest]) -> list[SendResult]:
        """Send each request in turn (the caller's thread is the owner)."""
        results: list[SendResult] = []
        with self.lock:
            if self.closed:
                raise ClientError("producer is closed")
            for req in requests:
                results += self._send_one(req)
        return results

    def _send_one(self, req: _SendRequest) -> list[SendResult]:
        """The first attempt over a blocking link when the route is cached and fresh; the
        answer is used as the retry loop uses it, and anything but a send status leaves
        the rest to that loop, run on this thread's loop with what the attempt learned."""
        producer = self.producer
        tried = producer._attempts()
        target = producer._cached_target(req, tried)
        if target is not None:
            addr, mq = target
            tried.made = 1
            link = self.links.get(addr)
            if link is None:
                link = self.links[addr] = BlockingLink(addr, security=producer.session.security)
            try:
                resp = link.request(producer._command(req, mq), producer.send_timeout_s)
            except (RemotingError, ProtocolError) as exc:
                del self.links[addr]  # it closed its socket; a dead master's goes for good
                tried.lost(exc, mq.broker_name)
            else:
                results = producer._answer(resp, addr, mq, req, tried)
                if results is not None:
                    return results
                if tried.final:
                    raise tried.error(req.topic)
        return self.loop.run_until_complete(producer._send_with_retries(req, tried))

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

    Each thread that sends gets a :class:`_ThreadSender`: a private loop and
    :class:`Producer` (its own connections and route cache) and blocking links.  A send
    whose route is cached makes its first attempt over a blocking socket (see
    :class:`_ThreadSender`); the rest (route lookups, retries) runs on the thread's loop,
    driven with ``run_until_complete`` in that thread.  Either way a send costs no hop to
    another thread and back (two wake-ups, 0.1-0.2 ms on a busy machine).  Between calls
    nothing runs: what arrives meanwhile (a closed connection, a late answer) is handled
    at the next call, and a dead connection fails over as any lost connection does.  The
    senders of threads that ended are closed when a new thread starts sending (and all of
    them by :meth:`close`).  A thread that already runs an asyncio loop cannot block
    inside it, and transactions need a loop that always runs: those calls (all calls,
    once a transaction was used) go through one shared loop thread.
    """

    def __init__(self, make: Callable[[], Producer]) -> None:
        self._make = make
        self._local = threading.local()
        self._all: list[_ThreadSender] = []
        self._all_lock = threading.Lock()
        #: the thread each entry of _all belongs to (an ended thread's entry is closed)
        self._owners: dict[threading.Thread, _ThreadSender] = {}
        self._fallback: EventLoopThread | None = None
        self._fallback_producer: Producer | None = None
        self._pinned = False
        self._closed = False

    def _own(self) -> _ThreadSender:
        mine: _ThreadSender | None = getattr(self._local, "mine", None)
        if mine is None:
            if self._closed:
                raise ClientError("producer is closed")
            loop = event_loop.new_call_loop()
            mine = _ThreadSender(loop, loop.run_until_complete(self._created()))
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

    def sender(self) -> _ThreadSender | None:
        """This thread's own sender; None when its calls go through the shared loop
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
        for sender in owned:
            sender.close(timeout)
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
        sender = self._loop.sender()
        if sender is None:
            return self._loop.run_shared(self._loop.shared_producer.send(
                topic, message, queue_id=queue_id, delay_level=delay_level,
                deliver_at=deliver_at))
        req = sender.producer._single_request(topic, message, queue_id, delay_level, deliver_at)
        return sender.send((req,))[0]

    def send_batch(self, topic: str, messages: Sequence[Message | bytes | str], *,
                   queue_id: int | None = None) -> list[SendResult]:
        """See :meth:`Producer.send_batch`."""
        sender = self._loop.sender()
        if sender is None:
            return self._loop.run_shared(self._loop.shared_producer.send_batch(
                topic, messages, queue_id=queue_id))
        return sender.send(sender.producer._batch_requests(topic, messages, queue_id))

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
