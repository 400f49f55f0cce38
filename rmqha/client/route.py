"""Connections and topic routes for rmqha's client.

:class:`ClientSession` keeps one :class:`~rmqha.net.client.RemotingClient` per address
(reconnected on demand), answers what brokers push (NOTIFY_CONSUMER_IDS_CHANGED), and
looks up topic routes on the name servers (GET_ROUTEINFO_BY_TOPIC), trying each name
server in turn and caching routes for ``route_ttl_s``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import (
    ClientError,
    RemotingError,
    RemotingTimeoutError,
    TopicNotFoundError,
)
from rmqha.protocol.headers import ConsumerIdsChangedHeader, RouteInfoHeader
from rmqha.protocol.route import MASTER_ID, BrokerData, QueueData, TopicRoute
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.net.connection import Connection
from rmqha.protocol.command import RemotingCommand

# The route types live in protocol/ (the broker reads routes too); kept importable here.
__all__ = ["MASTER_ID", "BrokerData", "QueueData", "TopicRoute", "ClientSession", "parse_namesrv"]

log = logging.getLogger(__name__)

def parse_namesrv(addrs: str | list[str] | tuple[str, ...]) -> list[str]:
    if isinstance(addrs, str):
        out = [a.strip() for a in addrs.replace(",", ";").split(";") if a.strip()]
    else:
        out = [a.strip() for a in addrs if a.strip()]
    if not out:
        raise ClientError("no name server address given")
    return out


class ClientSession:
    """Shared connections, route cache and server-push handling of one client."""

    def __init__(self, namesrv: str | list[str], *, route_ttl_s: float = 30.0,
                 rpc_timeout_s: float = 3.0, security: ClientSecurity | None = None) -> None:
        self.namesrv = parse_namesrv(namesrv)
        #: TLS and request signing of every connection (name servers and brokers).
        self.security = security
        self.route_ttl_s = route_ttl_s
        self.rpc_timeout_s = rpc_timeout_s
        self._clients: dict[str, RemotingClient] = {}
        #: What each broker address was last named as by a route (its cluster and group).
        self._brokers: dict[str, ServerRole] = {}
        self._routes: dict[str, TopicRoute] = {}
        self._ns_index = 0
        #: Called with the group name when a broker says a group's members changed.
        self.on_consumer_ids_changed: Callable[[str], None] | None = None
        #: Answers CHECK_TRANSACTION_STATE (set by a transactional producer).
        self.on_check_transaction: Callable[[RemotingCommand, Any], Awaitable[None]] | None = None

    def client(self, addr: str) -> RemotingClient:
        c = self._clients.get(addr)
        if c is None:
            c = self._clients[addr] = RemotingClient(
                addr, handler={RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_ids_changed,
                               RequestCode.CHECK_TRANSACTION_STATE: self._on_check_transaction},
                connect_timeout=self.rpc_timeout_s, security=self.security, expect=self.server_role(addr))
        return c

    def server_role(self, addr: str) -> ServerRole:
        """What ``addr`` is dialled as: a name server when it is one of ours, else a broker
        (of the cluster and group a route named it with, once one did).  Over TLS with a
        cluster CA its certificate must say so."""
        if addr in self.namesrv:
            return ServerRole.namesrv()
        return self._brokers.get(addr) or ServerRole.broker()

    def learn_brokers(self, route: TopicRoute) -> None:
        """Remember the cluster and group ``route`` names each broker address with."""
        for data in route.broker_datas.values():
            role = ServerRole.broker(data.cluster, data.broker_name)
            for addr in data.broker_addrs.values():
                self._brokers[addr] = role
                client = self._clients.get(addr)
                if client is not None:
                    client.expect = role

    async def _on_ids_changed(self, cmd: RemotingCommand, conn: RequestPeer) -> None:
        group = ConsumerIdsChangedHeader.parse(cmd.ext_fields).consumer_group
        if self.on_consumer_ids_changed is not None and group:
            self.on_consumer_ids_changed(group)
        return None

    async def _on_check_transaction(self, cmd: RemotingCommand, conn: RequestPeer) -> None:
        if self.on_check_transaction is not None:
            await self.on_check_transaction(cmd, conn)
        return None

    async def request(self, addr: str, cmd: RemotingCommand,
                      timeout: float | None = None) -> RemotingCommand:
        """One request; on a timeout the connection is closed (as RocketMQ clients do), so
        the next request opens a fresh one instead of waiting on a dead link."""
        client = self.client(addr)
        try:
            return await client.request(cmd, timeout or self.rpc_timeout_s)
        except RemotingTimeoutError:
            await client.close()
            raise

    def connected(self, addr: str) -> Connection | None:
        """The open connection to ``addr``, without I/O (None: none is open)."""
        client = self._clients.get(addr)
        return client.open_connection() if client is not None else None

    async def timed_out(self, addr: str) -> None:
        """A request to ``addr`` timed out: close its connection (as RocketMQ clients do),
        so the next request opens a fresh one instead of waiting on a dead link."""
        client = self._clients.get(addr)
        if client is not None:
            await client.close()

    async def request_frame(self, addr: str, frame: bytes, opaque: int,
                            timeout: float | None = None, *, signed: bool = False) -> bytes:
        """:meth:`request` of a request encoded already: its answer's frame, undecoded
        (see ``RemotingClient.request_frame``: nothing signs it; ``signed``: it was
        signed in place already, as the session's hook would sign its command)."""
        client = self.client(addr)
        try:
            return await client.request_frame(frame, opaque, timeout or self.rpc_timeout_s,
                                              signed=signed)
        except RemotingTimeoutError:
            await client.close()
            raise

    def fresh_route(self, topic: str) -> TopicRoute | None:
        """The cached route of a topic if it is younger than ``route_ttl_s`` (no I/O)."""
        cached = self._routes.get(topic)
        if cached is not None and time.monotonic() - cached.fetched_at < self.route_ttl_s:
            return cached
        return None

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The route of a topic; ClientError if no name server knows it."""
        cached = self._routes.get(topic)
        if not refresh and cached is not None and (
                time.monotonic() - cached.fetched_at < self.route_ttl_s):
            return cached
        last: Exception | None = None
        for i in range(len(self.namesrv)):
            addr = self.namesrv[(self._ns_index + i) % len(self.namesrv)]
            try:
                resp = await self.request(addr, RemotingCommand.request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteInfoHeader(topic=topic).build()))
            except RemotingError as exc:
                last = exc
                continue
            self._ns_index = (self._ns_index + i) % len(self.namesrv)
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                raise TopicNotFoundError(f"topic {topic} has no route: {resp.remark}")
            if resp.code != ResponseCode.SUCCESS:
                last = ClientError(f"route of {topic} refused by {addr}: {resp.code} {resp.remark}")
                continue
            data = resp.json_body()
            if not isinstance(data, dict):
                last = ClientError(f"empty route for {topic} from {addr}")
                continue
            route = TopicRoute.from_json(topic, data)
            self.learn_brokers(route)
            self._routes[topic] = route
            return route
        if cached is not None:
            log.warning("route refresh for %s failed (%s); keeping the cached one", topic, last)
            return cached
        raise ClientError(f"no name server answered for topic {topic}: {last}")

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                await c.close()
            except (RemotingError, OSError) as exc:
                log.debug("closing %s: %s", c.addr, exc)
