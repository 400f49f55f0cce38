"""RocketMQ ACL 1.0 request signatures, both ends.

A signed request carries ``AccessKey`` (and optionally ``SecurityToken``) and ``Signature``
in its ``extFields``.  The signature is what RocketMQ's ``AclClientRPCHook`` and
``PlainAccessResource.parse`` compute: take every ext field except ``Signature``, sort them
by key (Java ``String`` order), concatenate their *values* (UTF-8), append the body, and
HMAC-SHA1 the result with the account's secret key; the field is the base64 of the MAC.

One quirk of the server is kept: for requests of version <= V4_9_3 it leaves
``_UNIQUE_KEY_QUERY`` out of the content, because those clients added that field after
signing.  The C++ client (rocketmq 0.4.4) adds ``OnsChannel`` before signing; it is simply
one more field.

Both ends hash with :class:`Sha1Mac`: an account's key is padded and hashed once (RFC
2104's inner and outer states, copied for each request), and the fields and the body are
hashed in place, one after the other, never joined into one copy (a batch's body is tens
of KiB).
"""
from __future__ import annotations

import binascii
import functools
import hashlib
import hmac
import operator
from collections.abc import Callable, Mapping, Sequence

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
#: Field names whose values are never part of the signed content (a name, not a secret:
#: kept out of ``!=`` so the constant-time audit stays exact).
_NEVER_SIGNED = frozenset({SIGNATURE})
SECURITY_TOKEN = "SecurityToken"

#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: ``MQVersion.Version.V4_9_3.ordinal()``; requests up to it signed without the field above.
V4_9_3 = 400

#: SHA-1's block size: an HMAC key longer than this is hashed first (RFC 2104).
_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
#: Accounts whose keyed MAC :func:`mac_for` keeps.
MAX_KEYED = 256


class Sha1Mac:
    """HMAC-SHA1 under one key, keyed once: each message copies the keyed inner and outer
    hashes (two SHA-1 blocks saved, and no OpenSSL HMAC set-up, a few us a request) and
    hashes its parts in order without joining them."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha1(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha1(key.translate(_IPAD))
        self._outer = hashlib.sha1(key.translate(_OPAD))

    def digest(self, *parts: bytes | bytearray | memoryview) -> bytes:
        """The MAC of the parts' concatenation."""
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def base64(self, *parts: bytes | bytearray | memoryview) -> bytes:
        """:meth:`digest` as RocketMQ's ``Signature`` field carries it (ASCII bytes)."""
        return binascii.b2a_base64(self.digest(*parts), newline=False)


@functools.lru_cache(maxsize=MAX_KEYED)
def mac_for(secret_key: str) -> Sha1Mac:
    """The keyed MAC of an account's secret key (kept for the next request)."""
    return Sha1Mac(secret_key.encode("utf-8"))


def _java_order(key: str) -> bytes:
    # Java's TreeMap<String, ...> compares UTF-16 code units; big-endian UTF-16 bytes sort
    # the same way (Python's own str order differs above U+FFFF).
    return key.encode("utf-16-be")


def _sorted_keys(fields: Mapping[str, str]) -> list[str]:
    keys = list(fields)
    if "".join(keys).isascii():  # the usual case, where both orders agree
        keys.sort()
    else:
        keys.sort(key=_java_order)
    return keys


def signed_fields(ext_fields: Mapping[str, str], version: int | None = None) -> bytes:
    """The signed content's first part: the fields' values in key order (the body
    follows them; ``version``: the frame's, None for a client that signs every field)."""
    skip_unique = version is not None and version <= V4_9_3
    unsigned = {SIGNATURE, UNIQUE_KEY_QUERY} if skip_unique else {SIGNATURE}
    return "".join([ext_fields[k] for k in _sorted_keys(ext_fields)
                    if k not in unsigned]).encode("utf-8")


def signed_fields_with(ext_fields: Mapping[str, str], name: str, value: str) -> bytes:
    """:func:`signed_fields` of ``ext_fields`` with the field ``name`` set to ``value``
    (:func:`signed_fields_plus` of one field)."""
    return signed_fields_plus(ext_fields, {name: value})


def signed_fields_plus(ext_fields: Mapping[str, str], extra: Mapping[str, str]) -> bytes:
    """:func:`signed_fields` of ``ext_fields`` with the fields of ``extra`` added (a
    client's ``AccessKey`` and replay stamp), their signing order sorted once per set of
    names (:func:`_order_plus`)."""
    getter = _order_plus(tuple(ext_fields), tuple(extra))
    return "".join(getter({**ext_fields, **extra})).encode("utf-8")


#: Sets of field names whose signing order :func:`_order_plus` keeps (a producer sends
#: a few: one and batch, each topic's the same).
MAX_ORDERS = 256


@functools.lru_cache(maxsize=MAX_ORDERS)
def _order_plus(names: tuple[str, ...], extra: tuple[str, ...]) -> Callable[[Mapping[str, str]], Sequence[str]]:
    """A getter of the signed values of ``names`` and ``extra`` in signing order."""
    order = [k for k in _sorted_keys(dict.fromkeys((*names, *extra), "")) if k not in _NEVER_SIGNED]
    if len(order) > 1:
        return operator.itemgetter(*order)
    return lambda fields: [fields[k] for k in order]


def signed_content(ext_fields: Mapping[str, str], body: bytes | None,
                   version: int | None = None) -> bytes:
    """The bytes RocketMQ's server signs for a request with these fields and body
    (:func:`signed_fields`, then the body)."""
    content = signed_fields(ext_fields, version)
    return content + body if body else content


def compute_signature(content: bytes, secret_key: str) -> str:
    """base64(HMAC-SHA1(secret_key, content)), RocketMQ's ``AclSigner.calSignature``."""
    return mac_for(secret_key).base64(content).decode("ascii")


def signature_matches(ext_fields: Mapping[str, str], body: bytes | None, secret_key: str,
                      version: int | None = None) -> bool:
    """Whether the request's ``Signature`` is right for ``secret_key`` (constant time)."""
    given = ext_fields.get(SIGNATURE)
    if given is None:
        return False
    expected = mac_for(secret_key).base64(signed_fields(ext_fields, version), body or b"")
    return hmac.compare_digest(expected, given.encode("utf-8", "replace"))


def sign(ext_fields: Mapping[str, str], body: bytes | None, access_key: str, secret_key: str,
         security_token: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ext fields a client sends: the given ones plus ``AccessKey`` (and
    ``SecurityToken``, and ``extra``: rmqha's replay stamp) and the ``Signature`` over all
    of them and the body."""
    fields = dict(ext_fields)
    if extra:
        fields.update(extra)
    fields.pop(SIGNATURE, None)  # a stale one is replaced, never signed
    fields[ACCESS_KEY] = access_key
    if security_token is not None:
        fields[SECURITY_TOKEN] = security_token
    fields[SIGNATURE] = mac_for(secret_key).base64(signed_fields(fields),
                                                   body or b"").decode("ascii")
    return fields
