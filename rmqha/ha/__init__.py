"""HA replication: the master serving its commitlog to slaves, and the slave following it.

Public names: :class:`HAMaster`, :class:`HASlave`, :class:`HAConfig`, the states
:class:`SlaveState` / :class:`LinkState` and the handshake :class:`RefuseReason` codes.
See ARCHITECTURE.md (the data path of a send, failover, the HA frames) and the module docstrings.
"""
from __future__ import annotations

from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import RefuseReason
from rmqha.ha.master import HAMaster, LinkState
from rmqha.ha.slave import HASlave, SlaveState

__all__ = ["HAConfig", "HAMaster", "HASlave", "LinkState", "RefuseReason", "SlaveState"]
