"""The broker's RocketMQ ACL 1.0 check on its client port, as a :data:`rmqha.net.connection.Guard`.

With ``aclEnable`` every request is checked before any handler runs (the send fast path
included): the ``AccessKey`` must name an account of ``plain_acl.yml``, the ``Signature``
must be that account's HMAC-SHA1 of the request, and the account must hold the permission
the request code needs (:mod:`rmqha.security.acl`).  A refusal answers RocketMQ's code for
it (SYSTEM_ERROR with the reason as remark) and changes nothing.

Requests one cluster process sends another (a role notice from the controller, a slave
asking for the master's epochs) carry no client credentials: they are left to the cluster
secret's own check and never reach a client handler.
"""
from __future__ import annotations

from pathlib import Path

from rmqha.errors import AclError, RemoteCommandError
from rmqha.net.connection import Connection, Guard
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security.acl import AclValidator

#: Codes only cluster processes send to a broker (not a client's request).
CLUSTER_CODES = frozenset({
    int(RequestCode.NOTIFY_BROKER_ROLE_CHANGED),
    int(RequestCode.GET_BROKER_EPOCH_CACHE),
})


def acl_guard(acl_file: Path, *, recheck_interval_s: float = 1.0) -> Guard:
    """A guard checking every client request against ``acl_file`` (reloaded when it changes)."""
    validator = AclValidator(acl_file, recheck_interval_s=recheck_interval_s)

    def guard(cmd: RemotingCommand, conn: Connection) -> None:
        if cmd.code in CLUSTER_CODES:
            return
        try:
            validator.check(cmd.code, cmd.ext_fields, cmd.body, _host(conn.peer),
                            version=cmd.version)
        except AclError as exc:
            raise RemoteCommandError(exc.response_code, exc.remark, cmd.code) from None

    return guard


def _host(peer: str) -> str:
    """The address of ``host:port`` (an IPv6 host keeps its colons)."""
    return peer.rpartition(":")[0].strip("[]") or peer
