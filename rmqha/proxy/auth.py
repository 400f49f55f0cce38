"""RocketMQ ACL 1.0 for gRPC requests: the ``authorization`` header and the permission
each RPC needs, checked against the brokers' ``plain_acl.yml`` accounts.

RocketMQ 5 clients sign every call (``Signature.metadata`` in the clients)::

    authorization: MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>
    x-mq-date-time: 20240102T030405Z

where the signature is the lower-case hex of HMAC-SHA1(secretKey, x-mq-date-time).  The
check is the broker's (:mod:`rmqha.security.acl`) with a gRPC request in place of a
remoting one: a globally white-listed address passes; else the access key must name an
account, the account's white address passes, else the signature must match; an admin
account passes; else every resource the RPC names needs its permission (a topic PUB to
send or end a transaction, SUB to receive; a group SUB, checked as ``%RETRY%<group>``).
Every refusal is UNAUTHORIZED, as RocketMQ's proxy answers an ACL exception.

Replay window.  The signature covers only ``x-mq-date-time`` (second resolution), so one
captured header pair signs any call for as long as the proxy takes that time: a correctly
signed call whose ``x-mq-date-time`` is missing, malformed or more than
:data:`REPLAY_WINDOW_S` (5 minutes) from the proxy's clock is refused, naming the skew.
Within the window a captured pair still works (the protocol signs no nonce a cache could
hold: many calls of one second share one signature); TLS on the gRPC port is what keeps
it from being captured.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from rmqha.errors import ProxyError
from rmqha.protocol.code_rules import Kind, Need, topic_resource
from rmqha.proxy.status import Code
from rmqha.security.acl import (
    AclConfig,
    Perm,
    describe_resource,
    perm_allows,
    retry_topic,
)
from rmqha.security.address_pattern import parse_ip

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
#: A signed call's x-mq-date-time may be at most this far from the proxy's clock.
REPLAY_WINDOW_S = 300.0
#: x-mq-date-time's format (RocketMQ 5 clients: yyyyMMdd'T'HHmmss'Z', UTC).
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
_FIELDS = re.compile(r"(\w+)=([^,\s]*)")


@dataclass(frozen=True)
class Credentials:
    access_key: str
    signature: str
    date_time: str


def parse_authorization(metadata: Mapping[str, str]) -> Credentials | None:
    """The credentials of a call, None if it carries no ``authorization``."""
    header = metadata.get(AUTHORIZATION)
    if header is None:
        return None
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise ProxyError(Code.UNAUTHORIZED, f"authorization uses {algorithm!r}, not {ALGORITHM}")
    fields = dict(_FIELDS.findall(rest))
    if not fields.get("Credential") or not fields.get("Signature"):
        raise ProxyError(Code.UNAUTHORIZED, "authorization lacks Credential or Signature")
    access_key = fields["Credential"].split("/")[0]
    return Credentials(access_key, fields["Signature"], metadata.get(DATE_TIME, ""))


def signature(secret_key: str, date_time: str) -> str:
    """The client's signature: hex of HMAC-SHA1(secretKey, x-mq-date-time)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


@dataclass(frozen=True)
class Needs:
    """What one RPC asks for: a perm per topic and per group."""

    topics: Mapping[str, Perm]
    groups: Mapping[str, Perm]

    def resources(self) -> dict[str, Perm]:
        """Account keys -> perms; a topic ``%RETRY%<g>`` / ``%DLQ%<g>`` is group g's (SUB),
        a pop retry topic of one of the groups stands for its topic (rmqha.protocol.code_rules)."""
        out = {retry_topic(g): p for g, p in self.groups.items() if g}
        for t, p in self.topics.items():
            if t:
                named = topic_resource(t, Need.SUB, tuple(g for g in self.groups if g))
                if named.kind == Kind.GROUP:
                    out[retry_topic(named.name)] = Perm.SUB
                else:
                    out[named.name] = p
        return out


def check_date_time(date_time: str, now: float | None = None) -> None:
    """ProxyError UNAUTHORIZED unless ``date_time`` (x-mq-date-time) is within
    :data:`REPLAY_WINDOW_S` of ``now`` (the clock, by default)."""
    try:
        signed = dt.datetime.strptime(date_time, DATE_TIME_FORMAT).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        raise ProxyError(Code.UNAUTHORIZED, f"{DATE_TIME} {date_time!r} is missing or not "
                         "yyyyMMdd'T'HHmmss'Z' (it is what the signature signs)") from None
    skew = signed - (time.time() if now is None else now)
    if abs(skew) > REPLAY_WINDOW_S:
        raise ProxyError(Code.UNAUTHORIZED, f"{DATE_TIME} {date_time} is {abs(skew):.0f} s "
                         f"{'behind' if skew < 0 else 'ahead of'} the proxy's clock; at most "
                         f"{REPLAY_WINDOW_S:.0f} s are taken (an older signature may be a replay)")


def check(config: AclConfig, metadata: Mapping[str, str], peer_ip: str, needs: Needs,
          now: float | None = None) -> None:
    """Let the call through or raise ProxyError UNAUTHORIZED saying why (``now``: the
    clock the replay window is measured on, by default the system's)."""
    ip = parse_ip(peer_ip)
    if any(p.matches_ip(ip) for p in config.global_white):
        return
    creds = parse_authorization(metadata)
    if creds is None:
        raise ProxyError(Code.UNAUTHORIZED, "the request carries no authorization (ACL is on)")
    account = config.accounts.get(creds.access_key)
    if account is None:
        raise ProxyError(Code.UNAUTHORIZED, f"no ACL account for accessKey={creds.access_key}")
    if account.white_address.matches_ip(ip):
        return
    expected = signature(account.secret_key, creds.date_time)
    if not hmac.compare_digest(expected, creds.signature.lower()):
        raise ProxyError(Code.UNAUTHORIZED, f"check signature failed for accessKey={creds.access_key}")
    check_date_time(creds.date_time, now)
    if account.admin:
        return
    for resource, perm in needs.resources().items():
        owned, default = account.owned(resource)
        if not perm_allows(perm, owned):
            which = "default permission" if default else "permission"
            raise ProxyError(Code.UNAUTHORIZED, f"accessKey={account.access_key} has no {perm.name} "
                             f"{which} for {describe_resource(resource)} (it has {owned.name})")
