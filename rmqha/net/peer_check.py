"""Who may send a control request, by the identity in the sender's TLS certificate.

A control request says whom it speaks for (a broker registers, heartbeats, alters its
SyncStateSet ... as the cluster and group in its header); over mutual TLS the peer's
verified certificate says who it is (:attr:`rmqha.net.connection.Connection.peer_identity`).
:class:`PeerCheck` compares the two before a handler runs:

- the certificate names an rmqha identity: it must be one the request allows
  (:class:`Need`), else NO_PERMISSION naming both, and nothing changes;
- it names none (plaintext on a permissive port, a TLS peer without a certificate or with
  one of another kind): refused when the port enforces TLS with client authentication
  (``tls.server.mode=enforcing`` and ``tls.server.need.client.auth`` optional or require),
  let through otherwise.

The cluster secret's proof (:mod:`rmqha.protocol.request_auth`) is checked apart from this,
as before: with both configured a request needs both.  Which request needs whom is each
server's rule (``rmqha.controller.peer_rules``, the name server's and the broker's
handlers); this module only decides and words the refusal.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import ResponseCode, code_name
from rmqha.protocol.command import RemotingCommand
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings

log = logging.getLogger(__name__)

#: Roles that administer a cluster (an operator's tool, a controller).
ADMIN_ROLES: frozenset[Role] = frozenset({Role.ADMIN, Role.CONTROLLER})

Handler = Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand]]


@dataclass(frozen=True)
class Need:
    """Who may send one request: any peer of ``roles``, or the broker the request speaks
    for (``group``, and ``cluster`` when the request names one; None: no broker may)."""

    roles: frozenset[Role] = frozenset()
    cluster: str | None = None
    group: str | None = None

    @classmethod
    def broker(cls, cluster: str | None, group: str, *,
               or_roles: frozenset[Role] = frozenset()) -> Need:
        return cls(or_roles, cluster or None, group)

    def allows(self, peer: Identity) -> bool:
        if peer.role in self.roles:
            return True
        return (peer.role is Role.BROKER and self.group is not None and peer.group == self.group
                and (self.cluster is None or peer.cluster == self.cluster))

    def describe(self) -> str:
        """Who may, as an operator would write the certificate: ``rmqha:broker/C/G/<name>``."""
        names = [f"rmqha:{r.value}/<name>" for r in sorted(self.roles, key=lambda r: r.value)]
        if self.group is not None:
            names.insert(0, f"rmqha:broker/{self.cluster or '<cluster>'}/{self.group}/<name>")
        return " or ".join(names) or "nobody"


class PeerCheck:
    """The certificate check of one server port (see the module docstring)."""

    def __init__(self, tls: TlsSettings) -> None:
        #: Whether a peer without an rmqha certificate identity is refused.
        self.required = (tls.server_mode is TlsMode.ENFORCING
                         and tls.server_need_client_auth is not ClientAuth.NONE)

    def refusal(self, cmd: RemotingCommand, conn: RequestPeer, need: Need) -> RemotingCommand | None:
        """None when ``conn``'s peer may send ``cmd``; otherwise NO_PERMISSION saying what
        certificate was expected and what came."""
        peer = conn.peer_identity
        what = code_name(cmd.code)
        if peer is None:
            if not self.required:
                return None
            return cmd.response(
                ResponseCode.NO_PERMISSION,
                f"{what} needs a TLS client certificate naming {need.describe()}; the connection "
                f"from {conn.peer} has none with an rmqha identity (this port enforces TLS with "
                "client authentication; make certificates with `rmqha certs`)")
        if need.allows(peer):
            return None
        return cmd.response(
            ResponseCode.NO_PERMISSION,
            f"{what} refused: the sender's certificate names {peer}, but only {need.describe()} "
            f"may send it (a process acts only as the identity its certificate names)")

    def guarded(self, rule: Callable[[RemotingCommand], Need | None], fn: Handler,
                on_refusal: Callable[[RemotingCommand, RequestPeer, str], None] | None = None) -> Handler:
        """``fn`` behind this check, with ``rule`` saying who may send each request (None:
        anyone); a refused request is answered here and never reaches ``fn``."""
        async def handler(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
            need = rule(cmd)
            refused = None if need is None else self.refusal(cmd, conn, need)
            if refused is None:
                return await fn(cmd, conn)
            if on_refusal is not None:
                on_refusal(cmd, conn, refused.remark or "")
            else:
                log.warning("refused %s from %s: %s", cmd.describe(), conn.peer, refused.remark)
            return refused
        return handler
