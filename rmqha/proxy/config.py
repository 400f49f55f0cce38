"""ProxyConfig: settings of an ``rmqha proxy`` process.

Keys are RocketMQ's ``ProxyConfig`` names where RocketMQ has one, so its ``rmq-proxy.json``
works as it is (``rocketMQClusterName``, ``namesrvAddr``, ``grpcServerPort``, the
``grpcClient*`` settings handed to clients, the message limits, ...); TOML and
``key=value`` files take the same keys (:mod:`rmqha.config`).  rmqha's own keys say where
the server binds, how long routes and topic settings are cached, the ACL, and logging.
A key of RocketMQ's ProxyConfig that rmqha does not use is accepted and remembered in
``ignored_keys`` (:mod:`rmqha.proxy.rocketmq_keys`); any other unknown key is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rmqha.config import TlsKeys, load_config
from rmqha.errors import ConfigError
from rmqha.proxy.rocketmq_keys import ROCKETMQ_PROXY_KEYS, check_ignored_value
from rmqha.security.secret_policy import require_guarded_listener
from rmqha.security.tls import TlsMode, TlsSettings, server_context

DAY_MS = 24 * 3600 * 1000


def _alias(*names: str) -> dict[str, tuple[str, ...]]:
    return {"aliases": names}


@dataclass
class ProxyConfig(TlsKeys):
    """The proxy's keys; the ``tls.*`` keys (:class:`~rmqha.config.TlsKeys`) are the gRPC
    port's (``tls.server.*``, see :mod:`rmqha.proxy.grpc_tls`) and the proxy's links to name
    servers and brokers' (``tls.enable``, ``tls.client.*``)."""

    #: The cluster whose brokers this proxy serves (RocketMQ's ``rocketMQClusterName``).
    rocketmq_cluster_name: str = field(default="DefaultCluster", metadata=_alias("rocketMQClusterName"))
    #: Name servers, ``host:port`` joined by ``;`` (required).
    namesrv_addr: str = ""
    #: Only ``cluster`` (brokers are separate processes reached over remoting).
    proxy_mode: str = "cluster"
    #: The port RocketMQ 5 clients connect to (their endpoints).
    grpc_server_port: int = 8081
    #: Address the gRPC server binds (rmqha's key; RocketMQ binds every address).
    grpc_server_host: str = "127.0.0.1"
    #: Routes point clients at the port they connected to instead of grpc_server_port.
    use_endpoint_port_from_request: bool = False

    # --- limits checked before anything reaches a broker (RocketMQ's defaults) ----------
    #: Largest message body a send may carry (MESSAGE_BODY_TOO_LARGE above); also told to producers.
    max_message_size: int = 4 * 1024 * 1024
    #: An empty body is refused (MESSAGE_BODY_EMPTY).
    enable_message_body_empty_check: bool = True
    #: Bytes of user properties, tag and keys of one message (MESSAGE_PROPERTIES_TOO_LARGE above).
    max_user_property_size: int = 16 * 1024
    #: User properties of one message at most.
    user_property_max_num: int = 128
    #: A FIFO message group must be shorter than this many bytes (ILLEGAL_MESSAGE_GROUP).
    max_message_group_size: int = 64
    #: Furthest a delayed message's delivery time may lie ahead (ILLEGAL_DELIVERY_TIME).
    max_delay_time_mills: int = DAY_MS
    #: Longest orphaned-transaction recovery time a message may ask for (BAD_REQUEST above).
    max_transaction_recovery_second: int = 3600
    #: A send whose message type differs from its topic's ``message.type`` is refused.
    enable_topic_message_type_check: bool = True
    #: The proxy's retries of a send (following a failover) carry a producer id and a
    #: per-queue sequence, so the broker never stores one twice (not delayed or
    #: transactional sends; see rmqha.client.idempotence).
    idempotent_sends: bool = True
    #: Shortest invisible time a receive may ask for (ILLEGAL_INVISIBLE_TIME).
    min_invisible_time_mills_for_recv: int = 10_000
    #: Longest invisible time a receive or change may ask for (ILLEGAL_INVISIBLE_TIME).
    max_invisible_time_mills: int = 12 * 3600 * 1000
    #: Invisible time of a receive that asks the proxy to renew (``auto_renew``: push
    #: consumers); the proxy renews it until the client acks (see the renew keys).
    default_invisible_time_mills: int = 60_000

    # --- renewing the invisible time of auto_renew deliveries (RocketMQ's keys) ---------
    #: Renew the invisible time of messages a client received with ``auto_renew`` until it
    #: acks or changes them (off: they stay invisible default_invisible_time_mills).
    enable_proxy_auto_renew: bool = True
    #: A delivery is renewed once its invisible time ends within this many ms.
    renew_ahead_time_millis: int = 10_000
    #: 0: each renewal is the next step of RocketMQ's renew strategy (1, 3, 5, 10, 30
    #: minutes, then an hour); above 0: every renewal is this long (RocketMQ 5.0's key).
    renew_slice_time_millis: int = 0
    #: How often the proxy looks for deliveries to renew.
    renew_schedule_period_millis: int = 5000
    #: Renewing stops this long after the delivery: the message is then handed back with
    #: the group's retry delay (a nack).
    renew_max_time_millis: int = 3 * 3600 * 1000
    #: Failed renewals of one delivery in a row before the proxy gives it up (it becomes
    #: visible again when its invisible time ends).
    max_renew_retry_times: int = 3
    #: Invisible time left to the deliveries of a client that went away (terminated, its
    #: Telemetry stream closed, or no heartbeat for channel_expired_timeout).
    invisible_time_millis_when_clear: int = 1000
    #: A client that sent no heartbeat for this long is gone: its deliveries are no longer
    #: renewed.
    channel_expired_timeout: int = 120_000

    # --- settings answered to clients over Telemetry ------------------------------------
    #: Send attempts a producer makes (told over Telemetry).
    grpc_client_producer_max_attempts: int = 3
    #: A producer's first pause between attempts.
    grpc_client_producer_backoff_initial_millis: int = 10
    #: A producer's longest pause between attempts.
    grpc_client_producer_backoff_max_millis: int = 1000
    #: Growth of a producer's pause per attempt.
    grpc_client_producer_backoff_multiplier: float = 2.0
    #: Shortest time a receive waits for messages.
    grpc_client_consumer_min_long_polling_timeout_millis: int = 5000
    #: Longest time a receive waits for messages (told to consumers as their long-polling timeout).
    grpc_client_consumer_max_long_polling_timeout_millis: int = 20_000
    #: Messages a push consumer asks for per receive (told over Telemetry).
    grpc_client_consumer_long_polling_batch_size: int = 32

    # --- talking to the cluster (rmqha's keys) -------------------------------------------
    #: How long a topic route from the name servers is used; a broker error refreshes it
    #: at once, so a failover is followed without waiting for this.
    route_ttl_ms: int = 10_000
    #: How long topic configs (message types) and subscription groups read from the
    #: masters are used.
    metadata_ttl_ms: int = 5000
    #: Timeout of one remoting request to a name server or broker (a receive adds its
    #: polling time).
    rpc_timeout_ms: int = 3000
    #: How often the producer groups of connected transactional producers are announced
    #: to the masters (check-backs reach the proxy through them).
    transaction_heartbeat_period_second: int = 10

    # --- ACL ---------------------------------------------------------------------------
    #: Check every gRPC request's ``authorization`` against ``acl_file`` (RocketMQ ACL 1.0).
    acl_enable: bool = field(default=False, metadata=_alias("aclEnable"))
    #: The brokers' ``plain_acl.yml``; a relative path is beside the config file.
    acl_file: Path = field(default=Path("plain_acl.yml"), metadata=_alias("aclFile"))
    #: Serve gRPC off loopback with neither ACL nor TLS (refused without it:
    #: rmqha.security.secret_policy.require_guarded_listener).
    allow_insecure: bool = field(default=False, metadata=_alias("allowInsecure"))
    #: The account the proxy signs its own broker requests with (brokers with aclEnable);
    #: empty: unsigned.
    inner_access_key: str = ""
    #: The secret key of inner_access_key.
    inner_secret_key: str = ""

    #: DEBUG, INFO, WARNING, ERROR or CRITICAL.
    log_level: str = "INFO"
    #: Append JSON-line logs to this file instead of stderr; empty = stderr.
    log_file: str = ""
    #: JSON lines (else plain text).
    log_json: bool = True

    def __post_init__(self) -> None:
        # Keys of RocketMQ's ProxyConfig read and not used (logged once at start).
        self.ignored_keys: list[str] = []

    def take_foreign_key(self, key: str, value: object, source: str) -> bool:
        """Accept ``key`` if RocketMQ's proxy knows it (rmqha has no field for it)."""
        if key not in ROCKETMQ_PROXY_KEYS:
            return False
        check_ignored_value(key, value, source)
        if key not in self.ignored_keys:
            self.ignored_keys.append(key)
        return True

    def validate(self) -> None:
        self._validate_cluster()
        self._validate_positive()
        self._validate_polling()
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level {self.log_level!r} is not DEBUG, INFO, WARNING, ERROR or CRITICAL")
        halves = [k for k in (self.inner_access_key, self.inner_secret_key) if k]
        if len(halves) == 1:
            raise ConfigError("inner_access_key and inner_secret_key are set together (or neither)")
        check_port_settings(self.tls)
        require_guarded_listener(
            f"proxy {self.address}", [self.grpc_server_host],
            guarded=self.acl_enable or self.tls.server_mode is TlsMode.ENFORCING,
            allow_insecure=self.allow_insecure,
            guards="acl_enable = true (aclEnable) or tls_server_mode = \"enforcing\" (tls.server.mode)")

    def _validate_cluster(self) -> None:
        if not self.namesrv_addr.strip():
            raise ConfigError("namesrvAddr is required: the name servers the proxy finds brokers through")
        if self.proxy_mode.lower() != "cluster":
            raise ConfigError(f"proxyMode {self.proxy_mode!r} is not supported: rmqha supports proxyMode "
                              f"CLUSTER only (brokers are separate processes reached over remoting)")
        if not self.rocketmq_cluster_name:
            raise ConfigError("rocketMQClusterName must not be empty")
        if not 0 < self.grpc_server_port < 65536:
            raise ConfigError(f"grpcServerPort {self.grpc_server_port} is out of range 1-65535")

    def _validate_positive(self) -> None:
        for key in ("max_message_size", "max_user_property_size", "user_property_max_num",
                    "max_message_group_size", "min_invisible_time_mills_for_recv",
                    "max_invisible_time_mills", "default_invisible_time_mills",
                    "renew_ahead_time_millis", "renew_schedule_period_millis",
                    "renew_max_time_millis", "invisible_time_millis_when_clear",
                    "channel_expired_timeout",
                    "grpc_client_producer_max_attempts", "route_ttl_ms", "metadata_ttl_ms",
                    "rpc_timeout_ms", "transaction_heartbeat_period_second",
                    "grpc_client_consumer_long_polling_batch_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")

    def _validate_polling(self) -> None:
        low = self.grpc_client_consumer_min_long_polling_timeout_millis
        high = self.grpc_client_consumer_max_long_polling_timeout_millis
        if not 0 < low <= high:
            raise ConfigError(f"grpc_client_consumer_min_long_polling_timeout_millis ({low}) must be "
                              f"positive and at most grpc_client_consumer_max_long_polling_timeout_millis "
                              f"({high})")
        if self.min_invisible_time_mills_for_recv > self.max_invisible_time_mills:
            raise ConfigError("min_invisible_time_mills_for_recv is above max_invisible_time_mills")
        if self.renew_slice_time_millis < 0:
            raise ConfigError(f"renew_slice_time_millis must not be negative, got {self.renew_slice_time_millis}")
        if self.max_renew_retry_times < 0:
            raise ConfigError(f"max_renew_retry_times must not be negative, got {self.max_renew_retry_times}")

    @property
    def tls(self) -> TlsSettings:
        """The ``tls.*`` keys (and ``tls.config.file``'s) as settings."""
        return TlsSettings.from_config(self, "proxy config")

    @property
    def namesrv_list(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.replace(",", ";").split(";") if a.strip()]

    @property
    def address(self) -> str:
        return f"{self.grpc_server_host}:{self.grpc_server_port}"


def check_port_settings(s: TlsSettings) -> None:
    """ConfigError naming what the gRPC port cannot do with ``s``, or a file it cannot use."""
    if s.server_mode is TlsMode.PERMISSIVE:
        raise ConfigError(
            "tls.server.mode=permissive is not possible on the proxy's gRPC port: grpc serves "
            "a port with TLS or without, not both; use enforcing (and, while plaintext clients "
            "move over, a second proxy with tls.server.mode=disabled on another port)")
    if s.server_mode is TlsMode.ENFORCING:
        server_context(s)  # names the key of a missing or unreadable file


def load_proxy_config(path: str | Path | None = None, **overrides: object) -> ProxyConfig:
    """The proxy's config from ``path`` (JSON, TOML or key=value), the environment and
    ``overrides``; a relative ``acl_file`` is taken beside the config file."""
    cfg = load_config(ProxyConfig, path, overrides=overrides or None)
    if path is not None and not cfg.acl_file.is_absolute():
        cfg.acl_file = Path(path).resolve().parent / cfg.acl_file
    return cfg
