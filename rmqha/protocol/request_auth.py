"""Proof that a control request comes from a holder of the cluster secret.

This is the one place rmqha signs and checks control requests; the controller, the name
server and the broker all use it.  What it owns:

* **Which requests need proof** (:data:`SIGNED_CODES`): every request that changes the
  controller's state (apply broker id, register, heartbeat, alter SyncStateSet, elect,
  clean, config update), the name server's REGISTER_BROKER and UNREGISTER_BROKER, and the
  controller's NOTIFY_BROKER_ROLE_CHANGED to brokers.  Any other code passes unsigned.
* **The seam** (:class:`RequestAuthenticator`): a sender calls ``sign`` on a request before
  it leaves, a server calls ``verify`` before it handles one.  :class:`SharedSecretAuth`
  (HMAC over the shared cluster secret) is for links without TLS; an authenticator that
  trusts a TLS peer identity can take its place without changing any server, which is why
  ``verify`` also receives the connection.  :class:`OpenAuth` is a process without a
  secret (it signs nothing and accepts everything; the processes allow it on loopback
  only, see :mod:`rmqha.security.secret_policy`).
* **The proof**: three ext fields.  ``authTimestamp`` (ms since the Unix epoch),
  ``authNonce`` (128 random bits, hex) and ``authSignature`` = hex HMAC-SHA256 under a key
  derived from the secret (PBKDF2-SHA256, fixed salt, 100 000 rounds: a short secret is as
  slow to guess from captured requests as pysyncobj's is from its traffic) over a
  length-prefixed encoding of a version tag, the request code, the timestamp, the nonce,
  every other ext field sorted by name, and the body.  Nothing of the request is left out,
  so no field can be added or changed after signing.
* **The checks**: the signature (``hmac.compare_digest``), the timestamp within
  ``max_skew_s`` of this host's clock either way (30 s), the nonce not seen before (a
  bounded cache that keeps each nonce until its request is too old to pass anyway).  A
  refusal is :class:`rmqha.errors.RequestAuthError` naming what was wrong, never the secret;
  :func:`refusal` turns it into RocketMQ's NO_PERMISSION answer.
* **Proof where none is demanded** (:data:`OPTIONALLY_SIGNED_CODES`): a broker signs its
  GET_BROKER_HA_STATUS to its master, and :func:`proves_secret` lets the master's ACL
  guard admit it without an account (an unsigned one still needs one).
* **Admin tokens**: :func:`tokens_match` compares them in constant time.

A signed request can still be replayed once to *another* process within the skew window
(each process has its own nonce cache); the controller closes that for heartbeats by
taking a broker's heartbeats only with increasing signed timestamps (one per round).
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from rmqha.errors import RequestAuthError
from rmqha.protocol.code_rules import RULES, Server
from rmqha.protocol.codes import RequestCode, ResponseCode, code_name
from rmqha.protocol.command import RemotingCommand

TIMESTAMP_FIELD = "authTimestamp"
NONCE_FIELD = "authNonce"
SIGNATURE_FIELD = "authSignature"
AUTH_FIELDS = frozenset({TIMESTAMP_FIELD, NONCE_FIELD, SIGNATURE_FIELD})


def _signed(server: Server) -> frozenset[int]:
    return frozenset(int(c) for c, r in RULES.items() if r.signed and server in r.served_by)


#: Requests a controller takes only with proof (they change its state): the declarations
#: with ``signed`` (:mod:`rmqha.protocol.code_rules`), by who serves them.
CONTROLLER_SIGNED_CODES: frozenset[int] = _signed(Server.CONTROLLER)
#: Requests a name server takes only with proof (they change the routes).
NAMESRV_SIGNED_CODES: frozenset[int] = _signed(Server.NAMESRV)
#: Requests a broker takes only with proof (they change its role).
BROKER_SIGNED_CODES: frozenset[int] = _signed(Server.BROKER)
SIGNED_CODES: frozenset[int] = CONTROLLER_SIGNED_CODES | NAMESRV_SIGNED_CODES | BROKER_SIGNED_CODES
#: Requests a holder of the secret signs although no server demands proof of them: a
#: broker's ACL guard takes the proof in place of an account (:func:`proves_secret`).
OPTIONALLY_SIGNED_CODES: frozenset[int] = frozenset({RequestCode.GET_BROKER_HA_STATUS})

DEFAULT_MAX_SKEW_S = 30.0
DEFAULT_NONCE_CAPACITY = 200_000
_VERSION = b"rmqha-request-v1"
_KDF_SALT = b"rmqha/request-auth/v1"
_KDF_ROUNDS = 100_000
_LEN = struct.Struct(">I")


def tokens_match(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the configured one (any text)."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class RequestAuthenticator(Protocol):
    """What senders and servers need of request authentication (see the module doc)."""

    @property
    def enabled(self) -> bool:
        """False when requests are neither signed nor checked (no secret)."""
        ...

    def sign(self, cmd: RemotingCommand, *, timestamp_ms: int | None = None) -> RemotingCommand:
        """Add the proof to ``cmd`` if its code needs one; returns ``cmd``."""
        ...

    def verify(self, cmd: RemotingCommand, conn: Any = None) -> None:
        """Raise RequestAuthError unless ``cmd`` (if its code needs proof) carries valid
        proof; ``conn`` is the connection it came on."""
        ...


class OpenAuth:
    """No secret: signs nothing, accepts everything (a process on loopback only)."""

    enabled = False

    def sign(self, cmd: RemotingCommand, *, timestamp_ms: int | None = None) -> RemotingCommand:
        return cmd

    def verify(self, cmd: RemotingCommand, conn: Any = None) -> None:
        return None

    def __repr__(self) -> str:
        return "OpenAuth()"


class NonceCache:
    """Nonces seen recently, each kept ``ttl_s`` after it was first seen, at most
    ``capacity`` at a time (thread-safe; a server may verify on several threads)."""

    def __init__(self, ttl_s: float, capacity: int = DEFAULT_NONCE_CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, nonce: str) -> None:
        """Record ``nonce``; RequestAuthError if it was seen within the ttl or the cache
        is full of nonces that are all still live."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            if nonce in self._seen:
                raise RequestAuthError(f"nonce {nonce[:16]} was already used (a replayed request)")
            if len(self._seen) >= self.capacity:
                # Evicting a live nonce would let its request be replayed: refuse instead.
                raise RequestAuthError("too many signed requests in the replay window; retry shortly")
            self._seen[nonce] = now + self.ttl_s

    def _expire(self, now: float) -> None:
        # Insertion order is expiry order (one ttl for all).
        while self._seen:
            nonce, expires = next(iter(self._seen.items()))
            if expires > now:
                return
            del self._seen[nonce]


