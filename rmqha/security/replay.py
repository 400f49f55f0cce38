"""The brokers' replay window on RocketMQ ACL 1.0 requests (issue 37, point 3).

RocketMQ's ``AclClientRPCHook`` (and ACL 2.0's remoting builder in 5.x, which reads the
same fields) signs a request's ext fields and body, and nothing else: no time, no nonce.
A request captured on a plaintext link is therefore a valid request for ever.  rmqha
keeps the wire format and adds two ordinary ext fields, which the hook's rule signs like
every other field (so a stock RocketMQ broker checks them as it checks ``topic``):

* ``RmqhaTime``: when the request was signed, milliseconds since the epoch (decimal);
* ``RmqhaNonce``: 16 random hex digits, so that two identical requests (heartbeats every
  30 s, two equal sends in one millisecond) never share a signature.

A broker (:class:`ReplayWindow`) refuses a correctly signed request whose ``RmqhaTime``
is malformed or more than :data:`WINDOW_S` (5 minutes, the window RocketMQ 5's proxy
gives ``x-mq-date-time``) from its own clock, and remembers every admitted signature
until its time leaves the window: the same signature again (an exact replay inside the
window) is refused.  The signature is the cache's key because it covers the nonce and
every field: a replay is byte for byte the request, and a legitimate request never
repeats one (2^-64 per pair for the nonce alone).

The cache is bounded (:data:`DEFAULT_MAX_ENTRIES`, ~120 bytes each, ~30 MiB).  Full, it
forgets the entry with the *oldest signed time* and from then refuses any request signed
at or before that time ("older than the replay cache reaches"): the window shrinks under
load, never the guarantee that an admitted request is admitted once.  At 10 000 signed
requests a second the default still reaches back 26 s, more than any sane clock skew.

A request without ``RmqhaTime`` (RocketMQ's own clients, the C++ client) cannot be told
from its replay: it is admitted unless ``acl_require_signed_time`` is set, which refuses
it (an operator whose clients are all rmqha's).  Over TLS (``tls.server.mode =
enforcing``) nothing can be captured in the first place.
"""
from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable, Mapping

from rmqha.errors import AclAuthenticationError
from rmqha.security.signature import ACCESS_KEY

#: The signed time field (milliseconds since the epoch, decimal).
TIME_FIELD = "RmqhaTime"
#: The nonce field (16 hex digits).
NONCE_FIELD = "RmqhaNonce"
#: A signed time more than this far from the broker's clock is refused.
WINDOW_S = 300.0
#: Signatures remembered at most (see the module docstring for what a full cache does).
DEFAULT_MAX_ENTRIES = 262_144
_TIME_NAME = TIME_FIELD.encode()
#: ``RmqhaTime`` as the JSON header writes it: how a plain send's frame is searched for it.
_TIME_KEY_JSON = b'"' + TIME_FIELD.encode() + b'":"'
#: Longest decimal time accepted (ms since the epoch has 13 digits until the year 2286).
_MAX_DIGITS = 15


