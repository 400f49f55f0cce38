"""The controller process: remoting server + Raft node + heartbeat manager + elections.

Request handling (RocketMQ's controller codes, see :mod:`rmqha.protocol.codes`):

* GET_METADATA_INFO, BROKER_HEARTBEAT, GET/UPDATE_CONTROLLER_CONFIG: answered by any node.
* Everything else needs the Raft leader; a follower answers CONTROLLER_NOT_LEADER with
  the leader's address in ``controllerLeaderAddress`` (and in the remark).  That is the
  address the leader advertises (``advertised_address``, default its ``controller_peers``
  address), recorded by its first commit of the term (the barrier below), so brokers
  behind a NAT, a service address or a test's proxy follow the path the leader chose.
* On the leader, one writer task handles requests one at a time: validate against the
  committed state (:mod:`rmqha.controller.logic`), commit the event, answer after it is
  applied.  Requests that queue up meanwhile are validated in order against a scratch
  copy that already includes the earlier ones, and committed together as one Raft entry
  (group commit).  A new leader first commits a barrier so it has applied everything before it
  validates anything, and waits ``new_leader_heartbeat_wait`` for fresh heartbeats before
  it elects anyone.
* The leader's answer to BROKER_HEARTBEAT grants the master lease
  (:mod:`rmqha.broker.master_lease`): ``leaseGranted`` with its record of the group's
  master and epoch.  A new leader judges no master dead by silence until a heartbeat
  timeout after it took over (the lease guard, :mod:`rmqha.controller.heartbeat`).
* After a successful election the leader pushes NOTIFY_BROKER_ROLE_CHANGED (one-way) to the
  live brokers of the group at their registered addresses; with the secret over an
  authenticated channel to the broker's client port (a broker takes notices only so, or
  over TLS from a controller's certificate), over TLS too with ``tls.enable``.
* Admin writes (designated elections, clean, config updates) need ``adminToken`` in the
  header when the controller has an ``admin_token``.
* Security (:mod:`rmqha.protocol.request_auth`, :mod:`rmqha.security.secret_policy`): a controller
  starts only with a cluster secret, or ``allow_insecure`` on loopback.  With the secret
  every request that changes state (apply id, register, heartbeat, alter SyncStateSet,
  elect, clean, config update) must carry its HMAC, else NO_PERMISSION; role notices are
  signed.  A heartbeat is taken only for a registered id from its registered address, at
  an epoch the group has reached and, when signed, newer than the broker's last one; the
  timeout it asks for is capped at ``broker_heartbeat_timeout`` (the answer says what is
  in force, so the broker's master lease fits it).
* Serving TLS (any ``tls.server.mode`` but disabled), the Raft links between controllers
  are mutual TLS too (:mod:`rmqha.controller.raft_tls`): each end's certificate must name
  the controller of the group it is, by Raft address.
* Over mutual TLS the sender's certificate identity must fit the request too
  (:mod:`rmqha.controller.peer_rules`): a broker registers, heartbeats, alters its
  SyncStateSet and asks for an election only as its own cluster and group; clean, config
  updates and designated elections need an admin or controller certificate.
* Channels (:mod:`rmqha.net.channel`): with the secret the RPC port also takes
  authenticated channels (the secret's handshake, then a MAC on every frame both ways,
  answers included), and a state-changing request is taken only over one (or over TLS with
  a verified certificate), from a broker for its own group, an admin tool or a controller;
  read-only requests stay open to plain connections.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rmqha.protocol.code_rules import require_declared
from rmqha.protocol.control_headers import BrokerHeartbeatHeader, HeartbeatAnswerHeader, RoleChangedHeader
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.request_auth import (
    CONTROLLER_SIGNED_CODES, RefusalLog, check, request_auth, signed_timestamp_ms, tokens_match,
)
from rmqha.config import apply_values, check_port_free, resolve_key, to_dict
from rmqha.controller.config import SECRET_KEYS, UPDATE_BLACKLIST, ControllerConfig, Peer
from rmqha.controller.heartbeat import BrokerHeartbeatManager, BrokerLiveInfo
from rmqha.controller.logic import BadRequest, ControllerLogic, Decision
from rmqha.controller.metrics import ControllerMetrics
from rmqha.controller.peer_rules import need_for
from rmqha.controller.state import ReplicasState
from rmqha.errors import ConfigError, ControllerError, NotLeaderError, ProtocolError, RmqhaError
from rmqha.metrics import MetricsRegistry
from rmqha.controller.raft import RaftNode, RaftRole, RaftSettings
from rmqha.controller.raft_tls import RaftTls
from rmqha.net.client import RemotingClient
from rmqha.net.channel import refused_off_channel
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.net.peer import RequestPeer
from rmqha.net.peer_check import PeerCheck
from rmqha.net.server import RemotingServer
from rmqha.protocol.command import RemotingCommand
from rmqha.security.channel_auth import key_from_text
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import TlsSettings

log = logging.getLogger(__name__)

#: Codes answered without the leader.
#: Most requests validated and committed as one Raft entry.
_MAX_BATCH = 256

#: Who may send a state-changing request over a channel (or TLS).
_WRITERS = (Role.BROKER, Role.ADMIN, Role.CONTROLLER)

_ANY_NODE = {RequestCode.CONTROLLER_GET_METADATA_INFO, RequestCode.BROKER_HEARTBEAT,
             RequestCode.GET_CONTROLLER_CONFIG, RequestCode.UPDATE_CONTROLLER_CONFIG}


class _NotLeader(Exception):
    pass


class ControllerServer:
    def __init__(self, config: ControllerConfig, metrics_registry: MetricsRegistry | None = None) -> None:
        config.validate()
        self.config = config
        # Before anything listens: no secret, no controller (unless allowed on loopback).
        secret = config.check_security()
        self.auth = request_auth(secret)
        self._refusals = RefusalLog(log)
        self.peers: list[Peer] = config.peers()
        self.self_peer = config.self_peer()
        channels = (key_from_text(secret, Identity.controller(self.self_peer.id), _WRITERS)
                    if secret else None)
        self.state = ReplicasState()
        self.heartbeats = BrokerHeartbeatManager(config.new_leader_heartbeat_wait / 1000,
                                                 default_timeout_s=config.broker_heartbeat_timeout / 1000)
        self.logic = ControllerLogic(self.state, self.heartbeats, config.enable_elect_unclean_master)
        self.metrics = ControllerMetrics(config.controller_group, self.self_peer.id, metrics_registry)
        host, _, port = self.self_peer.rpc_address.rpartition(":")
        #: The RPC port's TLS (tls.server.*) and the role notices' links (tls.client.*).
        self.tls = TlsSettings.from_config(config, "controller config")
        self._links = ClientSecurity.for_links(self.tls)
        #: The role notices' links: ``_links`` and, with the secret, a channel to a broker.
        self._notice_links = (self._links or ClientSecurity()).with_channel(
            channels.expecting((Role.BROKER,))) if channels is not None else self._links
        #: Who may send what, by certificate identity (rmqha.controller.peer_rules).
        self.peer_check = PeerCheck(self.tls)
        self.remoting = RemotingServer(config.listen_host, int(port), None, config.max_frame_bytes,
                                       tls=self.tls, channels=channels,
                                       max_connections_per_peer=config.max_connections_per_peer)
        self.raft = RaftNode(
            RaftSettings(
                self_address=self.self_peer.raft_address,
                peers=[p.raft_address for p in self.peers],
                journal_file=config.journal_file,
                password=config.raft_secret(),
                fast=config.raft_fast,
                durable=config.raft_durable,
                raft_min_timeout=config.raft_min_timeout / 1000,
                raft_max_timeout=config.raft_max_timeout / 1000,
                append_entries_period=config.raft_heartbeat_interval / 1000,
                # Serving TLS: the Raft links too, mutual, with this controller's pair and CA.
                tls=RaftTls.from_settings(self.tls, {p.raft_address: p.id for p in self.peers}),
                # The Raft port listens where the RPC port does (pysyncobj alone: 0.0.0.0).
                bind_host=config.listen_host,
                max_connections_per_peer=config.max_connections_per_peer,
            ),
            self.state.apply, self.state.snapshot, self.state.restore,
            on_role_change=self._role_changed_from_raft,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[Callable[[ControllerLogic], Decision], asyncio.Future[Decision]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._ready_term = -1
        self._tasks: set[asyncio.Task[Any]] = set()
        self._notify_tasks: dict[str, asyncio.Task[None]] = {}
        self._electing: set[str] = set()
        #: Groups with an election decided but not yet applied: no master lease is granted
        #: for them (the answer would name the master being replaced).
        self._elections_in_flight: dict[str, int] = {}
        self._rechecks: dict[str, asyncio.TimerHandle] = {}
        self.heartbeats.add_inactive_listener(self._on_broker_inactive)
        self.heartbeats.close_probe = self._probe_closed_broker
        self._register_handlers()

    # --- lifecycle -------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.self_peer.rpc_address

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        rport = self.self_peer.raft_address.rpartition(":")[2]
        check_port_free(self.config.listen_host, int(self.remoting.port), "controller_peers (RPC port)")
        check_port_free(self.config.listen_host, int(rport), "raft port (raft_peers / raft_port_offset)")
        try:
            await self.remoting.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.address}: {exc}") from exc
        self.raft.start()
        if self.config.metrics_port:
            self.metrics.start_http(self.config.metrics_host, self.config.metrics_port,
                                    tls=self.tls if self.config.https_enable else None)
        self._spawn(self._scan_heartbeats_loop())
        self._spawn(self._rescan_masters_loop())
        self._spawn(self._raft_metrics_loop())
        log.info("controller %s serving %s (raft %s, group %s; control requests %s)",
                 self.self_peer.id, self.address, self.self_peer.raft_address,
                 self.config.controller_group,
                 "signed" if self.auth.enabled else "NOT authenticated (allow_insecure)")

    async def stop(self) -> None:
        for handle in self._rechecks.values():
            handle.cancel()
        for task in list(self._tasks) + list(self._notify_tasks.values()):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.remoting.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.raft.stop)
        self.metrics.stop()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- raft role -------------------------------------------------------------------

    def _role_changed_from_raft(self, role: RaftRole, term: int) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_role_change, role, term)

    def _on_role_change(self, role: RaftRole, term: int) -> None:
        self.metrics.raft(int(role), term)
        if role == RaftRole.LEADER:
            self.heartbeats.on_leader()
            # Master leases are granted only once this leader has applied every earlier
            # entry (its record of each group's master is current): barrier now.
            self._spawn(self._become_ready())
        else:
            self.heartbeats.on_not_leader()

    async def _become_ready(self) -> None:
        try:
            await self._run_decision(lambda logic: Decision())
        except (_NotLeader, ControllerError) as exc:
            log.info("new leader's barrier not done: %s", exc or "not leader")

    def leader_address(self) -> str:
        """The address clients are told to dial for the leader: the one it advertised in
        its barrier, else (before that is applied here, or from a controller that predates
        advertised addresses) its controller_peers address; empty when no leader is known."""
        leader = self.leader_peer()
        if leader is None:
            return ""
        if leader is self.self_peer:
            return self.config.advertised()
        return self.state.advertised_address(leader.id) or leader.rpc_address

    def leader_peer(self) -> Peer | None:
        if self.raft.is_leader:
            return self.self_peer
        leader = self.raft.leader
        for p in self.peers:
            if p.raft_address == leader:
                return p
        return None

    # --- request plumbing ------------------------------------------------------------

    def _register_handlers(self) -> None:
        table: dict[int, Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand]]] = {
            RequestCode.CONTROLLER_GET_METADATA_INFO: self._get_metadata,
            RequestCode.BROKER_HEARTBEAT: self._heartbeat,
            RequestCode.GET_CONTROLLER_CONFIG: self._get_config,
            RequestCode.UPDATE_CONTROLLER_CONFIG: self._update_config,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self._leader_call(
                lambda logic, cmd: logic.get_next_broker_id(cmd.ext_fields)),
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self._leader_call(
                lambda logic, cmd: logic.apply_broker_id(cmd.ext_fields)),
            RequestCode.CONTROLLER_REGISTER_BROKER: self._leader_call(
                lambda logic, cmd: logic.register_broker(cmd.ext_fields),
                before=lambda cmd: self._settle_holder(cmd.ext_fields.get("brokerName", ""),
                                                       cmd.ext_fields.get("brokerId", ""),
                                                       cmd.ext_fields.get("brokerAddress", ""))),
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self._leader_call(
                lambda logic, cmd: logic.get_replica_info(cmd.ext_fields)),
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self._leader_call(
                lambda logic, cmd: logic.get_sync_state_data(cmd.json_body())),
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self._leader_call(
                lambda logic, cmd: logic.alter_sync_state_set(cmd.ext_fields, cmd.json_body())),
            RequestCode.CONTROLLER_ELECT_MASTER: self._leader_call(
                lambda logic, cmd: logic.elect_master(cmd.ext_fields), admin=self._is_admin_elect,
                after=self._after_elect),
            RequestCode.CLEAN_BROKER_DATA: self._leader_call(
                lambda logic, cmd: logic.clean_broker_data(cmd.ext_fields), admin=lambda c: True,
                after=self._after_clean),
        }
        require_declared(table, "the controller")
        for code, fn in table.items():
            if code in CONTROLLER_SIGNED_CODES:
                fn = self._authenticated(fn)
            fn = self._identified(fn)
            self.remoting.register(code, self._metered(int(code), fn))

    def _authenticated(self, fn: Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand]]):
        """``fn`` behind the proof check: a request without valid proof, or (with the
        secret) not over an authenticated channel or TLS, changes nothing."""
        async def handler(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
            refused = check(self.auth, cmd, conn) or self._channel_check(cmd, conn)
            if refused is not None:
                self._refusals.note(cmd, conn.peer, refused.remark or "")
                return refused
            return await fn(cmd, conn)
        return handler

    def _identified(self, fn: Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand]]):
        """``fn`` behind the certificate identity check: a broker acts only as itself,
        admin requests need an admin or controller (rmqha.controller.peer_rules)."""
        return self.peer_check.guarded(lambda cmd: need_for(cmd, self.state), fn,
                                       lambda cmd, conn, why: self._refusals.note(cmd, conn.peer, why))

    def _channel_check(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
        return refused_off_channel(cmd, conn, _WRITERS) if self.auth.enabled else None

    def _metered(self, code: int, fn: Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand]]):
        async def handler(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
            try:
                resp = await fn(cmd, conn)
            except BadRequest as exc:
                resp = cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc))
            except ProtocolError as exc:
                resp = cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc))
            self.metrics.request(code, resp.code)
            return resp
        return handler

    def _not_leader(self, cmd: RemotingCommand) -> RemotingCommand:
        leader = self.leader_peer()
        addr = self.leader_address()
        return cmd.response(
            ResponseCode.CONTROLLER_NOT_LEADER,
            f"The controller is not in leader state; leader: {addr or 'unknown'}",
            {"controllerLeaderAddress": addr, "controllerLeaderId": leader.id if leader else ""},
        )

    def _check_admin(self, cmd: RemotingCommand) -> RemotingCommand | None:
        token = self.config.admin_token
        if token and not tokens_match(cmd.ext_fields.get("adminToken"), token):
            return cmd.response(ResponseCode.NO_PERMISSION,
                                "this admin operation needs the cluster's admin token")
        return None

    @staticmethod
    def _is_admin_elect(cmd: RemotingCommand) -> bool:
        return cmd.ext_fields.get("designateElect", "false").lower() == "true"

    async def _ensure_leader_ready(self) -> None:
        if not self.raft.is_leader:
            raise _NotLeader()
        term = self.raft.term
        if self._ready_term != term:
            barrier = {"type": "barrier", "leader_id": self.self_peer.id, "address": self.config.advertised()}
            await self.raft.apply(barrier, self.config.commit_timeout / 1000)
            self._ready_term = term

    async def _run_decision(self, decide: Callable[[ControllerLogic], Decision]) -> Decision:
        """Queue a request for the single writer; raise _NotLeader when not leader.

        The writer takes every queued request, validates them one after another (each
        against the state left by the ones before it, on a scratch copy), commits their
        events as one Raft entry and answers each after it is applied: one-at-a-time
        semantics with group commit.
        """
        if not self.raft.is_leader:
            raise _NotLeader()
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._pending.append((decide, fut))
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._write_loop())
        return await fut

    async def _write_loop(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
            try:
                await self._commit_batch(batch)
            except (_NotLeader, NotLeaderError):
                self._ready_term = -1
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(_NotLeader())
            except ControllerError as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            except Exception as exc:  # a bug must fail these requests, not hang them all
                log.exception("controller write batch failed")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(ControllerError(f"internal error: {exc!r}"))

    async def _commit_batch(self, batch: list[tuple[Callable[[ControllerLogic], Decision],
                                                   asyncio.Future[Decision]]]) -> None:
        await self._ensure_leader_ready()
        scratch = self.state.overlay() if len(batch) > 1 else None
        logic = self.logic if scratch is None else ControllerLogic(
            scratch, self.heartbeats, self.logic.enable_elect_unclean_master)
        decided: list[tuple[asyncio.Future[Decision], Decision, int | None]] = []
        events: list[dict[str, Any]] = []
        for decide, fut in batch:
            try:
                decision = decide(logic)
            except (BadRequest, ProtocolError) as exc:
                fut.set_exception(exc)
                continue
            slot = None
            if decision.event is not None:
                slot = len(events)
                events.append(decision.event)
                if scratch is not None:
                    scratch.apply(decision.event)
            decided.append((fut, decision, slot))
        results: list[Any] = []
        if events:
            payload = events[0] if len(events) == 1 else {"type": "batch", "events": events}
            started = time.perf_counter()
            electing = [str(e.get("broker_name")) for e in events if e.get("type") == "elect"]
            for name in electing:
                self._elections_in_flight[name] = self._elections_in_flight.get(name, 0) + 1
            try:
                result = await self.raft.apply(payload, self.config.commit_timeout / 1000)
            finally:
                for name in electing:
                    left = self._elections_in_flight.pop(name, 1) - 1
                    if left > 0:
                        self._elections_in_flight[name] = left
            self.metrics.commit(time.perf_counter() - started)
            results = [result] if len(events) == 1 else list(result.get("results", []))
        for fut, decision, slot in decided:
            if fut.done():
                continue
            if slot is not None:
                res = results[slot] if slot < len(results) else None
                if not (isinstance(res, dict) and res.get("ok")):
                    reason = res.get("reason") if isinstance(res, dict) else res
                    decision = Decision(ResponseCode.SYSTEM_ERROR,
                                        f"state changed while committing ({reason}); retry")
            fut.set_result(decision)

    def _leader_call(
        self, decide: Callable[[ControllerLogic, RemotingCommand], Decision], *,
        admin: Callable[[RemotingCommand], bool] | None = None,
        after: Callable[[RemotingCommand, Decision], None] | None = None,
        before: Callable[[RemotingCommand], Awaitable[None]] | None = None,
    ) -> Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand]]:
        async def handler(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
            if admin is not None and admin(cmd):
                refused = self._check_admin(cmd)
                if refused is not None:
                    return refused
            if not self.raft.is_leader:
                return self._not_leader(cmd)
            if before is not None:
                await before(cmd)
            try:
                decision = await self._run_decision(lambda logic: decide(logic, cmd))
            except _NotLeader:
                return self._not_leader(cmd)
            except ControllerError as exc:
                return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
            if after is not None:
                after(cmd, decision)
            return cmd.response(decision.code, decision.remark, decision.ext_fields,
                                decision.body if decision.body is not None else b"")
        return handler

    # --- any-node handlers -----------------------------------------------------------

    async def _get_metadata(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        leader = self.leader_peer()
        return cmd.response(ext_fields={
            "group": self.config.controller_group,
            "controllerLeaderId": leader.id if leader else "",
            "controllerLeaderAddress": self.leader_address(),
            "isLeader": self.raft.is_leader,
            "peers": "".join(f"{p.id}:{p.rpc_address};" for p in self.peers),
        })

    async def _heartbeat(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        if not cmd.ext_fields.get("brokerId"):
            return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, "Heart beat with empty brokerId")
        try:
            h = BrokerHeartbeatHeader.parse(cmd.ext_fields)
        except ProtocolError as exc:
            raise BadRequest(str(exc)) from None
        name, broker_id, address = h.broker_name, int(h.broker_id or 0), h.broker_addr
        # Only as itself: its registered id and address (an impostor must not refresh, or
        # move, another broker's liveness), at an epoch the group has reached.
        refused = self.logic.heartbeat_refusal(name, broker_id, address, h.epoch)
        if refused is not None:
            return cmd.response(refused.code, refused.remark)
        signed_ms = signed_timestamp_ms(cmd) if self.auth.enabled else None
        if not self.heartbeats.is_newer(name, broker_id, signed_ms):
            return cmd.response(ResponseCode.NO_PERMISSION,
                                f"heartbeat of {name}/{broker_id} signed at {signed_ms} is not newer "
                                "than the last one taken (a replayed copy?); refused")
        timeout_ms = self._heartbeat_timeout_ms(h.heartbeat_timeout_mills)
        self.heartbeats.on_heartbeat(
            h.cluster_name, name, broker_id, address, epoch=h.epoch, max_offset=h.max_offset,
            confirm_offset=h.confirm_offset, timeout_ms=timeout_ms,
            priority=h.election_priority, conn=conn,
            default_timeout_ms=self.config.broker_heartbeat_timeout, signed_ms=signed_ms,
        )
        answer = self._lease_answer(name)
        answer.heartbeat_timeout_ms = timeout_ms
        return cmd.response(remark="Heart beat success", ext_fields=answer.build())

    def _heartbeat_timeout_ms(self, asked: int | None) -> int:
        """The timeout a broker gets: what it asked for, at most ``broker_heartbeat_timeout``
        (a sender must not keep itself alive for as long as it likes)."""
        cap = self.config.broker_heartbeat_timeout
        return cap if asked is None or asked <= 0 else min(asked, cap)

    def _lease_answer(self, broker_name: str) -> HeartbeatAnswerHeader:
        """The master lease part of a heartbeat answer (rmqha.broker.master_lease).

        Granted only by a leader that has applied everything before its term, with no
        election of the group between decision and apply; it names the master on record,
        and the broker renews only if that is itself at the epoch it holds."""
        g = self.state.group(broker_name)
        granted = (self.raft.is_leader and self._ready_term == self.raft.term and g is not None
                   and broker_name not in self._elections_in_flight)
        if not granted or g is None:
            return HeartbeatAnswerHeader(lease_granted=False)
        return HeartbeatAnswerHeader(lease_granted=True, master_epoch=g.master_epoch,
                                     master_broker_id=g.master_id)

    def _config_view(self) -> dict[str, Any]:
        view = to_dict(self.config)
        for key in SECRET_KEYS:
            camel = "".join(w.capitalize() if i else w for i, w in enumerate(key.split("_")))
            if view.get(camel):
                view[camel] = "******"
        return view

    async def _get_config(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        text = "".join(f"{k}={'' if v is None else v}\n" for k, v in self._config_view().items())
        return cmd.response(body=text)

    async def _update_config(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        refused = self._check_admin(cmd)
        if refused is not None:
            return refused
        try:
            text = cmd.body.decode("utf-8")
        except UnicodeDecodeError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "string2Properties error")
        values: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#!":
                continue
            key, sep, value = line.partition("=")
            if not sep:
                return cmd.response(ResponseCode.SYSTEM_ERROR, "string2Properties error")
            values[key.strip()] = value.strip()
        black = set(UPDATE_BLACKLIST)
        for k in self.config.config_black_list.split(";"):
            if k.strip():
                try:
                    black.add(resolve_key(ControllerConfig, k.strip(), "configBlackList"))
                except ConfigError:
                    black.add(k.strip())
        try:
            names = {k: resolve_key(ControllerConfig, k, "the request") for k in values}
        except ConfigError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        refused_keys = [k for k, n in names.items() if n in black]
        if refused_keys:
            return cmd.response(ResponseCode.NO_PERMISSION,
                                f"Can not update config in black list: {', '.join(refused_keys)}")
        candidate = dataclasses.replace(self.config)
        try:
            apply_values(candidate, values, "UPDATE_CONTROLLER_CONFIG")
            candidate.validate()
        except ConfigError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        apply_values(self.config, values, "UPDATE_CONTROLLER_CONFIG")
        self.logic.enable_elect_unclean_master = self.config.enable_elect_unclean_master
        self.heartbeats.new_leader_wait_s = self.config.new_leader_heartbeat_wait / 1000
        self.heartbeats.default_timeout_s = self.config.broker_heartbeat_timeout / 1000
        log.info("controller config updated: %s", ", ".join(values))
        return cmd.response()

    # --- elections and notifications -------------------------------------------------

    def _after_elect(self, cmd: RemotingCommand, decision: Decision) -> None:
        name = cmd.ext_fields.get("brokerName", "")
        self.metrics.election(name, decision.code)
        if decision.code == ResponseCode.SUCCESS:
            self._notify_role_changed(name)

    def _after_clean(self, cmd: RemotingCommand, decision: Decision) -> None:
        if decision.code == ResponseCode.SUCCESS and decision.event is not None:
            ids = decision.event.get("broker_ids")
            self.heartbeats.remove_group(decision.event["broker_name"], ids)

    def _on_broker_inactive(self, cluster: str, broker_name: str, broker_id: int) -> None:
        if not self.raft.is_leader:
            return
        g = self.state.group(broker_name)
        if g is None or g.master_id != broker_id:
            return
        wait = self.heartbeats.judge_wait(broker_name, broker_id)
        if wait > 0:
            # A new leader: fresh heartbeats, or a lease the previous leader granted, may
            # still be on their way.  Look again when the wait is over.
            log.info("master %s/%d of %s is inactive; this leader judges it in %.2fs",
                     broker_name, broker_id, cluster, wait)
            self._recheck_later(cluster, broker_name, broker_id, wait)
            return
        log.info("master %s/%d of %s is inactive: electing", broker_name, broker_id, cluster)
        self._spawn(self.trigger_elect(broker_name))

    async def _settle_holder(self, broker_name: str, broker_id: int | str, address: str) -> None:
        """Before an id is refused to ``address`` because another address holds it: when
        the holder's heartbeat connection has closed, ask now whether that process is gone
        (the close probe may still be under way: a broker restarted on a new port
        registers at once, and was refused, and exited, while its old port was already
        closed).  A holder that is gone is dropped; one that answers keeps the id."""
        try:
            bid = int(broker_id)
        except (TypeError, ValueError):
            return  # the decision names the bad field
        live = self.heartbeats.info(broker_name, bid)
        if (live is None or live.address == address or live.conn is not None
                or not self.heartbeats.is_alive(broker_name, bid)):
            return
        await self._probe_address(live, live.last_update)

    def _probe_closed_broker(self, info: BrokerLiveInfo) -> None:
        self._spawn(self._probe_address(info, info.last_update))

    async def _probe_address(self, info: BrokerLiveInfo, last_update: float) -> None:
        """A broker's heartbeat connection closed: is the process gone?

        Its client port refusing a connection shows it is (a killed process's port is
        closed by the kernel at once), and a dead process acknowledges nothing, so its
        master role can go now.  Anything else (it accepts, or no answer in time) proves
        nothing: the broker stays alive until its heartbeat timeout, as for a silent one."""
        host, _, port = info.address.rpartition(":")
        try:
            for attempt in range(3):
                try:
                    _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 1.0)
                    break
                except ConnectionResetError:
                    # Reset mid-handshake: a listener closing as the process dies.  Ask
                    # again; a port that is gone then refuses.
                    if attempt == 2:
                        raise
                    await asyncio.sleep(0.05)
        except ConnectionRefusedError:
            log.info("broker %s/%d at %s is gone (connection closed, port refused)",
                     info.broker_name, info.broker_id, info.address)
            self.heartbeats.confirm_gone(info, last_update)
            return
        except (OSError, ValueError, asyncio.TimeoutError) as exc:
            log.info("broker %s/%d closed its heartbeat connection; %s does not answer (%s): "
                     "judged by its heartbeat timeout", info.broker_name, info.broker_id, info.address, exc)
            return
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass  # it was only a knock on the door
        log.info("broker %s/%d closed its heartbeat connection but %s accepts connections: "
                 "judged by its heartbeat timeout", info.broker_name, info.broker_id, info.address)

    def _recheck_later(self, cluster: str, broker_name: str, broker_id: int, wait: float) -> None:
        loop = self._loop
        if loop is None or broker_name in self._rechecks:
            return

        def recheck() -> None:
            self._rechecks.pop(broker_name, None)
            if not self.heartbeats.is_alive(broker_name, broker_id):
                self._on_broker_inactive(cluster, broker_name, broker_id)

        self._rechecks[broker_name] = loop.call_later(wait + 0.01, recheck)

    async def trigger_elect(self, broker_name: str) -> int:
        """A controller-triggered election (retried); returns the last response code."""
        if broker_name in self._electing:
            return ResponseCode.SYSTEM_BUSY
        self._electing.add(broker_name)
        code: int = ResponseCode.SYSTEM_ERROR
        try:
            for _ in range(max(1, self.config.elect_master_max_retry_count)):
                ext = {"brokerName": broker_name, "brokerId": "-1"}
                try:
                    decision = await self._run_decision(lambda logic: logic.elect_master(ext))
                except (_NotLeader, ControllerError) as exc:
                    log.info("election for %s not done: %s", broker_name, exc or "not leader")
                    return ResponseCode.CONTROLLER_NOT_LEADER
                code = decision.code
                self.metrics.election(broker_name, code)
                if code == ResponseCode.SUCCESS:
                    log.info("elected master %s of %s", decision.elected, broker_name)
                    self._notify_role_changed(broker_name)
                    return code
                if code in (ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                            ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                            ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED):
                    if code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE:
                        log.warning("%s: %s", broker_name, decision.remark)
                    return code
            return code
        finally:
            self._electing.discard(broker_name)

    def _notify_role_changed(self, broker_name: str) -> None:
        if not self.config.notify_broker_role_changed:
            return
        g = self.state.group(broker_name)
        if g is None or g.master_id is None:
            return
        header = RoleChangedHeader(master_address=g.master_address, master_epoch=g.master_epoch,
                                   sync_state_set_epoch=g.sync_state_set_epoch,
                                   master_broker_id=g.master_id).build()
        body = {"syncStateSet": sorted(g.sync_state_set), "syncStateSetEpoch": g.sync_state_set_epoch}
        for bid, entry in sorted(g.brokers.items()):
            if not self.heartbeats.is_alive(broker_name, bid):
                continue
            addr = entry.address
            previous = self._notify_tasks.get(addr)
            if previous is not None and not previous.done():
                previous.cancel()  # a newer epoch supersedes a pending notice
            cmd = self.auth.sign(RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                                         header, body, oneway=True))
            self._notify_tasks[addr] = asyncio.ensure_future(self._send_notify(addr, cmd))

    async def _send_notify(self, addr: str, cmd: RemotingCommand) -> None:
        # Failures are only logged: brokers also poll GET_REPLICA_INFO and catch up.  One
        # connection per notice, closed after it: notices come only after elections, and a
        # link held open to every broker would outlive a partition between them (a path
        # from the controllers into a broker that the network no longer gives).
        client = RemotingClient(addr, connect_timeout=3.0, security=self._notice_links, expect=ServerRole.broker())
        try:
            await asyncio.wait_for(client.oneway(cmd), 3.0)
        except (asyncio.TimeoutError, OSError, RmqhaError) as exc:
            log.info("role-change notice to %s failed: %s", addr, exc)
        finally:
            await client.close()

    # --- background loops ------------------------------------------------------------

    async def _scan_heartbeats_loop(self) -> None:
        interval = max(0.05, self.config.scan_not_active_broker_interval / 1000)
        while True:
            await asyncio.sleep(interval)
            self.heartbeats.scan()
            self.metrics.brokers(len(self.heartbeats.entries()))

    async def _rescan_masters_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.config.scan_inactive_master_interval / 1000))
            if not self.raft.is_leader:
                continue
            for name in self.logic.groups_needing_election():
                await self.trigger_elect(name)

    async def _raft_metrics_loop(self) -> None:
        while True:
            self.metrics.raft(int(self.raft.role), self.raft.term)
            await asyncio.sleep(1.0)


async def serve(config: ControllerConfig, stop: asyncio.Event | None = None) -> None:
    """Run one controller until ``stop`` is set or SIGTERM/SIGINT arrives."""
    server = ControllerServer(config)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Signals reach only the main thread; a controller run on another thread (an embedded
    # one, or a test) is stopped by its caller setting ``stop``.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(f"rmqha controller {server.self_peer.id} listening on {server.address}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
