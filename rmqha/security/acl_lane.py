"""The RocketMQ ACL 1.0 check of a broker's plain send, on its fast lane.

A plain send (:mod:`rmqha._core.send_frames`, parsed ``signed``) comes with its
``AccessKey``, its ``Signature`` and the bytes RocketMQ signs before the body, built from
its frame without a command; the body is hashed where it is, after them.
:meth:`SendLane.admits` decides it as :func:`rmqha.security.acl.check_request` would, and
says True only where that check lets it through:

- the connection's address is in ``globalWhiteRemoteAddresses``; or
- the account's ``whiteRemoteAddress`` takes it; or
- the signature is the account's HMAC-SHA1 of that content (constant-time compare) and the
  account may PUB to the topic (its entry or default, an admin account, or the trace topic).

Everything else (no or an unknown AccessKey, a wrong signature, no permission, a send to a
group's retry or dead-letter topic, a header unusual for signing) is False: the broker then
runs the ordinary check on the decoded command, which refuses it as it always did.

A send that verifies also passes the validator's replay window
(:mod:`rmqha.security.replay`): its ``RmqhaTime`` is read from the frame's JSON header
(:func:`rmqha.security.replay.time_in_frame`; a header where it cannot be read for sure
goes to the ordinary check) and its signature is remembered as the ordinary check would.

What an account may do on a topic is worked out once per connection, account and topic
(:class:`_Grants`, kept in the connection's state) and forgotten when ``plain_acl.yml``
is reloaded: the grants belong to the config object they were made from.  A grant that
needs a signature holds the account's keyed MAC
(:class:`~rmqha.security.signature.Sha1Mac`), keyed once per account and config.
"""
from __future__ import annotations

import hmac
from collections.abc import MutableMapping
from typing import Any

from rmqha.errors import AclAuthenticationError
from rmqha.protocol.code_rules import group_of_topic
from rmqha.security.acl import TRACE_TOPIC, AclConfig, AclValidator, Perm, perm_allows
from rmqha.security.address_pattern import parse_ip
from rmqha.security.replay import time_in_frame
from rmqha.security.signature import Sha1Mac, mac_for

#: Where a connection's grants live in its state mapping.
STATE_KEY = "acl.send_grants"
#: Grants kept per connection before they are forgotten (a client sending to ever new topics).
MAX_GRANTS = 1024
#: A grant that needs no signature (the account's whiteRemoteAddress).
_WHITE = True

Grant = Sha1Mac | bool | None
#: The code a refusal here would name (never shown: the ordinary check answers it).
_SEND = 10


class _Grants:
    """What one connection's accounts may send, under one config: (access key, topic) ->
    the account's keyed MAC (verify, then admit), :data:`_WHITE` (admit) or None (the
    ordinary check)."""

    __slots__ = ("config", "ip", "white", "by_topic")

    def __init__(self, config: AclConfig, remote_ip: str) -> None:
        self.config = config
        self.ip = parse_ip(remote_ip)
        self.white = any(p.matches_ip(self.ip) for p in config.global_white)
        self.by_topic: dict[tuple[str, str], Grant] = {}

    def grant(self, access_key: str, topic: str) -> Grant:
        key = (access_key, topic)
        try:
            return self.by_topic[key]
        except KeyError:
            pass
        if len(self.by_topic) >= MAX_GRANTS:
            self.by_topic.clear()
        grant = self.by_topic[key] = self._grant(access_key, topic)
        return grant

    def _grant(self, access_key: str, topic: str) -> Grant:
        account = self.config.accounts.get(access_key)
        if account is None:
            return None
        if account.white_address.matches_ip(self.ip):
            return _WHITE
        if group_of_topic(topic) is not None:
            return None  # a group's retry or dead-letter topic needs SUB on the group: the ordinary check
        if not (topic == TRACE_TOPIC or account.admin
                or perm_allows(Perm.PUB, account.owned(topic)[0])):
            return None
        return mac_for(account.secret_key)


class SendLane:
    """The ACL check of plain sends against one :class:`~rmqha.security.acl.AclValidator`
    (which re-reads ``plain_acl.yml`` when it changes)."""

    def __init__(self, validator: AclValidator) -> None:
        self.validator = validator

    def admits(self, access_key: str | None, topic: str, signature: bytes | None,
               fields: bytes | None, body: bytes, state: MutableMapping[str, Any],
               remote_ip: str, head: bytes = b"") -> bool:
        """Whether the ordinary check would let this send through (False: ask it).
        ``fields``: the signed content before ``body``; ``state``: the connection's own
        mapping; ``remote_ip``: its peer's address; ``head``: the frame up to its body
        (where the signed time is read)."""
        config = self.validator.current()
        grants = state.get(STATE_KEY)
        if grants is None or grants.config is not config:
            grants = state[STATE_KEY] = _Grants(config, remote_ip)
        if grants.white:
            return True
        if access_key is None:
            return False
        grant = grants.grant(access_key, topic)
        if grant is None:
            return False
        if grant is _WHITE:  # the account's whiteRemoteAddress, no signature to check
            return True
        if fields is None or signature is None or not isinstance(grant, Sha1Mac):
            return False
        if not hmac.compare_digest(grant.base64(fields, body), signature):
            return False
        return self._fresh(head, signature, access_key)

    def _fresh(self, head: bytes, signature: bytes, access_key: str) -> bool:
        """Whether the replay window takes this verified send (False: the ordinary check
        decides, and refuses it with the reason)."""
        replay = self.validator.replay
        if replay is None:
            return True
        readable, signed_at = time_in_frame(head)
        if not readable:
            return False
        try:
            replay.check(signed_at, signature, _SEND, access_key)
        except AclAuthenticationError:
            return False
        return True
