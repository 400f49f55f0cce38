"""Everything a test or benchmark cluster needs to run with its security on, as ``deploy/`` runs it.

:meth:`SecureSetup.make` writes into a (temporary) directory:

- ``pki/``: the CA and one certificate per process, made by ``rmqha certs dev-cluster``
  (the command an operator runs) for one controller, one name server, the broker groups
  and the client;
- ``plain_acl.yml``: an admin account (the harness creates topics with it) and the
  benchmark's producer account, which holds PUB on the benchmark's topics and nothing
  else, so every send goes through the whole permission check.

Every process then serves ``tls.server.mode = enforcing`` with
``tls.server.need.client.auth = require`` and dials its own links over TLS with its
certificate; brokers check ACL 1.0 signatures (``aclEnable``); the client presents the
client certificate and signs every request.
"""
from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqha.net.client_security import ClientSecurity, Credentials, client_context
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import SIGNATURE_FIELD
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import TlsSettings
from rmqha.testing.tls_keys import client_tls, config_keys, process_tls

ADMIN_KEY = "bench-admin"
PRODUCER_KEY = "bench-producer"
CLIENT = Identity.client("client")
ADMIN = Identity.admin("admin")


@dataclass(frozen=True)
class SecureSetup:
    """Certificates, accounts and the settings of every process and client of one cluster."""

    pki: Path
    acl_file: Path
    cluster: str
    admin_secret: str
    producer_secret: str

    @classmethod
    def make(cls, directory: Path, *, cluster: str, groups: Mapping[str, int],
             topics: Iterable[str]) -> SecureSetup:
        directory.mkdir(parents=True, exist_ok=True)
        pki = directory / "pki"
        _dev_cluster(pki, cluster, groups)
        setup = cls(pki, directory / "plain_acl.yml", cluster,
                    secrets.token_hex(16), secrets.token_hex(16))
        setup.acl_file.write_text(setup.acl_text(topics))
        return setup

    def acl_text(self, topics: Iterable[str]) -> str:
        perms = ", ".join(f"{t}=PUB" for t in topics)
        return (f"accounts:\n"
                f"  - accessKey: {ADMIN_KEY}\n    secretKey: {self.admin_secret}\n    admin: true\n"
                f"  - accessKey: {PRODUCER_KEY}\n    secretKey: {self.producer_secret}\n"
                f"    defaultTopicPerm: DENY\n    defaultGroupPerm: DENY\n"
                f"    topicPerms: [{perms}]\n")

    @property
    def ca(self) -> str:
        return str(self.pki / certs.CA_CERT)

    def process_keys(self, identity: Identity) -> dict[str, Any]:
        """A controller's or name server's config: mutual TLS on its port and its links."""
        return config_keys(process_tls(self.pki, identity))

    def broker_keys(self, group: str, name: str) -> dict[str, Any]:
        """A broker's config: as every process, and ACL 1.0 on its client port."""
        keys = self.process_keys(Identity.broker(self.cluster, group, name))
        return {**keys, "acl_enable": True, "acl_file": str(self.acl_file)}

    def client_tls(self, identity: Identity = CLIENT) -> TlsSettings:
        return client_tls(self.pki, identity)

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments of the benchmark's Producer and BlockingProducer."""
        return {"access_key": PRODUCER_KEY, "secret_key": self.producer_secret,
                "tls": self.client_tls()}

    def harness_security(self) -> ClientSecurity:
        """The harness's own requests: the admin certificate, signed as the admin account
        (except those the cluster secret signs: nothing may be added to them after)."""
        admin = Credentials(ADMIN_KEY, self.admin_secret)

        def hook(cmd: RemotingCommand) -> None:
            if SIGNATURE_FIELD not in cmd.ext_fields:
                admin.sign(cmd)
        return ClientSecurity(client_context(self.client_tls(ADMIN)), hook)


def _dev_cluster(pki: Path, cluster: str, groups: Mapping[str, int]) -> None:
    """``rmqha certs dev-cluster`` for one controller, one name server and ``groups``."""
    cmd = [sys.executable, "-m", "rmqha", "certs", "dev-cluster", "--dir", str(pki),
           "--cluster", cluster, "--controllers", "1", "--namesrv", "1"]
    for group, size in groups.items():
        cmd += ["--groups", f"{group}:{size}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
