"""The broker's RocketMQ ACL 1.0 check on its client port, as a :data:`rmqha.net.dispatcher.Guard`.

With ``aclEnable`` every request is checked before any handler runs (the send fast path
included): the ``AccessKey`` must name an account of ``plain_acl.yml``, the ``Signature``
must be that account's HMAC-SHA1 of the request, and the account must hold the permission
the request code needs (:mod:`rmqha.security.acl`).  A refusal answers RocketMQ's code for
it (SYSTEM_ERROR with the reason as remark) and changes nothing.

Every verified signature also passes the replay window (:mod:`rmqha.security.replay`):
a signed ``RmqhaTime`` within 5 minutes, a signature not taken before.

A plain send (the remoting connection's fast lane, parsed with its signing material) is
first put to :class:`rmqha.security.acl_lane.SendLane` (:meth:`AclGuard.plain`): what it
admits is what the check would admit, and everything else goes to the check as a command,
which answers today's refusal.

Who may send what is each code's declaration (:mod:`rmqha.protocol.code_rules`):

- a code only cluster processes send (the controller's role notice) carries no client
  credentials: it is left to the cluster secret's and the certificate's own checks and
  never reaches a client handler;
- a code cluster processes and operators send (GET_BROKER_EPOCH_CACHE,
  GET_BROKER_HA_STATUS) needs an admin account, or, over TLS, a certificate naming one of
  its senders (broker, controller, admin): the cluster's own tools ask with their
  certificate; GET_BROKER_HA_STATUS also takes, without TLS, the cluster secret's proof
  (:func:`rmqha.protocol.request_auth.proves_secret`: HMAC, fresh, nonce not seen before): a
  new slave asks its master for the HA address it advertises, signed as every control
  request is, and a broker holds no account of its own;
- every other code is the ACL's (:mod:`rmqha.security.acl`), and a code without a
  declaration is refused there.

The guard is also the messaging layer's :class:`~rmqha.protocol.code_rules.ResourceCheck`
(:meth:`AclGuard.allows`): a handler asks it about a record's topic before answering with
the record, and about each entry of a listing.  :meth:`AclGuard.protect` puts both in place,
for the broker process and the test harness alike.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rmqha.errors import AclError, RemoteCommandError
from rmqha.net.dispatcher import LanePeer
from rmqha.net.server import RemotingServer
from rmqha.protocol.code_rules import RULES, CodeRule, Named, Sender, rule_of
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
from rmqha.security.replay import ReplayWindow

_PROCESSES = Sender.BROKER | Sender.CONTROLLER
#: The certificate role of each sender a certificate can prove.
SENDER_ROLES: Mapping[Sender, Role] = {Sender.BROKER: Role.BROKER, Sender.CONTROLLER: Role.CONTROLLER,
                                       Sender.ADMIN: Role.ADMIN}


def _is_cluster_code(rule: CodeRule) -> bool:
    """Only cluster processes send it, with the secret's proof: the handler's checks decide."""
    return rule.signed and not (rule.senders & ~_PROCESSES)


def _by_certificate(rule: CodeRule) -> frozenset[Role]:
    """The certificate roles that send ``rule``'s code without an account: its senders',
    for an admin-only code that cluster processes send too."""
    if not rule.admin_only or not rule.senders & _PROCESSES:
        return frozenset()
    return frozenset(role for sender, role in SENDER_ROLES.items() if sender in rule.senders)


#: Codes only cluster processes send to a broker (not a client's request).
CLUSTER_CODES = frozenset(int(c) for c, r in RULES.items() if _is_cluster_code(r))
#: Admin codes a cluster process or operator may also send by certificate alone, and the roles.
BY_CERTIFICATE: Mapping[int, frozenset[Role]] = {int(c): roles for c, r in RULES.items()
                                                 if (roles := _by_certificate(r))}


class AclGuard:
    """The broker's :data:`~rmqha.net.dispatcher.Guard` (``guard(cmd, conn)``) and its
    :data:`~rmqha.net.dispatcher.PlainGuard` (:meth:`plain`), over one validator."""

    def __init__(self, acl_file: Path, *, recheck_interval_s: float = 1.0,
                 auth: RequestAuthenticator | None = None, replay: ReplayWindow | None = None) -> None:
        self.validator = AclValidator(acl_file, recheck_interval_s=recheck_interval_s, replay=replay)
        self.lane = SendLane(self.validator)
        self.auth: RequestAuthenticator = auth if auth is not None else OpenAuth()

    def __call__(self, cmd: RemotingCommand, conn: LanePeer) -> None:
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

    def allows(self, cmd: RemotingCommand, conn: LanePeer, named: Named) -> bool:
        """The :class:`~rmqha.protocol.code_rules.ResourceCheck`: whether the sender of
        ``cmd`` (which this guard let through) may see ``named``."""
        if cmd.code in CLUSTER_CODES or _cluster_peer(cmd, conn) or self._by_secret(cmd):
            return True
        return self.validator.allows(cmd.ext_fields, _host(conn.peer), named)

    def declared(self, code: int) -> CodeRule | None:
        """The declaration this guard decides ``code`` by."""
        return rule_of(code, self.validator.rules)

    def protect(self, server: RemotingServer, service: Any) -> None:
        """Guard ``server``'s client port and hand ``service`` (a
        :class:`rmqha.messaging.MessageService`) this guard as its resource check."""
        server.dispatcher.guard = self
        server.dispatcher.plain_guard = self.plain  # signed plain sends stay on the lane
        service.set_access(self)

    def plain(self, send: SendFrame, conn: LanePeer) -> bool:
        """Whether the check would let this plain send through (False: ask it)."""
        return self.lane.admits(send[12], send[3], send[13], send[14], send[10],
                                conn.attributes, _host(conn.peer), send[11])


def acl_guard(acl_file: Path, *, recheck_interval_s: float = 1.0,
              auth: RequestAuthenticator | None = None, replay: ReplayWindow | None = None) -> AclGuard:
    """A guard checking every client request against ``acl_file`` (reloaded when it
    changes); ``auth`` (the broker's cluster secret) admits the codes a broker signs;
    ``replay``: the window signed times must fall in (:mod:`rmqha.security.replay`)."""
    return AclGuard(acl_file, recheck_interval_s=recheck_interval_s, auth=auth, replay=replay)


def _cluster_peer(cmd: RemotingCommand, conn: LanePeer) -> bool:
    identity = getattr(conn, "peer_identity", None)
    return identity is not None and identity.role in BY_CERTIFICATE.get(cmd.code, ())


def _host(peer: str) -> str:
    """The address of ``host:port`` (an IPv6 host keeps its colons)."""
    return peer.rpartition(":")[0].strip("[]") or peer
