"""ControllerClient: what brokers and the admin CLI use to talk to a controller group.

It keeps one connection per controller, finds the leader with GET_METADATA_INFO (any
controller answers it) and follows CONTROLLER_NOT_LEADER answers, which name the leader.
Leader-only calls are retried on another controller until ``timeout`` when the leader
is unknown, has moved, or does not answer.  Heartbeats go to every controller (RocketMQ
#5712), so a new leader already knows who is alive; brokers send them answered
(:meth:`ControllerClient.heartbeat_to`): the leader's answer renews the master lease.

Methods return dataclasses; a refusal raises :class:`rmqha.errors.RemoteCommandError`
carrying RocketMQ's response code (``exc.code``) and remark, except where a method says
otherwise (``elect_master`` also returns on MASTER_STILL_EXIST).

With the cluster secret (``cluster_secret=``, or an ``auth=`` authenticator) every request
that changes the controllers' state is signed (:mod:`rmqha.protocol.request_auth`); each
round of heartbeats carries one signed timestamp for every controller, later than the
round before.  Its connections are then authenticated channels (:mod:`rmqha.net.channel`):
the secret's handshake with each controller, and a MAC on every frame both ways, so an
answer (register, elect, heartbeat's lease) that is not the controller's closes the
connection instead of reaching the caller.  ``channel=`` names the caller (a broker gives
its own identity); with only ``cluster_secret`` it is an admin tool's.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.control_headers import (
    AlterSyncStateSetHeader,
    ApplyBrokerIdHeader,
    BrokerHeartbeatHeader,
    CleanBrokerDataHeader,
    ElectMasterAnswer,
    ElectMasterHeader,
    GetNextBrokerIdHeader,
    GetReplicaInfoHeader,
    HeartbeatAnswerHeader,
    NextBrokerIdAnswer,
    RegisterBrokerAnswer,
    RegisterBrokerToControllerHeader,
    ReplicaInfoAnswer,
)
from rmqha.errors import ControllerError, RemoteCommandError, RemotingError
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import RequestAuthenticator, request_auth
from rmqha.security.channel_auth import ChannelKey, key_from_text
from rmqha.security.identity import Identity, Role

#: Who a client of the controllers proves to be when it has only the secret.
ADMIN_IDENTITY = Identity.admin("controller-client")


@dataclass
class ControllerMetadata:
    group: str
    leader_id: str
    leader_address: str
    is_leader: bool
    peers: list[tuple[str, str]]
    address: str = ""  # the controller that answered


@dataclass
class SyncStateSet:
    sync_state_set: list[int]
    sync_state_set_epoch: int


@dataclass
class ReplicaInfo:
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int


@dataclass
class HeartbeatAnswer:
    """A controller's answer to BROKER_HEARTBEAT (only the leader's grants the lease)."""

    address: str
    lease_granted: bool
    master_broker_id: int | None
    master_epoch: int
    #: The heartbeat timeout the controller applies to this broker (ms; None if it did not say).
    heartbeat_timeout_ms: int | None = None


@dataclass
class RegisterResult:
    cluster: str
    broker_name: str
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: list[int]


@dataclass
class ElectResult:
    code: int  # SUCCESS or CONTROLLER_MASTER_STILL_EXIST
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: list[int]
    broker_addrs: dict[int, str] = field(default_factory=dict)


@dataclass
class ReplicaIdentity:
    broker_name: str
    broker_id: int
    broker_address: str
    alive: bool


@dataclass
class BrokerReplicasState:
    broker_name: str
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int
    in_sync_replicas: list[ReplicaIdentity]
    not_in_sync_replicas: list[ReplicaIdentity]


def _opt_int(value: str | None) -> int | None:
    if value in (None, "", "null"):
        return None
    return int(value)


def _ids(body: Any) -> tuple[list[int], int]:
    if not isinstance(body, dict):
        return [], 0
    return [int(i) for i in body.get("syncStateSet") or []], int(body.get("syncStateSetEpoch", 0))


def parse_peers(text: str) -> list[tuple[str, str]]:
    out = []
    for item in text.split(";"):
        if item:
            pid, _, addr = item.partition(":")
            out.append((pid, addr))
    return out


class ControllerClient:
    """Async client of a controller group; ``addresses`` as a list or ``a;b;c`` text."""

    def __init__(self, addresses: Iterable[str] | str, *, request_timeout: float = 3.0,
                 admin_token: str | None = None, security: ClientSecurity | None = None,
                 cluster_secret: str | None = None,
                 auth: RequestAuthenticator | None = None,
                 channel: ChannelKey | None = None) -> None:
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.replace(",", ";").split(";") if a.strip()]
        self.addresses: list[str] = list(dict.fromkeys(addresses))
        if not self.addresses:
            raise ControllerError("no controller address given")
        if auth is not None and cluster_secret:
            raise ValueError("give cluster_secret or auth, not both")
        self.request_timeout = request_timeout
        self.admin_token = admin_token
        if channel is None and cluster_secret:
            channel = key_from_text(cluster_secret, ADMIN_IDENTITY)
        #: TLS, the authenticated channel (only a controller may answer) and a request
        #: hook of the connections to the controllers.
        self.security = (security or ClientSecurity()).with_channel(
            channel.expecting((Role.CONTROLLER,))) if channel is not None else security
        self.auth: RequestAuthenticator = auth if auth is not None else request_auth(cluster_secret)
        self._last_round_ms = 0
        self.leader: str | None = None
        self._clients: dict[str, RemotingClient] = {}

    def _client(self, addr: str) -> RemotingClient:
        client = self._clients.get(addr)
        if client is None:
            # Over TLS with the cluster CA the server must show a controller's certificate.
            client = self._clients[addr] = RemotingClient(addr, connect_timeout=self.request_timeout,
                                                          security=self.security, expect=ServerRole.controller())
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing --------------------------------------------------------------------

    async def request_to(self, addr: str, code: int, ext: Mapping[str, Any] | None = None,
                         body: Any = b"", timeout: float | None = None) -> RemotingCommand:
        """One request to one controller, no leader logic (signed when its code needs it)."""
        cmd = self.auth.sign(RemotingCommand.request(code, ext, body))
        return await self._client(addr).request(cmd, timeout or self.request_timeout)

    def heartbeat_round_ms(self) -> int:
        """A signing time for one round of heartbeats: now, and always later than the last
        round's (the controllers take a broker's heartbeats only with rising times)."""
        self._last_round_ms = max(int(time.time() * 1000), self._last_round_ms + 1)
        return self._last_round_ms

    async def get_metadata(self, addr: str | None = None) -> ControllerMetadata:
        """GET_METADATA_INFO from ``addr`` (or the first controller that answers)."""
        last: Exception | None = None
        for a in [addr] if addr else self._ordered():
            try:
                resp = await self.request_to(a, RequestCode.CONTROLLER_GET_METADATA_INFO)
            except RemotingError as exc:
                last = exc
                continue
            resp.check_success(RequestCode.CONTROLLER_GET_METADATA_INFO)
            ext = resp.ext_fields
            meta = ControllerMetadata(
                group=ext.get("group", ""), leader_id=ext.get("controllerLeaderId", ""),
                leader_address=ext.get("controllerLeaderAddress", ""),
                is_leader=ext.get("isLeader", "false") == "true",
                peers=parse_peers(ext.get("peers", "")), address=a)
            if meta.leader_address:
                self.leader = meta.leader_address
            return meta
        raise ControllerError(f"no controller answered ({last})")

    def _ordered(self) -> list[str]:
        if self.leader and self.leader in self.addresses:
            return [self.leader] + [a for a in self.addresses if a != self.leader]
        return list(self.addresses) + ([self.leader] if self.leader else [])

    async def find_leader(self, timeout: float | None = None) -> str:
        deadline = time.monotonic() + (timeout if timeout is not None else self.request_timeout * 3)
        while True:
            for addr in self._ordered():
                try:
                    meta = await self.get_metadata(addr)
                except (ControllerError, RemotingError, RemoteCommandError):
                    continue
                if meta.leader_address:
                    return meta.leader_address
            if time.monotonic() >= deadline:
                raise ControllerError(f"no controller leader found among {', '.join(self.addresses)}")
            await asyncio.sleep(0.05)

    async def call_leader(self, code: int, ext: Mapping[str, Any] | None = None, body: Any = b"",
                          timeout: float | None = None) -> RemotingCommand:
        """Send to the leader, following NOT_LEADER answers and retrying until ``timeout``."""
        total = timeout if timeout is not None else self.request_timeout * 3
        deadline = time.monotonic() + total
        last: str = "no attempt"
        while True:
            try:
                leader = self.leader or await self.find_leader(max(0.1, deadline - time.monotonic()))
                resp = await self.request_to(leader, code, ext, body)
            except (RemotingError, ControllerError) as exc:
                last = str(exc)
                self.leader = None
            else:
                if resp.code != ResponseCode.CONTROLLER_NOT_LEADER:
                    return resp
                last = resp.remark or "not leader"
                self.leader = resp.ext_fields.get("controllerLeaderAddress") or None
            if time.monotonic() >= deadline:
                raise ControllerError(f"request {code} found no controller leader in "
                                      f"{total:.1f}s: {last}")
            await asyncio.sleep(0.05)

    def _admin(self, ext: dict[str, Any]) -> dict[str, Any]:
        if self.admin_token:
            ext["adminToken"] = self.admin_token
        return ext

    # --- broker-side calls -----------------------------------------------------------

    async def get_next_broker_id(self, cluster: str, broker_name: str) -> int:
        resp = (await self.call_leader(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                                       GetNextBrokerIdHeader(cluster_name=cluster, broker_name=broker_name).build()))
        resp.check_success(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID)
        answer = NextBrokerIdAnswer.parse(resp.ext_fields)
        if answer.next_broker_id is None:
            raise ControllerError("the controller's answer to GET_NEXT_BROKER_ID names no nextBrokerId")
        return answer.next_broker_id

    async def apply_broker_id(self, cluster: str, broker_name: str, broker_id: int,
                              register_check_code: str) -> None:
        """Raises RemoteCommandError(CONTROLLER_BROKER_ID_INVALID) when refused; the remark
        and ``nextBrokerId`` in the answer say which id is next."""
        resp = await self.call_leader(RequestCode.CONTROLLER_APPLY_BROKER_ID, ApplyBrokerIdHeader(
            cluster_name=cluster, broker_name=broker_name, applied_broker_id=broker_id,
            register_check_code=register_check_code).build())
        resp.check_success(RequestCode.CONTROLLER_APPLY_BROKER_ID)

    async def register_broker(self, cluster: str, broker_name: str, broker_id: int,
                              broker_address: str) -> RegisterResult:
        resp = await self.call_leader(RequestCode.CONTROLLER_REGISTER_BROKER, RegisterBrokerToControllerHeader(
            cluster_name=cluster, broker_name=broker_name, broker_id=broker_id,
            broker_address=broker_address, invoke_time=int(time.time() * 1000)).build())
        resp.check_success(RequestCode.CONTROLLER_REGISTER_BROKER)
        h = RegisterBrokerAnswer.parse(resp.ext_fields)
        ids, epoch = _ids(resp.json_body())
        return RegisterResult(cluster, broker_name, h.master_broker_id, h.master_address or None, h.master_epoch,
                              epoch if h.sync_state_set_epoch is None else h.sync_state_set_epoch, ids)

    async def heartbeat(self, cluster: str, broker_name: str, broker_id: int, broker_address: str,
                        *, epoch: int = -1, max_offset: int = -1, confirm_offset: int = -1,
                        timeout_ms: int = 10000, priority: int | None = None) -> None:
        """One-way BROKER_HEARTBEAT to every controller (errors are ignored per controller)."""
        ext = _heartbeat_header(cluster, broker_name, broker_id, broker_address, epoch, max_offset,
                                confirm_offset, timeout_ms, priority)
        round_ms = self.heartbeat_round_ms()

        async def one(addr: str) -> None:
            cmd = self.auth.sign(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, ext, oneway=True),
                                 timestamp_ms=round_ms)
            try:
                await asyncio.wait_for(self._client(addr).oneway(cmd), self.request_timeout)
            except (RemotingError, asyncio.TimeoutError):
                pass  # that controller is down; the others still hear us

        await asyncio.gather(*(one(a) for a in self.addresses))

    async def heartbeat_to(self, addr: str, cluster: str, broker_name: str, broker_id: int,
                           broker_address: str, *, epoch: int = -1, max_offset: int = -1,
                           confirm_offset: int = -1, timeout_ms: int = 10000,
                           priority: int | None = None,
                           timeout: float | None = None,
                           round_ms: int | None = None) -> HeartbeatAnswer:
        """BROKER_HEARTBEAT to one controller, answered: the leader's answer grants the
        master lease (``leaseGranted``) with its record of the group's master.  Every
        heartbeat of one round should share ``round_ms`` (:meth:`heartbeat_round_ms`)."""
        ext = _heartbeat_header(cluster, broker_name, broker_id, broker_address, epoch, max_offset,
                                confirm_offset, timeout_ms, priority)
        cmd = self.auth.sign(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, ext),
                             timestamp_ms=round_ms if round_ms is not None else self.heartbeat_round_ms())
        resp = await self._client(addr).request(cmd, timeout or self.request_timeout)
        resp.check_success(RequestCode.BROKER_HEARTBEAT)
        h = HeartbeatAnswerHeader.parse(resp.ext_fields)
        return HeartbeatAnswer(address=addr, lease_granted=h.lease_granted, master_broker_id=h.master_broker_id,
                               master_epoch=h.master_epoch, heartbeat_timeout_ms=h.heartbeat_timeout_ms)

    async def get_replica_info(self, broker_name: str) -> ReplicaInfo:
        resp = await self.call_leader(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                      GetReplicaInfoHeader(broker_name=broker_name).build())
        resp.check_success(RequestCode.CONTROLLER_GET_REPLICA_INFO)
        h = ReplicaInfoAnswer.parse(resp.ext_fields)
        ids, epoch = _ids(resp.json_body())
        return ReplicaInfo(h.master_broker_id, h.master_address or None, h.master_epoch, ids, epoch)

    async def alter_sync_state_set(self, broker_name: str, master_broker_id: int, master_epoch: int,
                                   new_sync_state_set: Iterable[int],
                                   sync_state_set_epoch: int) -> SyncStateSet:
        resp = await self.call_leader(
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            AlterSyncStateSetHeader(broker_name=broker_name, master_broker_id=master_broker_id,
                                    master_epoch=master_epoch, invoke_time=int(time.time() * 1000)).build(),
            {"syncStateSet": sorted(set(new_sync_state_set)), "syncStateSetEpoch": sync_state_set_epoch})
        resp.check_success(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
        ids, epoch = _ids(resp.json_body())
        return SyncStateSet(ids, epoch)

    async def elect_master(self, cluster: str, broker_name: str, broker_id: int = -1, *,
                           designate: bool = False) -> ElectResult:
        """A broker-triggered election (``designate=False``) or an admin's choice of master.
        Returns on SUCCESS and on MASTER_STILL_EXIST (``result.code`` says which)."""
        ext = ElectMasterHeader(cluster_name=cluster, broker_name=broker_name, broker_id=broker_id,
                                designate_elect=designate, invoke_time=int(time.time() * 1000)).build()
        resp = await self.call_leader(RequestCode.CONTROLLER_ELECT_MASTER,
                                      self._admin(ext) if designate else ext)
        if resp.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            raise RemoteCommandError(resp.code, resp.remark, RequestCode.CONTROLLER_ELECT_MASTER)
        e = ElectMasterAnswer.parse(resp.ext_fields)
        body = resp.json_body() or {}
        group = body.get("brokerMemberGroup") or {}
        return ElectResult(resp.code, e.master_broker_id, e.master_address or None,
                           e.master_epoch, e.sync_state_set_epoch,
                           [int(i) for i in body.get("syncStateSet") or []],
                           {int(k): v for k, v in (group.get("brokerAddrs") or {}).items()})

    # --- admin calls -----------------------------------------------------------------

    async def get_sync_state_data(self, broker_names: Iterable[str]) -> dict[str, BrokerReplicasState]:
        resp = await self.call_leader(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
                                      list(broker_names))
        resp.check_success(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA)
        table = (resp.json_body() or {}).get("replicasInfoTable") or {}

        def ident(d: dict[str, Any]) -> ReplicaIdentity:
            return ReplicaIdentity(d["brokerName"], int(d["brokerId"]), d["brokerAddress"],
                                   bool(d.get("alive")))

        return {name: BrokerReplicasState(
                    name, d.get("masterBrokerId"), d.get("masterAddress"), int(d["masterEpoch"]),
                    int(d["syncStateSetEpoch"]), [ident(x) for x in d["inSyncReplicas"]],
                    [ident(x) for x in d["notInSyncReplicas"]])
                for name, d in table.items()}

    async def clean_broker_data(self, broker_name: str, broker_ids: Iterable[int] | None = None, *,
                                cluster: str = "", clean_living_broker: bool = False) -> None:
        ids = ";".join(str(i) for i in broker_ids) if broker_ids else None
        ext = CleanBrokerDataHeader(cluster_name=cluster, broker_name=broker_name,
                                    broker_controller_ids_to_clean=ids, is_clean_living_broker=clean_living_broker,
                                    invoke_time=int(time.time() * 1000)).build()
        resp = await self.call_leader(RequestCode.CLEAN_BROKER_DATA, self._admin(ext))
        resp.check_success(RequestCode.CLEAN_BROKER_DATA)

    async def get_controller_config(self, addr: str | None = None) -> dict[str, str]:
        resp = await self.request_to(addr or self.addresses[0], RequestCode.GET_CONTROLLER_CONFIG)
        resp.check_success(RequestCode.GET_CONTROLLER_CONFIG)
        out = {}
        for line in resp.body.decode("utf-8").splitlines():
            k, _, v = line.partition("=")
            if k:
                out[k] = v
        return out

    async def update_controller_config(self, values: Mapping[str, Any],
                                       addresses: Iterable[str] | None = None) -> None:
        """Send the update to each controller (each keeps its own config, as RocketMQ)."""
        text = "".join(f"{k}={v}\n" for k, v in values.items())
        for addr in addresses or self.addresses:
            resp = await self.request_to(addr, RequestCode.UPDATE_CONTROLLER_CONFIG,
                                         self._admin({}), text)
            resp.check_success(RequestCode.UPDATE_CONTROLLER_CONFIG)


class BlockingControllerClient:
    """Blocking wrapper for the CLI and tests: every async method, called synchronously."""

    def __init__(self, addresses: Iterable[str] | str, **kwargs: Any) -> None:
        self._loop = EventLoopThread("rmqha-controller-client")
        self._client = ControllerClient(addresses, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(attr(*args, **kwargs))
        return call

    def close(self) -> None:
        try:
            self._loop.run(self._client.close(), 5)
        finally:
            self._loop.stop()

    def __enter__(self) -> BlockingControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ControllerClient", "BlockingControllerClient",
           "ControllerMetadata", "ReplicaInfo", "RegisterResult", "ElectResult", "SyncStateSet",
           "ReplicaIdentity", "BrokerReplicasState"]


def _heartbeat_header(cluster: str, broker_name: str, broker_id: int, broker_address: str, epoch: int,
                      max_offset: int, confirm_offset: int, timeout_ms: int, priority: int | None) -> dict[str, str]:
    return BrokerHeartbeatHeader(cluster_name=cluster, broker_name=broker_name, broker_id=broker_id,
                                 broker_addr=broker_address, epoch=epoch, max_offset=max_offset,
                                 confirm_offset=confirm_offset, heartbeat_timeout_mills=timeout_ms,
                                 election_priority=priority).build()
