"""Everything a cluster on this machine needs to run with its security on, as ``deploy/`` runs it.

One setup for the chaos suite's secure mode (``make chaos``), the security cost benchmark
and ``rmqha demo``.  :meth:`SecureSetup.make` writes into a directory:

- ``pki/``: the CA, a ``cluster.secret`` and one certificate per process, made by
  :func:`rmqha.security.certs.dev_cluster` (the code behind ``rmqha certs dev-cluster``,
  the command an operator runs) for the controllers ``n0``.., one name server ``ns0``,
  the brokers ``<group>-<i>`` of each group, a client ``client`` and an operator ``admin``;
- ``plain_acl.yml``: an admin account (the harness's own requests, topic creation) and one
  application account that holds exactly what it was made with (:class:`Account`: PUB,
  SUB or both per topic, SUB on its consumer groups) and DENY for everything else, so
  every request of the workload goes through the whole permission check.

Every process then serves ``tls.server.mode = enforcing`` with
``tls.server.need.client.auth = require`` and dials its own links over TLS with its
certificate (a broker's HA links too: mutual TLS); brokers check ACL 1.0 signatures
(``aclEnable``); the application presents the client certificate and signs every request.
:meth:`SecureSetup.check_enforced` shows a running broker is secured as claimed.
"""
from __future__ import annotations

import json
import secrets
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqha.net.client_security import ClientSecurity, Credentials, client_context, current
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import FrameDecoder, RemotingCommand, encode
from rmqha.protocol.request_auth import SIGNATURE_FIELD
from rmqha.security.identity import Identity
from rmqha.security.tls import TlsSettings
from rmqha.testing.tls_keys import client_tls, config_keys, process_tls

CLIENT = Identity.client("client")
ADMIN = Identity.admin("admin")


@dataclass(frozen=True)
class Account:
    """One account of ``plain_acl.yml``: an admin, or an application with ``topics``
    (topic -> ``PUB``, ``SUB`` or ``PUB|SUB``) and SUB on ``groups``, DENY elsewhere."""

    access_key: str
    secret_key: str = field(repr=False)
    topics: Mapping[str, str] = field(default_factory=dict)
    groups: tuple[str, ...] = ()
    admin: bool = False

    @classmethod
    def new(cls, access_key: str, *, topics: Mapping[str, str] | None = None,
            groups: Sequence[str] = (), admin: bool = False) -> Account:
        """An account with a fresh random secret key."""
        return cls(access_key, secrets.token_hex(16), dict(topics or {}), tuple(groups), admin)

    def entry(self) -> str:
        """Its item of the file's ``accounts`` list."""
        head = f"  - accessKey: {self.access_key}\n    secretKey: {self.secret_key}\n"
        if self.admin:
            return head + "    admin: true\n"
        # Quoted: a name may start with a character YAML reserves (RocketMQ's %DLQ%<group>).
        topics = ", ".join(json.dumps(f"{topic}={perm}") for topic, perm in self.topics.items())
        groups = ", ".join(json.dumps(f"{group}=SUB") for group in self.groups)
        return (head + "    defaultTopicPerm: DENY\n    defaultGroupPerm: DENY\n"
                + f"    topicPerms: [{topics}]\n" + (f"    groupPerms: [{groups}]\n" if groups else ""))

    def options(self) -> dict[str, str]:
        """The ``access_key`` / ``secret_key`` keyword arguments of rmqha's clients."""
        return {"access_key": self.access_key, "secret_key": self.secret_key}


