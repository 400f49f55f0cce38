"""The source's and sink's I/O with rmqha: routes, queue bounds, ranged pulls, acknowledged sends.

Synchronous on purpose: Spark calls a data source from plain Python (the driver's
planning, an executor's task), so each :class:`QueueClient` runs rmqha's asyncio
:class:`~rmqha.client.route.ClientSession` on a private loop thread
(:class:`~rmqha.net.loop.EventLoopThread`) and returns plain values.

The confirm offset: a broker's consume-queue index never passes it (messages stored on
the master but not yet on the SyncStateSet are not in the index), and GET_MAX_OFFSET and
pulls are answered from that index on every replica.  :meth:`QueueClient.bounds` is
therefore the readable end, and a range planned from it is data that survives a failover
at the same offsets.  A pull that finds nothing below a range's end (a slave or a new
master that has not confirmed it again yet) is retried until ``read_timeout_ms``, then
the read fails: it never returns fewer rows than planned, nor a row past the range.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rmqha.client.route import ClientSession, TopicRoute
from rmqha.errors import (
    ClientError,
    ProtocolError,
    RemotingError,
    SparkOptionError,
    SparkSourceError,
    TopicNotFoundError,
)
from rmqha.net.client_security import ClientSecurity
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import PULL_SUSPEND, PullHeader
from rmqha.protocol.message import ReceivedMessage, decode_records
from rmqha.spark.options import ClientOptions
from rmqha.spark.queues import QueueId

log = logging.getLogger(__name__)

#: The group named in pulls: the source commits nothing (no PULL_COMMIT_OFFSET flag), so
#: no group's offsets change; brokers want a name.
READER_GROUP = "rmqha_spark_source"
#: A pull below the range's end that finds nothing is held this long by the broker.
_HOLD_MS = 1000
_RETRY_MIN_S = 0.05


@dataclass(frozen=True)
class QueueBounds:
    """The readable offsets of one queue: ``[low, high)``; high is the confirmed end."""

    low: int
    high: int


def security_of(opts: ClientOptions) -> ClientSecurity | None:
    return ClientSecurity.from_options(access_key=opts.access_key, secret_key=opts.secret_key,
                                       tls=opts.tls)


class QueueClient:
    """Routes, bounds and pulls for one Spark process (close it when done)."""

    def __init__(self, opts: ClientOptions, rpc_timeout_s: float = 5.0) -> None:
        self._loop = EventLoopThread("rmqha-spark")
        self._session = ClientSession(opts.namesrv, rpc_timeout_s=rpc_timeout_s, security=security_of(opts))
        self._rpc_timeout_s = rpc_timeout_s

    def close(self) -> None:
        try:
            self._loop.run(self._session.close(), timeout=10)
        finally:
            self._loop.stop()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- routes and bounds ---------------------------------------------------------------

    def queues(self, topics: tuple[str, ...]) -> list[QueueId]:
        """Every readable queue of ``topics``, sorted."""
        out: list[QueueId] = []
        for topic in topics:
            try:
                route = self._route(topic)
            except TopicNotFoundError as exc:
                raise SparkOptionError("topic", str(exc)) from exc
            out += [QueueId(topic, mq.broker_name, mq.queue_id) for mq in route.subscribe_queues()]
        return sorted(out)

    def _route(self, topic: str, refresh: bool = True) -> TopicRoute:
        return self._loop.run(self._session.route(topic, refresh=refresh))

    def bounds(self, queues: list[QueueId]) -> dict[QueueId, QueueBounds]:
        """Each queue's min offset and confirmed end, asked of all groups at once."""
        return self._loop.run(self._bounds(queues))

    async def _bounds(self, queues: list[QueueId]) -> dict[QueueId, QueueBounds]:
        lows = [self._offset(q, RequestCode.GET_MIN_OFFSET) for q in queues]
        highs = [self._offset(q, RequestCode.GET_MAX_OFFSET) for q in queues]
        got = await asyncio.gather(*lows, *highs)
        n = len(queues)
        return {q: QueueBounds(got[i], got[n + i]) for i, q in enumerate(queues)}

    async def _offset(self, q: QueueId, code: RequestCode) -> int:
        """GET_MIN/MAX_OFFSET of ``q`` from its group's master, else a slave (a killed
        master's group still answers); SparkSourceError when no replica does."""
        failures: list[str] = []
        for addr in await self._addresses(q):
            try:
                resp = await self._session.request(addr, RemotingCommand.request(
                    code, {"topic": q.topic, "queueId": str(q.queue_id)}), self._rpc_timeout_s)
            except RemotingError as exc:
                failures.append(f"{addr}: {exc}")
                continue
            if resp.code == ResponseCode.SUCCESS:
                return int(resp.ext_fields.get("offset", "0"))
            failures.append(f"{addr}: {resp.code} {resp.remark}")
        with contextlib.suppress(ClientError, ProtocolError, RemotingError):
            await self._session.route(q.topic, refresh=True)  # the next planning asks the new route
        raise SparkSourceError(f"{q.topic} {q.key}: no replica of {q.broker} answered {code.name}: "
                               f"{'; '.join(failures) or 'no address in the route'}")

    # --- pulls ---------------------------------------------------------------------------

    def read(self, q: QueueId, start: int, end: int, *, batch: int, timeout_ms: int,
             fail_on_data_loss: bool) -> Iterator[list[ReceivedMessage]]:
        """The messages of ``q`` at offsets ``[start, end)``, in order, in chunks.

        Offsets below the queue's retained log: an error naming failOnDataLoss, or (with it
        false) skipped with a warning.  Offsets not served within ``timeout_ms``: an error."""
        offset = start
        deadline = time.monotonic() + timeout_ms / 1000
        while offset < end:
            got, next_begin, low = self._loop.run(self._pull(q, offset, min(batch, end - offset)))
            if low > offset:
                if fail_on_data_loss:
                    raise SparkSourceError(
                        f"{q.topic} {q.key}: offsets {offset}..{low - 1} are gone from the broker (below its "
                        f"retained log); set failOnDataLoss=false to skip them")
                log.warning("%s %s: offsets %d..%d are gone; skipped (failOnDataLoss=false)",
                            q.topic, q.key, offset, low - 1)
                offset = low
                continue
            msgs = [m for m in got if offset <= m.queue_offset < end]
            if msgs:
                yield msgs
                offset = msgs[-1].queue_offset + 1
                deadline = time.monotonic() + timeout_ms / 1000
            elif next_begin > offset and next_begin <= end:
                offset = next_begin  # a hole the broker skips (nothing there to read)
            elif time.monotonic() > deadline:
                raise SparkSourceError(
                    f"{q.topic} {q.key}: offsets {offset}..{end - 1} were planned but not served within "
                    f"{timeout_ms} ms (readTimeoutMs); the broker serves only confirmed messages")

    async def _pull(self, q: QueueId, offset: int, count: int) -> tuple[list[ReceivedMessage], int, int]:
        """One pull: (messages, nextBeginOffset, the queue's min offset); ([], offset, -1)
        while no replica answers (the caller's deadline decides)."""
        header = PullHeader(consumer_group=READER_GROUP, topic=q.topic, queue_id=q.queue_id,
                            queue_offset=offset, max_msg_nums=count, sys_flag=PULL_SUSPEND,
                            commit_offset=0, suspend_timeout_ms=_HOLD_MS).build()
        for addr in await self._addresses(q):
            try:
                resp = await self._session.request(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, header),
                                                   _HOLD_MS / 1000 + self._rpc_timeout_s)
            except RemotingError as exc:
                log.info("pull of %s %s at %d from %s failed: %s", q.topic, q.key, offset, addr, exc)
                continue
            ext = resp.ext_fields
            next_begin, low = int(ext.get("nextBeginOffset", offset)), int(ext.get("minOffset", -1))
            if resp.code == ResponseCode.SUCCESS:
                return decode_records(resp.body, broker_name=q.broker), next_begin, -1
            if resp.code == ResponseCode.PULL_OFFSET_MOVED and low > offset:
                return [], next_begin, low
            if resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
                             ResponseCode.PULL_RETRY_IMMEDIATELY):
                return [], offset, -1
            log.info("pull of %s %s at %d refused by %s: %s %s", q.topic, q.key, offset, addr,
                     resp.code, resp.remark)
        # Every replica failed (a master killed a moment ago): ask the route again, so the
        # next try reaches whoever serves the group now; the caller's deadline decides.
        await asyncio.sleep(_RETRY_MIN_S)
        try:
            await self._session.route(q.topic, refresh=True)
        except (ClientError, ProtocolError, RemotingError) as exc:
            log.info("route of %s: %s", q.topic, exc)
        return [], offset, -1

    async def _addresses(self, q: QueueId) -> list[str]:
        """The group's master first, then its slaves (both serve confirmed messages); the
        route is asked again when the cached one names nobody."""
        for refresh in (False, True):
            try:
                route = await self._session.route(q.topic, refresh=refresh)
            except (ClientError, ProtocolError, RemotingError) as exc:
                log.info("route of %s: %s", q.topic, exc)
                continue
            data = route.broker_datas.get(q.broker)
            if data is not None and data.broker_addrs:
                return [data.broker_addrs[i] for i in sorted(data.broker_addrs)]
        return []
