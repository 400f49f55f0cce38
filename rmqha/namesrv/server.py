"""The name server process: a RemotingServer over the route table.

Answers (RocketMQ codes and shapes):

- REGISTER_BROKER (103): header ``brokerName, brokerAddr, clusterName, haServerAddr,
  brokerId, heartbeatTimeoutMillis``; body ``RegisterBrokerBody`` JSON whose
  ``topicConfigSerializeWrapper.dataVersion.stateVersion`` is the broker's master epoch
  (RocketMQ #6316).  Reply header ``haServerAddr, masterAddr``, body ``{"table":{}}``.
  A stale master's claim on id 0 is refused with SYSTEM_ERROR naming the holder.
- UNREGISTER_BROKER (104): only over the connection the broker registered on (a broker
  removes itself, nobody else).
- GET_ROUTEINFO_BY_TOPIC (105): ``TopicRouteData`` (ints as JSON numbers, brokerAddrs keys
  quoted) or TOPIC_NOT_EXIST (17).
- GET_BROKER_CLUSTER_INFO (106): ``ClusterInfo``.
- GET_BROKER_MEMBER_GROUP (901): RocketMQ's ``{"brokerMemberGroup": {cluster, brokerName,
  brokerAddrs}}`` plus rmqha's ``haAddrs``, ``masterAddr`` and ``masterEpoch`` beside it.
- GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206): ``{"topicList": [...]}``.
- DELETE_TOPIC_IN_NAMESRV (216): drop a topic from the routes until a broker registers it
  again (needs ``adminToken`` when the name server has an ``admin_token``).

With a cluster secret (``cluster_secret``) REGISTER_BROKER and UNREGISTER_BROKER must carry
its HMAC (:mod:`rmqha.protocol.request_auth`): anything else is answered NO_PERMISSION and
changes no route; and they are taken only over an authenticated channel
(:mod:`rmqha.net.channel`: the secret's handshake, then a MAC on every frame both ways, so
the answers are authenticated too) or over TLS with a verified certificate, from a broker
for its own cluster and group (or an admin tool).  Over mutual TLS the sender's
certificate must name a broker of the cluster and group the request names
(:mod:`rmqha.net.peer_check`), else NO_PERMISSION.  DELETE_TOPIC_IN_NAMESRV, a route
change that names no broker, takes a certificate of a broker, an admin tool or a
controller, never an application's.  Read-only requests (routes, cluster
info) stay open to plain RocketMQ clients.  Without a secret the name server runs on
loopback only, unless told ``allow_insecure`` (:mod:`rmqha.security.secret_policy`).

Other codes get REQUEST_CODE_NOT_SUPPORTED and the connection stays open.  With
``status_port`` set the process also serves a read-only status page
(:mod:`rmqha.namesrv.status_page`, data from :mod:`rmqha.namesrv.cluster_view`).  With
``enable_controller_in_namesrv`` the process also runs a controller node (its own port,
as RocketMQ's embedded DLedger controller listens on its own peer port).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from rmqha.protocol.code_rules import require_declared
from rmqha.protocol.codes import RequestCode, ResponseCode, code_name
from rmqha.errors import ConfigError
from rmqha.metrics import MetricsRegistry
from rmqha.controller.client import ControllerClient
from rmqha.namesrv.cluster_view import ClusterView
from rmqha.namesrv.config import NamesrvConfig
from rmqha.namesrv.route_table import BrokerRegistration, RouteTable, TopicConfig
from rmqha.namesrv.status_page import StatusPageServer
from rmqha.net.channel import refused_off_channel
from rmqha.net.client_security import ClientSecurity
from rmqha.net.peer import RequestPeer
from rmqha.net.peer_check import Need, PeerCheck
from rmqha.net.server import RemotingServer
from rmqha.protocol.command import RemotingCommand
from rmqha.security.channel_auth import key_from_text
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import TlsSettings, server_context
from rmqha.protocol.request_auth import (
    NAMESRV_SIGNED_CODES, RefusalLog, check, request_auth, tokens_match,
)

log = logging.getLogger(__name__)

_CONN_KEY = "namesrv_registrations"
#: Who may register or unregister brokers (over a channel or TLS).
_REGISTRARS = (Role.BROKER, Role.ADMIN)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def _int(ext: dict[str, str], key: str, default: int) -> int:
    raw = ext.get(key)
    if raw in (None, "", "null"):
        return default
    return int(raw)


#: Who may change routes without naming a broker: any broker, an admin tool, a controller.
_ROUTE_EDITORS = Need(frozenset({Role.BROKER, Role.ADMIN, Role.CONTROLLER}))


def _broker_named(cmd: RemotingCommand) -> Need:
    """Who may send a registration: a broker of the cluster and group it names."""
    return Need.broker(cmd.ext_fields.get("clusterName"), cmd.ext_fields.get("brokerName", ""))


def parse_register_body(body: bytes) -> tuple[dict[str, TopicConfig], int]:
    """Topic configs and the state version (master epoch) of a RegisterBrokerBody."""
    if not body:
        return {}, 0
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ValueError("RegisterBrokerBody is not a JSON object")
    wrapper = obj.get("topicConfigSerializeWrapper") or {}
    table = wrapper.get("topicConfigTable") or {}
    topics = {str(name): TopicConfig.from_json(str(name), cfg or {}) for name, cfg in table.items()}
    version = wrapper.get("dataVersion") or {}
    return topics, int(version.get("stateVersion", 0) or 0)


class NameServer:
    """A name server (and optionally an embedded controller) in one asyncio process."""

    def __init__(self, config: NamesrvConfig) -> None:
        self.config = config
        secret = config.check_security()
        self.auth = request_auth(secret)
        self._refusals = RefusalLog(log)
        self.routes = RouteTable(config.broker_expire_ms)
        #: The port's TLS (tls.server.*) and the status page's links to brokers (tls.client.*).
        self.tls = TlsSettings.from_config(config, "name server config")
        channels = key_from_text(secret, Identity.namesrv("namesrv"), _REGISTRARS) if secret else None
        self.server = RemotingServer(config.listen_host, config.listen_port, max_frame_bytes=config.max_frame_bytes,
                                     tls=self.tls, channels=channels,
                                     max_connections_per_peer=config.max_connections_per_peer)
        #: Over mutual TLS a broker registers and unregisters only as itself.
        self.peer_check = PeerCheck(self.tls)
        self.controller: Any = None
        # (broker_name, broker_addr) -> the connection it last registered over
        self._reg_conn: dict[tuple[str, str], RequestPeer] = {}
        self._scan_task: asyncio.Task[None] | None = None
        self.metrics: MetricsRegistry | None = MetricsRegistry() if config.metrics_port > 0 else None
        self.metrics_port: int | None = None
        self._requests: Any = None
        self.view: ClusterView | None = None
        self.status_page: StatusPageServer | None = None
        if config.status_port > 0:
            links = ClientSecurity.for_links(self.tls)
            controllers = (ControllerClient(config.status_controller_addr, request_timeout=1.0, security=links)
                           if config.status_controller_addr.strip() else None)
            self.view = ClusterView(self.routes, poll_ms=config.status_poll_ms, security=links,
                                    controllers=controllers)
            self.status_page = StatusPageServer(config.status_host, config.status_port,
                                                lambda: self.view.snapshot(self.address) if self.view else {},
                                                ssl_context=server_context(self.tls) if config.https_enable else None)
        if self.metrics is not None:
            self._register_metrics(self.metrics)
        served = (
            (RequestCode.REGISTER_BROKER, self._register_broker),
            (RequestCode.UNREGISTER_BROKER, self._unregister_broker),
            (RequestCode.GET_ROUTEINFO_BY_TOPIC, self._route_by_topic),
            (RequestCode.GET_BROKER_CLUSTER_INFO, self._cluster_info),
            (RequestCode.GET_BROKER_MEMBER_GROUP, self._member_group),
            (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self._topic_list),
            (RequestCode.DELETE_TOPIC_IN_NAMESRV, self._delete_topic),
        )
        require_declared((code for code, _ in served), "the name server")
        for code, handler in served:
            if code in NAMESRV_SIGNED_CODES:
                handler = self._identified(self._authenticated(handler))
            elif code == RequestCode.DELETE_TOPIC_IN_NAMESRV:
                handler = self._admin_or_broker(handler)
            self.server.register(code, self._metered(int(code), handler))

    def _authenticated(self, handler: Any) -> Any:
        """``handler`` behind the proof check (and, with the secret, the channel check):
        without them no route changes."""
        async def checked(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
            refused = check(self.auth, cmd, conn) or self._channel_check(cmd, conn)
            if refused is not None:
                self._refusals.note(cmd, conn.peer, refused.remark or "")
                return refused
            return await handler(cmd, conn)
        return checked

    def _identified(self, handler: Any) -> Any:
        """``handler`` behind the certificate check: the broker the request names
        (``clusterName``, ``brokerName``) must be the one the sender's certificate names."""
        return self.peer_check.guarded(_broker_named, handler,
                                       lambda cmd, conn, why: self._refusals.note(cmd, conn.peer, why))

    def _admin_or_broker(self, handler: Any) -> Any:
        """``handler`` behind the certificate check of a route change no broker names
        (DELETE_TOPIC_IN_NAMESRV): a broker, an admin tool or a controller may; an
        application's certificate never (issue 37)."""
        return self.peer_check.guarded(lambda cmd: _ROUTE_EDITORS, handler,
                                       lambda cmd, conn, why: self._refusals.note(cmd, conn.peer, why))

    def _channel_check(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
        return refused_off_channel(cmd, conn, _REGISTRARS) if self.auth.enabled else None

    @property
    def address(self) -> str:
        return self.server.address

    def _register_metrics(self, m: MetricsRegistry) -> None:
        m.gauge("rmqha_namesrv_brokers", "live broker registrations").set_function(
            lambda: float(sum(len(self.routes.members(g)) for g in self.routes.group_names())))
        m.gauge("rmqha_namesrv_broker_groups", "broker groups with a live member").set_function(
            lambda: float(len(self.routes.group_names())))
        m.gauge("rmqha_namesrv_topics", "topics served by at least one live broker group").set_function(
            lambda: float(len(self.routes.topics())))
        self._requests = m.counter("rmqha_namesrv_requests", "Requests by code and result",
                                   ("request_type", "result"))

    def _metered(self, code: int, handler: Any) -> Any:
        if self._requests is None:
            return handler
        counter = self._requests

        async def metered(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
            resp = await handler(cmd, conn)
            ok = resp is None or resp.code == ResponseCode.SUCCESS
            counter.labels(request_type=code_name(code), result="success" if ok else "failed").inc()
            return resp

        return metered

    async def start(self) -> None:
        if self.config.enable_controller_in_namesrv:
            await self._start_controller()
        try:
            await self.server.start()
        except OSError as exc:
            raise ConfigError(f"listen_port: cannot listen on {self.config.listen_host}:"
                              f"{self.config.listen_port}: {exc.strerror or exc}") from exc
        if self.metrics is not None:
            self.metrics_port = self.metrics.serve(self.config.metrics_port, self.config.metrics_host,
                                                   tls=self.tls if self.config.https_enable else None)
            log.info("metrics on %s://%s:%d/metrics", "https" if self.config.https_enable else "http",
                     self.config.metrics_host, self.metrics_port)
        if self.status_page is not None and self.view is not None:
            await self.status_page.start()
            self.view.start()
        self._scan_task = asyncio.get_running_loop().create_task(self._scan_loop())
        log.info("name server listening on %s", self.server.address)

    async def stop(self) -> None:
        if self._scan_task is not None:
            self._scan_task.cancel()
            try:
                await self._scan_task
            except asyncio.CancelledError:
                pass  # we cancelled it
            self._scan_task = None
        if self.status_page is not None:
            await self.status_page.stop()
        if self.view is not None:
            await self.view.stop()
        await self.server.stop()
        if self.controller is not None:
            await self.controller.stop()
            self.controller = None
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None

    async def _start_controller(self) -> None:
        # Imported here: a plain name server must not need the controller's dependencies.
        from rmqha.namesrv.embedded import start_embedded_controller

        self.controller = await start_embedded_controller(self.config, self.metrics)

    # --- housekeeping ---------------------------------------------------------------------

    async def _scan_loop(self) -> None:
        period = self.config.scan_not_active_broker_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            for reg in self.routes.expire(now_ms()):
                self._reg_conn.pop((reg.broker_name, reg.broker_addr), None)

    def _on_conn_closed(self, conn: RequestPeer) -> None:
        if not self.config.drop_on_disconnect:
            return
        for key in list(conn.attributes.get(_CONN_KEY, ())):
            if self._reg_conn.get(key) is conn:
                del self._reg_conn[key]
                if self.routes.unregister(*key):
                    log.info("broker %s of %s dropped: its connection closed (%s)", key[1], key[0], conn.close_reason)

    # --- handlers -------------------------------------------------------------------------

    async def _register_broker(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ext = cmd.ext_fields
        try:
            name, addr, cluster = ext["brokerName"], ext["brokerAddr"], ext["clusterName"]
            broker_id = _int(ext, "brokerId", -1)
            timeout_ms = _int(ext, "heartbeatTimeoutMillis", self.config.broker_expire_ms)
            if ext.get("compressed", "false").lower() == "true":
                return cmd.response(ResponseCode.SYSTEM_ERROR, "compressed RegisterBrokerBody is not supported")
            topics, state_version = parse_register_body(cmd.body)
        except KeyError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"REGISTER_BROKER without header field {exc}")
        except ValueError as exc:  # bad ints or a body that is not the expected JSON
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad REGISTER_BROKER request: {exc}")
        if broker_id < 0:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"brokerId {broker_id} is invalid")
        # rmqha brokers also send the epoch as a header (Java brokers only in the body).
        epoch = max(state_version, _int(ext, "masterEpoch", 0))
        reg = BrokerRegistration(
            cluster=cluster, broker_name=name, broker_addr=addr, broker_id=broker_id,
            ha_addr=ext.get("haServerAddr", ""), master_epoch=epoch, topics=topics,
            heartbeat_timeout_ms=min(timeout_ms, self.config.broker_expire_ms),
        )
        result = self.routes.register(reg, now_ms())
        if not result.accepted:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"registration as master refused: {result.reason}",
                                {"masterAddr": result.master_addr, "haServerAddr": result.ha_server_addr})
        if self.view is not None:
            self.view.observe_registration(reg)
        key = (name, addr)
        self._reg_conn[key] = conn
        keys: set[tuple[str, str]] = conn.attributes.setdefault(_CONN_KEY, set())
        if not keys:
            conn.add_close_callback(self._on_conn_closed)
        keys.add(key)
        return cmd.response(ResponseCode.SUCCESS, None,
                            {"masterAddr": result.master_addr, "haServerAddr": result.ha_server_addr},
                            {"table": {}})

    async def _unregister_broker(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ext = cmd.ext_fields
        name, addr = ext.get("brokerName", ""), ext.get("brokerAddr", "")
        registered_on = self._reg_conn.get((name, addr))
        if registered_on is not None and registered_on is not conn:
            # Only the broker itself leaves: a stranger must not drop live brokers from routes.
            return cmd.response(ResponseCode.NO_PERMISSION,
                                f"UNREGISTER_BROKER of {addr} ({name}) must come over the "
                                "connection it registered on; refused")
        self._reg_conn.pop((name, addr), None)
        self.routes.unregister(name, addr)
        return cmd.response(ResponseCode.SUCCESS)

    async def _route_by_topic(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        topic = cmd.ext_fields.get("topic", "")
        route = self.routes.topic_route(topic)
        if route is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
        return cmd.response(ResponseCode.SUCCESS, None, None, route)

    async def _cluster_info(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, None, self.routes.cluster_info())

    async def _member_group(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        name = cmd.ext_fields.get("brokerName", "")
        route = self.routes.group_route(name)
        if route is None:
            # RocketMQ answers an empty group rather than an error.
            route = {"cluster": cmd.ext_fields.get("clusterName", ""), "brokerName": name, "brokerAddrs": {},
                     "haAddrs": {}, "masterAddr": "", "masterEpoch": 0}
        body = {
            "brokerMemberGroup": {k: route[k] for k in ("cluster", "brokerName", "brokerAddrs")},
            "haAddrs": route["haAddrs"], "masterAddr": route["masterAddr"], "masterEpoch": route["masterEpoch"],
        }
        return cmd.response(ResponseCode.SUCCESS, None, None, body)

    async def _delete_topic(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        token = self.config.admin_token
        if token and not tokens_match(cmd.ext_fields.get("adminToken"), token):
            return cmd.response(ResponseCode.NO_PERMISSION, "admin token missing or wrong")
        topic = cmd.ext_fields.get("topic", "")
        removed = self.routes.delete_topic(topic)
        log.info("topic %s deleted from the routes of %d broker(s)", topic, removed)
        return cmd.response(ResponseCode.SUCCESS)

    async def _topic_list(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, None, {"topicList": self.routes.topics()})


async def run_namesrv(config: NamesrvConfig, stop: asyncio.Event) -> None:
    """Run a name server until ``stop`` is set."""
    ns = NameServer(config)
    await ns.start()
    try:
        await stop.wait()
    finally:
        await ns.stop()
