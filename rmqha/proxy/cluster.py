"""The proxy's way to the cluster: routes from the name servers, requests to masters,
topic and group settings read from the masters.

As RocketMQ's cluster-mode proxy, the proxy finds a broker group's master in the topic's
route (:class:`rmqha.client.route.ClientSession`, one connection per broker, routes cached
``route_ttl_ms``) and sends it remoting requests.  A request that cannot reach the master
or that the broker answers "not me now" (SERVICE_NOT_AVAILABLE: a slave or a fenced
master) refreshes the route and goes to the group's master again, with a short backoff,
until the caller's deadline: a failover is followed inside the proxy, and the client,
whose route names only the proxy, sees at most a slower answer.

Topic configs (their ``message.type``) and subscription groups come from the masters'
GET_ALL_TOPIC_CONFIG / GET_ALL_SUBSCRIPTIONGROUP_CONFIG and are kept ``metadata_ttl_ms``.
With ``inner_access_key`` every request is signed (RocketMQ ACL 1.0) as that account;
with ``tls.enable`` every connection is TLS with the ``tls.client.*`` files (a client
certificate for ports that require one), as the other processes' own links.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmqha.client.route import ClientSession, TopicRoute
from rmqha.errors import (
    ClientError,
    ConfigError,
    ProtocolError,
    ProxyError,
    RemoteCommandError,
    RemotingError,
    TopicNotFoundError,
)
from rmqha.net.client_security import ClientSecurity
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.topic_attributes import TopicMessageType, topic_message_type
from rmqha.protocol.topics import TopicConfig
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.status import RETRIABLE, Code, transport_error
from rmqha.security.replay import stamp
from rmqha.security.signature import sign

log = logging.getLogger(__name__)

#: First pause before a request is tried again on a group's (new) master; doubles.
RETRY_PAUSE_S = 0.1
RETRY_PAUSE_MAX_S = 0.8


@dataclass
class _Cached:
    value: Any
    at: float = field(default_factory=time.monotonic)


class Deadline:
    """When a request must be answered by (monotonic seconds)."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()


