"""Routes, assignments and the client's life cycle: QueryRoute, QueryAssignment,
Heartbeat, NotifyClientTermination and Telemetry's Settings (RocketMQ's ``RouteActivity``
and ``ClientActivity``).  A heartbeat keeps a client's auto-renewed deliveries renewed; a
terminating client's are handed back (:mod:`rmqha.proxy.renewal`).

QueryRoute answers the topic's queues pointing at the proxy (:mod:`rmqha.proxy.routing`);
QueryAssignment the queues a push consumer polls (FIFO for a consume-orderly group).
Telemetry's Settings are recorded per client (:mod:`rmqha.proxy.clients`) and answered
with the server's (:mod:`rmqha.proxy.settings`); a producer's topics are announced to the
brokers for check-backs (:mod:`rmqha.proxy.transactions`).  Heartbeats need nothing from
the brokers: pop consumers are not registered there.
"""
from __future__ import annotations

from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from rmqha.errors import ProxyError
from rmqha.proxy.calls import Call
from rmqha.proxy.clients import ClientRegistry, Stream
from rmqha.proxy.cluster import ClusterAccess
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.routing import assignments, proxy_endpoints, route_queues
from rmqha.proxy.settings import consumer_settings, default_group, producer_settings
from rmqha.proxy.status import Code
from rmqha.proxy.transactions import TransactionRelay
from rmqha.proxy.validation import check_group, check_topic

_CONSUMERS = frozenset({pb.ClientType.PUSH_CONSUMER, pb.ClientType.SIMPLE_CONSUMER})


def ok() -> Any:
    return pb.Status(code=Code.OK, message="OK")


class ClientActivity:
    """QueryRoute, QueryAssignment, Heartbeat, NotifyClientTermination, Settings."""

    def __init__(self, cfg: ProxyConfig, cluster: ClusterAccess, clients: ClientRegistry,
                 relay: TransactionRelay) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.clients = clients
        self.relay = relay

    def _endpoints(self, requested: Any) -> Any:
        if not requested.addresses:
            requested = pb.Endpoints(scheme=pb.AddressScheme.IPv4, addresses=[
                pb.Address(host=self.cfg.grpc_server_host, port=self.cfg.grpc_server_port)])
        return proxy_endpoints(requested, self.cfg.grpc_server_port,
                               self.cfg.use_endpoint_port_from_request)

    async def query_route(self, request: Any, call: Call) -> Any:
        topic = check_topic(request.topic.name)
        route = await self.cluster.route(topic)
        kind = await self.cluster.message_type(topic)
        queues = route_queues(route, request.topic, kind, self._endpoints(request.endpoints))
        return spb.QueryRouteResponse(status=ok(), message_queues=queues)

    async def query_assignment(self, request: Any, call: Call) -> Any:
        topic = check_topic(request.topic.name)
        group = check_group(request.group.name)
        route = await self.cluster.route(topic)
        config = await self.cluster.group_config(group, topic)
        fifo = config is not None and config.consume_message_orderly
        found = assignments(route, request.topic, fifo, self._endpoints(request.endpoints))
        if not found:
            return spb.QueryAssignmentResponse(status=pb.Status(code=Code.FORBIDDEN,
                                                                message="no readable queue"))
        return spb.QueryAssignmentResponse(status=ok(), assignments=found)

    async def heartbeat(self, request: Any, call: Call) -> Any:
        if request.client_type in _CONSUMERS:
            check_group(request.group.name)
        elif request.client_type != pb.ClientType.PRODUCER:
            raise ProxyError(Code.UNRECOGNIZED_CLIENT_TYPE,
                             f"client type {pb.ClientType.Name(request.client_type)} is not supported")
        self.clients.heard_from(call.client_id)
        return spb.HeartbeatResponse(status=ok())

    async def terminate(self, request: Any, call: Call) -> Any:
        record = self.clients.remove(call.client_id)
        if record is None:
            raise ProxyError(Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client")
        if record.producer_topics:
            self.relay.announce_soon()
        for stream in record.streams:
            stream.put_nowait(None)
        return spb.NotifyClientTerminationResponse(status=ok())

    async def settings(self, command: Any, call: Call, stream: Stream) -> Any:
        """Record a client's Settings and answer the server's; ProxyError if bad."""
        settings = command.settings
        kind = settings.WhichOneof("pub_sub")
        if kind == "publishing":
            for topic in settings.publishing.topics:
                check_topic(topic.name)
            answer = producer_settings(settings, self.cfg)
        elif kind == "subscription":
            group = check_group(settings.subscription.group.name)
            config = await self._group(group, settings)
            answer = consumer_settings(settings, self.cfg, config)
        else:
            raise ProxyError(Code.BAD_REQUEST, "there is no publishing or subscription data in settings")
        if self.clients.update(call.client_id, settings, stream):
            self.relay.announce_soon()
        return spb.TelemetryCommand(status=ok(), settings=answer)

    async def _group(self, group: str, settings: Any) -> Any:
        for entry in settings.subscription.subscriptions:
            config = await self.cluster.group_config(group, check_topic(entry.topic.name))
            if config is not None:
                return config
        return default_group(group)
