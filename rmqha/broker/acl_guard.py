"""The broker's RocketMQ ACL 1.0 check on its client port, as a :data:`rmqha.net.connection.Guard`.

With ``aclEnable`` every request is checked before any handler runs (the send fast path
included): the ``AccessKey`` must name an account of ``plain_acl.yml``, the ``Signature``
must be that account's HMAC-SHA1 of the request, and the account must hold the permission
the request code needs (:mod:`rmqha.security.acl`).  A refusal answers RocketMQ's code for
it (SYSTEM_ERROR with the reason as remark) and changes nothing.

A plain send (the remoting connection's fast lane, parsed with its signing material) is
first put to :class:`rmqha.security.acl_lane.SendLane` (:meth:`AclGuard.plain`): what it
admits is what the check would admit, and everything else goes to the check as a command,
which answers today's refusal.

A role notice from the controller carries no client credentials: it is left to the
cluster secret's and the certificate's own checks and never reaches a client handler.
GET_BROKER_EPOCH_CACHE needs an admin account (:data:`rmqha.security.acl.RMQHA_ADMIN_CODES`),
or, over TLS, a certificate naming a cluster process or an operator (broker, controller,
admin): the cluster's own tools ask with their certificate.  GET_BROKER_HA_STATUS needs an
account, such a certificate or, without TLS, the cluster secret's proof
(:func:`rmqha.protocol.request_auth.proves_secret`: HMAC, fresh, nonce not seen before): a
new slave asks its master for the HA address it advertises, signed as every control
request is, and a broker holds no account of its own.
"""
from __future__ import annotations

from pathlib import Path

from rmqha.errors import AclError, RemoteCommandError
from rmqha.net.connection import Connection
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand, SendFrame
from rmqha.protocol.request_auth import (
    OPTIONALLY_SIGNED_CODES,
    SIGNATURE_FIELD,
    OpenAuth,
    RequestAuthenticator,
    proves_secret,
)
from rmqha.security.acl import AclValidator
from rmqha.security.acl_lane import SendLane
from rmqha.security.identity import Role

#: Codes only cluster processes send to a broker (not a client's request).
CLUSTER_CODES = frozenset({int(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)})
#: Admin codes a cluster process or operator may also send by certificate alone.
BY_CERTIFICATE = frozenset({int(RequestCode.GET_BROKER_EPOCH_CACHE), int(RequestCode.GET_BROKER_HA_STATUS)})
#: The certificate roles :data:`BY_CERTIFICATE` takes.
CLUSTER_ROLES = frozenset({Role.BROKER, Role.CONTROLLER, Role.ADMIN})


class AclGuard:
    """The broker's :data:`~rmqha.net.connection.Guard` (``guard(cmd, conn)``) and its
    :data:`~rmqha.net.connection.PlainGuard` (:meth:`plain`), over one validator."""

    def __init__(self, acl_file: Path, *, recheck_interval_s: float = 1.0,
                 auth: RequestAuthenticator | None = None) -> None:
        self.validator = AclValidator(acl_file, recheck_interval_s=recheck_interval_s)
        self.lane = SendLane(self.validator)
        self.auth: RequestAuthenticator = auth if auth is not None else OpenAuth()

    def __call__(self, cmd: RemotingCommand, conn: Connection) -> None:
        if cmd.code in CLUSTER_CODES or _cluster_peer(cmd, conn) or self._by_secret(cmd):
            return
        try:
            self.validator.check(cmd.code, cmd.ext_fields, cmd.body, _host(conn.peer),
                                 version=cmd.version)
        except AclError as exc:
            raise RemoteCommandError(exc.response_code, exc.remark, cmd.code) from None

    def _by_secret(self, cmd: RemotingCommand) -> bool:
        # A request without the proof's fields goes to the ACL untouched.
        return (cmd.code in OPTIONALLY_SIGNED_CODES and SIGNATURE_FIELD in cmd.ext_fields
                and proves_secret(self.auth, cmd))

    def plain(self, send: SendFrame, conn: Connection) -> bool:
        """Whether the check would let this plain send through (False: ask it)."""
        return self.lane.admits(send[12], send[3], send[13], send[14], send[10],
                                conn.attributes, _host(conn.peer))


def acl_guard(acl_file: Path, *, recheck_interval_s: float = 1.0,
              auth: RequestAuthenticator | None = None) -> AclGuard:
    """A guard checking every client request against ``acl_file`` (reloaded when it
    changes); ``auth`` (the broker's cluster secret) admits the codes a broker signs."""
    return AclGuard(acl_file, recheck_interval_s=recheck_interval_s, auth=auth)


def _cluster_peer(cmd: RemotingCommand, conn: Connection) -> bool:
    identity = conn.peer_identity
    return cmd.code in BY_CERTIFICATE and identity is not None and identity.role in CLUSTER_ROLES


def _host(peer: str) -> str:
    """The address of ``host:port`` (an IPv6 host keeps its colons)."""
    return peer.rpartition(":")[0].strip("[]") or peer