@functools.lru_cache(maxsize=8)
def _derive_key(secret: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", secret, _KDF_SALT, _KDF_ROUNDS)


def _canonical(cmd: RemotingCommand, timestamp: str, nonce: str) -> bytes:
    parts = [_VERSION, str(int(cmd.code)).encode(), timestamp.encode(), nonce.encode()]
    for key in sorted(k for k in cmd.ext_fields if k not in AUTH_FIELDS):
        parts += (key.encode("utf-8"), cmd.ext_fields[key].encode("utf-8"))
    parts.append(cmd.body)
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


class SharedSecretAuth:
    """HMAC-SHA256 proof under the shared cluster secret (see the module doc)."""

    enabled = True

    def __init__(self, secret: str | bytes, *, max_skew_s: float = DEFAULT_MAX_SKEW_S,
                 nonce_capacity: int = DEFAULT_NONCE_CAPACITY,
                 wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if not raw:
            raise ValueError("the cluster secret is empty")
        self._key = _derive_key(raw)
        self.max_skew_s = max_skew_s
        self._wall_clock = wall_clock
        # A nonce must outlive every timestamp that could still pass with it.
        self.nonces = NonceCache(2 * max_skew_s, nonce_capacity, monotonic)

    def __repr__(self) -> str:
        return f"SharedSecretAuth(max_skew_s={self.max_skew_s})"  # never the key

    def now_ms(self) -> int:
        return int(self._wall_clock() * 1000)

    def signature(self, cmd: RemotingCommand, timestamp: str, nonce: str) -> str:
        return hmac.new(self._key, _canonical(cmd, timestamp, nonce), hashlib.sha256).hexdigest()

    def sign(self, cmd: RemotingCommand, *, timestamp_ms: int | None = None) -> RemotingCommand:
        if cmd.code not in SIGNED_CODES and cmd.code not in OPTIONALLY_SIGNED_CODES:
            return cmd
        timestamp = str(self.now_ms() if timestamp_ms is None else int(timestamp_ms))
        nonce = secrets.token_hex(16)
        for name in AUTH_FIELDS:
            cmd.ext_fields.pop(name, None)
        cmd.ext_fields[TIMESTAMP_FIELD] = timestamp
        cmd.ext_fields[NONCE_FIELD] = nonce
        cmd.ext_fields[SIGNATURE_FIELD] = self.signature(cmd, timestamp, nonce)
        return cmd

    def verify(self, cmd: RemotingCommand, conn: Any = None) -> None:
        if cmd.code in SIGNED_CODES:
            self.verify_proof(cmd)

    def verify_proof(self, cmd: RemotingCommand) -> None:
        """Raise RequestAuthError unless ``cmd`` carries valid, fresh, unused proof,
        whatever its code (its nonce is then spent)."""
        ext = cmd.ext_fields
        missing = sorted(f for f in AUTH_FIELDS if not ext.get(f))
        if missing:
            raise RequestAuthError(f"unsigned request: {', '.join(missing)} missing "
                                   "(the sender needs the cluster secret)")
        timestamp, nonce, given = ext[TIMESTAMP_FIELD], ext[NONCE_FIELD], ext[SIGNATURE_FIELD]
        expected = self.signature(cmd, timestamp, nonce)
        if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("ascii")):
            raise RequestAuthError("bad signature (a different cluster secret, or the request "
                                   "was changed after signing)")
        self._check_fresh(timestamp)
        self.nonces.add(nonce)

    def _check_fresh(self, timestamp: str) -> None:
        try:
            sent_ms = int(timestamp)
        except ValueError:
            raise RequestAuthError(f"authTimestamp {timestamp[:32]!r} is not an integer") from None
        skew_s = (self.now_ms() - sent_ms) / 1000
        if abs(skew_s) > self.max_skew_s:
            when = "old" if skew_s > 0 else "in the future"
            raise RequestAuthError(f"stale request: signed {abs(skew_s):.1f}s {when} "
                                   f"(at most {self.max_skew_s:.0f}s either way; check the clocks)")


def request_auth(secret: str | None, **kwargs: Any) -> RequestAuthenticator:
    """The authenticator for a process: shared-secret HMAC with a secret, else open."""
    return SharedSecretAuth(secret, **kwargs) if secret else OpenAuth()


def proves_secret(auth: RequestAuthenticator, cmd: RemotingCommand) -> bool:
    """Whether ``cmd`` carries valid proof of the cluster secret (any code; its nonce is
    then spent); False for a process without a secret, which can check none."""
    if not isinstance(auth, SharedSecretAuth):
        return False
    try:
        auth.verify_proof(cmd)
    except RequestAuthError:
        return False
    return True


def signed_timestamp_ms(cmd: RemotingCommand) -> int | None:
    """The timestamp of a request's proof (None if it carries none); read it after verify()."""
    raw = cmd.ext_fields.get(TIMESTAMP_FIELD)
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


class RefusalLog:
    """Logs refusals without letting a flood of them flood the log: the first refusal of
    a kind, then at most one line per ``period_s`` for that kind, saying how many were
    refused since the last.  The one rate limit of refusal warnings: the remoting ports
    key it by request code (:meth:`note`), the HA and Raft ports by what was refused and
    why (:meth:`warn`: a reason that names no peer address or time), so each kind still
    shows once, at once, and a flood of one kind is a line per period."""

    def __init__(self, logger: logging.Logger, period_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.period_s = period_s
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._quiet: dict[Hashable, int] = {}
        self.refused = 0

    def note(self, cmd: RemotingCommand, peer: str, reason: str) -> None:
        """A refused request: keyed by its code."""
        code = int(cmd.code)
        self.warn(code, "refused %s from %s: %s", code_name(code), peer, reason)

    def warn(self, kind: Hashable, msg: str, *args: object, level: int = logging.WARNING) -> bool:
        """Count one refusal of ``kind`` and log ``msg % args`` at ``level`` unless one of
        that kind was logged within ``period_s``; True when it was logged."""
        self.refused += 1
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.period_s:
            self._quiet[kind] = self._quiet.get(kind, 0) + 1
            return False
        self._last[kind] = now
        quiet = self._quiet.pop(kind, 0)
        more = f" ({quiet} more refused since the last report)" if quiet else ""
        self._log.log(level, msg + "%s", *args, more)
        return True


def refusal(cmd: RemotingCommand, exc: RequestAuthError) -> RemotingCommand:
    """RocketMQ's NO_PERMISSION answer to a request whose proof failed, saying why."""
    return cmd.response(ResponseCode.NO_PERMISSION,
                        f"{code_name(cmd.code)} refused: {exc}")


def check(auth: RequestAuthenticator, cmd: RemotingCommand, conn: Any = None) -> RemotingCommand | None:
    """None if ``cmd`` may be handled, else the NO_PERMISSION answer to send instead."""
    try:
        auth.verify(cmd, conn)
    except RequestAuthError as exc:
        return refusal(cmd, exc)
    return None
