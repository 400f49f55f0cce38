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
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rmqha import event_loop
from rmqha.client.model import Message, MessageQueue, SendResult, SendStatus
from rmqha.client.route import ClientSession, QueueData, TopicRoute
from rmqha.client.transaction import (
    CheckListener,
    LocalTransaction,
    TransactionSendResult,
    TransactionSupport,
    delay_properties,
)
from rmqha.codes import RequestCode, ResponseCode
from rmqha.errors import (
    ClientError,
    ProtocolError,
    RemotingError,
    RemotingTimeoutError,
    SendError,
    TopicNotFoundError,
)
from rmqha.messaging.message import (
    DEFAULT_COMPRESS_OVER_BYTES,
    BatchItem,
    CompressionType,
    Prop,
    compress,
    encode_batch,
    encode_properties,
    new_uniq_key,
)
from rmqha.messaging.topics import DEFAULT_TOPIC
from rmqha.remoting import EventLoopThread, RemotingCommand, next_opaque

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


def _as_message(m: Message | bytes | str) -> Message:
    if isinstance(m, Message):
        return m
    if isinstance(m, str):
        return Message(m.encode("utf-8"))
    return Message(bytes(m))


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
    ) -> None:
        self.group = group
        self.session = ClientSession(namesrv, rpc_timeout_s=send_timeout_s)
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
        (epoch ms) hold the message back until then."""
        msg = _as_message(message)
        props = self._properties(msg)
        if delay_level is not None or deliver_at is not None:
            delay_properties(props, delay_level, deliver_at)
        body, sys_flag = msg.body, 0
        if self.compress_over_bytes >= 0 and len(body) > self.compress_over_bytes:
            body, sys_flag = compress(body, self.compression)
        # Header values as the strings they travel as (SendMessageRequestHeaderV2's short
        # names), so encoding converts nothing.
        header = {
            "a": self.group, "b": topic, "c": "TBW102", "d": "4", "f": str(sys_flag),
            "g": str(time.time_ns() // 1_000_000), "h": str(msg.flag),
            "i": encode_properties(props), "j": "0", "k": "false", "m": "false",
        }
        results = await self._send_with_retries(topic, RequestCode.SEND_MESSAGE_V2, header,
                                                body, [props[Prop.UNIQ_KEY]], queue_id)
        return results[0]

    async def send_batch(self, topic: str, messages: Sequence[Message | bytes | str], *,
                         queue_id: int | None = None) -> list[SendResult]:
        """Send messages as batches (one queue per batch); one result per message, in order."""
        msgs = [_as_message(m) for m in messages]
        results: list[SendResult] = []
        chunk: list[tuple[BatchItem, str]] = []
        size = 0
        for m in msgs:
            props = self._properties(m)
            item = BatchItem(m.body, props, m.flag)
            # Upper bound of the encoded size (header, body, k\x01v\x02 pairs).
            item_size = 22 + len(m.body) + sum(len(k) + len(v) + 2 for k, v in props.items()) * 4
            if chunk and size + item_size > self.max_batch_bytes:
                results += await self._send_chunk(topic, chunk, queue_id)
                chunk, size = [], 0
            chunk.append((item, props[Prop.UNIQ_KEY]))
            size += item_size
        if chunk:
            results += await self._send_chunk(topic, chunk, queue_id)
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

    def _properties(self, msg: Message) -> dict[str, str]:
        props = dict(msg.properties)
        if msg.tags:
            props[Prop.TAGS] = msg.tags
        if msg.keys:
            props[Prop.KEYS] = msg.keys
        props.setdefault(Prop.UNIQ_KEY, new_uniq_key())
        props[Prop.WAIT] = "true"
        return props

    async def _send_chunk(self, topic: str, chunk: list[tuple[BatchItem, str]],
                          queue_id: int | None) -> list[SendResult]:
        body = encode_batch(item for item, _ in chunk)
        sys_flag = 0
        if (self.compress_batches and self.compress_over_bytes >= 0
                and len(body) > self.compress_over_bytes):
            # The whole batch travels compressed; the broker inflates it before storing.
            body, sys_flag = compress(body, self.compression)
        header = {
            "a": self.group, "b": topic, "c": "TBW102", "d": "4", "f": str(sys_flag),
            "g": str(time.time_ns() // 1_000_000), "h": "0",
            "i": encode_properties({Prop.WAIT: "true"}), "j": "0", "k": "false", "m": "true",
        }
        return await self._send_with_retries(topic, RequestCode.SEND_BATCH_MESSAGE, header,
                                             body, [uid for _, uid in chunk], queue_id)

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

    async def _send_with_retries(self, topic: str, code: int, header: dict[str, str],
                                 body: bytes, uniq_keys: list[str],
                                 queue_id: int | None) -> list[SendResult]:
        deadline = time.monotonic() + self.retry_deadline_s
        avoid: str | None = None
        redirect: str | None = None
        refresh = False
        last_code: int | None = None
        last_status = ""
        last_error = ""
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1:
                delay = min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 2)))
                if time.monotonic() + delay > deadline:
                    break
                await asyncio.sleep(delay)
            try:
                route = None if refresh else self.session.fresh_route(topic)
                if route is None:
                    route = await self._route(topic, refresh)
                mq = self._pick(route, avoid, queue_id)
            except ClientError as exc:
                last_error, last_status, refresh = str(exc), "NO_ROUTE", True
                continue
            addr = redirect or route.broker_datas[mq.broker_name].master
            redirect = None
            assert addr is not None
            # A fresh header dict per attempt, handed over as is: every value is a str.
            req = RemotingCommand(code=code, opaque=next_opaque(),
                                  ext_fields={**header, "e": str(mq.queue_id)}, body=body)
            try:
                resp = await self.session.request(addr, req, self.send_timeout_s)
            except RemotingError as exc:
                # A timed-out send may have been stored: the retry keeps the UNIQ_KEYs, so
                # readers can drop the duplicate.
                timed_out = isinstance(exc, RemotingTimeoutError)
                last_error, last_status = str(exc), "TIMEOUT" if timed_out else "CONNECTION"
                refresh, avoid = True, mq.broker_name
                continue
            status = _STATUS.get(resp.code)
            if status is not None:
                return self._results(resp, status, mq, uniq_keys, attempt)
            last_code, last_error = resp.code, resp.remark or ""
            last_status = resp.ext_fields.get("putStatus", "")
            if resp.code not in _RETRYABLE:
                break
            refresh = True
            master = resp.ext_fields.get("masterAddress", "") or _master_in_remark(
                resp.remark or "")
            if master and master != addr:
                redirect = master  # a slave named its master: go there directly
            else:
                avoid = mq.broker_name
        raise SendError(
            f"send to {topic} failed after {attempt} attempt(s): "
            f"{last_status or last_code} {last_error}".strip(), last_code, last_status)

    def _results(self, resp: RemotingCommand, status: SendStatus, mq: MessageQueue,
                 uniq_keys: list[str], attempts: int) -> list[SendResult]:
        ext = resp.ext_fields
        try:
            queue_id = int(ext.get("queueId", mq.queue_id))
            first = int(ext["queueOffset"])
        except (KeyError, ValueError) as exc:
            raise ProtocolError(f"send response without queueOffset: {ext}") from exc
        ids = ext.get("msgId", "").split(",")
        queue = MessageQueue(mq.topic, mq.broker_name, queue_id)
        return [
            SendResult(status, uid, ids[i] if i < len(ids) else "", queue, first + i, attempts)
            for i, uid in enumerate(uniq_keys)
        ]


class _ThreadLoops:
    """Runs a BlockingProducer's coroutines on the calling thread's own event loop.

    Each thread that sends gets a private loop and :class:`Producer` (its own connections
    and route cache), driven with ``run_until_complete`` in that thread: a send costs no
    hop to another thread and back (two wake-ups, 0.1-0.2 ms on a busy machine).  Between
    calls the loop does not run; what arrives meanwhile (a closed connection, a late
    answer) is handled at the next call, and a dead connection fails over as any lost
    connection does.  The loops of threads that ended are closed when a new thread starts
    sending (and all of them by :meth:`close`).  A thread that already runs an asyncio
    loop cannot block inside it, and transactions need a loop that always runs: those
    calls (all calls, once a transaction was used) go through one shared loop thread.
    """

    def __init__(self, make: Callable[[], Producer]) -> None:
        self._make = make
        self._local = threading.local()
        self._all: list[tuple[asyncio.AbstractEventLoop, Producer, threading.Lock]] = []
        self._all_lock = threading.Lock()
        #: the thread each entry of _all belongs to (an ended thread's entry is closed)
        self._owners: dict[threading.Thread, tuple[asyncio.AbstractEventLoop, Producer,
                                                   threading.Lock]] = {}
        self._fallback: EventLoopThread | None = None
        self._fallback_producer: Producer | None = None
        self._pinned = False
        self._closed = False

    def _own(self) -> tuple[asyncio.AbstractEventLoop, Producer, threading.Lock]:
        mine = getattr(self._local, "mine", None)
        if mine is None:
            if self._closed:
                raise ClientError("producer is closed")
            loop = event_loop.new_call_loop()
            mine = (loop, loop.run_until_complete(self._created()), threading.Lock())
            with self._all_lock:
                gone = [e for t, e in self._owners.items() if not t.is_alive()]
                for e in gone:
                    self._all.remove(e)
                self._owners = {t: e for t, e in self._owners.items() if t.is_alive()}
                self._all.append(mine)
                self._owners[threading.current_thread()] = mine
            self._local.mine = mine
            for e in gone:  # threads that sent once and ended: free their connections
                self._close_one(*e)
        return mine

    @staticmethod
    def _close_one(loop: asyncio.AbstractEventLoop, producer: Producer, lock: threading.Lock,
                   timeout: float = 10.0) -> None:
        with lock:
            try:
                loop.run_until_complete(asyncio.wait_for(producer.close(), timeout))
            finally:
                loop.close()

    async def _created(self) -> Producer:
        return self._make()

    @staticmethod
    def _in_async_thread() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

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

    @property
    def producer(self) -> Producer:
        """This thread's Producer (the shared one in a thread that runs a loop, or once
        pinned)."""
        if self._pinned or self._in_async_thread():
            return self._shared()[1]
        return self._own()[1]

    def run(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` (made from :attr:`producer`) to completion and return its result."""
        if self._closed:
            if inspect.iscoroutine(coro):
                coro.close()  # never awaited: say so quietly, not with a RuntimeWarning
            raise ClientError("producer is closed")
        if self._pinned or self._in_async_thread():
            return self._shared()[0].run(coro, timeout)
        loop, _, lock = self._own()
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        with lock:
            return loop.run_until_complete(coro)

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        with self._all_lock:
            owned, self._all = self._all, []
            self._owners.clear()
            fallback, self._fallback = self._fallback, None
            fallback_producer, self._fallback_producer = self._fallback_producer, None
        for loop, producer, lock in owned:
            self._close_one(loop, producer, lock, timeout)
        if fallback is not None:
            try:
                if fallback_producer is not None:
                    fallback.run(fallback_producer.close(), timeout)
            finally:
                fallback.stop()


