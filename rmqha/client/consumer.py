"""rmqha's consumer: pull every queue of a topic assigned to this member of the group.

Members of a group share a topic's queues (RocketMQ's AllocateMessageQueueAveragely over
the group's member list, which every broker keeps from heartbeats); the assignment is
recomputed at start, every ``rebalance_interval_s`` and when a broker says the group
changed.  Each owned queue has a pull task that long-polls the broker (the master, or
any replica while the master is gone) and feeds decoded, decompressed messages to
:meth:`Consumer.poll`.  Offsets: messages handed out by a ``poll()`` count as processed
at the next ``poll()`` or ``commit()`` (at-least-once); processed offsets are committed to
the broker every ``commit_interval_s``, when a queue moves to another member, and on
close, so a restarted consumer resumes where it stopped.  A body that does not
decompress is delivered raw with ``decompress_error`` set, never dropped; a queue whose
offset fell below the retained log is logged with the number of messages skipped.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rmqha.client.model import MessageQueue, ReceivedMessage
from rmqha.client.pull_buffer import Handed, PullBuffer
from rmqha.client.route import ClientSession, TopicRoute
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ClientError, ProtocolError, RemotingError
from rmqha.protocol.headers import (
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    ConsumerData,
    ConsumerListHeader,
    HeartbeatData,
    PullHeader,
    QueryConsumerOffsetHeader,
    SubscriptionData,
    UnregisterClientHeader,
    UpdateConsumerOffsetHeader,
)
from rmqha.protocol.message import decode_records, parse_subscription
from rmqha.net.client_security import ClientSecurity, TlsOption
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand

log = logging.getLogger(__name__)

#: The first retry of a subscribed topic's missing route.
_ROUTE_RETRY_MIN_S = 0.1

_PULL_SUSPEND_AND_SUBSCRIPTION = PULL_SUSPEND | PULL_SUBSCRIPTION


def allocate_averagely(queues: Sequence[MessageQueue], members: Sequence[str],
                       me: str) -> list[MessageQueue]:
    """RocketMQ's AllocateMessageQueueAveragely (queues and members sorted by the caller)."""
    if me not in members or not queues:
        return []
    index = members.index(me)
    n, m = len(queues), len(members)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n - start)
    return [queues[(start + i) % n] for i in range(max(0, count))]


@dataclass
class _QueueState:
    mq: MessageQueue
    next_offset: int  # next offset to pull
    processed: int  # next offset after what the application has processed
    committed: int
    #: Messages of this queue buffered or handed out and not yet processed.
    pending: int = 0
    task: asyncio.Task[None] | None = None
    suggested_id: int = 0
    skipped: int = 0
    stop: bool = field(default=False)