class ClusterAccess:
    """Routes, masters and requests for the proxy."""

    def __init__(self, cfg: ProxyConfig) -> None:
        self.cfg = cfg
        self.session = ClientSession(cfg.namesrv_list, route_ttl_s=cfg.route_ttl_ms / 1000,
                                     rpc_timeout_s=cfg.rpc_timeout_ms / 1000,
                                     security=ClientSecurity.for_links(cfg.tls))
        self._topics: dict[str, _Cached] = {}
        self._groups: dict[str, _Cached] = {}

    @property
    def rpc_timeout_s(self) -> float:
        return self.cfg.rpc_timeout_ms / 1000

    async def close(self) -> None:
        await self.session.close()

    # --- routes ------------------------------------------------------------------------

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route; TOPIC_NOT_FOUND if no name server knows it."""
        try:
            return await self.session.route(topic, refresh=refresh)
        except TopicNotFoundError:
            raise ProxyError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist") from None
        except ClientError as exc:
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"route of {topic}: {exc}") from None

    async def master(self, topic: str, group: str, *, refresh: bool = False) -> str | None:
        route = await self.route(topic, refresh=refresh)
        data = route.broker_datas.get(group)
        return None if data is None else data.master

    # --- requests ----------------------------------------------------------------------

    def signed(self, cmd: RemotingCommand) -> RemotingCommand:
        if self.cfg.inner_access_key:
            cmd.ext_fields = sign(cmd.ext_fields, cmd.body, self.cfg.inner_access_key,
                                  self.cfg.inner_secret_key, extra=stamp())
        return cmd

    async def request(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        return await self.session.request(addr, self.signed(cmd), timeout)

    async def to_master(self, topic: str, group: str, make: Callable[[], RemotingCommand],
                        deadline: Deadline, *, extra_s: float = 0.0,
                        what: str = "request") -> RemotingCommand:
        """``make()``'s request answered by the master of ``group`` (a broker group of
        ``topic``'s route), following a failover until ``deadline``; ``extra_s`` is how
        long the broker may hold it (a long poll)."""
        pause = RETRY_PAUSE_S
        refresh = False
        while True:
            last = await self._try_master(topic, group, make, deadline, extra_s, refresh, what)
            if isinstance(last, RemotingCommand):
                return last
            if deadline.left() <= pause:
                raise last
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX_S)
            refresh = True

    async def _try_master(self, topic: str, group: str, make: Callable[[], RemotingCommand],
                          deadline: Deadline, extra_s: float, refresh: bool,
                          what: str) -> RemotingCommand | ProxyError:
        """One attempt: the answer, or the error to raise if no attempt is left."""
        addr = await self.master(topic, group, refresh=refresh)
        if addr is None:
            return ProxyError(Code.PROXY_TIMEOUT, f"{what}: broker group {group} has no master "
                              f"right now (a failover in progress?)")
        timeout = max(0.05, min(deadline.left(), self.rpc_timeout_s + extra_s))
        try:
            resp = await self.request(addr, make(), timeout)
        except RemotingError as exc:
            log.info("%s to %s (%s) failed, looking for the master again: %s", what, group, addr, exc)
            return transport_error(exc, what)
        if resp.code in RETRIABLE:
            log.info("%s: %s answers %s, looking for the master again", what, addr, resp.remark)
            return ProxyError(Code.PROXY_TIMEOUT, f"{what}: {resp.remark or 'not the master'}")
        return resp

    # --- topic and group settings --------------------------------------------------------

    async def _from_master(self, route: TopicRoute, code: int, key: str) -> Mapping[str, Any]:
        """A master's table answer (``topicConfigTable`` / ``subscriptionGroupTable``)."""
        for data in sorted(route.broker_datas.values(), key=lambda b: b.broker_name):
            if data.master is None:
                continue
            try:
                resp = await self.request(data.master, RemotingCommand.request(code),
                                          self.rpc_timeout_s)
                table = resp.check_success(code).json_body() or {}
            except (RemotingError, ProtocolError) as exc:
                log.info("%s from %s failed: %s", RequestCode(code).name, data.master, exc)
                continue
            except RemoteCommandError as exc:
                log.info("%s refused by %s: %s", RequestCode(code).name, data.master, exc)
                continue
            value = table.get(key) if isinstance(table, dict) else None
            if isinstance(value, dict):
                return value
        return {}

    async def topic_config(self, topic: str) -> TopicConfig | None:
        """The topic's config on one of its masters (cached ``metadata_ttl_ms``)."""
        cached = self._topics.get(topic)
        if cached is not None and time.monotonic() - cached.at < self.cfg.metadata_ttl_ms / 1000:
            return cached.value  # type: ignore[no-any-return]
        route = await self.route(topic)
        raw = (await self._from_master(route, RequestCode.GET_ALL_TOPIC_CONFIG,
                                       "topicConfigTable")).get(topic)
        config = _topic_config(raw)
        if config is not None:
            self._topics[topic] = _Cached(config)
        return config

    async def message_type(self, topic: str) -> TopicMessageType:
        """The topic's ``message.type``; NORMAL when it declares none (RocketMQ's default)."""
        config = await self.topic_config(topic)
        declared = None if config is None else topic_message_type(config.attributes)
        return declared or TopicMessageType.NORMAL

    async def group_config(self, group: str, topic: str) -> SubscriptionGroupConfig | None:
        """The group's settings on a master of ``topic`` (None: nobody created it)."""
        cached = self._groups.get(group)
        if cached is not None and time.monotonic() - cached.at < self.cfg.metadata_ttl_ms / 1000:
            return cached.value  # type: ignore[no-any-return]
        route = await self.route(topic)
        raw = (await self._from_master(route, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                                       "subscriptionGroupTable")).get(group)
        config = None
        if raw is not None:
            try:
                config = SubscriptionGroupConfig.from_rocketmq(raw)
            except ConfigError as exc:
                log.warning("subscription group %s has a config the proxy cannot read: %s", group, exc)
        self._groups[group] = _Cached(config)
        return config

    # --- the cluster's masters -----------------------------------------------------------

    async def cluster_masters(self) -> dict[str, str]:
        """Broker name -> master address of the proxy's cluster (GET_BROKER_CLUSTER_INFO)."""
        for addr in self.session.namesrv:
            try:
                resp = await self.request(addr, RemotingCommand.request(
                    RequestCode.GET_BROKER_CLUSTER_INFO), self.rpc_timeout_s)
                info = resp.check_success().json_body() or {}
            except (RemotingError, ProtocolError, RemoteCommandError) as exc:
                log.info("cluster info from %s failed: %s", addr, exc)
                continue
            return _masters(info, self.cfg.rocketmq_cluster_name)
        return {}


def _topic_config(raw: Any) -> TopicConfig | None:
    if not isinstance(raw, dict):
        return None
    try:
        return TopicConfig.from_rocketmq(raw)
    except ConfigError as exc:
        log.warning("a topic config the proxy cannot read: %s", exc)
        return None


def _masters(info: Mapping[str, Any], cluster: str) -> dict[str, str]:
    names = (info.get("clusterAddrTable") or {}).get(cluster) or []
    table = info.get("brokerAddrTable") or {}
    out = {}
    for name in names:
        addrs = (table.get(name) or {}).get("brokerAddrs") or {}
        master = addrs.get("0", addrs.get(0))
        if master:
            out[str(name)] = str(master)
    return out


def expect_success(resp: RemotingCommand, what: str,
                   codes: Callable[[int], Code]) -> RemotingCommand:
    """``resp`` if SUCCESS, else ProxyError with the status ``codes`` maps it to."""
    if resp.code == ResponseCode.SUCCESS:
        return resp
    raise ProxyError(codes(resp.code), f"{what} refused by the broker: {resp.remark or resp.code}")
