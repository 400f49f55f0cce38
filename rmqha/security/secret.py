"""The cluster secret: where it comes from, how it is kept out of logs, how it is compared.

Internal links that run without TLS authenticate with one secret shared by every process of
the cluster (:mod:`rmqha.security.link_auth`).  :func:`load_cluster_secret` takes it from,
in order, a configuration value, the environment variable ``RMQHA_CLUSTER_SECRET``, or a
file (a configuration path or ``RMQHA_CLUSTER_SECRET_FILE``).  The value lives in a
:class:`ClusterSecret`, whose ``repr``/``str`` never show it, so a secret that ends up in a
log line or a traceback's locals shows as ``ClusterSecret(<hidden, 32 bytes>)``.

A secret must be at least :data:`MIN_SECRET_BYTES` long: the link handshake's transcript
lets an eavesdropper test guesses offline, so only a random secret is safe.
:func:`generate_secret_text` makes one (``rmqha certs secret`` writes it to a file).
"""
from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from rmqha.errors import ConfigError

log = logging.getLogger(__name__)

ENV_SECRET = "RMQHA_CLUSTER_SECRET"
ENV_SECRET_FILE = "RMQHA_CLUSTER_SECRET_FILE"
MIN_SECRET_BYTES = 16


def constant_time_equals(a: bytes | str, b: bytes | str) -> bool:
    """Whether ``a == b``, in time that does not depend on where they differ."""
    a_bytes = a.encode() if isinstance(a, str) else a
    b_bytes = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(a_bytes, b_bytes)


class ClusterSecret:
    """Secret bytes that never print themselves."""

    __slots__ = ("_value", "source")

    def __init__(self, value: bytes, source: str) -> None:
        if len(value) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"the cluster secret from {source} has {len(value)} bytes; at least "
                f"{MIN_SECRET_BYTES} are needed (make one with `rmqha certs secret`)")
        self._value = value
        self.source = source

    def reveal(self) -> bytes:
        """The secret bytes, for key derivation only."""
        return self._value

    def __repr__(self) -> str:
        return f"ClusterSecret(<hidden, {len(self._value)} bytes, from {self.source}>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterSecret):
            return NotImplemented
        return constant_time_equals(self._value, other._value)

    def __hash__(self) -> int:
        return hash(len(self._value))

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a ClusterSecret is not pickled (it would leave the process)")


def generate_secret_text() -> str:
    """A fresh random secret as text (32 random bytes, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def read_secret_text(path: Path | str, key: str = "cluster_secret_file") -> str:
    """The secret in ``path``: its first line, surrounding whitespace dropped.  ConfigError
    names ``key`` for a missing, unreadable or empty file; a file that others may read is
    used all the same, with a warning naming the file (never its content)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"{key}: {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: cannot read {p}: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("cluster secret file %s can be read by group or others (mode %o); "
                    "chmod 600 it", p, stat.S_IMODE(mode))
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise ConfigError(f"{key}: {p} is empty")
    return lines[0].strip()


def read_secret_file(path: str | Path) -> ClusterSecret:
    """The secret in a file, as :func:`read_secret_text` reads it."""
    return ClusterSecret(read_secret_text(path).encode(), f"file {path}")


def load_cluster_secret(value: str | None = None, file: str | Path | None = None,
                        env: Mapping[str, str] | None = None) -> ClusterSecret | None:
    """The cluster secret from the first source that has one, or None when none does.

    ``value`` and ``file`` are configuration values (``clusterSecret`` /
    ``clusterSecretFile``); ``env`` defaults to ``os.environ``.
    """
    environ = os.environ if env is None else env
    if value:
        return ClusterSecret(value.encode(), "configuration")
    if environ.get(ENV_SECRET):
        return ClusterSecret(environ[ENV_SECRET].encode(), f"${ENV_SECRET}")
    path = file or environ.get(ENV_SECRET_FILE)
    if path:
        return read_secret_file(path)
    return None


def write_secret_file(path: str | Path, text: str) -> Path:
    """Write a secret to a new file readable by its owner only; an existing file is never
    overwritten (ConfigError names it)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{p} already exists; remove it first to make a new secret") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text + "\n")
    return p
