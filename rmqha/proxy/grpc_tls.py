"""TLS on the proxy's gRPC port: RocketMQ's ``tls.server.*`` keys as grpc server credentials.

The port's settings are the other processes' (:class:`~rmqha.security.tls.TlsSettings`,
the ``tls.*`` keys of :class:`~rmqha.config.TlsKeys`), with what grpc can do:

- ``disabled``: plaintext; ``enforcing``: TLS only (grpc closes a plaintext connection in
  its handshake);
- ``permissive`` is refused: grpc serves a port with TLS or without, never both (RocketMQ's
  proxy tells them apart by the first byte).  The proxy keeps no state, so a migration
  runs a second proxy without TLS beside the enforcing one until the last plaintext
  client moved;
- ``tls.server.need.client.auth``: ``require`` asks for a client certificate and checks
  it against ``tls.server.trustCertPath``; ``none`` and ``optional`` do not ask (grpc
  asks only to require: a port that admits clients without certificates admits the same
  clients whether or not it looks at the ones that come with one).

The files are re-read when they change (checked at most once a second, when a client
connects): a renewed certificate serves new connections without a restart; files that
cannot be read keep the previous certificate and log why.  grpc takes an unencrypted
key, so a key with ``tls.server.keyPassword`` is decrypted in memory.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import grpc
from cryptography.hazmat.primitives import serialization

from rmqha.errors import ConfigError
from rmqha.proxy.config import check_port_settings
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings, server_context

log = logging.getLogger(__name__)

RECHECK_INTERVAL_S = 1.0

FileStamp = tuple[int, int, int] | None


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}={path} cannot be read: {exc.strerror}") from None


def _plain_key(pem: bytes, password: str, path: str) -> bytes:
    """The key as grpc takes it (PEM, unencrypted)."""
    if not password:
        return pem
    try:
        key = serialization.load_pem_private_key(pem, password.encode())
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"tls.server.keyPath={path} cannot be decrypted with "
                          f"tls.server.keyPassword: {exc}") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _stamp(path: str) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class PortCertificates:
    """The port's certificate configuration, rebuilt when one of its files changes."""

    def __init__(self, s: TlsSettings, recheck_interval_s: float = RECHECK_INTERVAL_S) -> None:
        self.settings = s
        self.require_client_auth = s.server_need_client_auth is ClientAuth.REQUIRE
        self.paths = [p for p in (s.server_cert_path, s.server_key_path,
                                  s.server_trust_cert_path if self.require_client_auth else "") if p]
        self.recheck_interval_s = recheck_interval_s
        self._stamps = [_stamp(p) for p in self.paths]
        self._next_check = time.monotonic() + recheck_interval_s
        self.generation = 0

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """The files as they are now (ConfigError naming the key of one that cannot be used)."""
        s = self.settings
        server_context(s)  # a certificate that does not match its key fails here, by name
        chain = _read(s.server_cert_path, "tls.server.certPath")
        key = _plain_key(_read(s.server_key_path, "tls.server.keyPath"), s.server_key_password,
                         s.server_key_path)
        roots = (_read(s.server_trust_cert_path, "tls.server.trustCertPath")
                 if self.require_client_auth else None)
        return grpc.ssl_server_certificate_configuration([(key, chain)], roots)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's fetcher, called as a client connects: a new configuration when the files
        changed, else None (keep the current one)."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.recheck_interval_s
        stamps = [_stamp(p) for p in self.paths]
        if stamps == self._stamps:
            return None
        self._stamps = stamps
        try:
            config = self.configuration()
        except ConfigError as exc:
            log.error("gRPC port's TLS files changed but cannot be used; keeping the previous "
                      "certificate: %s", exc)
            return None
        self.generation += 1
        log.info("gRPC port's TLS certificate re-read from %s", ", ".join(self.paths))
        return config

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self.configuration(), self.fetch,
                                                   self.require_client_auth)


def port_credentials(s: TlsSettings) -> grpc.ServerCredentials | None:
    """Credentials for the gRPC port (None: plaintext)."""
    check_port_settings(s)
    if s.server_mode is TlsMode.DISABLED:
        return None
    if s.server_need_client_auth is ClientAuth.OPTIONAL:
        log.info("tls.server.need.client.auth=optional: the gRPC port does not ask clients for "
                 "certificates (grpc asks only to require one)")
    return PortCertificates(s).credentials()