class BlockingProducer:
    """The producer for synchronous code.

    Each sending thread drives its own asyncio loop and :class:`Producer` in place (see
    :class:`_ThreadLoops`), so one message costs no thread hop; threads send
    concurrently, each over its own connections.
    """

    def __init__(self, namesrv: str | list[str], group: str = "rmqha_producer",
                 **options: Any) -> None:
        # Made once here so bad options fail in the constructor, not at the first send.
        Producer(namesrv, group, **options)
        self._loop = _ThreadLoops(lambda: Producer(namesrv, group, **options))

    @property
    def _producer(self) -> Producer:
        return self._loop.producer

    def send(self, topic: str, message: Message | bytes | str, *,
             queue_id: int | None = None, delay_level: int | None = None,
             deliver_at: int | None = None) -> SendResult:
        return self._loop.run(self._producer.send(topic, message, queue_id=queue_id,
                                                  delay_level=delay_level,
                                                  deliver_at=deliver_at))

    def send_batch(self, topic: str, messages: Sequence[Message | bytes | str], *,
                   queue_id: int | None = None) -> list[SendResult]:
        return self._loop.run(self._producer.send_batch(topic, messages, queue_id=queue_id))

    def send_transaction(self, topic: str, message: Message | bytes | str,
                         local_transaction: LocalTransaction, arg: Any = None, *,
                         queue_id: int | None = None) -> TransactionSendResult:
        self._loop.pin_shared()
        return self._loop.run(self._producer.send_transaction(
            topic, message, local_transaction, arg, queue_id=queue_id))

    def set_transaction_check_listener(self, check: CheckListener, *,
                                       topics: Sequence[str] = ()) -> None:
        self._loop.pin_shared()

        async def register() -> None:
            self._producer.set_transaction_check_listener(check, topics=topics)

        self._loop.run(register())

    def close(self) -> None:
        self._loop.close()

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
