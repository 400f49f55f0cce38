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
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"

#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: ``MQVersion.Version.V4_9_3.ordinal()``; requests up to it signed without the field above.
V4_9_3 = 400


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


def signed_content(ext_fields: Mapping[str, str], body: bytes | None,
                   version: int | None = None) -> bytes:
    """The bytes RocketMQ's server signs for a request with these fields and body
    (``version``: the frame's; None for a client that signs every field)."""
    skip_unique = version is not None and version <= V4_9_3
    unsigned = {SIGNATURE, UNIQUE_KEY_QUERY} if skip_unique else {SIGNATURE}
    parts = [ext_fields[k] for k in _sorted_keys(ext_fields) if k not in unsigned]
    content = "".join(parts).encode("utf-8")
    return content + body if body else content


def compute_signature(content: bytes, secret_key: str) -> str:
    """base64(HMAC-SHA1(secret_key, content)), RocketMQ's ``AclSigner.calSignature``."""
    mac = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(mac).decode("ascii")


def signature_matches(ext_fields: Mapping[str, str], body: bytes | None, secret_key: str,
                      version: int | None = None) -> bool:
    """Whether the request's ``Signature`` is right for ``secret_key`` (constant time)."""
    given = ext_fields.get(SIGNATURE)
    if given is None:
        return False
    expected = compute_signature(signed_content(ext_fields, body, version), secret_key)
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


def sign(ext_fields: Mapping[str, str], body: bytes | None, access_key: str, secret_key: str,
         security_token: str | None = None) -> dict[str, str]:
    """The ext fields a client sends: the given ones plus ``AccessKey`` (and
    ``SecurityToken``) and the ``Signature`` over all of them and the body."""
    fields = dict(ext_fields)
    fields.pop(SIGNATURE, None)  # a stale one is replaced, never signed
    fields[ACCESS_KEY] = access_key
    if security_token is not None:
        fields[SECURITY_TOKEN] = security_token
    fields[SIGNATURE] = compute_signature(signed_content(fields, body), secret_key)
    return fields
