"""Certificates for TLS tests: a cluster CA, a foreign CA, expired certificates, and the
:class:`~rmqha.security.tls.TlsSettings` of a server or client holding one of them.

:func:`make_pki` lays out three directories under one base:

- ``good``: a CA and a certificate per identity of a small cluster
  (``controller-n0``, ``namesrv-ns0``, ``broker-DefaultCluster-g1-g1-0``, ``client-client``,
  ``admin-admin``);
- ``foreign``: the same identities from another CA (trusting ``good``'s CA, so the only
  thing wrong with them is who signed them);
- ``expired``: the same identities from ``good``'s CA, expired a month ago.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings

BROKER = Identity.broker("DefaultCluster", "g1", "g1-0")
CLIENT = Identity.client("client")
CONTROLLER = Identity.controller("n0")
NAMESRV = Identity.namesrv("ns0")


@dataclass(frozen=True)
class Pki:
    good: Path
    foreign: Path
    expired: Path

    @property
    def ca(self) -> Path:
        return self.good / certs.CA_CERT


def make_pki(base: Path) -> Pki:
    pki = Pki(base / "good", base / "foreign", base / "expired")
    certs.dev_cluster(pki.good, controllers=1, groups={"g1": 1}, namesrv=1)
    certs.dev_cluster(pki.foreign, controllers=1, groups={"g1": 1}, namesrv=1)
    pki.expired.mkdir()
    for name in (certs.CA_CERT, certs.CA_KEY):
        (pki.expired / name).write_bytes((pki.good / name).read_bytes())
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    for ident in certs.dev_cluster_identities(cluster="DefaultCluster", controllers=1,
                                              groups={"g1": 1}, namesrv=1):
        certs.issue(pki.expired, ident, days=1, now=old)
    return pki


def server_tls(directory: Path, identity: Identity, ca: Path, *,
               mode: TlsMode = TlsMode.ENFORCING,
               client_auth: ClientAuth = ClientAuth.REQUIRE) -> TlsSettings:
    """A server's settings with ``identity``'s pair from ``directory``, trusting ``ca``."""
    stem = directory / identity.file_stem()
    return TlsSettings(server_mode=mode, server_cert_path=f"{stem}.crt",
                       server_key_path=f"{stem}.key", server_trust_cert_path=str(ca),
                       server_need_client_auth=client_auth)


def client_tls(directory: Path, identity: Identity | None, ca: Path) -> TlsSettings:
    """A client's settings: ``identity``'s pair from ``directory`` (None: no certificate),
    servers checked against ``ca``."""
    if identity is None:
        return TlsSettings(client_enable=True, client_trust_cert_path=str(ca))
    stem = directory / identity.file_stem()
    return TlsSettings(client_enable=True, client_cert_path=f"{stem}.crt",
                       client_key_path=f"{stem}.key", client_trust_cert_path=str(ca))


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
