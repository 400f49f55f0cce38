"""Which certificate identity may send each controller request (over mutual TLS).

- A broker acts only as itself: CONTROLLER_APPLY_BROKER_ID, CONTROLLER_REGISTER_BROKER,
  BROKER_HEARTBEAT and CONTROLLER_ALTER_SYNC_STATE_SET need a broker certificate of the
  cluster and group the request names (``clusterName``, else the group's cluster on
  record, and ``brokerName``).  Nobody else may speak for a broker, an admin included.
- CONTROLLER_ELECT_MASTER: the group's own broker (it asks to be elected), or an admin or
  controller; a designated election (``designateElect=true``) only an admin or controller.
- CLEAN_BROKER_DATA and UPDATE_CONTROLLER_CONFIG: an admin or controller only.
- Reads (metadata, replica info, SyncStateSet data, next id, config) need no particular
  identity: the port's TLS settings already decide who may connect.

A broker certificate names cluster, group and an instance name; its broker id is handed
out by the controller after the certificate was made, so members of one group are not told
apart here (the controller's own checks take a heartbeat only from the id's registered
address).  :class:`rmqha.net.peer_check.PeerCheck` applies these rules.
"""
from __future__ import annotations

from rmqha.controller.state import ReplicasState
from rmqha.net.peer_check import ADMIN_ROLES, Need
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand

#: Requests a broker sends for itself and nobody sends for it.
BROKER_ONLY: frozenset[int] = frozenset({
    RequestCode.CONTROLLER_APPLY_BROKER_ID, RequestCode.CONTROLLER_REGISTER_BROKER,
    RequestCode.BROKER_HEARTBEAT, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
})
#: Requests only an administrator (or a controller) sends.
ADMIN_ONLY: frozenset[int] = frozenset({
    RequestCode.CLEAN_BROKER_DATA, RequestCode.UPDATE_CONTROLLER_CONFIG,
})


def _claimed_cluster(cmd: RemotingCommand, state: ReplicasState) -> str | None:
    """The cluster a request speaks for: its ``clusterName``, else its group's on record."""
    named = cmd.ext_fields.get("clusterName", "")
    if named:
        return named
    group = state.group(cmd.ext_fields.get("brokerName", ""))
    return group.cluster if group is not None and group.cluster else None


def need_for(cmd: RemotingCommand, state: ReplicasState) -> Need | None:
    """Who may send ``cmd`` (None: any peer the port admits)."""
    code = cmd.code
    if code in ADMIN_ONLY:
        return Need(ADMIN_ROLES)
    group = cmd.ext_fields.get("brokerName", "")
    if code in BROKER_ONLY:
        return Need.broker(_claimed_cluster(cmd, state), group)
    if code == RequestCode.CONTROLLER_ELECT_MASTER:
        if cmd.ext_fields.get("designateElect", "false").lower() == "true":
            return Need(ADMIN_ROLES)
        return Need.broker(_claimed_cluster(cmd, state), group, or_roles=ADMIN_ROLES)
    return None
