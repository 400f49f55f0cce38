"""NamesrvConfig: settings of a name server process (RocketMQ ``NamesrvConfig`` names accepted).

An embedded controller (``enable_controller_in_namesrv = true``) takes its own settings
from ``controller_config_file`` (a controller config file) and/or a ``[controller]`` table
in the name server's TOML file; either is loaded into the controller's config dataclass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqha.config import TlsKeys, load_config
from rmqha.errors import ConfigError
from rmqha.security.secret_policy import check_optional_secret, require_guarded_listener, resolve_secret
from rmqha.security.tls import TlsMode, TlsSettings


def _alias(*names: str) -> dict[str, tuple[str, ...]]:
    return {"aliases": names}


@dataclass
class NamesrvConfig(TlsKeys):
    #: Address the remoting port binds; off loopback only with a cluster secret or
    #: allow_insecure.
    listen_host: str = "127.0.0.1"
    #: The remoting port clients and other processes dial.
    listen_port: int = field(default=9876, metadata=_alias("listenPort"))
    #: A broker not renewed for this long is dropped (RocketMQ: 120 s).
    broker_expire_ms: int = field(default=120_000, metadata=_alias("brokerChannelExpiredTime"))
    #: How often expired brokers are looked for (RocketMQ scans every 5 s).
    scan_not_active_broker_interval_ms: int = field(default=5000, metadata=_alias("scanNotActiveBrokerInterval"))
    #: Drop a broker's registrations as soon as the connection it registered over closes
    #: (RocketMQ's BrokerHousekeepingService does the same on channel close).
    drop_on_disconnect: bool = True
    #: Largest remoting frame accepted; a longer length closes the connection before
    #: anything is allocated.
    max_frame_bytes: int = 16 * 1024 * 1024
    #: Connections one peer host may hold open on each port of this process (a stranger
    #: opening more gets each extra one closed at accept, logged; rmqha.net.peer_limit).
    max_connections_per_peer: int = 512
    #: Admin writes (topic deletion from the route table) need this token when set.
    admin_token: str = ""
    #: The cluster's shared secret (env RMQHA_CLUSTER_SECRET): REGISTER_BROKER and
    #: UNREGISTER_BROKER must then carry an HMAC under it.  An embedded controller without
    #: a secret of its own uses this one.
    cluster_secret: str = field(default="", metadata=_alias("clusterSecret"))
    #: A file whose first line is the cluster secret (a mounted Secret); cluster_secret wins.
    cluster_secret_file: str = field(default="", metadata=_alias("clusterSecretFile"))
    #: Listen off loopback without a cluster secret (registrations then go unchecked) or
    #: without a TLS-only port (routes then readable by anyone who reaches it).
    allow_insecure: bool = field(default=False, metadata=_alias("allowInsecure"))


    #: Run a controller inside this name server process (RocketMQ's
    #: enableControllerInNamesrv).
    enable_controller_in_namesrv: bool = field(default=False, metadata=_alias("enableControllerInNamesrv"))
    #: Config file of the embedded controller (else the [controller] table of this file).
    controller_config_file: str = ""
    #: ``[controller]`` table of a TOML file: controller settings (any key spelling).
    controller: dict[str, Any] = field(default_factory=dict)

    #: Prometheus /metrics port; 0 = off (as the controller's metricsPromExporterPort).
    metrics_port: int = field(default=0, metadata=_alias("metricsPromExporterPort"))
    #: Address the Prometheus exporter binds.
    metrics_host: str = field(default="127.0.0.1", metadata=_alias("metricsPromExporterHost"))
    #: Read-only HTML status page (groups, masters, SyncStateSets, lag, elections) on this
    #: port; 0 = off.  On loopback unless status_host says otherwise: it has no login.
    status_port: int = field(default=0, metadata=_alias("statusPort"))
    #: Address the status page binds (set 0.0.0.0 only behind something that authenticates).
    status_host: str = field(default="127.0.0.1", metadata=_alias("statusHost"))
    #: How often the page's data is refreshed from the brokers (and the page polls it).
    status_poll_ms: int = field(default=1000, metadata=_alias("statusPollMs"))
    #: Controllers (host:port;...) the status page asks for each group's master and
    #: SyncStateSet, the authority on both: a restarted name server shows a group's master
    #: as soon as any member registers, not when the master registers again; empty = the
    #: brokers' own answers only.
    status_controller_addr: str = field(default="", metadata=_alias("statusControllerAddr"))
    #: Serve /metrics and the status page over HTTPS with the tls.server.* certificate (and client certificates
    #: as tls.server.need.client.auth asks); read at start.
    https_enable: bool = field(default=False, metadata=_alias("httpsEnable"))
    #: DEBUG, INFO, WARNING, ERROR or CRITICAL.
    log_level: str = "INFO"
    #: Append JSON-line logs to this file instead of stderr; empty = stderr.
    log_file: str = ""
    #: One JSON object per log line; false = plain text.
    log_json: bool = True

    def validate(self) -> None:
        if not 0 <= self.listen_port < 65536:
            raise ConfigError(f"listen_port {self.listen_port} is out of range")
        if not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics_port {self.metrics_port} is out of range (0 = off)")
        if not 0 <= self.status_port < 65536:
            raise ConfigError(f"status_port {self.status_port} is out of range (0 = off)")
        if not 100 <= self.status_poll_ms <= 60_000:
            raise ConfigError(f"status_poll_ms {self.status_poll_ms} must be between 100 and 60000")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level {self.log_level!r} is not DEBUG, INFO, WARNING, ERROR or CRITICAL")
        if self.broker_expire_ms <= 0 or self.scan_not_active_broker_interval_ms <= 0:
            raise ConfigError("broker_expire_ms and scan_not_active_broker_interval_ms must be positive")
        if (self.controller_config_file or self.controller) and not self.enable_controller_in_namesrv:
            raise ConfigError(
                "controller settings given but enable_controller_in_namesrv is false "
                "(set it to true to host a controller in the name server)"
            )
        if self.controller_config_file and not Path(self.controller_config_file).exists():
            raise ConfigError(f"controller_config_file {self.controller_config_file} does not exist")

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    def secret(self) -> str | None:
        """The cluster secret (cluster_secret, else cluster_secret_file), or None."""
        return resolve_secret(self.cluster_secret, self.cluster_secret_file or None)

    def check_security(self) -> str | None:
        """The cluster secret; ConfigError if this name server may not run without one."""
        secret = self.secret()
        who = f"name server {self.address}"
        check_optional_secret(secret, self.allow_insecure, [self.listen_host], who)
        tls_only = TlsSettings.from_config(self, "name server config").server_mode is TlsMode.ENFORCING
        require_guarded_listener(who, [self.listen_host], guarded=tls_only, allow_insecure=self.allow_insecure,
                                 guards="tls_server_mode = \"enforcing\" (tls.server.mode) with the "
                                        "cluster CA's certificates")
        return secret


def load_namesrv_config(path: str | Path | None = None, **overrides: object) -> NamesrvConfig:
    return load_config(NamesrvConfig, path, overrides=overrides or None)