class Consumer:
    """Asyncio consumer of one or more topics in a consumer group (clustering mode)."""

    def __init__(
        self,
        namesrv: str | list[str],
        group: str,
        topics: str | Sequence[str],
        *,
        tags: str = "*",
        client_id: str | None = None,
        pull_batch: int = 32,
        long_poll_s: float = 15.0,
        commit_interval_s: float = 1.0,
        rebalance_interval_s: float = 10.0,
        heartbeat_interval_s: float = 10.0,
        rpc_timeout_s: float = 3.0,
        buffer_messages: int = 4096,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: TlsOption = None,
    ) -> None:
        self.group = group
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.tags = tags
        self._tag_set = parse_subscription(tags)
        host = socket.gethostbyname(socket.gethostname()) if client_id is None else ""
        self.client_id = client_id or f"{host}@{os.getpid()}#{time.monotonic_ns()}"
        self.pull_batch = pull_batch
        self.long_poll_s = long_poll_s
        self.commit_interval_s = commit_interval_s
        self.rebalance_interval_s = rebalance_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.session = ClientSession(namesrv, rpc_timeout_s=rpc_timeout_s, security=ClientSecurity.from_options(
            access_key=access_key, secret_key=secret_key, tls=tls))
        self.session.on_consumer_ids_changed = self._ids_changed
        self._queues: dict[MessageQueue, _QueueState] = {}
        self._buffer: PullBuffer[MessageQueue] = PullBuffer(buffer_messages)
        self._handed: list[Handed[MessageQueue]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_now = asyncio.Event()
        #: How soon a topic without a route is asked for again (doubles while it has none).
        self._route_retry_s = _ROUTE_RETRY_MIN_S
        self._rebalance_lock = asyncio.Lock()
        self._routes: dict[str, TopicRoute] = {}
        self._closed = False
        self._started = False

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> Consumer:
        if self._started:
            return self
        self._started = True
        await self._refresh_routes()
        await self._heartbeat_all()
        await self._rebalance()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._housekeeping()))
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        for st in self._queues.values():
            st.stop = True
            if st.task is not None:
                st.task.cancel()
        for t in self._tasks + [s.task for s in self._queues.values() if s.task]:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._mark_processed()
        await self.commit()
        await self._unregister()
        await self.session.close()

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- public API ---------------------------------------------------------------------

    async def poll(self, timeout: float = 1.0, max_messages: int = 256) -> list[ReceivedMessage]:
        """Messages that arrived (waits up to ``timeout`` for the first one).  Calling it
        again marks the previous batch processed."""
        self._mark_processed()
        out, self._handed = await self._buffer.take(timeout, max_messages)
        return out

    async def commit(self) -> None:
        """Commit everything handed out so far as processed."""
        self._mark_processed()
        # One round trip for all queues rather than one after another (close waits on it).
        await asyncio.gather(*(self._commit_queue(st) for st in list(self._queues.values())))

    def assignment(self) -> list[MessageQueue]:
        return sorted(self._queues)

    def positions(self) -> dict[MessageQueue, int]:
        return {mq: st.processed for mq, st in self._queues.items()}

    # --- internals: offsets -------------------------------------------------------------

    def _mark_processed(self) -> None:
        for mq, size, next_offset in self._handed:
            st = self._queues.get(mq)
            if st is None:
                continue
            st.pending -= size
            if next_offset > st.processed:
                st.processed = next_offset
        self._handed = []
        for st in self._queues.values():
            self._skip_filtered(st)

    def _admin_address(self, mq: MessageQueue) -> str | None:
        route = self._routes.get(mq.topic)
        bd = None if route is None else route.broker_datas.get(mq.broker_name)
        return None if bd is None else bd.any_address()

    async def _commit_queue(self, st: _QueueState) -> None:
        if st.processed <= st.committed:
            return
        addr = self._admin_address(st.mq)
        if addr is None:
            return
        offset = st.processed
        header = UpdateConsumerOffsetHeader(consumer_group=self.group, topic=st.mq.topic,
                                            queue_id=st.mq.queue_id, commit_offset=offset)
        req = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, header.build())
        try:
            resp = await self.session.request(addr, req, self.rpc_timeout_s)
        except RemotingError as exc:
            log.warning("commit of %s offset %d failed: %s", st.mq, offset, exc)
            return
        if resp.code == ResponseCode.SUCCESS:
            st.committed = max(st.committed, offset)
        else:
            log.warning("commit of %s offset %d refused: %s %s", st.mq, offset, resp.code,
                        resp.remark)

    async def _query_offset(self, mq: MessageQueue) -> int:
        addr = self._admin_address(mq)
        if addr is None:
            raise ClientError(f"no broker address for {mq}")
        resp = await self.session.request(addr, RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET, QueryConsumerOffsetHeader(
                consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id).build()))
        if resp.code == ResponseCode.SUCCESS:
            return int(resp.ext_fields.get("offset", "0"))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return 0
        raise ClientError(f"offset query for {mq} refused: {resp.code} {resp.remark}")

    # --- internals: membership ----------------------------------------------------------

    def _ids_changed(self, group: str) -> None:
        if group == self.group:
            self._rebalance_now.set()

    async def _refresh_routes(self) -> None:
        for topic in self.topics:
            try:
                self._routes[topic] = await self.session.route(topic, refresh=True)
            except (ClientError, ProtocolError) as exc:
                log.warning("route of %s unavailable: %s", topic, exc)

    def _heartbeat_body(self) -> dict[str, Any]:
        version = int(time.time() * 1000)
        subscriptions = [SubscriptionData(t, self.tags, version) for t in self.topics]
        return HeartbeatData(self.client_id, [ConsumerData(self.group, subscriptions)]).build()

    async def _heartbeat_all(self) -> None:
        body = self._heartbeat_body()
        addrs = sorted({a for r in self._routes.values() for a in r.addresses()})
        for addr in addrs:
            try:
                await self.session.request(addr, RemotingCommand.request(
                    RequestCode.HEART_BEAT, None, body), self.rpc_timeout_s)
            except RemotingError as exc:
                log.debug("heartbeat to %s failed: %s", addr, exc)

    async def _unregister(self) -> None:
        addrs = sorted({a for r in self._routes.values() for a in r.addresses()})
        for addr in addrs:
            try:
                await self.session.request(addr, RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT, UnregisterClientHeader(
                        client_id=self.client_id, consumer_group=self.group).build()), 1.0)
            except RemotingError as exc:
                log.debug("unregister at %s failed: %s", addr, exc)

    async def _members(self, route: TopicRoute) -> list[str] | None:
        for bd in sorted(route.broker_datas.values(), key=lambda b: b.broker_name):
            addr = bd.any_address()
            if addr is None:
                continue
            try:
                resp = await self.session.request(addr, RemotingCommand.request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                    ConsumerListHeader(consumer_group=self.group).build()))
            except RemotingError as exc:
                log.debug("consumer list from %s failed: %s", addr, exc)
                continue
            if resp.code != ResponseCode.SUCCESS:
                continue
            body = resp.json_body() or {}
            ids = sorted(str(i) for i in body.get("consumerIdList", []))
            if self.client_id in ids:
                return ids
        return None

    async def _rebalance(self) -> None:
        async with self._rebalance_lock:
            wanted: set[MessageQueue] = set()
            known_topics = set()
            for topic in self.topics:
                route = self._routes.get(topic)
                if route is None:
                    continue
                members = await self._members(route)
                if members is None:
                    # Membership unknown (brokers unreachable): keep what we own.
                    wanted |= {mq for mq in self._queues if mq.topic == topic}
                    known_topics.add(topic)
                    continue
                known_topics.add(topic)
                wanted |= set(allocate_averagely(route.subscribe_queues(), members,
                                                 self.client_id))
            for mq in [m for m in self._queues if m not in wanted and m.topic in known_topics]:
                await self._drop_queue(mq)
            new = sorted(wanted - set(self._queues))
            # Asked all at once: a start waits one round trip, not one per queue.
            found = await asyncio.gather(*(self._query_offset(mq) for mq in new),
                                         return_exceptions=True)
            for mq, offset in zip(new, found):
                if isinstance(offset, (ClientError, RemotingError)):
                    log.warning("cannot start %s: %s", mq, offset)
                    continue
                if isinstance(offset, BaseException):
                    raise offset
                st = _QueueState(mq, offset, offset, offset)
                self._queues[mq] = st
                st.task = asyncio.get_running_loop().create_task(self._pull_loop(st))

    async def _drop_queue(self, mq: MessageQueue) -> None:
        st = self._queues.get(mq)
        if st is None:
            return
        st.stop = True
        if st.task is not None:
            st.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await st.task
        self._mark_processed()
        await self._commit_queue(st)
        del self._queues[mq]
        # Buffered messages of the queue were never handed out: the new owner reads them
        # from the committed offset, so keeping them here would only duplicate them.
        self._buffer.drop(mq)

    async def _housekeeping(self) -> None:
        last_commit = last_rebalance = last_heartbeat = time.monotonic()
        while not self._closed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._rebalance_now.wait(), self._housekeeping_wait())
            now = time.monotonic()
            try:
                await self._retry_missing_routes()
                if now - last_commit >= self.commit_interval_s:
                    last_commit = now
                    for st in list(self._queues.values()):
                        await self._commit_queue(st)
                if now - last_heartbeat >= self.heartbeat_interval_s:
                    last_heartbeat = now
                    await self._refresh_routes()
                    await self._heartbeat_all()
                due = now - last_rebalance >= self.rebalance_interval_s
                if self._rebalance_now.is_set() or due:
                    self._rebalance_now.clear()
                    last_rebalance = now
                    await self._rebalance()
            except (ClientError, RemotingError, ProtocolError) as exc:
                log.warning("consumer housekeeping: %s", exc)

    def _housekeeping_wait(self) -> float:
        wait = min(self.commit_interval_s, 1.0)
        if any(t not in self._routes for t in self.topics):
            wait = min(wait, self._route_retry_s)
        return wait

    async def _retry_missing_routes(self) -> None:
        """A topic without a route yet (a producer's first send created it a moment ago and
        the broker's registration is on its way) is asked for again soon, backing off, so
        the consumer starts within a fraction of a second instead of at the next heartbeat."""
        if all(t in self._routes for t in self.topics):
            self._route_retry_s = _ROUTE_RETRY_MIN_S
            return
        await self._refresh_routes()
        if all(t in self._routes for t in self.topics):
            await self._heartbeat_all()
            self._rebalance_now.set()
        else:
            self._route_retry_s = min(self._route_retry_s * 2, self.heartbeat_interval_s)

    # --- internals: pulling -------------------------------------------------------------

    def _pull_address(self, st: _QueueState) -> str | None:
        route = self._routes.get(st.mq.topic)
        bd = None if route is None else route.broker_datas.get(st.mq.broker_name)
        if bd is None:
            return None
        return bd.broker_addrs.get(st.suggested_id) or bd.any_address()

    @staticmethod
    def _skip_filtered(st: _QueueState) -> None:
        """With nothing of the queue waiting to be processed, everything below the next
        pull offset is done (messages filtered out by tag included): committing it keeps
        a restarted member from scanning them again."""
        if st.pending == 0 and st.next_offset > st.processed:
            st.processed = st.next_offset

    async def _pull_loop(self, st: _QueueState) -> None:
        backoff = 0.05
        while not st.stop and not self._closed:
            addr = self._pull_address(st)
            if addr is None:
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                await self._refresh_routes()
                continue
            req = RemotingCommand.request(RequestCode.PULL_MESSAGE, PullHeader(
                consumer_group=self.group, topic=st.mq.topic, queue_id=st.mq.queue_id,
                queue_offset=st.next_offset, max_msg_nums=self.pull_batch,
                sys_flag=_PULL_SUSPEND_AND_SUBSCRIPTION, commit_offset=0,
                suspend_timeout_ms=int(self.long_poll_s * 1000), subscription=self.tags,
            ).build())
            try:
                resp = await self.session.request(addr, req, self.long_poll_s + self.rpc_timeout_s)
            except RemotingError as exc:
                log.debug("pull %s from %s failed: %s", st.mq, addr, exc)
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                await self._refresh_routes()
                continue
            ext = resp.ext_fields
            try:
                next_begin = int(ext.get("nextBeginOffset", st.next_offset))
                st.suggested_id = int(ext.get("suggestWhichBrokerId", 0))
            except ValueError:
                next_begin = st.next_offset
            if resp.code == ResponseCode.SUCCESS:
                backoff = 0.05
                try:
                    msgs = decode_records(resp.body, broker_name=st.mq.broker_name)
                except ProtocolError as exc:
                    log.error("undecodable pull body for %s at %d: %s", st.mq, st.next_offset, exc)
                    await asyncio.sleep(backoff)
                    continue
                for msg in msgs:
                    if msg.decompress_error:
                        log.error("message %s of %s: %s", msg.queue_offset, st.mq,
                                  msg.decompress_error)
                if self._tag_set is not None:
                    # Brokers filter on tag hashes; a hash collision is filtered here.
                    msgs = [m for m in msgs if m.tags in self._tag_set]
                st.pending += len(msgs)
                await self._buffer.put(st.mq, msgs)
                st.next_offset = next_begin
                self._skip_filtered(st)
            elif resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                backoff = 0.05
                st.next_offset = next_begin
                self._skip_filtered(st)
            elif resp.code == ResponseCode.PULL_OFFSET_MOVED:
                if next_begin > st.next_offset:
                    st.skipped += next_begin - st.next_offset
                    log.error("%s: offset %d is below the retained log; %d message(s) skipped,"
                              " resuming at %d", st.mq, st.next_offset,
                              next_begin - st.next_offset, next_begin)
                    st.processed = max(st.processed, next_begin)
                else:
                    log.warning("%s: offset %d beyond the queue end; resuming at %d", st.mq,
                                st.next_offset, next_begin)
                st.next_offset = next_begin
            else:
                log.warning("pull %s refused: %s %s", st.mq, resp.code, resp.remark)
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)


class BlockingConsumer:
    """The consumer for synchronous code (its asyncio loop runs on a private thread)."""

    def __init__(self, namesrv: str | list[str], group: str, topics: str | Sequence[str],
                 **options: Any) -> None:
        self._loop = EventLoopThread("rmqha-consumer")
        self._consumer: Consumer = self._loop.run(self._make(namesrv, group, topics, options))

    @staticmethod
    async def _make(namesrv: str | list[str], group: str, topics: str | Sequence[str],
                    options: dict[str, Any]) -> Consumer:
        return await Consumer(namesrv, group, topics, **options).start()

    def poll(self, timeout: float = 1.0, max_messages: int = 256) -> list[ReceivedMessage]:
        return self._loop.run(self._consumer.poll(timeout, max_messages))

    def commit(self) -> None:
        self._loop.run(self._consumer.commit())

    def assignment(self) -> list[MessageQueue]:
        return self._loop.run(self._async_assignment())

    async def _async_assignment(self) -> list[MessageQueue]:
        return self._consumer.assignment()

    def close(self) -> None:
        try:
            self._loop.run(self._consumer.close(), timeout=15)
        finally:
            self._loop.stop()

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
