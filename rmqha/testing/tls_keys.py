"""The TLS settings of a process of a test or benchmark cluster whose certificates
``rmqha certs dev-cluster`` made, and those settings as config keys.

One place for what the chaos suite's secure mode, the security cost benchmark and the TLS
tests all need: a process's enforcing mutual-TLS port and links from its identity's pair,
a client's settings, and the config fields a broker, name server or controller file sets.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings


def _ca(pki: Path) -> Path:
    # rmqha.security.certs loads cryptography: imported when used, so `rmqha`'s parser
    # (which shows the demo's docstring, and the demo uses this module) starts without it.
    from rmqha.security.certs import CA_CERT
    return pki / CA_CERT


def _pair(pki: Path, identity: Identity) -> tuple[str, str]:
    stem = pki / identity.file_stem()
    return f"{stem}.crt", f"{stem}.key"


def server_tls(pki: Path, identity: Identity, ca: Path | None = None, *,
               mode: TlsMode = TlsMode.ENFORCING,
               client_auth: ClientAuth = ClientAuth.REQUIRE) -> TlsSettings:
    """A server's settings with ``identity``'s pair from ``pki``, trusting ``ca`` (the
    directory's own CA by default)."""
    cert, key = _pair(pki, identity)
    return TlsSettings(server_mode=mode, server_cert_path=cert, server_key_path=key,
                       server_trust_cert_path=str(ca or _ca(pki)),
                       server_need_client_auth=client_auth)


def client_tls(pki: Path, identity: Identity | None, ca: Path | None = None) -> TlsSettings:
    """A client's settings: ``identity``'s pair from ``pki`` (None: no certificate),
    servers checked against ``ca`` (the directory's own CA by default)."""
    trust = str(ca or _ca(pki))
    if identity is None:
        return TlsSettings(client_enable=True, client_trust_cert_path=trust)
    cert, key = _pair(pki, identity)
    return TlsSettings(client_enable=True, client_cert_path=cert, client_key_path=key,
                       client_trust_cert_path=trust)


def process_tls(pki: Path, identity: Identity) -> TlsSettings:
    """A cluster process as ``deploy/`` runs it: enforcing mutual TLS on its port and TLS
    with the same pair on its own links."""
    links = client_tls(pki, identity)
    return dataclasses.replace(server_tls(pki, identity), client_enable=True,
                               client_cert_path=links.client_cert_path,
                               client_key_path=links.client_key_path,
                               client_trust_cert_path=links.client_trust_cert_path)


def config_keys(settings: TlsSettings) -> dict[str, object]:
    """``settings`` as the config fields a broker, name server or controller file sets."""
    return {
        "tls_server_mode": settings.server_mode.value,
        "tls_server_cert_path": settings.server_cert_path,
        "tls_server_key_path": settings.server_key_path,
        "tls_server_trust_cert_path": settings.server_trust_cert_path,
        "tls_server_need_client_auth": settings.server_need_client_auth.value,
        "tls_enable": settings.client_enable,
        "tls_client_cert_path": settings.client_cert_path,
        "tls_client_key_path": settings.client_key_path,
        "tls_client_trust_cert_path": settings.client_trust_cert_path,
    }
