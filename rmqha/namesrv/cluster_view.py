"""What the name server's status page shows: groups, masters, SyncStateSets, lag, elections.

The name server already knows who is registered (group, address, id, the master epoch a
broker registered with).  For the rest it asks each live broker GET_BROKER_HA_STATUS, as
``rmqha ha-status`` does: the master answers its SyncStateSet, max and confirm offsets and
each slave's ack offset; a slave its own offsets and link state.  One refresh runs every
``status_poll_ms`` in the background (never per page view), so any number of open pages
costs the brokers one query each per period.

With ``status_controller_addr`` the controllers are asked too (GET_REPLICA_INFO of each
group, with the brokers' queries): they are the authority on the master and the
SyncStateSet, and they answer at once after a name server restart, when the routes hold
only the members that registered again so far (a broker registers every 30 s by default,
so a master could be missing from the page for that long); a master the controllers name
but the routes do not hold yet is asked for its status at the address they give.  A slave
that is caught up (its link SUSPEND: heartbeats only) and in the SyncStateSet is shown as
"in sync".

Elections are master epoch changes *observed* here, from registrations as they arrive and
from the brokers' answers, each with the wall-clock time it was first seen: a name server
started after an election has no record of it, and the time is when this process learnt
of it (within a poll period, or at once when the new master registers).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rmqha.controller.client import ControllerClient, ReplicaInfo
from rmqha.protocol.codes import RequestCode
from rmqha.errors import RmqhaError
from rmqha.namesrv.route_table import MASTER_ID, BrokerRegistration, RouteTable
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.protocol.command import RemotingCommand

log = logging.getLogger(__name__)

#: What the page says of a slave in the SyncStateSet whose link is caught up.
IN_SYNC = "in sync"
#: How many elections the page lists (newest first).
ELECTIONS_KEPT = 50
#: A broker that left the routes (killed, expired, unregistered) stays on the page, as
#: down, this long: an operator should see what is missing, not just what is left.
GONE_KEPT_MS = 5 * 60_000


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Election:
    """One master epoch change of a group, as this name server observed it."""

    group: str
    epoch: int
    previous_epoch: int | None  # None: the group's first master seen by this name server
    master_address: str
    master_id: int | None
    previous_master_address: str | None
    observed_at_ms: int  # wall clock
    source: str  # "registration" or "broker status"


@dataclass
class BrokerView:
    """One broker of a group: what it registered and what it answered."""

    address: str
    registered_id: int
    cluster: str = ""
    broker_id: int | None = None  # the controller's id (a master registers as 0)
    role: str = "unknown"
    reachable: bool = False
    error: str | None = None
    master_epoch: int = 0
    max_offset: int | None = None
    confirm_offset: int | None = None
    #: Bytes the master has that this broker has not acknowledged (0 for the master).
    lag_bytes: int | None = None
    lag_ms: int | None = None
    in_sync: bool | None = None
    link_state: str | None = None
    #: When it was last seen in the routes, if it has left them (wall clock ms).
    gone_since_ms: int | None = None
    #: Whether it is in the routes (False: a master the controllers name, not registered yet).
    registered: bool = True


@dataclass
class GroupView:
    cluster: str
    name: str
    master_address: str = ""
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: list[int] = field(default_factory=list)
    sync_state_set_epoch: int = 0
    max_offset: int | None = None
    confirm_offset: int | None = None
    brokers: list[BrokerView] = field(default_factory=list)
    #: Where the master and SyncStateSet come from: "controller" or "brokers".
    source: str = "brokers"


class ClusterView:
    """The status page's data, refreshed in the background from registrations and brokers."""

    def __init__(self, routes: RouteTable, *, poll_ms: int, request_timeout_s: float = 1.0,
                 clock: Callable[[], int] = wall_ms, security: ClientSecurity | None = None,
                 controllers: ControllerClient | None = None) -> None:
        self.routes = routes
        #: The controllers asked for each group's master and SyncStateSet (None: not asked).
        self.controllers = controllers
        #: TLS of the connections to the brokers (the name server's tls.client.*).
        self.security = security
        self.poll_ms = poll_ms
        self.request_timeout_s = request_timeout_s
        self._clock = clock
        self._clients: dict[str, RemotingClient] = {}
        self._groups: list[GroupView] = []
        self._refreshed_at_ms = 0
        # group -> (epoch, master address) last seen, to notice the next change
        self._masters: dict[str, tuple[int, str]] = {}
        # group -> address -> (the broker as last seen registered, when it was seen)
        self._last_seen: dict[str, dict[str, tuple[BrokerView, int]]] = {}
        self.elections: deque[Election] = deque(maxlen=ELECTIONS_KEPT)
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="status-view")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass  # we cancelled it
            self._task = None
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self.controllers is not None:
            await self.controllers.close()

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except (RmqhaError, OSError, ValueError, TypeError, KeyError) as exc:
                # One bad round (a broker answering something odd) must not end the page.
                log.warning("status page refresh failed: %s", exc)
            await asyncio.sleep(self.poll_ms / 1000)

    # --- observations ---------------------------------------------------------------------

    def observe_registration(self, reg: BrokerRegistration) -> None:
        """A registration was accepted: a master's epoch may be new."""
        if reg.broker_id == MASTER_ID:
            self._observe_master(reg.broker_name, reg.master_epoch, reg.broker_addr, None, "registration")

    def _observe_master(self, group: str, epoch: int, address: str, master_id: int | None, source: str) -> None:
        if epoch <= 0 or not address:
            return
        seen = self._masters.get(group)
        if seen is not None and epoch <= seen[0]:
            if epoch == seen[0] and master_id is not None:
                # The registration named no controller id; the broker's answer does.
                for e in self.elections:
                    if e.group == group and e.epoch == epoch and e.master_id is None:
                        e.master_id = master_id
            return
        self._masters[group] = (epoch, address)
        self.elections.appendleft(Election(
            group=group, epoch=epoch, previous_epoch=seen[0] if seen else None,
            master_address=address, master_id=master_id,
            previous_master_address=seen[1] if seen else None,
            observed_at_ms=self._clock(), source=source))
        if seen is not None:
            log.info("status page: %s has a new master %s at epoch %d (was %s at epoch %d)",
                     group, address, epoch, seen[1], seen[0])

    # --- refresh --------------------------------------------------------------------------

    async def _status(self, address: str) -> dict[str, Any]:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = RemotingClient(address, connect_timeout=self.request_timeout_s,
                                                             security=self.security, expect=ServerRole.broker())
        cmd = RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS)
        resp = await asyncio.wait_for(client.request(cmd, self.request_timeout_s), self.request_timeout_s * 2)
        resp.check_success(RequestCode.GET_BROKER_HA_STATUS)
        body = resp.json_body()
        if not isinstance(body, dict):
            raise ValueError(f"GET_BROKER_HA_STATUS of {address} is not a JSON object")
        return body

    async def _ask(self, address: str) -> dict[str, Any] | str:
        """The broker's status, or why there is none (a line for the page)."""
        try:
            return await self._status(address)
        except (RmqhaError, OSError, ValueError, asyncio.TimeoutError) as exc:
            client = self._clients.pop(address, None)
            if client is not None:
                await client.close()
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _replica_info(self, group: str) -> ReplicaInfo | None:
        """The controllers' record of ``group``; None when not asked or no answer."""
        if self.controllers is None:
            return None
        try:
            return await asyncio.wait_for(self.controllers.get_replica_info(group), self.request_timeout_s * 2)
        except (RmqhaError, OSError, asyncio.TimeoutError) as exc:
            log.debug("status page: no replica info of %s from the controllers: %s", group, exc)
            return None

    async def refresh(self) -> None:
        names = self.routes.group_names()
        regs = [r for name in names for r in self.routes.members(name)]
        infos = dict(zip(names, await asyncio.gather(*(self._replica_info(n) for n in names))))
        # A master the controllers name that has not registered again yet is asked too.
        addrs = list(dict.fromkeys([r.broker_addr for r in regs]
                                   + [i.master_address for i in infos.values() if i and i.master_address]))
        answers = await asyncio.gather(*(self._ask(a) for a in addrs))
        by_addr = dict(zip(addrs, answers))
        groups: list[GroupView] = []
        now = self._clock()
        for name in names:
            members = [r for r in regs if r.broker_name == name]
            if members:
                groups.append(self._group(name, _with_unregistered_master(members, infos.get(name)), by_addr,
                                          infos.get(name), {r.broker_addr for r in members}))
        self._add_departed(groups, now)
        # Clients of brokers that left the routes are closed, not kept forever.
        for addr in [a for a in self._clients if a not in by_addr]:
            await self._clients.pop(addr).close()
        self._groups = groups
        self._refreshed_at_ms = self._clock()

    def _add_departed(self, groups: list[GroupView], now: int) -> None:
        """Remember who is registered; list brokers that left recently as down."""
        by_name = {g.name: g for g in groups}
        for g in groups:
            seen = self._last_seen.setdefault(g.name, {})
            for b in g.brokers:
                seen[b.address] = (b, now)
        for name in list(self._last_seen):
            seen = self._last_seen[name]
            for addr, (b, at) in list(seen.items()):
                if at == now:
                    continue
                if now - at > GONE_KEPT_MS:
                    del seen[addr]
                    continue
                g = by_name.get(name)
                if g is None:  # the whole group left: show it, empty of live brokers
                    g = by_name[name] = GroupView(cluster=b.cluster, name=name)
                    groups.append(g)
                g.brokers.append(BrokerView(
                    address=addr, registered_id=b.registered_id, broker_id=b.broker_id, role="down",
                    master_epoch=b.master_epoch, max_offset=b.max_offset, confirm_offset=b.confirm_offset,
                    gone_since_ms=at, error="left the name server's routes (process gone or not renewing)"))
            if not seen:
                del self._last_seen[name]
        groups.sort(key=lambda g: g.name)

    def _group(self, name: str, members: list[BrokerRegistration],
               answers: dict[str, dict[str, Any] | str], info: ReplicaInfo | None = None,
               registered: set[str] | None = None) -> GroupView:
        g = GroupView(cluster=members[0].cluster, name=name)
        master_status: dict[str, Any] | None = None
        for reg in members:
            st = answers.get(reg.broker_addr)
            if isinstance(st, dict) and st.get("role") == "master":
                if master_status is None or int(st.get("masterEpoch") or 0) > int(master_status.get("masterEpoch") or 0):
                    master_status = st
        master_reg = next((r for r in members if r.broker_id == MASTER_ID), None)
        if master_status is not None:
            g.master_address = str(master_status.get("address") or "")
            g.master_id = _int_or_none(master_status.get("controllerBrokerId"))
            g.master_epoch = int(master_status.get("masterEpoch") or 0)
            g.sync_state_set = [int(i) for i in master_status.get("syncStateSet") or []]
            g.sync_state_set_epoch = int(master_status.get("syncStateSetEpoch") or 0)
            g.max_offset = _int_or_none(master_status.get("maxOffset"))
            g.confirm_offset = _int_or_none(master_status.get("confirmOffset"))
            self._observe_master(name, g.master_epoch, g.master_address, g.master_id, "broker status")
        elif master_reg is not None:
            g.master_address, g.master_epoch = master_reg.broker_addr, master_reg.master_epoch
        if info is not None and info.master_address:
            # The controllers' record wins: it is what every broker of the group follows.
            g.source = "controller"
            g.master_address, g.master_id, g.master_epoch = info.master_address, info.master_broker_id, info.master_epoch
            g.sync_state_set, g.sync_state_set_epoch = sorted(info.sync_state_set), info.sync_state_set_epoch
            self._observe_master(name, g.master_epoch, g.master_address, g.master_id, "controller")
        slaves_seen: dict[int, dict[str, Any]] = {}
        if master_status is not None:
            ha = master_status.get("ha")
            for s in (ha.get("slaves") if isinstance(ha, dict) else None) or []:
                if isinstance(s, dict) and s.get("broker_id") is not None:
                    slaves_seen[int(s["broker_id"])] = s
        for reg in members:
            b = self._broker(reg, answers.get(reg.broker_addr), g, slaves_seen)
            b.registered = registered is None or reg.broker_addr in registered
            g.brokers.append(b)
        g.brokers.sort(key=lambda b: (b.role != "master", b.broker_id if b.broker_id is not None else 1 << 30))
        return g

    @staticmethod
    def _broker(reg: BrokerRegistration, st: dict[str, Any] | str | None, g: GroupView,
                slaves_seen: dict[int, dict[str, Any]]) -> BrokerView:
        b = BrokerView(address=reg.broker_addr, registered_id=reg.broker_id, cluster=reg.cluster,
                       broker_id=None if reg.broker_id == MASTER_ID else reg.broker_id,
                       master_epoch=reg.master_epoch)
        if not isinstance(st, dict):
            b.error = st or "no answer"
            return b
        b.reachable = True
        b.role = str(st.get("role") or "unknown")
        b.broker_id = _int_or_none(st.get("controllerBrokerId")) or b.broker_id
        b.master_epoch = int(st.get("masterEpoch") or 0)
        b.max_offset = _int_or_none(st.get("maxOffset"))
        b.confirm_offset = _int_or_none(st.get("confirmOffset"))
        ha = st.get("ha") if isinstance(st.get("ha"), dict) else {}
        if b.role == "master":
            b.lag_bytes, b.lag_ms = 0, 0
            b.in_sync = True
            b.link_state = "serving"
            return b
        b.in_sync = b.broker_id in g.sync_state_set if b.broker_id is not None and g.sync_state_set else None
        # SUSPEND is the HA link's word for caught up (heartbeats only): in the set, in sync.
        state = ha.get("state")
        b.link_state = IN_SYNC if b.in_sync and state == "SUSPEND" else state
        seen = slaves_seen.get(b.broker_id) if b.broker_id is not None else None
        if seen is not None:  # the master's view: what the slave acknowledged
            b.lag_bytes = _int_or_none(seen.get("lag_bytes"))
            b.lag_ms = _int_or_none(seen.get("lag_ms"))
        elif g.max_offset is not None and b.max_offset is not None:
            b.lag_bytes = max(g.max_offset - b.max_offset, 0)
        return b

    # --- the page's JSON ------------------------------------------------------------------

    def snapshot(self, namesrv_address: str) -> dict[str, Any]:
        return {
            "namesrv": namesrv_address,
            "refreshedAtMs": self._refreshed_at_ms,
            "nowMs": self._clock(),
            "pollMs": self.poll_ms,
            "groups": [asdict(g) for g in self._groups],
            "elections": [asdict(e) for e in self.elections],
        }


def _with_unregistered_master(members: list[BrokerRegistration], info: ReplicaInfo | None) -> list[BrokerRegistration]:
    """``members`` and, when the controllers name a master the routes do not hold yet, a
    stand-in registration of it (asked for its status like the others)."""
    if info is None or not info.master_address or any(r.broker_addr == info.master_address for r in members):
        return members
    stand_in = BrokerRegistration(cluster=members[0].cluster, broker_name=members[0].broker_name,
                                  broker_addr=info.master_address, broker_id=MASTER_ID,
                                  master_epoch=info.master_epoch)
    return [*members, stand_in]


def _int_or_none(value: Any) -> int | None:
    if value in (None, "", "null"):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
