"""The chaos suite with security on: mutual TLS on every remoting port and ACL on the brokers.

``RMQHA_CHAOS_SECURITY`` picks the mode of every chaos run (``make chaos`` sets
``tls-acl``; unset, the runs have the cluster secret only, as in ``make test``):

- ``tls-acl``: a CA and a certificate per process made with ``rmqha certs dev-cluster``
  (the command an operator runs); every controller, name server and broker port
  ``tls.server.mode=enforcing`` with ``tls.server.need.client.auth=require`` and its own
  links over TLS with its certificate, so each control request is checked against the
  identity its certificate names; every broker ``aclEnable`` with a ``plain_acl.yml``
  holding one application account (the producers and the tailing consumer: PUB and SUB
  on the checked topic, SUB for the consumer group, nothing else) and one admin account
  (the harness's probes and status samples, over the admin certificate).

The cluster secret stays on in both modes (control requests carry its proof too).
"""
from __future__ import annotations

import os
import secrets
import socket
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqha.net.client_security import ClientSecurity, Credentials, client_context, current
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import FrameDecoder, RemotingCommand, encode
from rmqha.protocol.request_auth import SIGNATURE_FIELD
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import TlsSettings
from rmqha.testing.tls_keys import client_tls, config_keys, process_tls

ENV = "RMQHA_CHAOS_SECURITY"
MODES = ("", "tls-acl")
APP_KEY = "chaos-app"
ADMIN_KEY = "chaos-admin"


def mode() -> str:
    """The mode asked for (ValueError naming the allowed ones for anything else)."""
    value = os.environ.get(ENV, "").strip()
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(repr(m) for m in MODES)}")
    return value


@dataclass(frozen=True)
class SecureCluster:
    """Certificates, accounts and the settings of every process and client of one run."""

    pki: Path
    acl_file: Path
    cluster: str
    app_secret: str
    admin_secret: str

    @classmethod
    def make(cls, directory: Path, *, cluster: str, group: str, brokers: int, controllers: int,
             topic: str, consumer_group: str) -> SecureCluster:
        directory.mkdir(parents=True, exist_ok=True)
        pki = directory / "pki"
        cmd = [sys.executable, "-m", "rmqha", "certs", "dev-cluster", "--dir", str(pki), "--cluster", cluster,
               "--controllers", str(controllers), "--namesrv", "1", "--groups", f"{group}:{brokers}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
        setup = cls(pki, directory / "plain_acl.yml", cluster, secrets.token_hex(16), secrets.token_hex(16))
        setup.acl_file.write_text(
            "accounts:\n"
            f"  - accessKey: {APP_KEY}\n    secretKey: {setup.app_secret}\n"
            "    defaultTopicPerm: DENY\n    defaultGroupPerm: DENY\n"
            f"    topicPerms: [{topic}=PUB|SUB]\n    groupPerms: [{consumer_group}=SUB]\n"
            f"  - accessKey: {ADMIN_KEY}\n    secretKey: {setup.admin_secret}\n    admin: true\n")
        return setup

    @property
    def ca(self) -> str:
        return str(self.pki / certs.CA_CERT)

    def process_keys(self, identity: Identity) -> dict[str, Any]:
        """A process's config: enforcing mutual TLS on its port, TLS with its pair on its links."""
        return config_keys(process_tls(self.pki, identity))

    def controller_keys(self, n: int) -> dict[int, dict[str, Any]]:
        return {i: self.process_keys(Identity.controller(f"n{i}")) for i in range(n)}

    def namesrv_keys(self) -> dict[str, Any]:
        return self.process_keys(Identity.namesrv("ns0"))

    def broker_keys(self, group: str, name: str) -> dict[str, Any]:
        return {**self.process_keys(Identity.broker(self.cluster, group, name)),
                "acl_enable": True, "acl_file": str(self.acl_file)}

    def _client_tls(self, identity: Identity) -> TlsSettings:
        return client_tls(self.pki, identity)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of the workload's producers and consumer."""
        return {"access_key": APP_KEY, "secret_key": self.app_secret,
                "tls": self._client_tls(Identity.client("client"))}

    def harness_security(self) -> ClientSecurity:
        """The harness's own requests: the admin certificate, signed as the admin account
        (except those the cluster secret signs: nothing may be added to them after)."""
        admin = Credentials(ADMIN_KEY, self.admin_secret)

        def hook(cmd: RemotingCommand) -> None:
            if SIGNATURE_FIELD not in cmd.ext_fields:
                admin.sign(cmd)
        return ClientSecurity(client_context(self._client_tls(Identity.admin("admin"))), hook)

    def check_enforced(self, broker_address: str, ha_address: str | None = None) -> list[str]:
        """What shows the run is not secured as it claims (empty: all hold): a plaintext
        request to a broker gets no answer, one over TLS without an account is refused by
        the ACL, and a plaintext slave's hello to the master's HA port (when given) gets
        not one byte back."""
        problems = []
        if ha_address is not None:
            answer = ha_plaintext_answer(ha_address)
            if answer:
                problems.append(f"a plaintext hello to the HA port {ha_address} got {len(answer)} "
                                f"bytes back: {answer[:16]!r}")
        plain = _ask(broker_address, None)
        if plain is not None:
            problems.append(f"a plaintext request to {broker_address} was answered: {plain}")
        tls = _ask(broker_address, current(client_context(self._client_tls(Identity.client("client")))))
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


def _ask(address: str, context: ssl.SSLContext | None) -> str | None:
    """GET_BROKER_HA_STATUS over a fresh socket: "code remark" of the answer, None when the
    connection closes (or fails its handshake) without one."""
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
