"""Who a process is: its role in the cluster and the names that pick it out.

An :class:`Identity` travels as text of the form ``rmqha:<role>/<field>/...``:

- ``rmqha:controller/<id>``                  a controller (its Raft id, e.g. ``n0``)
- ``rmqha:namesrv/<id>``                     a name server
- ``rmqha:broker/<cluster>/<group>/<name>``  a broker: its cluster, its broker group
  (RocketMQ's ``brokerName``) and a stable instance name chosen by the operator
- ``rmqha:client/<name>``                    a producer or consumer process
- ``rmqha:admin/<name>``                     an operator's tool (``rmqha admin ...``)

A broker is named by group and instance name, not by broker id: in controller mode the id
is handed out by the controller at the broker's first start, after its certificate was
made.  Authorisation decisions use the role, cluster and group (a slave may replicate from
a master of its own group); the instance name tells members of a group apart in logs.

The same text is the SAN URI of a certificate (:mod:`rmqha.security.certs`) and the claimed
identity of a link handshake (:mod:`rmqha.security.link_auth`).
"""
from __future__ import annotations

import enum
import re
from collections.abc import Collection
from dataclasses import dataclass

from rmqha.errors import ConfigError, PeerIdentityError

SCHEME = "rmqha:"

_FIELD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class Role(enum.Enum):
    """A process's role; the value is the role's word in an identity's text."""

    CONTROLLER = "controller"
    NAMESRV = "namesrv"
    BROKER = "broker"
    CLIENT = "client"
    ADMIN = "admin"


#: How many ``/``-separated fields follow each role.
_FIELD_COUNT: dict[Role, int] = {Role.BROKER: 3}


@dataclass(frozen=True)
class Identity:
    """A role plus its names; ``cluster`` and ``group`` are set for brokers only."""

    role: Role
    name: str
    cluster: str = ""
    group: str = ""

    def __post_init__(self) -> None:
        for label, value in self._labelled_fields():
            if not _FIELD.match(value):
                raise ConfigError(
                    f"identity {label} {value!r} is not allowed: use 1-64 letters, digits, "
                    "'.', '_' or '-', starting with a letter or digit")
        if self.role is not Role.BROKER and (self.cluster or self.group):
            raise ConfigError(f"a {self.role.value} identity has no cluster or group "
                              f"(got cluster={self.cluster!r}, group={self.group!r})")

    def _labelled_fields(self) -> list[tuple[str, str]]:
        if self.role is Role.BROKER:
            return [("cluster", self.cluster), ("group", self.group), ("name", self.name)]
        return [("name", self.name)]

    @classmethod
    def controller(cls, controller_id: str) -> Identity:
        return cls(Role.CONTROLLER, controller_id)

    @classmethod
    def namesrv(cls, namesrv_id: str) -> Identity:
        return cls(Role.NAMESRV, namesrv_id)

    @classmethod
    def broker(cls, cluster: str, group: str, name: str) -> Identity:
        return cls(Role.BROKER, name, cluster, group)

    @classmethod
    def client(cls, name: str) -> Identity:
        return cls(Role.CLIENT, name)

    @classmethod
    def admin(cls, name: str) -> Identity:
        return cls(Role.ADMIN, name)

    @classmethod
    def parse(cls, text: str) -> Identity:
        """The identity written as ``rmqha:<role>/<fields>`` (ConfigError naming the text)."""
        if not text.startswith(SCHEME):
            raise ConfigError(f"identity {text!r} does not start with {SCHEME!r}")
        role_word, _, rest = text[len(SCHEME):].partition("/")
        try:
            role = Role(role_word)
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise ConfigError(f"identity {text!r} names unknown role {role_word!r} "
                              f"(known: {known})") from None
        fields = rest.split("/")
        want = _FIELD_COUNT.get(role, 1)
        if len(fields) != want:
            raise ConfigError(f"identity {text!r}: a {role.value} has {want} field(s) "
                              f"after the role, got {len(fields)}")
        if role is Role.BROKER:
            return cls.broker(*fields)
        return cls(role, fields[0])

    def __str__(self) -> str:
        return SCHEME + "/".join([self.role.value] + [v for _, v in self._labelled_fields()])

    def file_stem(self) -> str:
        """A file name for this identity's key and certificate (``broker-C-G-N``)."""
        return "-".join([self.role.value] + [v for _, v in self._labelled_fields()])


def identity_from_uris(uris: list[str] | tuple[str, ...], where: str) -> Identity:
    """The one ``rmqha:`` identity among a certificate's SAN URIs (ConfigError when there
    is none or more than one; ``where`` names the certificate)."""
    ours = [u for u in uris if u.startswith(SCHEME)]
    if len(ours) != 1:
        raise ConfigError(f"{where} names {len(ours)} rmqha identities in its SAN URIs "
                          f"({', '.join(ours) or 'none'}); exactly one is needed")
    return Identity.parse(ours[0])


def authorize(peer: Identity, *, roles: Collection[Role] | None = None,
              expected: Identity | None = None, cluster: str | None = None,
              group: str | None = None) -> Identity:
    """``peer`` if it is ``expected`` / has one of ``roles`` / is a broker of ``cluster`` /
    of ``group`` (each check only when given); PeerIdentityError naming both otherwise."""
    if expected is not None and peer != expected:
        raise PeerIdentityError(f"peer is {peer}, expected {expected}")
    if roles is not None and peer.role not in roles:
        wanted = ", ".join(sorted(r.value for r in roles))
        raise PeerIdentityError(f"peer is {peer}; only {wanted} may connect here")
    if cluster is not None and peer.cluster != cluster:
        raise PeerIdentityError(f"peer is {peer}, not a broker of cluster {cluster}")
    if group is not None and peer.group != group:
        raise PeerIdentityError(f"peer is {peer}, not a broker of group {group}")
    return peer
