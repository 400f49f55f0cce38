"""Looking messages up: by key, by unique id (``msgId``), by offset message id.

What RocketMQ's ``MQAdminImpl`` does, for rmqha's Python client: a key or unique-id query
goes to one broker of every group in the topic's route (QUERY_MESSAGE, with
``_UNIQUE_KEY_QUERY=true`` for a unique id) and the answers are merged, keeping only
records whose topic and key really match (the brokers' index is a hash table); an offset
message id (store host + commitlog offset) is read from the broker it names
(VIEW_MESSAGE_BY_ID).  :class:`BlockingMessageQuery` is the same for synchronous code.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rmqha.client.route import ClientSession
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ClientError, ProtocolError, RemotingError
from rmqha.protocol.headers import QueryMessageHeader, ViewMessageHeader
from rmqha.protocol.message import (
    Prop,
    ReceivedMessage,
    decode_records,
    parse_offset_msg_id,
)
from rmqha.net.client_security import ClientSecurity, TlsOption
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand

#: The most records a broker returns for one query (RocketMQ's defaultQueryMaxNum).
MAX_RESULTS = 32
_FOREVER_MS = 2**63 - 1


class MessageQuery:
    """Lookups through the name servers (use as ``async with``)."""

    def __init__(self, namesrv: str | list[str], *, timeout_s: float = 5.0,
                 access_key: str | None = None, secret_key: str | None = None,
                 tls: TlsOption = None) -> None:
        self.session = ClientSession(namesrv, rpc_timeout_s=timeout_s, security=ClientSecurity.from_options(
            access_key=access_key, secret_key=secret_key, tls=tls))
        self.timeout_s = timeout_s

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> MessageQuery:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def by_key(self, topic: str, key: str, *, max_num: int = MAX_RESULTS,
                     begin_ms: int = 0, end_ms: int = _FOREVER_MS) -> list[ReceivedMessage]:
        """Messages of ``topic`` whose KEYS include ``key``, newest first."""
        found = await self._query(topic, key, False, max_num, begin_ms, end_ms)
        return [m for m in found if key in (m.keys or "").split(" ")]

    async def by_unique_key(self, topic: str, msg_id: str, *, begin_ms: int = 0,
                            end_ms: int = _FOREVER_MS) -> list[ReceivedMessage]:
        """The message(s) of ``topic`` whose unique id (``UNIQ_KEY``, the client msgId) is
        ``msg_id`` (more than one only if it was stored twice, e.g. a retried send)."""
        found = await self._query(topic, msg_id, True, MAX_RESULTS, begin_ms, end_ms)
        return [m for m in found if m.properties.get(Prop.UNIQ_KEY) == msg_id]

    async def by_offset_id(self, offset_msg_id: str) -> ReceivedMessage | None:
        """The record an offset message id names (its broker and commitlog offset)."""
        address, offset = parse_offset_msg_id(offset_msg_id)
        resp = await self.session.request(address, RemotingCommand.request(
            RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageHeader(offset=offset).build()),
            self.timeout_s)
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return None
        msgs = decode_records(resp.body)
        return msgs[0] if msgs else None

    async def by_id(self, msg_id: str, topic: str | None = None) -> list[ReceivedMessage]:
        """mqadmin's queryMsgById: a unique id looked up in ``topic`` (when given), else the
        id read as an offset message id.  Both are 32 hex digits, so with a topic the
        unique id is tried first."""
        if topic:
            found = await self.by_unique_key(topic, msg_id)
            if found:
                return found
        try:
            msg = await self.by_offset_id(msg_id)
        except (ProtocolError, RemotingError, OSError):
            return []
        if msg is None or (topic and msg.topic != topic):
            return []
        return [msg]

    async def _query(self, topic: str, key: str, unique: bool, max_num: int, begin_ms: int,
                     end_ms: int) -> list[ReceivedMessage]:
        route = await self.session.route(topic, refresh=True)
        addresses = [a for a in (b.any_address() for b in route.broker_datas.values()) if a]
        if not addresses:
            raise ClientError(f"topic {topic} has no broker to ask")
        ext = QueryMessageHeader(topic=topic, key=key, max_num=max_num,
                                 begin_timestamp=begin_ms, end_timestamp=end_ms,
                                 unique_key=True if unique else None).build()
        answers = await asyncio.gather(*(self._ask(a, ext) for a in addresses),
                                       return_exceptions=True)
        out: list[ReceivedMessage] = []
        errors: list[str] = []
        for addr, ans in zip(addresses, answers):
            if isinstance(ans, BaseException):
                errors.append(f"{addr}: {ans}")
                continue
            out.extend(m for m in ans if m.topic == topic)
        if errors and len(errors) == len(addresses):
            raise ClientError("no broker answered the query: " + "; ".join(errors))
        out.sort(key=lambda m: m.store_timestamp, reverse=True)
        return out

    async def _ask(self, address: str, ext: dict[str, str]) -> Sequence[ReceivedMessage]:
        resp = await self.session.request(
            address, RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext), self.timeout_s * 3)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise ClientError(f"query refused: {resp.code} {resp.remark}")
        return decode_records(resp.body, broker_name="")


class BlockingMessageQuery:
    """:class:`MessageQuery` for synchronous code (its asyncio loop runs on a private thread)."""

    def __init__(self, namesrv: str | list[str], *, timeout_s: float = 5.0) -> None:
        self._loop = EventLoopThread("rmqha-query")
        self._query: MessageQuery = self._loop.run(self._make(namesrv, timeout_s))

    @staticmethod
    async def _make(namesrv: str | list[str], timeout_s: float) -> MessageQuery:
        return MessageQuery(namesrv, timeout_s=timeout_s)

    def by_key(self, topic: str, key: str, **options: int) -> list[ReceivedMessage]:
        return self._loop.run(self._query.by_key(topic, key, **options))

    def by_unique_key(self, topic: str, msg_id: str, **options: int) -> list[ReceivedMessage]:
        return self._loop.run(self._query.by_unique_key(topic, msg_id, **options))

    def by_offset_id(self, offset_msg_id: str) -> ReceivedMessage | None:
        return self._loop.run(self._query.by_offset_id(offset_msg_id))

    def by_id(self, msg_id: str, topic: str | None = None) -> list[ReceivedMessage]:
        return self._loop.run(self._query.by_id(msg_id, topic))

    def close(self) -> None:
        try:
            self._loop.run(self._query.close(), timeout=10)
        finally:
            self._loop.stop()

    def __enter__(self) -> BlockingMessageQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
