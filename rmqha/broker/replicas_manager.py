"""ReplicasManager: the broker's side of controller mode (after RocketMQ's ReplicasManager).

It owns the broker's view of its group (master id, address, master epoch, SyncStateSet and
its epoch) and decides role changes; the :class:`RoleListener` (the Broker) carries them
out on the store, the HA layer and the messaging layer.  Everything runs on the broker's
asyncio loop; role changes are serialised by one lock.

- Start-up: negotiate the broker id (:mod:`rmqha.broker.identity`), register with the
  controller (which records the current address), heartbeat, then take the role the
  register answer names, or ask for an election when the group has no master.  Until a
  role is taken the broker is fenced (RocketMQ #6508: a broker that served before the
  controller confirmed its role lost acknowledged writes).
- Heartbeats go to *every* controller every ``broker_heartbeat_interval_ms`` (RocketMQ
  #5712: liveness is per controller node, so a new leader must already know us), carrying
  the last epoch, max offset, confirm offset and election priority.
- The controller leader's answers to those heartbeats renew the master lease
  (:mod:`rmqha.broker.master_lease`); a master without one is *lease-fenced*: it keeps its
  role and epoch but takes and acknowledges no writes (:attr:`ReplicasManager.accepts_writes`)
  until a renewal names it master of the same epoch again.
- Replica info is polled every ``sync_broker_metadata_period_ms``; NOTIFY_BROKER_ROLE_CHANGED
  pushes are taken at once.  Either way only a master epoch *newer* than the one held
  changes anything; stale notices are logged and ignored.  A notice must carry the
  controller's signature when the broker has the cluster secret and come over an
  authenticated channel from a controller (or TLS with a controller's verified
  certificate, :func:`rmqha.net.channel.refused_off_channel`), and one that names this
  broker master is confirmed with the controller leader (GET_REPLICA_INFO) before the role
  is taken: the leader's record is what the broker acts on.
- The controller caps the heartbeat timeout a broker asks for and says what it applies;
  the master lease is shortened to end ``master_lease_margin_ms`` before the smallest
  timeout any controller applies.
- SyncStateSet changes proposed by the HA master go to the controller with
  AlterSyncStateSet; a FENCED answer (2000/2001: our epoch or set epoch is old) re-reads
  replica info, which applies whatever newer state the controller has.
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Protocol

from rmqha import log as rmqha_log
from rmqha.broker.config import BrokerConfig
from rmqha.failpoints import Failpoint, hit
from rmqha.broker.identity import IdentityStore, negotiate_broker_id
from rmqha.broker.master_lease import LeaseGrant, MasterLease
from rmqha.protocol.codes import ResponseCode
from rmqha.errors import (
    BrokerError, BrokerIdentityError, ControllerError, ProtocolError, RemoteCommandError, RemotingError, RmqhaError,
)
from rmqha.net.channel import refused_off_channel
from rmqha.net.peer import RequestPeer
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.control_headers import RoleChangedHeader
from rmqha.protocol.request_auth import OpenAuth, RefusalLog, RequestAuthenticator, check
from rmqha.security.identity import Role as PeerRole

log = logging.getLogger(__name__)


class Role(str, enum.Enum):
    FENCED = "fenced"
    MASTER = "master"
    SLAVE = "slave"


@dataclass(frozen=True)
class GroupState:
    """One snapshot of the controller's record of a group (replica info, notify, elect...)."""

    master_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0


