"""ControllerConfig: the settings of one controller process (RocketMQ-style defaults).

Loaded with :func:`rmqha.config.load_config` from TOML or a RocketMQ ``key=value`` file;
RocketMQ's camelCase keys (``controllerDLegerPeers``, ``enableElectUncleanMaster``, ...)
are accepted.  Peers are ``id-host:port`` entries separated by ``;`` where host:port is the
controller's remoting (RPC) address, as in RocketMQ; each controller's Raft (pysyncobj)
address is given by ``raft_peers`` in the same format or, when that is empty, is the RPC
port plus ``raft_port_offset``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rmqha.config import TlsKeys
from rmqha.errors import ConfigError
from rmqha.security.secret_policy import require_controller_secret, resolve_secret

#: Keys UPDATE_CONTROLLER_CONFIG refuses: they would redirect storage, change the Raft
#: membership or weaken security.  (RocketMQ's configBlackList, extended.)
UPDATE_BLACKLIST: frozenset[str] = frozenset({
    "controller_store_path", "config_store_path", "config_black_list", "controller_peers",
    "controller_self_id", "controller_group", "raft_peers", "raft_port_offset",
    "raft_password", "admin_token", "listen_host", "metrics_port", "metrics_host",
    "raft_fast", "raft_durable", "tls_server_mode", "tls_server_cert_path",
    "tls_server_key_path", "tls_server_key_password", "tls_server_trust_cert_path",
    "tls_server_need_client_auth", "tls_enable", "tls_client_cert_path", "tls_client_key_path",
    "tls_client_key_password", "tls_client_trust_cert_path", "tls_client_auth_server",
    "tls_config_file", "https_enable", "cluster_secret", "cluster_secret_file", "allow_insecure",
    "advertised_address",
})

#: Values never shown by GET_CONTROLLER_CONFIG.
SECRET_KEYS: frozenset[str] = frozenset({"raft_password", "admin_token", "cluster_secret",
                                         "tls_server_key_password", "tls_client_key_password"})


@dataclass(frozen=True)
class Peer:
    id: str
    rpc_address: str
    raft_address: str


def _parse_peer_list(text: str, key: str) -> list[tuple[str, str]]:
    out = []
    for item in [p.strip() for p in text.replace(",", ";").split(";") if p.strip()]:
        pid, sep, addr = item.partition("-")
        host, colon, port = addr.rpartition(":")
        if not sep or not pid or not colon or not host or not port.isdigit():
            raise ConfigError(f"{key}: bad peer {item!r}; expected id-host:port")
        out.append((pid, addr))
    return out


@dataclass
class ControllerConfig(TlsKeys):
    #: Name of the controller group (RocketMQ's controllerDLegerGroup); shown in metrics and
    #: GET_CONTROLLER_CONFIG.
    controller_group: str = field(default="rmqha-controller",
                                  metadata={"aliases": ("controllerDLegerGroup",)})
    #: Every controller as id-host:port;... where host:port is its remoting (RPC) address.
    controller_peers: str = field(default="n0-127.0.0.1:9878",
                                  metadata={"aliases": ("controllerDLegerPeers",)})
    #: This controller's id among controller_peers.
    controller_self_id: str = field(default="n0", metadata={"aliases": ("controllerDLegerSelfId",)})
    #: Every controller's Raft (pysyncobj) address as id-host:port;...; empty = each RPC
    #: port plus raft_port_offset.
    raft_peers: str = ""
    #: Added to a controller's RPC port to get its Raft port when raft_peers is empty.
    raft_port_offset: int = 1000
    #: Address the remoting port binds; off loopback only with a cluster secret or
    #: allow_insecure.
    listen_host: str = "127.0.0.1"
    #: host:port brokers and tools are told to dial for this controller when it leads
    #: (controllerLeaderAddress) if that differs from its controller_peers address (a NAT,
    #: a service address or a proxy in between); empty = its controller_peers address.
    advertised_address: str = field(default="", metadata={"aliases": ("controllerAdvertisedAddress",)})
    #: Directory of the Raft journal, its metadata and snapshots (raft/ under it).
    controller_store_path: Path = field(default_factory=lambda: Path.home() / "rmqha" / "controller")
    #: Accepted for RocketMQ confs; unused (UPDATE_CONTROLLER_CONFIG changes are not
    #: persisted).
    config_store_path: Path | None = None
    #: Keys UPDATE_CONTROLLER_CONFIG refuses, ;-separated, on top of the built-in list
    #: (storage, membership, security).
    config_black_list: str = "configBlackList;configStorePath"
    #: The secret the whole cluster shares (env RMQHA_CLUSTER_SECRET): control requests
    #: carry an HMAC under it, and Raft traffic is encrypted with it unless raft_password
    #: is set.  Required unless allow_insecure; never shown by GET_CONTROLLER_CONFIG.
    cluster_secret: str | None = field(default=None, metadata={"aliases": ("clusterSecret",)})
    #: A file whose first line is the cluster secret (a mounted Secret); cluster_secret wins.
    cluster_secret_file: Path | None = field(default=None, metadata={"aliases": ("clusterSecretFile",)})
    #: Run without a cluster secret: only when every Raft peer and listen_host are loopback.
    allow_insecure: bool = field(default=False, metadata={"aliases": ("allowInsecure",)})
    #: pysyncobj ``password`` when it must differ from the cluster secret; alone it is the
    #: cluster secret too.
    raft_password: str | None = None
    #: When set, admin writes (elect, clean, config update) must carry it (extField adminToken).
    admin_token: str | None = None
    #: How often brokers whose heartbeat timed out are looked for (ms).
    scan_not_active_broker_interval: int = 5000
    #: How often the leader looks for groups whose master is gone and elects one (ms).
    scan_inactive_master_interval: int = 5000
    #: Attempts of one election before the leader gives up until the next scan.
    elect_master_max_retry_count: int = 3
    #: Elect a live replica outside the SyncStateSet when no member is alive (may lose
    #: acknowledged messages).
    enable_elect_unclean_master: bool = False
    #: Push NOTIFY_BROKER_ROLE_CHANGED to a group's brokers after an election (they also
    #: poll).
    notify_broker_role_changed: bool = True
    #: Heartbeat timeout assumed when a broker's heartbeat does not say, and the longest
    #: one a broker may ask for (ms; its answers say what is in force).
    broker_heartbeat_timeout: int = 10000
    #: A new leader waits this long for fresh heartbeats before electing anyone (ms).
    new_leader_heartbeat_wait: int = 3000
    #: rmqha's Raft timing (appends sent at once, with the pipelining guard); false runs
    #: pysyncobj's own batching at raft_heartbeat_interval (the benches' baseline).
    raft_fast: bool = True
    #: fsync the Raft log before any message leaves and the term/vote before any vote
    #: (group commit); off only to measure what durability costs.
    raft_durable: bool = True
    #: Shortest Raft election timeout (ms); each wait is random between this and
    #: raft_max_timeout.
    raft_min_timeout: int = 400
    #: Longest Raft election timeout (ms).
    raft_max_timeout: int = 800
    #: Raft heartbeat period (ms); without raft_fast also the append batching period.
    raft_heartbeat_interval: int = 50
    #: How long a write waits for its Raft commit before the request fails (ms).
    commit_timeout: int = 5000
    #: Largest remoting frame accepted; a longer length closes the connection before
    #: anything is allocated.
    max_frame_bytes: int = 16 * 1024 * 1024
    #: Connections one peer host may hold open on each port of this process (a stranger
    #: opening more gets each extra one closed at accept, logged; rmqha.net.peer_limit).
    max_connections_per_peer: int = 512

    #: Prometheus exporter port (0 = off).
    metrics_port: int = field(default=0, metadata={"aliases": ("metricsPromExporterPort",)})
    #: Address the Prometheus exporter binds.
    metrics_host: str = field(default="127.0.0.1", metadata={"aliases": ("metricsPromExporterHost",)})
    #: Serve /metrics over HTTPS with the tls.server.* certificate (and client certificates
    #: as tls.server.need.client.auth asks); read at start.
    https_enable: bool = field(default=False, metadata={"aliases": ("httpsEnable",)})

    def validate(self) -> None:
        peers = self.peers()
        if self.controller_self_id not in {p.id for p in peers}:
            raise ConfigError(
                f"controllerDLegerSelfId {self.controller_self_id!r} is not among the peers "
                f"({', '.join(p.id for p in peers)})"
            )
        if self.raft_min_timeout <= 0 or self.raft_max_timeout < self.raft_min_timeout:
            raise ConfigError("raft_min_timeout must be > 0 and <= raft_max_timeout")
        if self.advertised_address:
            host, colon, port = self.advertised_address.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"advertised_address: bad address {self.advertised_address!r}; "
                                  f"expected host:port")

    def advertised(self) -> str:
        """The address this controller names itself by as leader: advertised_address, else
        its controller_peers (RPC) address."""
        return self.advertised_address or self.self_peer().rpc_address

    def secret(self) -> str | None:
        """The cluster secret: cluster_secret, else cluster_secret_file, else raft_password."""
        return resolve_secret(self.cluster_secret, self.cluster_secret_file, self.raft_password)

    def raft_secret(self) -> str | None:
        """pysyncobj's password: raft_password, else the cluster secret."""
        return self.raft_password or self.secret()

    def check_security(self) -> str | None:
        """The cluster secret; ConfigError (naming the keys) if this controller may not run
        as configured without one (see :mod:`rmqha.security.secret_policy`)."""
        secret = self.secret()
        addresses = [self.listen_host]
        for p in self.peers():
            addresses += (p.rpc_address, p.raft_address)
        require_controller_secret(secret, self.allow_insecure, addresses,
                                  f"controller {self.controller_self_id}")
        return secret

    def peers(self) -> list[Peer]:
        rpc = _parse_peer_list(self.controller_peers, "controller_peers")
        if not rpc:
            raise ConfigError("controller_peers is empty")
        ids = [pid for pid, _ in rpc]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"controller_peers: duplicate ids in {self.controller_peers!r}")
        raft: dict[str, str] = {}
        if self.raft_peers.strip():
            raft = dict(_parse_peer_list(self.raft_peers, "raft_peers"))
            if set(raft) != set(ids):
                raise ConfigError("raft_peers must name the same ids as controller_peers")
        out = []
        for pid, addr in rpc:
            if pid in raft:
                raft_addr = raft[pid]
            else:
                host, _, port = addr.rpartition(":")
                raft_addr = f"{host}:{int(port) + self.raft_port_offset}"
            out.append(Peer(pid, addr, raft_addr))
        return out

    def self_peer(self) -> Peer:
        for p in self.peers():
            if p.id == self.controller_self_id:
                return p
        raise ConfigError(f"controllerDLegerSelfId {self.controller_self_id!r} is not a peer")

    @property
    def journal_file(self) -> Path:
        return self.controller_store_path / "raft" / "journal"