def stamp(now_ms: int | None = None) -> dict[str, str]:
    """The two fields a client adds to a request before signing it."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return {TIME_FIELD: str(ms), NONCE_FIELD: os.urandom(8).hex()}


def time_in_frame(head: bytes) -> tuple[bool, str | None]:
    """Whether a plain send's ``head`` (its length word and header) can be read here for
    sure, and its ``RmqhaTime`` value (None: the header has no such field).  Not readable
    (a binary header, the name where the JSON key pattern is not): the caller takes the
    ordinary path, which decodes the command."""
    if _TIME_NAME not in head:
        return True, None
    if head[:1] != b"\x00":  # RocketMQ's binary header: leave it to the full decode
        return False, None
    at = head.find(_TIME_KEY_JSON)
    if at < 0:
        return False, None
    start = at + len(_TIME_KEY_JSON)
    end = head.find(b'"', start, start + _MAX_DIGITS + 1)
    if end < 0:
        return False, None
    # Inside a valid JSON string a quote is escaped, so '"RmqhaTime":"' is the key itself
    # (the fast lane's parser took the header as valid JSON with no key given twice).
    return True, head[start:end].decode("ascii", "replace")


class ReplayWindow:
    """The window and the signature cache of one broker port (used from its event loop)."""

    def __init__(self, *, window_s: float = WINDOW_S, max_entries: int = DEFAULT_MAX_ENTRIES,
                 require_time: bool = False, clock: Callable[[], float] = time.time) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.window_ms = int(window_s * 1000)
        self.max_entries = max_entries
        self.require_time = require_time
        self._clock = clock
        self._seen: set[bytes] = set()
        self._by_time: list[tuple[int, bytes]] = []
        #: Requests signed at or before this time (ms) are refused: the cache forgot one.
        self._floor_ms = -1

    def __len__(self) -> int:
        return len(self._seen)

    def check_fields(self, fields: Mapping[str, str], signature: bytes, code: int) -> None:
        """:meth:`check` of a decoded request's fields."""
        self.check(fields.get(TIME_FIELD), signature, code, fields.get(ACCESS_KEY, "?"))

    def check(self, signed_at: str | None, signature: bytes, code: int, access_key: str) -> None:
        """Admit (and remember) a request whose signature was verified, or raise
        :class:`~rmqha.errors.AclAuthenticationError` saying why it may be a replay."""
        if signed_at is None:
            if self.require_time:
                raise AclAuthenticationError(
                    f"request code {code} for accessKey={access_key} carries no signed {TIME_FIELD}: "
                    "refused (acl_require_signed_time: a request without it could be a replay)")
            return
        now_ms = int(self._clock() * 1000)
        at_ms = _parse_ms(signed_at, code, access_key)
        skew_s = (at_ms - now_ms) / 1000
        if abs(at_ms - now_ms) > self.window_ms:
            side = "ahead of" if skew_s > 0 else "behind"
            raise AclAuthenticationError(
                f"request code {code} for accessKey={access_key} was signed {abs(skew_s):.0f} s {side} "
                f"the broker's clock (at most {self.window_ms // 1000} s): refused as a possible replay")
        self._forget_before(now_ms - self.window_ms)
        if at_ms <= self._floor_ms:
            raise AclAuthenticationError(
                f"request code {code} for accessKey={access_key} was signed {-skew_s:.0f} s ago, older "
                f"than the replay cache reaches now ({self.max_entries} signatures): signed too long "
                "before it was sent; refused")
        if signature in self._seen:
            raise AclAuthenticationError(
                f"request code {code} for accessKey={access_key} is a replay: its signature was "
                "already taken within the replay window")
        self._remember(at_ms, signature)

    def _forget_before(self, limit_ms: int) -> None:
        heap = self._by_time
        while heap and heap[0][0] < limit_ms:
            self._seen.discard(heapq.heappop(heap)[1])

    def _remember(self, at_ms: int, signature: bytes) -> None:
        self._seen.add(signature)
        heapq.heappush(self._by_time, (at_ms, signature))
        while len(self._by_time) > self.max_entries:
            oldest, dropped = heapq.heappop(self._by_time)
            self._seen.discard(dropped)
            self._floor_ms = max(self._floor_ms, oldest)


def _parse_ms(text: str, code: int, access_key: str) -> int:
    if not (0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()):
        raise AclAuthenticationError(
            f"request code {code} for accessKey={access_key}: {TIME_FIELD}={text[:32]!r} is not a time "
            "in milliseconds since the epoch: refused")
    return int(text)


def plaintext_acl_warning(address: str, tls_mode: str, *, require_time: bool) -> str:
    """The broker's start-up warning for ACL on a port that serves plaintext."""
    if require_time:
        exposure = ("requests without a signed RmqhaTime are refused (acl_require_signed_time), and "
                    f"a captured request is refused after {WINDOW_S:.0f} s or when sent a second time")
    else:
        exposure = ("a request of a RocketMQ client (no signed RmqhaTime) can be replayed as it is, for "
                    "ever (acl_require_signed_time = true refuses such requests); one of an rmqha client "
                    f"is refused after {WINDOW_S:.0f} s or when sent a second time")
    return (f"ACL on {address} over plaintext (tls.server.mode = {tls_mode}): a signed request can be "
            f"captured on the network; {exposure}; serve TLS only (tls.server.mode = enforcing) to "
            "keep requests from being captured")
