"""BrokerConfig: every setting of a broker process, with RocketMQ-style keys and defaults.

Field names are rmqha's snake_case (units in the name: ``_ms``, ``_bytes``, ``_hours``);
each also accepts RocketMQ's camelCase ``BrokerConfig``/``MessageStoreConfig`` key through
``aliases`` (``brokerClusterName``, ``controllerAddr``, ``haMaxTimeSlaveNotCatchup``, ...),
so a ``broker.conf`` from a RocketMQ controller-mode deployment mostly loads as it is.
Load with :func:`load_broker_config` (TOML or ``key=value``; env ``RMQHA_<KEY>``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqha.broker.master_lease import lease_ms_for, min_margin_ms
from rmqha.config import TlsKeys, load_config
from rmqha.errors import ConfigError
from rmqha.security.identity import Identity
from rmqha.security.secret import ClusterSecret, load_cluster_secret
from rmqha.security.secret_policy import check_optional_secret, require_guarded_listener, resolve_secret
from rmqha.security.tls import TlsMode, TlsSettings

INT32_MAX = 2**31 - 1


def _alias(*names: str) -> dict[str, tuple[str, ...]]:
    return {"aliases": names}


@dataclass
class BrokerConfig(TlsKeys):
    # --- identity -------------------------------------------------------------------------
    #: Cluster name (brokerClusterName): routes, identities and HA peers must match it.
    cluster: str = field(default="DefaultCluster", metadata=_alias("brokerClusterName", "cluster_name"))
    #: Broker group name: the brokers of one group replicate one commitlog.
    broker_name: str = field(default="broker-a", metadata=_alias("brokerName"))
    #: Root of this broker's store (commitlog, consume queues, epoch file, .broker.meta).
    store_dir: Path = field(default=Path("~/store"), metadata=_alias("storePathRootDir", "store_path_root_dir"))

    # --- network --------------------------------------------------------------------------
    #: Address the remoting port binds; off loopback only with a cluster secret or
    #: allow_insecure.
    listen_host: str = "127.0.0.1"
    #: The IP others use to reach this broker (advertised); empty = ``listen_host``.
    broker_ip: str = field(default="", metadata=_alias("brokerIP1"))
    #: The remoting port clients and other processes dial.
    listen_port: int = field(default=10911, metadata=_alias("listenPort", "client_port"))
    #: 0 = ``listen_port + 1`` (RocketMQ: haListenPort <= 0 -> listenPort + 1).
    ha_listen_port: int = field(default=0, metadata=_alias("haListenPort", "ha_port"))
    #: host:port slaves dial for replication when it differs from the HA listener (a proxy,
    #: NAT or relay in between); empty = the advertised host and the HA port.
    ha_advertised_address: str = field(default="", metadata=_alias("haAdvertisedAddress"))
    #: Controllers' remoting addresses, host:port;...
    controller_addr: list[str] = field(default_factory=list, metadata=_alias("controllerAddr", "controller_addresses"))
    #: Name servers' addresses, host:port;...; empty = register with none.
    namesrv_addr: list[str] = field(default_factory=list, metadata=_alias("namesrvAddr", "namesrv_addresses"))
    #: Largest remoting frame accepted; a longer length closes the connection before
    #: anything is allocated.
    max_frame_bytes: int = 16 * 1024 * 1024
    #: Connections one peer host may hold open on each port of this process (a stranger
    #: opening more gets each extra one closed at accept, logged; rmqha.net.peer_limit).
    max_connections_per_peer: int = 512
    #: Timeout of one request to a controller or name server.
    rpc_timeout_ms: int = 3000
    #: Admin writes (topic changes, config updates) need this token when it is set.
    admin_token: str = ""
    #: RocketMQ ACL 1.0 on the client port: every request signed by an account of
    #: ``acl_file`` (``plain_acl.yml``; a relative path is beside the config file).
    acl_enable: bool = field(default=False, metadata=_alias("aclEnable"))
    #: The ACL accounts file; re-read when it changes.
    acl_file: Path = field(default=Path("plain_acl.yml"), metadata=_alias("aclFile"))
    #: With ``acl_enable``: refuse a signed request that carries no signed ``RmqhaTime``
    #: (RocketMQ's own clients never send one; rmqha's always do).  Such a request cannot be
    #: told from its replay; off, it is taken as RocketMQ takes it (docs/security.md, Replay).
    acl_require_signed_time: bool = False
    #: With ``acl_enable``: signatures the replay window remembers (~120 bytes each); full,
    #: it refuses requests signed before the oldest one it forgot (the window shrinks).
    acl_replay_cache_entries: int = 262_144
    #: The secret shared by every process of the cluster (at least 16 bytes; make one with
    #: ``rmqha certs secret``).  Given, every HA link authenticates both ways (the peer
    #: must be a broker of this cluster and group) and every HA frame carries a MAC; this
    #: broker's requests to controllers and name servers are signed with it, and role
    #: notices must carry the controller's.  Else ``RMQHA_CLUSTER_SECRET``, else the first
    #: line of ``cluster_secret_file`` (or ``RMQHA_CLUSTER_SECRET_FILE``).  Without any,
    #: the broker runs on loopback only (see ``allow_insecure``).
    cluster_secret: str = field(default="", repr=False, metadata=_alias("clusterSecret"))
    #: A file whose first line is the cluster secret (a mounted Secret); cluster_secret
    #: wins.
    cluster_secret_file: str = field(default="", metadata=_alias("clusterSecretFile"))
    #: With a cluster secret, also accept (master) or speak (slave) RocketMQ's own HA wire,
    #: which has no room for authentication: such a link is open to an impostor.
    ha_allow_unauthenticated_rocketmq_dialect: bool = field(
        default=False, metadata=_alias("haAllowUnauthenticatedRocketmqDialect"))


    # --- without a cluster secret ------------------------------------------------------
    #: Listen off loopback without a cluster secret (role notices then go unchecked) or
    #: with neither ACL nor a TLS-only port (every topic open to anyone who reaches it).
    allow_insecure: bool = field(default=False, metadata=_alias("allowInsecure"))

    # --- controller mode ------------------------------------------------------------------
    #: Accepted for RocketMQ config compatibility; rmqha brokers always run in controller mode.
    enable_controller_mode: bool = field(default=True, metadata=_alias("enableControllerMode"))
    #: Ignored, as in RocketMQ controller mode (the id comes from the controller and is kept
    #: in .broker.meta; the role from elections).  Accepted so quick-start confs load.
    broker_id: int = field(default=-1, metadata=_alias("brokerId"))
    #: Ignored, as broker_id is: the role comes from elections.
    broker_role: str = field(default="", metadata=_alias("brokerRole"))
    #: How often this broker sends BROKER_HEARTBEAT to every controller.
    broker_heartbeat_interval_ms: int = field(default=1000, metadata=_alias("brokerHeartbeatInterval"))
    #: A broker silent this long is dead to the controllers (sent with each heartbeat); the
    #: master lease is shorter.
    controller_heartbeat_timeout_ms: int = field(default=10000, metadata=_alias("controllerHeartBeatTimeoutMills"))
    #: How long one heartbeat round waits for the controllers' answers.
    send_heartbeat_timeout_ms: int = field(default=1000, metadata=_alias("sendHeartbeatTimeoutMillis"))
    #: The master accepts and acknowledges writes only while it holds a lease from the
    #: controller leader (rmqha.broker.master_lease); off = RocketMQ's behaviour (a master
    #: cut off from the controllers keeps writing after another was elected).
    master_lease_enable: bool = field(default=True, metadata=_alias("masterLeaseEnable"))
    #: Lease length counted from the send time of the renewing heartbeat; 0 = the longest
    #: safe one, controller_heartbeat_timeout_ms - master_lease_margin_ms.
    master_lease_ms: int = field(default=0, metadata=_alias("masterLeaseMillis"))
    #: How much shorter than the heartbeat timeout the lease is: covers a controller leader
    #: cut off from its quorum (1.5 s Raft fallback + a tick) and clock-rate differences.
    master_lease_margin_ms: int = field(default=2000, metadata=_alias("masterLeaseMarginMillis"))
    #: How often this broker polls the controller for its group's replica info (role,
    #: epochs, SyncStateSet).
    sync_broker_metadata_period_ms: int = field(default=5000, metadata=_alias("syncBrokerMetadataPeriod"))
    #: How often a master checks whether a slave should join or leave the SyncStateSet.
    check_sync_state_set_period_ms: int = field(default=5000, metadata=_alias("checkSyncStateSetPeriod"))
    #: Accepted for RocketMQ confs; unused: the controller client follows NOT_LEADER
    #: answers and re-asks GET_METADATA_INFO whenever the leader moves.
    sync_controller_metadata_period_ms: int = field(default=10000, metadata=_alias("syncControllerMetadataPeriod"))
    #: Lower is preferred in elections (RocketMQ brokerElectionPriority).
    broker_election_priority: int = field(default=INT32_MAX, metadata=_alias("brokerElectionPriority"))
    #: How often this broker renews its registration with every name server.
    register_name_server_period_ms: int = field(default=30000, metadata=_alias("registerNameServerPeriod"))
    #: How long the name server keeps this broker without a renewal.
    namesrv_broker_timeout_ms: int = field(default=120000, metadata=_alias("heartbeatTimeoutMillis"))

    # --- store ----------------------------------------------------------------------------
    #: Size of one commitlog segment file (mapped, sparse).
    segment_bytes: int = field(default=1 << 30, metadata=_alias("mappedFileSizeCommitLog"))
    #: ``async`` or ``sync`` (RocketMQ ASYNC_FLUSH / SYNC_FLUSH accepted). With ``sync`` a
    #: master fsyncs on its event loop once per loop turn, while the slaves copy.
    flush: str = field(default="async", metadata=_alias("flushDiskType", "flush_mode"))
    #: With flush = async, how often the commitlog is fsynced.
    flush_interval_ms: int = field(default=500, metadata=_alias("flushIntervalCommitLog"))
    #: Segments older than this are deleted by retention (never the active one).
    file_reserved_hours: int = field(default=72, metadata=_alias("fileReservedTime"))
    #: Segments are sparse: disk blocks are reserved (fallocate) and faulted in this far
    #: ahead of the writer, so a full disk refuses a write cleanly instead of a SIGBUS.
    prefault_window_bytes: int = field(default=32 << 20, metadata=_alias("prefaultWindowBytes"))

    # --- acks -----------------------------------------------------------------------------
    #: A send is acknowledged only once every SyncStateSet member holds it (else
    #: in_sync_replicas copies).
    all_ack_in_sync_state_set: bool = field(default=False, metadata=_alias("allAckInSyncStateSet"))
    #: Without all_ack_in_sync_state_set: copies (master included) a send needs before it is
    #: acknowledged.
    in_sync_replicas: int = field(default=1, metadata=_alias("inSyncReplicas"))
    #: The floor: fewer copies than this never acknowledge a send, and a smaller
    #: SyncStateSet refuses writes.
    min_in_sync_replicas: int = field(default=1, metadata=_alias("minInSyncReplicas"))
    #: Accepted for RocketMQ confs; unused (only slave-acting-master mode reads it).
    total_replicas: int = field(default=1, metadata=_alias("totalReplicas"))
    #: How long a send waits for its copies before it answers FLUSH_SLAVE_TIMEOUT (stored,
    #: not confirmed).
    slave_timeout_ms: int = field(default=3000, metadata=_alias("slaveTimeout"))

    # --- HA -------------------------------------------------------------------------------
    #: HA wire a slave speaks: framed (rmqha's own) or rocketmq (RocketMQ 5's AutoSwitch
    #: HA); a master takes both.
    ha_protocol: str = "framed"
    #: An idle HA link carries an empty block (master) or an ack (slave) this often.
    ha_send_heartbeat_interval_ms: int = field(default=5000, metadata=_alias("haSendHeartbeatInterval"))
    #: An HA link silent this long is closed (and a slave dials again).
    ha_housekeeping_interval_ms: int = field(default=20000, metadata=_alias("haHousekeepingInterval"))
    #: 256 KiB, not RocketMQ's 32 KiB: Python pays per frame, and slave catch-up on loopback
    #: runs twice as fast with the larger blocks (benches/bench_replication.py).
    ha_transfer_batch_bytes: int = field(default=262144, metadata=_alias("haTransferBatchSize"))
    #: A SyncStateSet member not caught up for this long is proposed out of the set.
    ha_max_time_slave_not_catchup_ms: int = field(default=15000, metadata=_alias("haMaxTimeSlaveNotCatchup"))
    #: An empty slave starts from its master's last segment instead of its first byte.
    sync_from_last_file: bool = field(default=False, metadata=_alias("syncFromLastFile"))
    #: A slave fsyncs what it received before acking it (RocketMQ's slaves do not: off).
    ha_slave_flush_before_ack: bool = False
    #: A slave takes live replication traffic in its compiled lane (no GIL); false: Python only.
    ha_slave_compiled_lane: bool = True
    #: This slave replicates but never joins the SyncStateSet (RocketMQ's asyncLearner).
    async_learner: bool = field(default=False, metadata=_alias("asyncLearner"))
    #: A store that fails its start-up checks (a missing segment file) is moved aside to
    #: ``store_dir/aside-<time>/`` and the broker starts empty, to be rebuilt by replication
    #: from its master.  Off: the broker refuses to start and names what is wrong.
    rebuild_store_from_master: bool = False
    #: On start, check every record's CRC in this many of the last segments, below the
    #: flushed offset too (bytes changed at rest); ``rmqha scrub`` checks a whole store.
    verify_segments_on_open: int = 2

    # --- messaging ------------------------------------------------------------------------
    #: Accepted for RocketMQ confs; unused: compression is the client's choice (its
    #: compress_over_bytes).
    compress_msg_body_over_bytes: int = field(default=4096, metadata=_alias("compressMsgBodyOverHowmuch"))
    #: A send to an unknown topic creates it with default_topic_queue_nums queues.
    auto_create_topic_enable: bool = field(default=True, metadata=_alias("autoCreateTopicEnable"))
    #: Queues of an auto-created topic.
    default_topic_queue_nums: int = field(default=4, metadata=_alias("defaultTopicQueueNums"))
    #: Longest a pull or pop is held waiting for new messages, whatever the client asks.
    long_polling_max_ms: int = 15000
    #: How often retention looks for segments older than ``file_reserved_hours``.
    retention_interval_s: float = 60.0
    #: Upper bound of one pull response body.
    max_pull_bytes: int = 4 * 1024 * 1024
    #: Consumer offsets committed by pulls are written to the replicated state this often.
    offset_flush_interval_s: float = 1.0
    #: A client (producer/consumer) without a heartbeat for this long is forgotten.
    client_expire_s: float = 120.0
    #: Delay levels 1..N for DELAY and consumer retries: durations with s, m, h or d.
    message_delay_level: str = field(
        default="1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        metadata=_alias("messageDelayLevel"))
    #: How often due timer messages (TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS) are
    #: delivered.
    timer_precision_ms: int = field(default=1000, metadata=_alias("timerPrecisionMs"))
    #: Longest timer delay accepted.
    timer_max_delay_s: int = field(default=3 * 24 * 3600, metadata=_alias("timerMaxDelaySec"))
    #: A transaction's half message is checked back with its producer once this old.
    transaction_timeout_ms: int = field(default=6000, metadata=_alias("transactionTimeOut"))
    #: Units per consume-queue file (RocketMQ's ``mappedFileSizeConsumeQueue`` is this x 20 bytes).
    consume_queue_file_units: int = 300_000
    #: How often consume queues are flushed and checkpointed; a crash re-indexes about this much.
    consume_queue_flush_interval_s: float = 1.0
    #: How often pending half messages are looked at for check-backs.
    transaction_check_interval_ms: int = field(default=30000, metadata=_alias("transactionCheckInterval"))
    #: Check-backs before an unresolved half message is discarded.
    transaction_check_max: int = field(default=15, metadata=_alias("transactionCheckMax"))
    #: How often the master revives popped messages whose invisible time ran out.
    pop_revive_interval_ms: int = field(default=1000, metadata=_alias("reviveInterval"))
    #: Revived pops wait RocketMQ's retry backoff (delay level 3 + retry count) in the retry topic.
    pop_revive_backoff: bool = True
    #: Pops of a group nobody created use default group settings (else SUBSCRIPTION_GROUP_NOT_EXIST).
    auto_create_subscription_group: bool = field(default=True, metadata=_alias("autoCreateSubscriptionGroup"))
    #: Sends to a topic with a message.type attribute must be of that type.
    topic_message_type_check: bool = True
    #: Idempotent producers: (producer, queue) pairs whose last results the master keeps
    #: (least recently used dropped; ~2 KiB each).
    idempotent_max_producer_queues: int = 10_000
    #: Idempotent producers: bytes of the log's tail read back for their state when the
    #: broker becomes master.
    idempotent_rebuild_bytes: int = 64 << 20
    #: QUERY_ASSIGNMENT's mode for a topic/group no SET_MESSAGE_REQUEST_MODE set: PULL or POP.
    default_message_request_mode: str = "PULL"
    #: POP mode's popShareQueueNum for those (-1 or 0: every consumer pops every queue).
    default_pop_share_queue_num: int = -1

    # --- operations -----------------------------------------------------------------------
    #: Prometheus /metrics port; 0 = off (as the controller's metricsPromExporterPort).
    metrics_port: int = field(default=0, metadata=_alias("metricsPromExporterPort"))
    #: Address the Prometheus exporter binds.
    metrics_host: str = field(default="127.0.0.1", metadata=_alias("metricsPromExporterHost"))
    #: Serve /metrics over HTTPS with the tls.server.* certificate (and client certificates
    #: as tls.server.need.client.auth asks); read at start.
    https_enable: bool = field(default=False, metadata=_alias("httpsEnable"))
    #: DEBUG, INFO, WARNING, ERROR or CRITICAL.
    log_level: str = "INFO"
    #: Append JSON-line logs to this file instead of stderr; empty = stderr.
    log_file: str = ""
    #: One JSON object per log line; false = plain text.
    log_json: bool = True

    def validate(self) -> None:
        self.store_dir = Path(os.path.expanduser(str(self.store_dir)))
        flush = self.flush.strip().lower()
        flush = {"async_flush": "async", "sync_flush": "sync"}.get(flush, flush)
        if flush not in ("async", "sync"):
            raise ConfigError(f"flush must be 'async' or 'sync' (or ASYNC_FLUSH/SYNC_FLUSH), got {self.flush!r}")
        self.flush = flush
        if self.ha_protocol not in ("framed", "rocketmq"):
            raise ConfigError(f"ha_protocol must be 'framed' or 'rocketmq', got {self.ha_protocol!r}")
        self.default_message_request_mode = self.default_message_request_mode.strip().upper()
        if self.default_message_request_mode not in ("PULL", "POP"):
            raise ConfigError(f"default_message_request_mode must be PULL or POP, got "
                              f"{self.default_message_request_mode!r}")
        if not self.enable_controller_mode:
            raise ConfigError("enable_controller_mode=false is not supported: rmqha brokers always run in controller mode")
        for key in ("cluster", "broker_name"):
            value = getattr(self, key)
            if not value or "#" in value:
                raise ConfigError(f"{key} {value!r} must be non-empty and must not contain '#'")
        if not 0 <= self.listen_port < 65536:
            raise ConfigError(f"listen_port {self.listen_port} is out of range")
        if not 0 <= self.ha_listen_port < 65536:
            raise ConfigError(f"ha_listen_port {self.ha_listen_port} is out of range")
        if not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics_port {self.metrics_port} is out of range (0 = off)")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level {self.log_level!r} is not DEBUG, INFO, WARNING, ERROR or CRITICAL")
        for key in ("retention_interval_s", "offset_flush_interval_s", "client_expire_s", "max_pull_bytes"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        for key in ("timer_precision_ms", "timer_max_delay_s", "transaction_timeout_ms",
                    "transaction_check_interval_ms", "transaction_check_max",
                    "pop_revive_interval_ms"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        from rmqha.messaging.delayed_delivery import parse_delay_levels

        parse_delay_levels(self.message_delay_level)
        if not self.controller_addr:
            raise ConfigError("controller_addr is empty: a broker needs at least one controller address")
        for key in ("broker_heartbeat_interval_ms", "sync_broker_metadata_period_ms",
                    "check_sync_state_set_period_ms", "register_name_server_period_ms",
                    "controller_heartbeat_timeout_ms", "rpc_timeout_ms", "slave_timeout_ms",
                    "idempotent_max_producer_queues", "idempotent_rebuild_bytes"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        self._check_master_lease()
        self._check_cluster_secret()
        if self.in_sync_replicas < 1 or self.min_in_sync_replicas < 1:
            raise ConfigError("in_sync_replicas and min_in_sync_replicas must be at least 1")
        if self.acl_replay_cache_entries < 1:
            raise ConfigError(f"acl_replay_cache_entries must be at least 1, got {self.acl_replay_cache_entries}")
        if self.segment_bytes < 4096:
            raise ConfigError(f"segment_bytes {self.segment_bytes} is below 4096")
        if self.prefault_window_bytes < 8192:
            raise ConfigError(f"prefault_window_bytes {self.prefault_window_bytes} is below 8192")
        # The HA knobs are checked together by the HA layer; fail at load, not at election.
        from rmqha.ha.config import HAConfig

        HAConfig.from_object(self)

    def _check_cluster_secret(self) -> None:
        """A secret that loads, names this broker can have, and a dialect it can protect."""
        if self.load_cluster_secret() is None:
            return
        Identity.broker(self.cluster, self.broker_name, "0")  # ConfigError names a bad one
        if self.ha_protocol == "rocketmq" and not self.ha_allow_unauthenticated_rocketmq_dialect:
            raise ConfigError("ha_protocol = rocketmq cannot be authenticated: with a cluster secret it "
                              "needs ha_allow_unauthenticated_rocketmq_dialect = true")

    def load_cluster_secret(self) -> ClusterSecret | None:
        """The cluster secret (``cluster_secret``, ``RMQHA_CLUSTER_SECRET``,
        ``cluster_secret_file``), or None; ConfigError for a short or unreadable one."""
        return load_cluster_secret(value=self.cluster_secret or None, file=self.cluster_secret_file or None)

    def _check_master_lease(self) -> None:
        if not self.master_lease_enable:
            return
        timeout = self.controller_heartbeat_timeout_ms
        floor = min_margin_ms(timeout)
        if self.master_lease_margin_ms < floor:
            raise ConfigError(
                f"master_lease_margin_ms {self.master_lease_margin_ms} is below the safe minimum "
                f"{floor} for controller_heartbeat_timeout_ms {timeout} (Raft leader fallback + "
                f"a tick + 0.2% of the timeout for clock rates)")
        if self.master_lease_ms < 0:
            raise ConfigError(f"master_lease_ms must be 0 (derived) or positive, got {self.master_lease_ms}")
        limit = timeout - self.master_lease_margin_ms
        if self.master_lease_ms > limit:
            raise ConfigError(
                f"master_lease_ms {self.master_lease_ms} must be at most controller_heartbeat_timeout_ms "
                f"{timeout} - master_lease_margin_ms {self.master_lease_margin_ms} = {limit}: a longer "
                f"lease outlives the controller's view of this master")
        if self.master_lease_ms_in_force <= self.broker_heartbeat_interval_ms:
            raise ConfigError(
                f"the master lease ({self.master_lease_ms_in_force} ms) must be longer than "
                f"broker_heartbeat_interval_ms {self.broker_heartbeat_interval_ms}, or every "
                f"heartbeat round would find it expired; raise controller_heartbeat_timeout_ms")

    # --- derived --------------------------------------------------------------------------

    def secret(self) -> str | None:
        """The cluster secret (cluster_secret, else cluster_secret_file), or None."""
        return resolve_secret(self.cluster_secret, self.cluster_secret_file or None)

    def check_security(self) -> str | None:
        """The cluster secret; ConfigError if this broker may not run without one."""
        secret = self.secret()
        who = f"broker {self.broker_name} ({self.broker_address})"
        check_optional_secret(secret, self.allow_insecure, [self.listen_host], who)
        tls_only = TlsSettings.from_config(self, "broker config").server_mode is TlsMode.ENFORCING
        require_guarded_listener(who, [self.listen_host], guarded=self.acl_enable or tls_only,
                                 allow_insecure=self.allow_insecure,
                                 guards="acl_enable = true (aclEnable) or tls_server_mode = \"enforcing\" "
                                        "(tls.server.mode)")
        return secret

    @property
    def master_lease_ms_in_force(self) -> int:
        """The lease length used: ``master_lease_ms`` or, when 0, timeout minus margin."""
        return lease_ms_for(self.controller_heartbeat_timeout_ms, self.master_lease_margin_ms,
                            self.master_lease_ms)

    @property
    def advertised_host(self) -> str:
        return self.broker_ip or self.listen_host

    @property
    def ha_port(self) -> int:
        """The HA listen port: configured, else client port + 1 (0 if the client port is 0)."""
        if self.ha_listen_port:
            return self.ha_listen_port
        return self.listen_port + 1 if self.listen_port else 0

    @property
    def broker_address(self) -> str:
        return f"{self.advertised_host}:{self.listen_port}"

    @property
    def ha_address(self) -> str:
        if self.ha_advertised_address:
            return self.ha_advertised_address
        return f"{self.advertised_host}:{self.ha_port}"


def load_broker_config(path: str | Path | None = None, **overrides: object) -> BrokerConfig:
    """Defaults < file < ``RMQHA_<KEY>`` environment < ``overrides``; validated."""
    cfg = load_config(BrokerConfig, path, overrides=overrides or None)
    if path is not None and not cfg.acl_file.is_absolute():
        # RocketMQ keeps plain_acl.yml beside the broker's config; so does rmqha.
        cfg.acl_file = Path(path).resolve().parent / cfg.acl_file
    return cfg
