"""The broker process object: store, identity, roles, HA, messaging and name-server registration.

:class:`Broker` wires the layers together on one asyncio loop:

- the store in ``store_dir``: ``commitlog/`` (:class:`rmqha.store.CommitLog`) and
  ``epochFileCheckpoint`` (:class:`rmqha.store.EpochMap`), plus ``.broker.meta``;
- the :class:`~rmqha.broker.replicas_manager.ReplicasManager` (controller side) which calls
  back :meth:`Broker.become_master`, :meth:`Broker.become_slave`, ...;
- a :class:`~rmqha.net.server.RemotingServer` on the client port serving the messaging
  handlers, NOTIFY_BROKER_ROLE_CHANGED and two admin queries: GET_BROKER_EPOCH_CACHE (1007,
  RocketMQ's ``EpochEntryCache`` body) and GET_BROKER_HA_STATUS (907, role, offsets, HA link);
- :class:`rmqha.ha.HAMaster` / :class:`rmqha.ha.HASlave` on the HA port;
- the :class:`rmqha.messaging.MessageService`;
- registration with every name server every ``register_name_server_period_ms`` and at once
  after every role change (as id 0 when master, with the master epoch as state version).

With a cluster secret its requests to controllers and name servers are signed and role
notices must be signed by a controller (:mod:`rmqha.protocol.request_auth`) and come over an
authenticated channel the controller dialled to the client port (:mod:`rmqha.net.channel`;
plain clients share the port), and over mutual TLS come from a controller's certificate
(:mod:`rmqha.net.peer_check`); without one
it listens on loopback only unless told ``allow_insecure`` (:mod:`rmqha.security.secret_policy`).

Until the controller has told it its role the broker is fenced: every write code is
refused with SERVICE_NOT_AVAILABLE, and it does not register with name servers.  A master
also needs its lease from the controller (:mod:`rmqha.broker.master_lease`) to take and
acknowledge writes.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

from rmqha import log as rmqha_log
from rmqha.broker.acl_guard import acl_guard
from rmqha.broker.admin_info import BrokerAdminInfo, earliest_store_time
from rmqha.broker.store_repair import COMMITLOG_DIR, EPOCH_FILE, cut_at_first_bad_record, move_store_aside
from rmqha.broker.config import BrokerConfig
from rmqha.broker.confirm_checkpoint import ConfirmCheckpoint
from rmqha.failpoints import Failpoint, hit
from rmqha.broker.metrics import (
    FlushProbe, flush_latency_histogram, register_broker_metrics, served_bytes_counter,
)
from rmqha.broker.replicas_manager import ReplicasManager, Role
from rmqha.broker.replication import Replication
from rmqha.broker.role_fence import RoleFence
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import (
    BrokerError, ConfigError, MissingSegmentError, RemoteCommandError, RemotingError, StoreError,
)
from rmqha.ha import HAConfig, HAMaster, HASlave
from rmqha.ha.auth import HAAuth
from rmqha.ha.tls_link import HATls
from rmqha.messaging import MessageService
from rmqha.messaging.queue_assignment import namesrv_route_source
from rmqha.metrics import MetricsRegistry
from rmqha.net.client import RemotingClient, split_address
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.net.peer import RequestPeer
from rmqha.net.peer_check import Need, PeerCheck
from rmqha.net.server import RemotingServer
from rmqha.protocol.code_rules import APPEND_CODES, require_declared
from rmqha.protocol.command import RemotingCommand
from rmqha.security.replay import ReplayWindow, plaintext_acl_warning
from rmqha.security.tls import TlsMode, TlsSettings
from rmqha.protocol.request_auth import OpenAuth, RequestAuthenticator, request_auth
from rmqha.security.channel_auth import ChannelKey
from rmqha.security.identity import Identity
from rmqha.security.identity import Role as IdentityRole
from rmqha.store.disk_usage import directory_usage

log = logging.getLogger(__name__)

#: Java Long.MAX_VALUE: RocketMQ's wire value for the open end of the last epoch.
OPEN_END = (1 << 63) - 1
#: Who may send NOTIFY_BROKER_ROLE_CHANGED, by TLS certificate (rmqha.net.peer_check).
FROM_CONTROLLER = Need(frozenset({IdentityRole.CONTROLLER}))

#: What the broker process serves itself, besides its messaging service's codes (the
#: declarations' served_by is checked against them, tests/unit/test_code_rules.py).
BROKER_OWN_CODES = (RequestCode.NOTIFY_BROKER_ROLE_CHANGED, RequestCode.GET_BROKER_EPOCH_CACHE,
                    RequestCode.GET_BROKER_HA_STATUS, *BrokerAdminInfo.CODES)


class Broker:
    """One broker process (see the module docstring)."""

    def __init__(self, config: BrokerConfig, *, controller_client: Any = None) -> None:
        self.config = config
        self.store_dir = Path(config.store_dir)
        self.commitlog: Any = None
        self.epoch_map: Any = None
        self.message_service: MessageService | None = None
        self.ha_master: HAMaster | None = None
        self.ha_slave: HASlave | None = None
        self.replication = Replication(self)
        self._controller_client = controller_client
        #: The client port's TLS (tls.server.*) and this broker's own links' (tls.client.*).
        self.tls = TlsSettings.from_config(config, "broker config")
        self._links = ClientSecurity.for_links(self.tls)
        #: The HA port's and the slave's mutual TLS, with the client port's files (None: off).
        self._ha_tls = HATls.from_settings(self.tls, config.cluster, config.broker_name)
        #: The name servers' links: ``_links`` and, with the secret, authenticated channels.
        self._ns_links = self._links
        #: Signs this broker's control requests, checks the role notices it gets.
        self.auth: RequestAuthenticator = OpenAuth()
        self.replicas: ReplicasManager | None = None
        self.server: RemotingServer | None = None
        self._ns_clients: dict[str, RemotingClient] = {}
        self._ns_kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._ha_lock = asyncio.Lock()
        self._known_ids: frozenset[int] = frozenset()
        self._known_ids_at = 0.0
        self._started = False
        self.metrics: MetricsRegistry | None = None
        #: The bound Prometheus port (None when metrics are off).
        self.metrics_port: int | None = None
        #: Set when a background loop died of an unexpected error; run_broker then exits.
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None
        #: (master id, master client address) the HA slave follows, None unless slave.
        self._slave_of: tuple[int, str] | None = None
        self._served_bytes: Any = None
        # Every log line says which broker it comes from; id -1 and epoch 0 until known.
        rmqha_log.context.group = config.broker_name
        rmqha_log.context.broker_id = -1
        rmqha_log.context.epoch = 0

    # --- derived state --------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self.replicas.role if self.replicas is not None else Role.FENCED

    @property
    def broker_id(self) -> int | None:
        return self.replicas.status.broker_id if self.replicas is not None else None

    @property
    def namesrv_broker_id(self) -> int:
        """The id registered with name servers: 0 for the master (RocketMQ MASTER_ID)."""
        return 0 if self.role == Role.MASTER else int(self.broker_id or 0)

    # --- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, settle the id, serve, register; returns once registered."""
        from rmqha.controller.client import ControllerClient
        from rmqha.store import EpochMap

        cfg = self.config
        self.auth = request_auth(cfg.check_security())
        self.store_dir.mkdir(parents=True, exist_ok=True)
        channel = self._channel_key()
        if channel is not None:
            self._ns_links = (self._links or ClientSecurity()).with_channel(
                channel.expecting((IdentityRole.NAMESRV,)))
        controller = self._controller_client or ControllerClient(
            cfg.controller_addr, request_timeout=cfg.rpc_timeout_ms / 1000, security=self._links,
            auth=self.auth, channel=channel)
        self.replicas = ReplicasManager(cfg, controller, self, on_task_failed=self._task_done,
                                        auth=self.auth)
        # Refuse a wrong identity before touching the store or any network peer.
        self.replicas.identity.read_meta()
        self.replicas.identity.read_temp()

        try:
            self.commitlog = self._open_commitlog()
        except MissingSegmentError as exc:
            if not cfg.rebuild_store_from_master:
                raise StoreError(f"{exc} [store {self.store_dir}]") from None
            aside = move_store_aside(self.store_dir, str(exc))
            log.warning("store moved aside to %s (%s); starting empty, replication rebuilds it "
                        "from the master", aside, exc)
            self.commitlog = self._open_commitlog()
        self.epoch_map = EpochMap.open(self.store_dir / EPOCH_FILE)
        self.replication.checkpoint = ConfirmCheckpoint(self.store_dir)
        if self.epoch_map.last_epoch() > 0:
            rmqha_log.context.epoch = int(self.epoch_map.last_epoch())
        if cfg.metrics_port > 0:
            # Built before the message service, which takes it for its rmqha_messaging_* series.
            self.metrics = MetricsRegistry()
            register_broker_metrics(self, self.metrics)
            self.commitlog.add_append_listener(
                FlushProbe(self.commitlog, flush_latency_histogram(self.metrics)).on_append)
            self._served_bytes = served_bytes_counter(self.metrics)
        log.info("store open: %s max offset %d, epochs %s", self.store_dir, self.commitlog.max_offset,
                 self.epoch_map.pairs())

        broker_id = await self.replicas.negotiate_id()
        self.message_service = self._make_message_service(broker_id)
        self.message_service.set_role("fenced", None)

        # Every write code is fenced, even one the messaging layer does not serve.
        fence = RoleFence(lambda: self.role, lambda: self.replicas.status.master_address if self.replicas else None,
                          cfg.broker_address, cfg.broker_name)
        handlers: dict[int, Any] = {int(code): None for code in APPEND_CODES}
        handlers.update({int(code): h for code, h in self.message_service.handlers().items()})
        # With the secret the client port also takes channels, from controllers only (their
        # role notices); plain clients are served as before, told apart by the preface.
        self.server = RemotingServer(
            cfg.listen_host, cfg.listen_port, max_frame_bytes=cfg.max_frame_bytes, tls=self.tls,
            max_connections_per_peer=cfg.max_connections_per_peer,
            channels=channel.expecting((IdentityRole.CONTROLLER,)) if channel is not None else None)
        if cfg.acl_enable:
            replay = ReplayWindow(max_entries=cfg.acl_replay_cache_entries, require_time=cfg.acl_require_signed_time)
            acl_guard(cfg.acl_file, auth=self.auth, replay=replay).protect(self.server, self.message_service)
        if self._served_bytes is not None and handlers.get(int(RequestCode.PULL_MESSAGE)) is not None:
            handlers[int(RequestCode.PULL_MESSAGE)] = self._count_served(handlers[int(RequestCode.PULL_MESSAGE)])
        for code, handler in handlers.items():
            self.server.register(code, fence.task(code, handler))
        for code, now in self.message_service.immediate_handlers().items():
            self.server.register_immediate(code, fence.now(now))
        plain, refuse = self.message_service.plain_send_handler()
        self.server.dispatcher.register_plain_send(fence.now(plain), refuse)
        self.server.dispatcher.register_plain_sends(fence.run(self.message_service.plain_sends_handler()))
        # Over mutual TLS a role notice comes only from a controller's certificate.
        self.server.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                             PeerCheck(self.tls).guarded(lambda cmd: FROM_CONTROLLER,
                                                         self.replicas.handle_notify))
        self.server.register(RequestCode.GET_BROKER_EPOCH_CACHE, self._handle_epoch_cache)
        admin = BrokerAdminInfo(cfg, is_master=lambda: self.role == Role.MASTER,
                                earliest_store_time=lambda: earliest_store_time(self.message_service, self.commitlog), store_dir=str(self.store_dir))
        for code, handler in admin.handlers().items():
            self.server.register(code, fence.task(code, handler))
        self.server.register(RequestCode.GET_BROKER_HA_STATUS, self._handle_ha_status)
        require_declared(self.server.dispatcher.served_codes(), "the broker")
        try:
            await self.server.start()
        except OSError as exc:
            raise ConfigError(f"listen_port: cannot listen on {cfg.listen_host}:{cfg.listen_port}: {exc}") from exc
        log.info("broker %s/%s id %d serving clients on %s", cfg.cluster, cfg.broker_name, broker_id,
                 self.server.address)
        if cfg.acl_enable and self.server.tls_mode is not TlsMode.ENFORCING:
            # ACL 1.0 signs no time or nonce: a captured request of a RocketMQ client is
            # valid for ever over plaintext (issue 37; docs/security.md).
            log.warning("%s", plaintext_acl_warning(self.server.address, self.server.tls_mode.value,
                                                    require_time=cfg.acl_require_signed_time))

        if self.metrics is not None:
            self.metrics_port = self.metrics.serve(cfg.metrics_port, cfg.metrics_host,
                                                   tls=self.tls if cfg.https_enable else None)
            log.info("metrics on %s://%s:%d/metrics", "https" if cfg.https_enable else "http",
                     cfg.metrics_host, self.metrics_port)

        await self.replicas.start()
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._namesrv_loop(), name="namesrv-register")
        task.add_done_callback(self._task_done)
        self._tasks.append(task)
        self._started = True

    def _open_commitlog(self) -> Any:
        from rmqha.store import CommitLog

        cfg = self.config
        return CommitLog(
            self.store_dir / COMMITLOG_DIR, segment_bytes=cfg.segment_bytes, flush=cfg.flush,
            flush_interval_ms=cfg.flush_interval_ms,
            # STOREHOST of every record: consumers send failed messages back there.
            store_host=(cfg.advertised_host, cfg.listen_port),
            verify_segments_on_open=cfg.verify_segments_on_open,
            prefault_window_bytes=cfg.prefault_window_bytes,
        )

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("broker task %s died: %r; stopping the broker", task.get_name(), exc, exc_info=exc)
            self.failure = exc
            self.failed.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass  # cancelled above
        self._tasks.clear()
        if self._started:
            await self._unregister_namesrv()
        for client in self._ns_clients.values():
            await client.close()
        # Fenced, then the client port closed, then the controller links: a controller that
        # sees the links close finds the port refusing and elects a successor at once.
        if self.replicas is not None:
            self.replicas.fence_for_shutdown()
        if self.server is not None:
            await self.server.stop()
        if self.replicas is not None:
            await self.replicas.stop()
        await self._stop_ha()
        if self.message_service is not None:
            self.message_service.close()
        if self.replication.checkpoint is not None:
            self.replication.checkpoint.flush()
        if self.commitlog is not None:
            self.commitlog.close()
        if self.metrics is not None:
            self.metrics.stop()

    # --- wiring the other layers ------------------------------------------------------------

    def _make_message_service(self, broker_id: int) -> MessageService:
        return MessageService(
            self.commitlog, store_dir=str(self.store_dir), config=self.config,
            broker_name=self.config.broker_name, broker_id=broker_id, replication=self.replication,
            on_segments_deleted=self._on_segments_deleted, on_topics_changed=self.topics_changed,
            metrics=self.metrics,
            epoch=lambda: self.replicas.master_epoch if self.replicas is not None else 0,
            topic_route=(namesrv_route_source(self.config.namesrv_addr, self._namesrv_request)
                         if self.config.namesrv_addr else None),
        )

    def _count_served(self, handler: Any) -> Any:
        """Wrap the pull handler: count the bytes of every response body (messages out)."""
        counter = self._served_bytes

        async def counted(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
            resp = await handler(cmd, conn)
            if resp is not None and resp.body:
                counter.inc(len(resp.body))
            return resp

        return counted

    def _ha_config(self) -> HAConfig:
        return HAConfig.from_object(self.config)

    def _channel_key(self) -> ChannelKey | None:
        """What proves this broker on its channels to controllers and name servers (None
        without a secret); named by its address (its id is not settled yet)."""
        cfg = self.config
        secret = cfg.load_cluster_secret()
        if secret is None:
            return None
        name = "b-" + re.sub(r"[^A-Za-z0-9._-]", "_", cfg.broker_address)[:60]
        return ChannelKey(secret, Identity.broker(cfg.cluster, cfg.broker_name, name))

    def _ha_auth(self) -> HAAuth | None:
        """The cluster secret and this broker's identity for its HA links (None without a
        secret).  The identity's name is the broker id, which tells members apart."""
        cfg = self.config
        secret = cfg.load_cluster_secret()
        if secret is None:
            return None
        assert self.replicas is not None
        me = Identity.broker(cfg.cluster, cfg.broker_name, str(self.replicas.broker_id))
        return HAAuth(secret, me, cfg.ha_allow_unauthenticated_rocketmq_dialect)

    async def is_known_replica(self, broker_id: int) -> bool:
        """True if the controller knows ``broker_id`` as a member of this group.

        Answered from a cache; an unknown id refreshes it first (a new member registers
        with the controller just before it connects), at most every 200 ms.
        """
        if broker_id in self._known_ids:
            return True
        if time.monotonic() - self._known_ids_at > 0.2:
            self._known_ids_at = time.monotonic()
            await self._refresh_known_ids()
        return broker_id in self._known_ids

    async def _refresh_known_ids(self) -> None:
        if self.replicas is None:
            return
        try:
            data = await self.replicas.controller.get_sync_state_data([self.config.broker_name])
        except (RemotingError, RemoteCommandError, BrokerError) as exc:
            log.debug("could not refresh known replicas: %s", exc)
            return
        ids: set[int] = set()
        entry = _field(data, self.config.broker_name)
        if entry is None and isinstance(data, dict):
            entry = (data.get("replicasInfoTable") or {}).get(self.config.broker_name)
        for key in ("inSyncReplicas", "notInSyncReplicas", "in_sync_replicas", "not_in_sync_replicas"):
            for rep in _field(entry, key) or ():
                rid = _field(rep, "brokerId", "broker_id")
                if rid is not None:
                    ids.add(int(rid))
        if ids:
            self._known_ids = frozenset(ids)

    def _on_confirm(self, offset: int) -> None:
        self.replication.learned(offset)
        if self.message_service is not None:
            # At the end of the turn: the ack that moved it may release a send's answer.
            self.message_service.confirm_soon(offset)

    def _on_truncate(self, offset: int) -> None:
        if self.replication.checkpoint is not None:
            self.replication.checkpoint.cut(offset)
        if self.message_service is not None:
            self.message_service.on_truncate(offset)

    def _on_segments_deleted(self, min_offset: int) -> None:
        """Retention deleted segments: drop epoch entries that ended before the new min offset."""
        if self.epoch_map is not None:
            self.epoch_map.truncate_prefix(min_offset)

    async def _stop_ha(self) -> None:
        if self.ha_master is not None:
            master, self.ha_master = self.ha_master, None
            await master.stop()
        if self.ha_slave is not None:
            slave, self.ha_slave = self.ha_slave, None
            await slave.stop()

    # --- RoleListener ----------------------------------------------------------------------

    def heartbeat_status(self) -> tuple[int, int, int]:
        if self.commitlog is None or self.epoch_map is None:
            return -1, 0, 0
        return int(self.epoch_map.last_epoch()), int(self.commitlog.max_offset), int(self.replication.confirm_offset())

    def _append_epoch(self, epoch: int) -> None:
        """Record (epoch, max offset) in the epoch map (the first entry of a new master term)."""
        em = self.epoch_map
        last = em.last_epoch()
        if last > epoch:
            # Entries from a term the controller no longer has (a wiped controller): drop them.
            log.warning("epoch map has epoch %d beyond the controller's %d; dropping the newer entries", last, epoch)
            em.truncate_suffix_by_epoch(epoch + 1)
            last = em.last_epoch()
        if last == epoch:
            log.info("epoch map already ends with epoch %d", epoch)
            return
        em.append(epoch, int(self.commitlog.max_offset))

    async def become_master(self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None:
        rmqha_log.context.epoch = epoch
        async with self._ha_lock:
            self._slave_of = None
            if self.ha_slave is not None:
                slave, self.ha_slave = self.ha_slave, None
                await slave.stop()
            before = int(self.commitlog.max_offset)
            self.commitlog.cut_to_last_whole_record()
            after = int(self.commitlog.max_offset)
            if after != before:
                log.warning("cut %d bytes of partial record at the log end (%d -> %d)", before - after, before, after)
                self.epoch_map.truncate_suffix(after + 1)
            self._append_epoch(epoch)
            hit(Failpoint.AFTER_MASTER_EPOCH_APPENDED)
            log.info("became master of %s at epoch %d from offset %d; epochs %s",
                     self.config.broker_name, epoch, after, self.epoch_map.pairs())
            await self._start_ha_master(sync_state_set, sync_state_set_epoch)
            if self.message_service is not None:
                self.message_service.set_role("master", None)
        self._ns_kick.set()

    async def _start_ha_master(self, ids: frozenset[int], ids_epoch: int) -> None:
        assert self.replicas is not None
        master = HAMaster(
            self.commitlog, self.epoch_map, group=self.config.broker_name, broker_id=self.replicas.broker_id,
            config=self._ha_config(), is_known_replica=self.is_known_replica,
            alter_sync_state_set=self.replicas.alter_sync_state_set, on_confirm=self._on_confirm,
            sync_state_set=set(ids), sync_state_set_epoch=ids_epoch, auth=self._ha_auth(), tls=self._ha_tls,
        )
        await master.start(self.config.listen_host, self.config.ha_port)
        self.ha_master = master
        await self._refresh_known_ids()

    async def master_reelected(self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None:
        rmqha_log.context.epoch = epoch
        async with self._ha_lock:
            self._append_epoch(epoch)
            log.info("re-elected master of %s at epoch %d; epochs %s", self.config.broker_name, epoch,
                     self.epoch_map.pairs())
            if self.ha_master is not None:
                self.ha_master.on_new_epoch(epoch, int(self.commitlog.max_offset))
                self.ha_master.set_sync_state_set(set(sync_state_set), sync_state_set_epoch)
        self._ns_kick.set()

    async def become_slave(self, master_id: int, master_address: str, epoch: int) -> None:
        rmqha_log.context.epoch = epoch
        async with self._ha_lock:
            # Refuse writes first: a demoted master must not append while it steps down.
            if self.message_service is not None:
                self.message_service.set_role("slave", master_address)
            if self.ha_master is not None:
                master, self.ha_master = self.ha_master, None
                await master.stop()
            if self.ha_slave is not None:
                if self._slave_of == (master_id, master_address):
                    log.info("master %d at %s unchanged at epoch %d; keeping the HA link", master_id, master_address, epoch)
                    self._ns_kick.set()
                    return
                slave, self.ha_slave = self.ha_slave, None
                await slave.stop()
            self._slave_of = None
            if (cut := cut_at_first_bad_record(self.commitlog, self.epoch_map)) is not None:
                self._on_truncate(cut)
            ha_addr = await self._master_ha_address(master_address)
            log.info("became slave of %d (%s, HA %s) at epoch %d", master_id, master_address, ha_addr, epoch)
            await self._start_ha_slave(ha_addr)
            self._slave_of = (master_id, master_address)
        self._ns_kick.set()

    async def _start_ha_slave(self, ha_addr: str) -> None:
        assert self.replicas is not None
        slave = HASlave(
            self.commitlog, self.epoch_map, group=self.config.broker_name, broker_id=self.replicas.broker_id,
            master_ha_address=ha_addr, config=self._ha_config(), async_learner=self.config.async_learner,
            protocol=self.config.ha_protocol, on_confirm=self._on_confirm, on_truncate=self._on_truncate,
            address=self.config.broker_address, auth=self._ha_auth(), tls=self._ha_tls,
        )
        await slave.start()
        self.ha_slave = slave

    async def _master_ha_address(self, master_address: str) -> str:
        """The master's HA address, asked of the master itself (GET_BROKER_HA_STATUS).

        The controller protocol carries only client addresses; RocketMQ slaves learn the HA
        address from the name server.  Asking the master works without a name server;
        if it does not answer, its default (client port + 1) is used.
        """
        client = RemotingClient(master_address, connect_timeout=1.0, security=self._links,
                                expect=ServerRole.broker(self.config.cluster, self.config.broker_name))
        try:
            for _ in range(3):
                try:
                    # Signed: a master with aclEnable takes the secret's proof for an account.
                    ask = self.auth.sign(RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS))
                    resp = await client.request(ask, 1.0)
                except RemotingError as exc:
                    log.debug("asking %s for its HA address failed: %s", master_address, exc)
                    await asyncio.sleep(0.2)
                    continue
                if resp.code == ResponseCode.SUCCESS:
                    addr = (resp.json_body() or {}).get("haAddress")
                    if addr:
                        return str(addr)
                else:  # the fallback below is wrong for an advertised or moved HA port
                    log.warning("master %s refused its HA address (code %d: %s); trying its client port + 1",
                                master_address, resp.code, resp.remark)
                break
        finally:
            await client.close()
        host, port = split_address(master_address)
        return f"{host}:{port + 1}"

    def apply_sync_state_set(self, ids: frozenset[int], epoch: int) -> None:
        if self.ha_master is not None:
            self.ha_master.set_sync_state_set(set(ids), epoch)

    # --- name servers -----------------------------------------------------------------------

    def _register_body(self) -> dict[str, Any]:
        topics: dict[str, Any] = {}
        if self.message_service is not None:
            raw = self.message_service.topic_configs() or {}
            for name, cfg in raw.items():
                topics[str(name)] = cfg if isinstance(cfg, dict) else _topic_config_json(str(name), cfg)
        epoch = self.replicas.master_epoch if self.replicas else 0
        return {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": topics,
                "dataVersion": {"timestamp": int(time.time() * 1000), "counter": 0, "stateVersion": epoch},
            },
            "filterServerList": [],
        }

    async def register_namesrv_once(self) -> None:
        """REGISTER_BROKER to every name server (skipped while fenced)."""
        if self.role == Role.FENCED or not self.config.namesrv_addr:
            return
        ext = {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.config.broker_address,
            "clusterName": self.config.cluster,
            "haServerAddr": self.config.ha_address,
            "brokerId": self.namesrv_broker_id,
            "masterEpoch": self.replicas.master_epoch if self.replicas else 0,
            "heartbeatTimeoutMillis": self.config.namesrv_broker_timeout_ms,
            "enableActingMaster": False,
            "compressed": False,
        }
        body = self._register_body()
        await asyncio.gather(*(self._register_one(addr, ext, body) for addr in self.config.namesrv_addr))

    def _ns_client(self, addr: str) -> RemotingClient:
        client = self._ns_clients.get(addr)
        if client is None:
            client = self._ns_clients[addr] = RemotingClient(addr, connect_timeout=1.0,
                                                             security=self._ns_links,
                                                             expect=ServerRole.namesrv())
        return client

    async def _namesrv_request(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        """One request to a name server over the broker's link (routes for QUERY_ASSIGNMENT)."""
        return await self._ns_client(addr).request(cmd, self.config.rpc_timeout_ms / 1000)

    async def _register_one(self, addr: str, ext: dict[str, Any], body: dict[str, Any]) -> None:
        client = self._ns_client(addr)
        try:
            cmd = self.auth.sign(RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body))
            resp = await client.request(cmd, self.config.rpc_timeout_ms / 1000)
        except RemotingError as exc:
            log.debug("register to name server %s failed: %s", addr, exc)
            return
        if resp.code != ResponseCode.SUCCESS:
            log.warning("name server %s refused registration: %s", addr, resp.remark)

    async def _unregister_namesrv(self) -> None:
        ext = {"brokerName": self.config.broker_name, "brokerAddr": self.config.broker_address,
               "clusterName": self.config.cluster, "brokerId": self.namesrv_broker_id}
        for addr, client in self._ns_clients.items():
            try:
                cmd = self.auth.sign(RemotingCommand.request(RequestCode.UNREGISTER_BROKER, ext))
                await client.request(cmd, 1.0)
            except RemotingError as exc:
                log.debug("unregister from %s failed: %s", addr, exc)

    async def _namesrv_loop(self) -> None:
        period = self.config.register_name_server_period_ms / 1000
        while True:
            self._ns_kick.clear()
            await self.register_namesrv_once()
            try:
                await asyncio.wait_for(self._ns_kick.wait(), period)
            except asyncio.TimeoutError:
                pass  # the period elapsed: renew the registration

    def topics_changed(self) -> None:
        """Tell name servers about topic changes now (the messaging layer may call this)."""
        self._ns_kick.set()

    # --- admin handlers ---------------------------------------------------------------------

    def epoch_cache(self) -> dict[str, Any]:
        """RocketMQ ``EpochEntryCache``: the last entry's endOffset is Long.MAX_VALUE."""
        entries = self.epoch_map.entries() if self.epoch_map is not None else []
        epoch_list = [{"epoch": e, "startOffset": s, "endOffset": end} for e, s, end in entries]
        if epoch_list:
            epoch_list[-1]["endOffset"] = OPEN_END
        return {
            "clusterName": self.config.cluster,
            "brokerName": self.config.broker_name,
            "brokerId": self.namesrv_broker_id,
            "epochList": epoch_list,
            "maxOffset": int(self.commitlog.received_end()) if self.commitlog is not None else 0,
        }

    async def _handle_epoch_cache(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, None, self.epoch_cache())

    def ha_status(self) -> dict[str, Any]:
        st = self.replicas.status if self.replicas is not None else None
        status: dict[str, Any] = {
            "role": self.role.value,
            "clusterName": self.config.cluster,
            "brokerName": self.config.broker_name,
            "brokerId": self.namesrv_broker_id,
            "controllerBrokerId": self.broker_id,
            "address": self.config.broker_address,
            "haAddress": self.config.ha_address,
            "masterId": st.master_id if st else None,
            "masterAddress": st.master_address if st else None,
            "masterEpoch": st.master_epoch if st else 0,
            "syncStateSet": sorted(st.sync_state_set) if st else [],
            "syncStateSetEpoch": st.sync_state_set_epoch if st else 0,
            "staleNoticesIgnored": st.stale_notices_ignored if st else 0,
            "unconfirmedNoticesIgnored": st.unconfirmed_notices_ignored if st else 0,
            "lastEpoch": self.epoch_map.last_epoch() if self.epoch_map is not None else -1,
            "maxOffset": int(self.commitlog.received_end()) if self.commitlog is not None else 0,
            "confirmOffset": self.replication.confirm_offset() if self.commitlog is not None else 0,
            "corruptRecords": [b.offset for b in self.commitlog.corrupt] if self.commitlog is not None else [],
            "acceptingWrites": self.replicas.accepts_writes if self.replicas is not None else False,
            "leaseFenced": self.replicas.lease_fenced if self.replicas is not None else False,
            "masterLease": self.replicas.lease_status() if self.replicas is not None else {},
            # CLOCK_MONOTONIC seconds: comparable between processes on one host only.
            "ackWindows": {str(e): w for e, w in self.replication.ack_windows.items()},
            # Blocks on disk vs logical size: segments are sparse, so the two differ.
            "storeDisk": directory_usage(self.store_dir).as_dict(),
        }
        if self.ha_master is not None:
            status["ha"] = _jsonable(self.ha_master.status())
        elif self.ha_slave is not None:
            status["ha"] = _jsonable(self.ha_slave.status())
        return status

    async def _handle_ha_status(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, None, self.ha_status())


def _field(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, dict):
            if name in obj:
                return obj[name]
        elif obj is not None and hasattr(obj, name):
            return getattr(obj, name)
    return None


def _topic_config_json(name: str, cfg: Any) -> dict[str, Any]:
    to_json = getattr(cfg, "to_json", None)
    if callable(to_json):
        return to_json()
    return {
        "topicName": name,
        "readQueueNums": int(_field(cfg, "read_queue_nums", "readQueueNums") or 4),
        "writeQueueNums": int(_field(cfg, "write_queue_nums", "writeQueueNums") or 4),
        "perm": int(_field(cfg, "perm") or 6),
        "topicSysFlag": int(_field(cfg, "topic_sys_flag", "topicSysFlag") or 0),
        "order": bool(_field(cfg, "order") or False),
    }


def _jsonable(value: Any) -> Any:
    """Status objects (dataclasses, enums, sets) as JSON-friendly values."""
    import dataclasses
    import enum

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, enum.Enum):
        return value.name
    return value


async def run_broker(config: BrokerConfig, stop: asyncio.Event) -> None:
    """Run a broker until ``stop`` is set; raise if it fails to start or a loop dies."""
    broker = Broker(config)
    stopper = asyncio.ensure_future(stop.wait())
    failure = asyncio.ensure_future(broker.failed.wait())
    start = asyncio.ensure_future(broker.start())
    try:
        done, _ = await asyncio.wait({start, stopper, failure}, return_when=asyncio.FIRST_COMPLETED)
        if start in done:
            start.result()  # raise start-up errors (wrong identity, bad store)
            await asyncio.wait({stopper, failure}, return_when=asyncio.FIRST_COMPLETED)
        else:
            start.cancel()
            try:
                await start
            except asyncio.CancelledError:
                pass  # stopping during start-up
        if broker.failed.is_set():
            raise BrokerError(f"a broker background task died: {broker.failure}; exiting")
    finally:
        stopper.cancel()
        failure.cancel()
        await broker.stop()
