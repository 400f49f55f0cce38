"""HA replication: the master serving its commitlog to slaves, and the slave following it.

Public names: :class:`HAMaster`, :class:`HASlave`, :class:`HAConfig`, the states
:class:`SlaveState` / :class:`LinkState` and the handshake :class:`RefuseReason` codes.
The two classes are façades over modules split by job (as RocketMQ's ``store/ha/autoswitch``):

* wire: :mod:`~rmqha.ha.frames` (byte layouts), :mod:`~rmqha.ha.dialects` (the two
  dialects as events), :mod:`~rmqha.ha.link` (one TCP link), :mod:`~rmqha.ha.auth` (who
  may open a link: the cluster-secret handshake, :class:`HAAuth`),
  :mod:`~rmqha.ha.frame_mac` (the MAC on every frame), :mod:`~rmqha.ha.handshake`
  (both halves of the handshake);
* master: :mod:`~rmqha.ha.acceptor` (the port), :mod:`~rmqha.ha.connection` (one slave's
  transfer and acks), :mod:`~rmqha.ha.sync_service` (which links count, the confirm offset,
  the SyncStateSet), :mod:`~rmqha.ha.set_changes` (proposals to the controller),
  :mod:`~rmqha.ha.waiters` (sends waiting for copies), :mod:`~rmqha.ha.link_table`;
* rules without I/O: :mod:`~rmqha.ha.confirm`, :mod:`~rmqha.ha.proposals`,
  :mod:`~rmqha.ha.sync_state`, :mod:`~rmqha.ha.offsets`;
* slave: :mod:`~rmqha.ha.slave_session` (one connection), :mod:`~rmqha.ha.truncation`,
  :mod:`~rmqha.ha.receive` (blocks in, acks out), :mod:`~rmqha.ha.appender` (blocks checked
  and appended), :mod:`~rmqha.ha.slave_epochs`, :mod:`~rmqha.ha.slave_state`.

ARCHITECTURE.md has the data path of a send and of a failover, and the HA frames.
"""
from __future__ import annotations

from rmqha.ha.auth import HAAuth
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import RefuseReason
from rmqha.ha.master import HAMaster, LinkState
from rmqha.ha.slave import HASlave, SlaveState

__all__ = ["HAAuth", "HAConfig", "HAMaster", "HASlave", "LinkState", "RefuseReason", "SlaveState"]
