"""The proxy process: the gRPC server and the background work, started and stopped in order.

:func:`run_proxy` binds ``grpcServerHost:grpcServerPort`` (grpc.aio; TLS as
``tls.server.mode`` says, :mod:`rmqha.proxy.grpc_tls`), serves
:class:`~rmqha.proxy.service.MessagingService`, announces producer groups to the
masters (:class:`~rmqha.proxy.transactions.TransactionRelay`) and renews auto_renew
deliveries (:class:`~rmqha.proxy.renewal.Renewal`) until ``stop`` is set; then it stops
taking calls, lets running ones end for a moment, hands back the deliveries it renewed and
closes its broker connections.  The proxy keeps nothing on disk.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc

from rmqha.errors import ConfigError
from rmqha.proxy.client_activity import ClientActivity
from rmqha.proxy.clients import ClientRegistry
from rmqha.proxy.cluster import ClusterAccess
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.consuming import Consuming
from rmqha.proxy.grpc_tls import port_credentials
from rmqha.proxy.producing import Producing
from rmqha.proxy.renewal import Renewal
from rmqha.proxy.rocketmq_keys import ignored_keys_line
from rmqha.proxy.service import MessagingService
from rmqha.proxy.transactions import TransactionRelay, proxy_client_id
from rmqha.security.acl import AclValidator

log = logging.getLogger(__name__)

#: RocketMQ's ``grpcMaxInboundMessageSize``: a request may carry a batch of large bodies.
MAX_INBOUND_BYTES = 130 * 1024 * 1024
GRACE_S = 1.0
#: A connection's TLS and HTTP/2 handshake within this long (gRPC's own default: 120 s),
#: as the remoting ports' deadline; a connection with no call open this long is closed
#: (GOAWAY: clients dial again when they next call), RocketMQ's 120 s channel idle time.
HANDSHAKE_TIMEOUT_MS = 10_000
IDLE_TIMEOUT_MS = 120_000
#: The server's channel options: frame size and the deadlines above, and no SO_REUSEPORT:
#: grpc sets it on Linux by default, so a second process (another proxy, a test's server)
#: binding a taken port would silently share it, each taking some of the connections; with
#: it off a taken port is refused at start (ConfigError naming the port).
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_INBOUND_BYTES),
    ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", IDLE_TIMEOUT_MS),
    ("grpc.so_reuseport", 0),
]


def build_service(cfg: ProxyConfig) -> tuple[MessagingService, ClusterAccess, TransactionRelay]:
    cluster = ClusterAccess(cfg)
    clients = ClientRegistry()
    relay = TransactionRelay(cluster, clients, proxy_client_id(cfg.grpc_server_port),
                             cfg.transaction_heartbeat_period_second)
    renewal = Renewal(cfg, cluster, clients)
    acl = AclValidator(cfg.acl_file) if cfg.acl_enable else None
    service = MessagingService(ClientActivity(cfg, cluster, clients, relay), Producing(cfg, cluster),
                               Consuming(cfg, cluster, renewal), clients, acl)
    return service, cluster, relay


async def run_proxy(cfg: ProxyConfig, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    service, cluster, relay = build_service(cfg)
    renewal = service.consuming.renewal
    server = grpc.aio.server(options=SERVER_OPTIONS)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
    credentials = port_credentials(cfg.tls)
    try:
        bound = (server.add_insecure_port(cfg.address) if credentials is None
                 else server.add_secure_port(cfg.address, credentials))
    except RuntimeError as exc:   # grpcio 1.5x raises where older ones returned 0
        await cluster.close()
        raise ConfigError(f"grpcServerPort: cannot bind {cfg.address} (is it taken?): {exc}") from None
    if bound == 0:
        await cluster.close()
        raise ConfigError(f"grpcServerPort: cannot bind {cfg.address}")
    await server.start()
    if cfg.ignored_keys:
        log.info("%s", ignored_keys_line(cfg.ignored_keys))
    log.info("proxy serving gRPC%s on %s for cluster %s (name servers %s)",
             "" if credentials is None else " over TLS", cfg.address,
             cfg.rocketmq_cluster_name, cfg.namesrv_addr)
    announcing = asyncio.create_task(relay.run(stop))
    renewing = asyncio.create_task(renewal.run(stop))
    try:
        await stop.wait()
    finally:
        announcing.cancel()
        renewing.cancel()
        await server.stop(GRACE_S)
        await renewal.close()
        await cluster.close()
        log.info("proxy stopped")
