"""The credential and TLS flags of ``rmqha``'s client commands.

- ``--access-key`` / ``--secret-key`` (default ``$RMQHA_ACCESS_KEY`` /
  ``$RMQHA_SECRET_KEY``): sign every request the RocketMQ ACL 1.0 way, for brokers with
  ``aclEnable``.  Prefer the environment for the secret: a command line is visible to
  every user of the host (``ps``).
- ``--tls``: connect over TLS, checking servers against the system's CAs and host names;
  ``--tls-ca FILE`` (``$RMQHA_TLS_CA``) checks them against a cluster CA instead (made
  with ``rmqha certs``), and ``--tls-cert`` / ``--tls-key`` (``$RMQHA_TLS_CERT`` /
  ``$RMQHA_TLS_KEY``) present a client certificate to servers that require one.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from rmqha.errors import ConfigError
from rmqha.net.client_security import (
    ENV_ACCESS_KEY,
    ENV_SECRET_KEY,
    ClientSecurity,
    TlsOption,
)
from rmqha.security.tls import TlsSettings


def add_flags(p: argparse.ArgumentParser, *, credentials: bool = True) -> None:
    """The TLS flags, and with ``credentials`` the ACL ones, on a command's parser."""
    env = os.environ.get
    if credentials:
        p.add_argument("--access-key", "--accessKey", dest="access_key",
                       default=env(ENV_ACCESS_KEY),
                       help=f"ACL access key (default: ${ENV_ACCESS_KEY})")
        p.add_argument("--secret-key", "--secretKey", dest="secret_key",
                       default=env(ENV_SECRET_KEY),
                       help=f"ACL secret key (default: ${ENV_SECRET_KEY}; prefer it: "
                            "arguments show in ps)")
    p.add_argument("--tls", action="store_true",
                   help="connect over TLS (servers checked against the system's CAs)")
    p.add_argument("--tls-ca", default=env("RMQHA_TLS_CA"), metavar="FILE",
                   help="TLS, servers checked against this CA file (default: $RMQHA_TLS_CA)")
    p.add_argument("--tls-cert", default=env("RMQHA_TLS_CERT"), metavar="FILE",
                   help="client certificate for servers that require one (default: $RMQHA_TLS_CERT)")
    p.add_argument("--tls-key", default=env("RMQHA_TLS_KEY"), metavar="FILE",
                   help="its key (default: $RMQHA_TLS_KEY)")


def tls_option(args: argparse.Namespace) -> TlsOption:
    """What the TLS flags ask for, as a client's ``tls`` argument (None: plaintext)."""
    cert, key, ca = args.tls_cert, args.tls_key, args.tls_ca
    if cert or key:
        if not (cert and key and ca):
            raise ConfigError("--tls-cert needs --tls-key and --tls-ca (the CA that "
                              "checks the servers)")
        return TlsSettings(client_enable=True, client_cert_path=cert, client_key_path=key,
                           client_trust_cert_path=ca)
    if ca:
        return str(ca)
    return True if args.tls else None


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """``access_key``, ``secret_key`` and ``tls`` for Producer, Consumer and the admin clients."""
    return {"access_key": getattr(args, "access_key", None),
            "secret_key": getattr(args, "secret_key", None), "tls": tls_option(args)}


def client_security(args: argparse.Namespace) -> ClientSecurity | None:
    """The same, for a bare remoting client."""
    return ClientSecurity.from_options(**client_options(args), env={})