class RoleListener(Protocol):
    """What the broker does on role changes (all awaited on the loop, one at a time)."""

    async def become_master(self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None: ...

    async def master_reelected(self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None: ...

    async def become_slave(self, master_id: int, master_address: str, epoch: int) -> None: ...

    def apply_sync_state_set(self, ids: frozenset[int], epoch: int) -> None: ...

    def heartbeat_status(self) -> tuple[int, int, int]:
        """(last epoch in the epoch map, max offset, confirm offset) for controller heartbeats."""
        ...


@dataclass
class ReplicasStatus:
    role: Role = Role.FENCED
    broker_id: int | None = None
    master_id: int | None = None
    master_address: str | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = field(default_factory=frozenset)
    sync_state_set_epoch: int = 0
    registered: bool = False
    stale_notices_ignored: int = 0
    #: Notices naming this broker master that the controller leader did not confirm.
    unconfirmed_notices_ignored: int = 0


def _opt_int(value: Any) -> int | None:
    if value is None or value == "" or value == "null":
        return None
    return int(value)


class ReplicasManager:
    """Drives one broker's identity, registration, heartbeats and role from the controller."""

    def __init__(self, config: BrokerConfig, controller: Any, listener: RoleListener,
                 on_task_failed: Callable[[asyncio.Task[None]], None] | None = None,
                 auth: RequestAuthenticator | None = None) -> None:
        self.config = config
        self.controller = controller  # rmqha.controller.client.ControllerClient
        #: Checks that role notices come from a controller (holder of the cluster secret).
        self.auth: RequestAuthenticator = auth if auth is not None else OpenAuth()
        self._refusals = RefusalLog(log)
        #: The heartbeat timeout each controller says it applies to us (ms).
        self._applied_timeouts: dict[str, int] = {}
        #: Signing time of the last heartbeat round (each round's is later).
        self._round_ms = 0
        self.listener = listener
        self.identity = IdentityStore(config.store_dir, config.cluster, config.broker_name)
        self.status = ReplicasStatus()
        self._role_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        #: Called when a background loop dies of an unexpected error (the broker exits).
        self._on_task_failed = on_task_failed
        self.lease = MasterLease(config.master_lease_ms_in_force / 1000, enabled=config.master_lease_enable)
        #: Times this broker, as master, found its lease expired and fenced itself.
        self.lease_expiries = 0
        self._lease_fenced = False
        #: Set (and replaced by a fresh one) at every renewal: what a held write waits on.
        self._lease_renewed = asyncio.Event()
        #: The heartbeat in flight to each controller: a controller that does not answer
        #: gets no new one until it does (the others are not held up by it).
        self._heartbeats_pending: dict[str, asyncio.Task[None]] = {}

    # --- properties -----------------------------------------------------------------------

    @property
    def broker_id(self) -> int:
        if self.status.broker_id is None:
            raise BrokerError("broker id not negotiated yet")
        return self.status.broker_id

    @property
    def role(self) -> Role:
        return self.status.role

    @property
    def master_epoch(self) -> int:
        return self.status.master_epoch

    @property
    def accepts_writes(self) -> bool:
        """Master, and holding the lease for the epoch it is master of (not stopping)."""
        return (self.status.role == Role.MASTER and not self._stopping.is_set()
                and self.lease.holds(self.status.master_epoch))

    @property
    def awaiting_first_lease(self) -> bool:
        """Master of an epoch it has never held a lease for: it took the role and asked the
        controller leader at once, and the answer is on its way."""
        return (self.status.role == Role.MASTER and self.lease.enabled
                and self.lease.granted_epoch < self.status.master_epoch and not self._stopping.is_set())

    async def wait_for_first_lease(self, timeout_s: float) -> None:
        """Hold a write that reaches a new master before its first lease (at most
        ``timeout_s``) instead of refusing it: the grant is one heartbeat answer away.  A
        lease that expired at this epoch is not waited for (its master may be cut off, and
        clients should try elsewhere at once); nothing here accepts a write without one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.awaiting_first_lease:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._lease_renewed.wait(), left)
            except asyncio.TimeoutError:
                return

    @property
    def lease_fenced(self) -> bool:
        """Master by role, but its lease expired: it refuses writes and acknowledges none."""
        return self.status.role == Role.MASTER and not self.lease.holds(self.status.master_epoch)

    # --- start / stop ---------------------------------------------------------------------

    async def negotiate_id(self) -> int:
        """Settle the broker id (identity files + controller); called before serving."""
        broker_id = await negotiate_broker_id(
            self.identity, self.controller, address=self.config.broker_address, stop=self._stopping,
        )
        self.status.broker_id = broker_id
        rmqha_log.context.broker_id = broker_id
        return broker_id

    async def start(self) -> None:
        """Register, start heartbeats and the metadata poll, and take the first role.

        Returns once registered; the role may still be pending (then the poll keeps asking).
        """
        await self._register_until_done()
        loop = asyncio.get_running_loop()
        await self._send_heartbeats_and_wait()
        for coro, name in ((self._heartbeat_loop(), "controller-heartbeat"),
                           (self._sync_metadata_loop(), "sync-broker-metadata"),
                           (self._lease_watch_loop(), "master-lease-watch")):
            task = loop.create_task(coro, name=name)
            if self._on_task_failed is not None:
                task.add_done_callback(self._on_task_failed)
            self._tasks.append(task)

    def fence_for_shutdown(self) -> None:
        """A stopping broker acknowledges nothing more: its successor may be elected as
        soon as the controllers see it go."""
        self._stopping.set()
        self.lease.revoke()

    async def stop(self) -> None:
        self.fence_for_shutdown()
        tasks = self._tasks + list(self._side_tasks) + [t for t in self._heartbeats_pending.values() if not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass  # cancelled above, as intended
        self._tasks.clear()
        await self.controller.close()

    # --- registration ---------------------------------------------------------------------

    async def _register_until_done(self) -> None:
        delay = 0.2
        while not self._stopping.is_set():
            try:
                state = await self._register()
            except RemoteCommandError as exc:
                if exc.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID:
                    # Another live broker holds our id: retrying cannot help, an operator must.
                    raise BrokerIdentityError(f"the controller refused this broker's id: {exc}") from None
                log.warning("register to controller failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except (RemotingError, ControllerError) as exc:
                log.warning("register to controller failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            hit(Failpoint.AFTER_REGISTER_BROKER)
            self.status.registered = True
            if state.master_id is not None and state.master_address:
                try:
                    await self.change_role(state, source="register")
                except (RmqhaError, OSError):
                    log.exception("taking the role named at registration failed; the metadata poll retries")
            return

    async def _register(self) -> GroupState:
        result = await self.controller.register_broker(
            self.config.cluster, self.config.broker_name, self.broker_id, self.config.broker_address,
        )
        state = _group_state(result)
        log.info("registered to controller as id %d at %s (master %s epoch %d)",
                 self.broker_id, self.config.broker_address, state.master_id, state.master_epoch)
        return state

    # --- heartbeats -----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        period = self.config.broker_heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            self._send_heartbeats()

    def _send_heartbeats(self) -> list[asyncio.Task[None]]:
        """BROKER_HEARTBEAT to every controller, each on a task of its own; returns them.

        Answered, not one-way: the leader's answer renews the master lease from this
        round's send time.  A controller that has not answered the previous round is
        skipped, so a stuck one neither piles up requests nor delays the others."""
        epoch, max_offset, confirm_offset = self.listener.heartbeat_status()
        # Taken before anything is sent: the lease must end before the controller's view of
        # this heartbeat does, and the controller cannot have received it any earlier.
        sent_at = time.monotonic()
        # One signing time for the round: a copy sent to one controller is never newer
        # than what another controller already took from us.
        self._round_ms = max(int(time.time() * 1000), self._round_ms + 1)
        loop = asyncio.get_running_loop()
        started = []
        for addr in self.controller.addresses:
            pending = self._heartbeats_pending.get(addr)
            if pending is not None and not pending.done():
                continue
            task = loop.create_task(self._heartbeat_one(addr, sent_at, epoch, max_offset, confirm_offset,
                                                        self._round_ms),
                                    name=f"heartbeat-{addr}")
            self._heartbeats_pending[addr] = task
            started.append(task)
        return started

    async def _heartbeat_one(self, addr: str, sent_at: float, epoch: int, max_offset: int,
                             confirm_offset: int, round_ms: int) -> None:
        try:
            answer = await self.controller.heartbeat_to(
                addr, self.config.cluster, self.config.broker_name, self.broker_id, self.config.broker_address,
                epoch=epoch, max_offset=max_offset, confirm_offset=confirm_offset,
                timeout_ms=self.config.controller_heartbeat_timeout_ms,
                priority=self.config.broker_election_priority,
                timeout=self.config.send_heartbeat_timeout_ms / 1000,
                round_ms=round_ms,
            )
        except (RmqhaError, OSError, ValueError, asyncio.TimeoutError) as exc:
            # That controller is down, slow or not the leader: the others still hear us.
            log.debug("heartbeat to controller %s failed: %s", addr, exc)
            return
        self._fit_lease(addr, getattr(answer, "heartbeat_timeout_ms", None))
        grant = LeaseGrant(answer.lease_granted, answer.master_broker_id, answer.master_epoch)
        held = self.lease.holds(self.status.master_epoch)
        if self.lease.on_answer(grant, sent_at, self.broker_id):
            self._lease_renewed.set()
            self._lease_renewed = asyncio.Event()
        if held and not self.lease.holds(self.status.master_epoch) and self.status.role == Role.MASTER:
            log.warning("controller %s names master %s at epoch %d: master lease of epoch %d revoked",
                        addr, grant.master_id, grant.master_epoch, self.status.master_epoch)
        self._watch_lease()

    def _fit_lease(self, addr: str, applied_ms: int | None) -> None:
        """A controller judges us by the timeout it applies (it caps what we ask for): the
        lease must end the margin before the shortest one any controller applies."""
        if applied_ms is None or not self.lease.enabled:
            return
        self._applied_timeouts[addr] = applied_ms
        shortest = min(self._applied_timeouts.values())
        configured = self.config.master_lease_ms_in_force
        lease_ms = max(0, min(configured, shortest - self.config.master_lease_margin_ms))
        if round(self.lease.lease_s * 1000) == lease_ms:
            return
        if lease_ms < configured:
            log.warning("controllers apply a %d ms heartbeat timeout (this broker asks for %d): master "
                        "lease shortened from %d to %d ms%s", shortest,
                        self.config.controller_heartbeat_timeout_ms, configured, lease_ms,
                        "; no lease is possible: raise broker_heartbeat_timeout on the controllers"
                        if lease_ms <= self.config.broker_heartbeat_interval_ms else "")
        self.lease.lease_s = lease_ms / 1000

    async def _send_heartbeats_and_wait(self) -> None:
        tasks = self._send_heartbeats()
        if tasks:
            await asyncio.wait(tasks, timeout=self.config.send_heartbeat_timeout_ms / 1000)

    # --- master lease ---------------------------------------------------------------------

    async def _lease_watch_loop(self) -> None:
        """Logs and counts lease fencing as it happens.  Writes never wait for this loop:
        :attr:`accepts_writes` reads the lease clock itself."""
        tick = min(0.05, self.lease.lease_s / 10) if self.lease.enabled else 1.0
        while True:
            await asyncio.sleep(tick)
            self._watch_lease()

    def lease_status(self) -> dict[str, Any]:
        """The lease as ha-status shows it (fencing noticed now, not at the next tick)."""
        self._watch_lease()
        return dict(self.lease.status(self.status.master_epoch), expiries=self.lease_expiries,
                    fenced=self.lease_fenced)

    def _watch_lease(self) -> None:
        fenced = self.lease_fenced
        if fenced == self._lease_fenced:
            return
        self._lease_fenced = fenced
        if fenced and self.lease.granted_epoch != self.status.master_epoch:
            log.info("master of epoch %d: no lease for it yet; writes wait for the controller "
                     "leader's answer", self.status.master_epoch)
        elif fenced:
            self.lease_expiries += 1
            log.warning(
                "master lease of epoch %d expired (lease %d ms, no renewal from the controller "
                "leader): refusing writes and acknowledging none until it is renewed",
                self.status.master_epoch, round(self.lease.lease_s * 1000))
        elif self.status.role == Role.MASTER:
            log.info("master lease of epoch %d held: accepting writes", self.status.master_epoch)

    # --- metadata poll --------------------------------------------------------------------

    async def _sync_metadata_loop(self) -> None:
        period = self.config.sync_broker_metadata_period_ms / 1000
        while True:
            try:
                await self.sync_once()
            except (RemotingError, ControllerError) as exc:
                log.debug("replica info poll failed: %s", exc)
            except RemoteCommandError as exc:
                if exc.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
                    log.warning("controller has no record of %s; registering again", self.config.broker_name)
                    await self._register_until_done()
                else:
                    log.warning("replica info poll refused: %s", exc)
            except (RmqhaError, OSError):
                # A role change failed half-way (store or HA start-up): the role and epoch
                # were not recorded, so the next poll tries the change again.
                log.exception("acting on replica info failed; retrying next period")
            await asyncio.sleep(period)

    async def sync_once(self) -> GroupState:
        """Read replica info once and act on it (role change, election, SyncStateSet)."""
        state = _group_state(await self.controller.get_replica_info(self.config.broker_name))
        if state.master_id is None or not state.master_address:
            await self.elect()
        elif state.master_epoch > self.status.master_epoch:
            await self.change_role(state, source="replica info")
        elif (state.master_epoch == self.status.master_epoch and state.master_id == self.status.broker_id
              and self.status.role == Role.MASTER):
            self._apply_sync_state_set(state.sync_state_set, state.sync_state_set_epoch)
        elif (state.master_epoch == self.status.master_epoch and self.status.role == Role.SLAVE
              and state.master_id == self.status.master_id and state.master_address != self.status.master_address):
            await self._follow_moved_master(state)
        return state

    async def _follow_moved_master(self, state: GroupState) -> None:
        """Same master, same epoch, new address (it restarted on another port): follow it."""
        assert state.master_id is not None and state.master_address is not None
        async with self._role_lock:
            if self.status.master_epoch != state.master_epoch or self.status.role != Role.SLAVE:
                return
            log.info("master %d moved from %s to %s at epoch %d; following it",
                     state.master_id, self.status.master_address, state.master_address, state.master_epoch)
            await self.listener.become_slave(state.master_id, state.master_address, state.master_epoch)
            self.status.master_address = state.master_address

    async def elect(self) -> None:
        """Ask the controller to elect a master for the group (this broker as candidate)."""
        try:
            # Returns on SUCCESS and on MASTER_STILL_EXIST (then naming the current master).
            result = await self.controller.elect_master(self.config.cluster, self.config.broker_name, self.broker_id)
        except RemoteCommandError as exc:
            log.info("election for %s refused: %s", self.config.broker_name, exc)
            return
        state = _group_state(result)
        if state.master_id is not None and state.master_address and state.master_epoch > self.status.master_epoch:
            await self.change_role(state, source="election")

    # --- notifications --------------------------------------------------------------------

    async def handle_notify(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        """NOTIFY_BROKER_ROLE_CHANGED (1008) from the controller: signed and over a
        controller's channel (with a secret), and confirmed with the controller leader
        before it makes this broker master."""
        refused = check(self.auth, cmd, conn) or self._off_channel(cmd, conn)
        if refused is not None:
            self._refusals.note(cmd, conn.peer, refused.remark or "")
            return refused
        try:
            h = RoleChangedHeader.parse(cmd.ext_fields)
            body = cmd.json_body() or {}
            state = GroupState(
                master_id=h.master_broker_id,
                master_address=h.master_address or None,
                master_epoch=h.master_epoch,
                sync_state_set=frozenset(int(i) for i in body.get("syncStateSet", [])),
                sync_state_set_epoch=int(body.get("syncStateSetEpoch", h.sync_state_set_epoch or 0) or 0),
            )
        except (TypeError, ValueError, ProtocolError) as exc:
            return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, f"bad role notification: {exc}")
        if self.status.broker_id is None or not self.status.registered:
            log.info("ignoring role notification (epoch %d): not registered yet", state.master_epoch)
            return cmd.response(ResponseCode.SUCCESS)
        if state.master_id == self.status.broker_id and state.master_epoch > self.status.master_epoch:
            await self._take_confirmed(state)
        else:
            await self.change_role(state, source="notification")
        return cmd.response(ResponseCode.SUCCESS)

    def _off_channel(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
        """With the secret, a notice that did not come from a controller over a channel
        (or TLS): a signature copied onto a plain connection proves nothing of its sender."""
        return refused_off_channel(cmd, conn, (PeerRole.CONTROLLER,)) if self.auth.enabled else None

    async def _take_confirmed(self, notice: GroupState) -> None:
        """A notice makes this broker master only if the controller leader's record says
        so at the notice's epoch or later; the role taken is the leader's record."""
        try:
            record = _group_state(await self.controller.get_replica_info(self.config.broker_name))
        except (RmqhaError, OSError, asyncio.TimeoutError) as exc:
            log.warning("role notice names this broker master at epoch %d but the controller could "
                        "not confirm it (%s); the replica info poll decides", notice.master_epoch, exc)
            return
        if record.master_epoch < notice.master_epoch:
            self.status.unconfirmed_notices_ignored += 1
            log.warning("ignoring a role notice naming this broker master at epoch %d: the controller "
                        "leader's record is master %s at epoch %d", notice.master_epoch,
                        record.master_id, record.master_epoch)
            return
        await self.change_role(record, source="notification (confirmed)")

    # --- role changes ---------------------------------------------------------------------

    async def change_role(self, state: GroupState, *, source: str) -> bool:
        """Take the role ``state`` names if its master epoch is newer than ours; True if taken."""
        async with self._role_lock:
            held = self.status.master_epoch
            if state.master_epoch <= held:
                if state.master_epoch < held or state.master_id != self.status.master_id:
                    self.status.stale_notices_ignored += 1
                    log.warning(
                        "ignoring stale %s: master %s at epoch %d, but this broker holds epoch %d (master %s)",
                        source, state.master_id, state.master_epoch, held, self.status.master_id,
                    )
                elif self.status.role == Role.MASTER and state.master_id == self.status.broker_id:
                    self._apply_sync_state_set(state.sync_state_set, state.sync_state_set_epoch)
                return False
            if state.master_id is None or not state.master_address:
                log.info("%s at epoch %d names no master; staying %s", source, state.master_epoch, self.status.role.value)
                return False
            me = self.broker_id
            was = self.status.role
            if not (was == Role.MASTER and state.master_id == me):
                # Fenced while the switch runs (and if it fails half-way): no writes are
                # taken under a role that is neither the old one nor the new one yet.
                self.status.role = Role.FENCED
            log.info("%s: master of %s is now %d (%s) at epoch %d (was %s at epoch %d, this broker %s)",
                     source, self.config.broker_name, state.master_id, state.master_address,
                     state.master_epoch, self.status.master_id, held, was.value)
            before = dataclasses.replace(self.status)
            # Recorded before the switch: the new HA master proposes SyncStateSet changes
            # under the new epoch at once.
            self.status.master_epoch = state.master_epoch
            self.status.master_id = state.master_id
            try:
                if state.master_id == me:
                    self.status.master_address = self.config.broker_address
                    ss = state.sync_state_set or frozenset({me})
                    self.status.sync_state_set = ss
                    self.status.sync_state_set_epoch = state.sync_state_set_epoch
                    if was == Role.MASTER:
                        await self.listener.master_reelected(state.master_epoch, ss, state.sync_state_set_epoch)
                    else:
                        await self.listener.become_master(state.master_epoch, ss, state.sync_state_set_epoch)
                    self.status.role = Role.MASTER
                    if not self.lease.holds(state.master_epoch):
                        # The lease for the new epoch comes with the next answered heartbeat:
                        # ask now rather than wait out the heartbeat period.
                        self._send_heartbeats()
                else:
                    self.status.master_address = state.master_address
                    await self.listener.become_slave(state.master_id, state.master_address, state.master_epoch)
                    self.status.role = Role.SLAVE
            except BaseException:
                # Half-way: forget the new epoch so the next poll or notice tries again,
                # and stay fenced (the old role's services may be partly stopped).
                role = self.status.role
                self.status = before
                self.status.role = role
                raise
            rmqha_log.context.epoch = state.master_epoch
        return True

    async def _resync(self) -> None:
        try:
            await self.sync_once()
        except (RmqhaError, OSError) as exc:
            log.warning("replica info re-read after a refused AlterSyncStateSet failed: %s", exc)

    def _apply_sync_state_set(self, ids: frozenset[int], epoch: int) -> None:
        if epoch <= self.status.sync_state_set_epoch or not ids:
            return
        log.info("SyncStateSet of %s is now %s (epoch %d)", self.config.broker_name, sorted(ids), epoch)
        self.status.sync_state_set = ids
        self.status.sync_state_set_epoch = epoch
        self.listener.apply_sync_state_set(ids, epoch)

    async def alter_sync_state_set(self, new_ids: frozenset[int] | set[int] | list[int]) -> tuple[frozenset[int], int]:
        """Propose a new SyncStateSet to the controller (called by the HA master).

        Returns the set and epoch now in force: the new ones on success; on a FENCED or
        other refusal, whatever a fresh replica-info read says (the HA master adopts it).
        """
        ids = frozenset(int(i) for i in new_ids) | {self.broker_id}
        if self.status.role != Role.MASTER:
            raise BrokerError(f"only the master proposes SyncStateSet changes (this broker is {self.status.role.value})")
        try:
            result = await self.controller.alter_sync_state_set(
                self.config.broker_name, self.broker_id, self.status.master_epoch,
                sorted(ids), self.status.sync_state_set_epoch,
            )
        except RemoteCommandError as exc:
            log.warning("AlterSyncStateSet %s refused: %s; re-reading replica info", sorted(ids), exc)
            # Re-read on a task of its own: acting on it may stop the HA master, whose
            # proposal task is the one running this call.
            task = asyncio.get_running_loop().create_task(self._resync(), name="resync-after-fenced")
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)
            return self.status.sync_state_set, self.status.sync_state_set_epoch
        new_set, new_epoch = _sync_state_result(result, ids)
        if new_epoch > self.status.sync_state_set_epoch:
            # The HA master adopts the returned set itself; only our record changes here.
            log.info("SyncStateSet of %s is now %s (epoch %d)", self.config.broker_name, sorted(new_set), new_epoch)
            self.status.sync_state_set = new_set
            self.status.sync_state_set_epoch = new_epoch
        return self.status.sync_state_set, self.status.sync_state_set_epoch


def _field(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, dict):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return None


def _group_state(result: Any) -> GroupState:
    """A GroupState from the controller client's answer dataclasses (register, replica info, elect)."""
    ss = _field(result, "sync_state_set", "syncStateSet") or ()
    return GroupState(
        master_id=_opt_int(_field(result, "master_broker_id", "master_id", "masterBrokerId")),
        master_address=_field(result, "master_address", "masterAddress") or None,
        master_epoch=int(_field(result, "master_epoch", "masterEpoch") or 0),
        sync_state_set=frozenset(int(i) for i in ss),
        sync_state_set_epoch=int(_field(result, "sync_state_set_epoch", "syncStateSetEpoch") or 0),
    )


def _sync_state_result(result: Any, proposed: frozenset[int]) -> tuple[frozenset[int], int]:
    ss = _field(result, "sync_state_set", "syncStateSet", "new_sync_state_set")
    epoch = _field(result, "sync_state_set_epoch", "new_sync_state_set_epoch", "syncStateSetEpoch", "newSyncStateSetEpoch")
    return (frozenset(int(i) for i in ss) if ss else proposed), int(epoch or 0)
