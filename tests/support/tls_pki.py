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
from rmqha.testing.tls_keys import client_tls, config_keys, server_tls

__all__ = ["BROKER", "CLIENT", "CONTROLLER", "NAMESRV", "Pki", "client_tls", "config_keys",
           "make_pki", "server_tls"]

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
