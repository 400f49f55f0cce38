"""The cluster secret as configuration: where a process gets it and when it may run without.

Every process (controller, name server, broker) reads the same secret from, in order:
``cluster_secret`` (a config file key, or the environment variable
``RMQHA_CLUSTER_SECRET``, which the config loader maps onto it), else the first line of
``cluster_secret_file`` (``RMQHA_CLUSTER_SECRET_FILE``: a mounted Kubernetes Secret or a
Docker secret).  A controller also takes its legacy ``raft_password`` as the secret.  The
secret never appears in logs, answers or error messages.

Without a secret:

* a **controller** refuses to start unless ``allow_insecure = true``, and even then only
  when every Raft peer and its listen address are on loopback: pysyncobj unpickles what
  its peers send, and only the secret makes it authenticate that first;
* a **name server** or **broker** runs unauthenticated (logging a warning) when everything
  it listens on is loopback, and refuses otherwise unless ``allow_insecure = true``.

Beyond the secret, which guards control requests only, a process that serves clients off
loopback must guard their data too (:func:`require_guarded_listener`): a **broker** or
**proxy** needs ACL (``acl_enable``) or a TLS-only port (``tls.server.mode = enforcing``,
whose client certificates come from the cluster CA), a **name server** the TLS-only port.
Otherwise it refuses to start, before it binds anything, unless ``allow_insecure = true``.
One rule decides what counts as off loopback for all of them (:func:`off_loopback`):
anything but 127.0.0.0/8, ::1 and ``localhost``, so the wildcards ``0.0.0.0`` and ``::``
count, as does a DNS name.
"""
from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from pathlib import Path

from rmqha.errors import ConfigError
from rmqha.security.secret import MIN_SECRET_BYTES, read_secret_text

log = logging.getLogger(__name__)

#: How the error messages name the keys (snake_case, RocketMQ spelling, environment).
SECRET_KEYS_TEXT = ("cluster_secret (clusterSecret, env RMQHA_CLUSTER_SECRET) or "
                    "cluster_secret_file (clusterSecretFile, env RMQHA_CLUSTER_SECRET_FILE)")


def is_loopback(address: str) -> bool:
    """Whether ``host`` or ``host:port`` is a loopback address (a DNS name other than
    localhost is assumed to leave the machine)."""
    host = _host(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host(address: str) -> str:
    if address.startswith("["):  # [v6]:port
        return address[1:address.find("]")] if "]" in address else address
    if address.count(":") == 1:  # host:port
        return address.rpartition(":")[0]
    return address  # a bare host, or a bare IPv6 address


def resolve_secret(value: str | None, path: Path | str | None, *fallbacks: str | None) -> str | None:
    """``value``, else the content of ``path``, else the first non-empty fallback."""
    if value:
        return value
    if path is not None and str(path):
        return read_secret_text(path)
    return next((f for f in fallbacks if f), None)


def off_loopback(addresses: Iterable[str]) -> list[str]:
    """The addresses of ``addresses`` that are not loopback, sorted, each once."""
    return sorted({a for a in addresses if not is_loopback(a)})


def require_guarded_listener(who: str, addresses: Iterable[str], *, guarded: bool,
                             allow_insecure: bool, guards: str) -> None:
    """ConfigError naming the keys (``guards``, e.g. "acl_enable = true or
    tls.server.mode = enforcing") when ``who`` would serve clients on a non-loopback
    address of ``addresses`` without ``guarded`` (ACL or a TLS-only port), unless
    ``allow_insecure``; a warning when it runs so anyway."""
    remote = off_loopback(addresses)
    if not remote or guarded:
        return
    if not allow_insecure:
        raise ConfigError(
            f"{who} would listen on {', '.join(remote)} with neither TLS nor ACL: anyone who "
            f"reaches it could read and write every topic; set {guards}, or allow_insecure = true "
            "(allowInsecure) to serve it unprotected anyway")
    log.warning("%s serves %s with neither TLS nor ACL (allow_insecure = true): anyone who "
                "reaches it can read and write every topic", who, ", ".join(remote))


def _long_enough(secret: str, who: str) -> None:
    """Every process takes the same secrets (a broker's HA links refuse shorter ones)."""
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ConfigError(f"{who}: the cluster secret has {len(secret.encode())} bytes; at least "
                          f"{MIN_SECRET_BYTES} are needed (make one with `rmqha certs secret`)")


def require_controller_secret(secret: str | None, allow_insecure: bool,
                              addresses: Iterable[str], who: str) -> None:
    """ConfigError naming the keys to set unless a controller may run as configured."""
    if secret:
        _long_enough(secret, who)
        return
    if not allow_insecure:
        raise ConfigError(
            f"{who} has no cluster secret: set {SECRET_KEYS_TEXT} (or raft_password) to the "
            "secret every controller, name server and broker of the cluster shares; "
            "allow_insecure = true runs without one, on loopback only")
    remote = off_loopback(addresses)
    if remote:
        raise ConfigError(
            f"{who}: allow_insecure = true is refused because {', '.join(remote)} "
            f"{'is' if len(remote) == 1 else 'are'} not loopback (pysyncobj would unpickle "
            f"whatever reaches its port): set {SECRET_KEYS_TEXT}")


def check_optional_secret(secret: str | None, allow_insecure: bool,
                          addresses: Iterable[str], who: str) -> None:
    """For a name server or broker: ConfigError when it would listen off loopback
    without a secret (unless ``allow_insecure``); a warning when it runs without one."""
    if secret:
        _long_enough(secret, who)
        return
    remote = off_loopback(addresses)
    if remote and not allow_insecure:
        raise ConfigError(
            f"{who} has no cluster secret and listens on {', '.join(remote)}: anyone who "
            f"reaches it could change routes or roles; set {SECRET_KEYS_TEXT}, or "
            "allow_insecure = true to run unauthenticated anyway")
    log.warning("%s runs without a cluster secret: control requests are not authenticated "
                "(set %s)", who, SECRET_KEYS_TEXT)