@dataclass(frozen=True)
class SecureSetup:
    """Certificates, accounts and the settings of every process and client of one cluster."""

    pki: Path
    acl_file: Path
    cluster: str
    app: Account
    admin: Account

    @classmethod
    def make(cls, directory: Path, *, cluster: str, groups: Mapping[str, int], app: Account,
             controllers: int = 1, admin_key: str = "cluster-admin") -> SecureSetup:
        directory.mkdir(parents=True, exist_ok=True)
        pki = directory / "pki"
        # Imported here: certs loads cryptography, and `rmqha`'s parser imports the demo.
        from rmqha.security import certs
        certs.dev_cluster(pki, cluster=cluster, controllers=controllers, groups=groups, namesrv=1)
        setup = cls(pki, directory / "plain_acl.yml", cluster, app, Account.new(admin_key, admin=True))
        setup.acl_file.write_text(setup.acl_text())
        return setup

    def issue(self, identity: Identity, *, ips: Sequence[str] = (), dns: Sequence[str] = ()) -> None:
        """A certificate from this setup's CA for one more process (the demo's proxy)."""
        from rmqha.security import certs  # (see make)
        certs.issue(self.pki, identity, ips=list(ips), dns=list(dns))

    def acl_text(self) -> str:
        return "accounts:\n" + self.admin.entry() + self.app.entry()

    @property
    def ca(self) -> str:
        from rmqha.security.certs import CA_CERT  # (see make)
        return str(self.pki / CA_CERT)

    @property
    def cluster_secret(self) -> str:
        """The secret ``dev_cluster`` wrote beside the certificates."""
        from rmqha.security.certs import SECRET_FILE  # (see make)
        return (self.pki / SECRET_FILE).read_text(encoding="utf-8").strip()

    def process_keys(self, identity: Identity) -> dict[str, Any]:
        """A process's config: enforcing mutual TLS on its port, TLS with its pair on its links."""
        return config_keys(process_tls(self.pki, identity))

    def controller_keys(self, n: int) -> dict[int, dict[str, Any]]:
        """Controller node i -> its keys (``Cluster.add_controllers``'s ``per_node``)."""
        return {i: self.process_keys(Identity.controller(f"n{i}")) for i in range(n)}

    def namesrv_keys(self) -> dict[str, Any]:
        return self.process_keys(Identity.namesrv("ns0"))

    def broker_keys(self, group: str, name: str) -> dict[str, Any]:
        """A broker's config: as every process, and ACL 1.0 on its client port."""
        keys = self.process_keys(Identity.broker(self.cluster, group, name))
        return {**keys, "acl_enable": True, "acl_file": str(self.acl_file)}

    def client_tls(self, identity: Identity = CLIENT) -> TlsSettings:
        return client_tls(self.pki, identity)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of the application's producers and consumers."""
        return {**self.app.options(), "tls": self.client_tls()}

    def admin_options(self) -> dict[str, Any]:
        """Keyword arguments of an operator's tools (``TopicAdmin``): the admin account over
        the admin certificate."""
        return {**self.admin.options(), "tls": self.client_tls(ADMIN)}

    def harness_security(self) -> ClientSecurity:
        """The harness's own requests: the admin certificate, signed as the admin account
        (except those the cluster secret signs: nothing may be added to them after)."""
        admin = Credentials(self.admin.access_key, self.admin.secret_key)

        def hook(cmd: RemotingCommand) -> None:
            if SIGNATURE_FIELD not in cmd.ext_fields:
                admin.sign(cmd)
        return ClientSecurity(client_context(self.client_tls(ADMIN)), hook)

    def check_enforced(self, broker_address: str, ha_address: str | None = None) -> list[str]:
        """What shows the broker is not secured as claimed (empty: all holds): a plaintext
        request gets no answer, one over TLS without an account is refused by the ACL,
        and a plaintext slave's hello to the master's HA port (when given) gets not one
        byte back."""
        problems = []
        if ha_address is not None:
            answer = ha_plaintext_answer(ha_address)
            if answer:
                problems.append(f"a plaintext hello to the HA port {ha_address} got {len(answer)} "
                                f"bytes back: {answer[:16]!r}")
        plain = ask_status(broker_address, None)
        if plain is not None:
            problems.append(f"a plaintext request to {broker_address} was answered: {plain}")
        tls = ask_status(broker_address, current(client_context(self.client_tls())))
        if tls is None or "AccessKey" not in tls:
            problems.append(f"a request without an account to {broker_address} was not refused by "
                            f"the ACL: {tls}")
        return problems


def ha_plaintext_answer(address: str) -> bytes:
    """What an HA port sends a plaintext peer that says it is a slave at offset 0 (the
    rocketmq dialect's 16-byte report), until it closes or is silent for 2 s."""
    host, _, port = address.rpartition(":")
    got = b""
    try:
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            sock.sendall(bytes(16))
            while data := sock.recv(65536):
                got += data
    except OSError:
        pass  # a reset or the silence's timeout: what came before it is the answer
    return got


def ask_status(address: str, context: ssl.SSLContext | None) -> str | None:
    """GET_BROKER_HA_STATUS, unsigned, over a fresh socket (TLS with ``context``): "code
    remark" of the answer, None when the connection closes (or fails its handshake)
    without one."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            sock = context.wrap_socket(raw) if context is not None else raw
            sock.sendall(encode(RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS)))
            decoder = FrameDecoder()
            while True:
                data = sock.recv(65536)
                if not data:
                    return None
                for cmd in decoder.feed(data):
                    return f"{cmd.code} {cmd.remark}"
    except (OSError, ssl.SSLError):
        return None
