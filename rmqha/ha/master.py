"""The master side of HA replication (:class:`HAMaster`): the public face of its parts.

One :class:`HAMaster` listens on the broker's HA port and serves every slave that passes
the handshake, in either dialect (told apart by the connection's first four bytes).  The
work is split by job, as RocketMQ's ``store/ha/autoswitch`` splits it:

* :mod:`rmqha.ha.acceptor`: the port; per connection, mutual TLS when the broker serves
  TLS (:mod:`rmqha.ha.tls_link`), admission (:mod:`rmqha.ha.auth`:
  with a cluster secret, a slave of this cluster and group proves itself, and every frame
  carries a MAC), handshake, then acks until it ends;
* :mod:`rmqha.ha.handshake`: what master and slave say before the transfer;
* :mod:`rmqha.ha.connection`: one slave's link: the transfer (blocks straight from the
  commitlog, labelled with their epoch), heartbeats, reading and checking its acks
  (AutoSwitchHAConnection);
* :mod:`rmqha.ha.sync_service`: which links count (one per slave id, the newest), the
  confirm offset, the SyncStateSet and its proposals, waking the writers on appends
  (AutoSwitchHAService);
* :mod:`rmqha.ha.waiters`: the sends waiting for their copies (GroupTransferService);
* rules without I/O: :mod:`rmqha.ha.confirm` (confirm offset, copies, the ack policy),
  :mod:`rmqha.ha.proposals` (expand and shrink), :mod:`rmqha.ha.sync_state`,
  :mod:`rmqha.ha.offsets` (block cutting).

The façade starts and stops the parts and reports their status; what a broker asks while
it runs (pushes, copies of an offset, the SyncStateSet) it asks :attr:`HAMaster.sync`, the
:class:`~rmqha.ha.sync_service.SyncService`, directly.

The master owns the confirm offset (min ack over the SyncStateSet, counting itself with its
max offset; a member without a live link freezes it, RocketMQ #6662), waits for acks on
behalf of producers, and proposes SyncStateSet changes through the broker's async
``alter_sync_state_set(new_ids) -> (ids, epoch)`` callback.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.store.epoch_map import EpochMap
from rmqha.ha.acceptor import Acceptor
from rmqha.ha.auth import HAAuth
from rmqha.ha.config import HAConfig
from rmqha.ha.connection import LinkState
from rmqha.ha.handshake import MasterHandshake
from rmqha.ha.set_changes import AlterCallback
from rmqha.ha.sync_service import SyncService
from rmqha.ha.tls_link import HATls, check_tls_group

log = logging.getLogger(__name__)

__all__ = ["AlterCallback", "HAMaster", "LinkState"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HAMaster:
    """Serves the commitlog to slaves on the HA port and keeps the confirm offset.

    Call everything on the event loop the master was started on; the commitlog may be
    appended from any thread (the append listener hops onto the loop).
    """

    def __init__(
        self,
        commitlog: ReplicatedLog,
        epoch_map: EpochMap,
        *,
        group: str,
        broker_id: int,
        config: HAConfig | None = None,
        is_known_replica: Callable[[int], bool | Awaitable[bool]] | None = None,
        alter_sync_state_set: AlterCallback | None = None,
        on_confirm: Callable[[int], Any] | None = None,
        sync_state_set: Iterable[int] = (),
        sync_state_set_epoch: int = 0,
        confirm_offset: int | None = None,
        auth: HAAuth | None = None,
        tls: HATls | None = None,
    ) -> None:
        """``auth``: the cluster secret and this broker's identity; every slave must then
        authenticate (None: links run unauthenticated, as without a cluster secret).
        ``tls``: the port speaks mutual TLS only (None: plaintext)."""
        if auth is not None:
            auth.check_group(group)
        check_tls_group(tls, group)
        self.auth = auth
        self.tls = tls
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.group = group
        self.broker_id = int(broker_id)
        self.config = config or HAConfig()
        self._service = SyncService(
            commitlog, epoch_map, self.config, self.broker_id, alter=alter_sync_state_set,
            on_confirm=on_confirm, sync_state_set=sync_state_set, sync_state_set_epoch=sync_state_set_epoch,
            confirm_offset=confirm_offset,
        )
        handshake = MasterHandshake(commitlog, epoch_map, self.config, group=group, broker_id=self.broker_id,
                                    is_known_replica=is_known_replica)
        self._acceptor = Acceptor(handshake, self._service, auth, tls,
                                  max_connections_per_peer=self.config.max_connections_per_peer)
        self._stopped = False
        self.address = ""

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 picks a free port); returns the bound port."""
        bound = self._acceptor.listen(host, port)
        self.address = f"{host}:{bound}"
        self._service.start()
        s = self._service.sync_state
        log.info("HA master %s listening on %s (group %s, set %s epoch %d, %s)", self.broker_id,
                 self.address, self.group, sorted(s.local), s.epoch, self._auth_words())
        if self.auth is None and not _is_loopback(host):
            log.warning("HA port %s takes unauthenticated links: whoever reaches it can read the whole "
                        "log and pose as a slave; set cluster_secret on every broker", self.address)
        return bound

    def _auth_words(self) -> str:
        auth = self.auth
        tls = "; mutual TLS" if self.tls is not None else ""
        if auth is None:
            return f"links unauthenticated: no cluster secret{tls}"
        rocketmq = "; rocketmq dialect unauthenticated" if auth.allow_unauthenticated_rocketmq else ""
        return f"links authenticated as {auth.identity}{rocketmq}{tls}"

    @property
    def refused_links(self) -> int:
        """Links this HA port refused so far (each kind logged once per period)."""
        return self._acceptor.refused

    async def stop(self) -> None:
        """Close the port and every link; pending ack waits answer False."""
        if self._stopped:
            return
        self._stopped = True
        tasks = self._service.stop() + self._acceptor.close()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._service.waiters.fail_all()
        log.info("HA master %s stopped", self.broker_id)

    # --- the SyncStateSet and the confirm offset ---------------------------------------------

    @property
    def sync(self) -> SyncService:
        """The links, confirm offset, SyncStateSet and waiting sends, asked directly: the
        pushes (``push_now``, ``defer_push``) and the waits for copies (``when_copies``,
        ``wait_for_acks``, ...) have no forwarding method here."""
        return self._service

    @property
    def confirm_offset(self) -> int:
        return self._service.confirm_now()

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The set the controller applied (the master always included)."""
        return self._service.sync_state.local

    @property
    def sync_state_set_epoch(self) -> int:
        return self._service.sync_state.epoch

    def set_sync_state_set(self, ids: Iterable[int], epoch: int) -> bool:
        """Adopt the controller's set (ignored if ``epoch`` is older than the one held)."""
        return self._service.apply_set(ids, epoch)

    def on_new_epoch(self, epoch: int, start: int) -> None:
        """The broker appended (or asks to append) epoch ``epoch`` starting at ``start``.

        Links need no reset: every block's label is read from the live epoch map, so the
        next block after ``start`` already travels under the new epoch (#9689).
        """
        self._service.on_new_epoch(epoch, start)

    # --- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Everything ``ha-status`` shows for a master."""
        s = self._service.sync_state
        members = s.local
        slaves = self._service.slave_rows()
        return {
            "role": "master",
            "group": self.group,
            "broker_id": self.broker_id,
            "address": self.address,
            "epoch": self.epoch_map.last_epoch(),
            "max_offset": self.commitlog.max_offset,
            "confirm_offset": self.confirm_offset,
            "sync_state_set": sorted(members),
            "sync_state_set_epoch": s.epoch,
            "proposed_sync_state_set": sorted(s.proposed) if s.proposed is not None else None,
            "slave_num": len(slaves),
            "in_sync_slave_num": len(members) - 1,
            "slaves": slaves,
        }
