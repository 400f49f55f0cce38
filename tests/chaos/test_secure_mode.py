"""The chaos suite's security mode: its self-check fires on a port that is not secured.

:meth:`rmqha.testing.secure_setup.SecureSetup.check_enforced` runs at the start of every
``RMQHA_CHAOS_SECURITY=tls-acl`` run (``make chaos``); here, against servers in this
process, it must find nothing wrong with a port enforcing mutual TLS behind the ACL and
must fire for a plaintext port and for a TLS port without the ACL (its negative controls).
"""
from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from secure_mode import mode, secure_cluster

from rmqha.broker.acl_guard import acl_guard
from rmqha.net.loop import EventLoopThread
from rmqha.net.server import RemotingServer
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security.tls import TlsSettings
from rmqha.testing.secure_setup import SecureSetup, ha_plaintext_answer


async def _ok(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
    return cmd.response()


def _problems(setup: SecureSetup, tls: TlsSettings | None, acl: bool) -> list[str]:
    loop = EventLoopThread("secure-mode-test")

    async def serve() -> RemotingServer:
        server = RemotingServer("127.0.0.1", 0, {RequestCode.GET_BROKER_HA_STATUS: _ok}, tls=tls)
        if acl:
            server.dispatcher.guard = acl_guard(setup.acl_file)
        await server.start()
        return server

    try:
        server = loop.run(serve(), 10)
        try:
            return setup.check_enforced(server.address)
        finally:
            loop.run(server.stop(), 10)
    finally:
        loop.stop()


@pytest.mark.slow  # runs where the check does (make chaos); rmqha certs costs seconds
def test_check_enforced_passes_mtls_with_acl_and_fires_without(tmp_path: Path) -> None:
    setup = secure_cluster(tmp_path, cluster="c", group="g", brokers=1, controllers=1, topic="t",
                           consumer_group="cg")
    keys = setup.broker_keys("g", "g-0")
    tls = TlsSettings.from_properties({"tls.server.mode": keys["tls_server_mode"],
                                       "tls.server.certPath": keys["tls_server_cert_path"],
                                       "tls.server.keyPath": keys["tls_server_key_path"],
                                       "tls.server.trustCertPath": keys["tls_server_trust_cert_path"],
                                       "tls.server.need.client.auth": keys["tls_server_need_client_auth"]})
    assert _problems(setup, tls, acl=True) == []
    plaintext = _problems(setup, None, acl=True)
    assert any("plaintext request" in p for p in plaintext), plaintext
    no_acl = _problems(setup, tls, acl=False)
    assert any("not refused by the ACL" in p for p in no_acl), no_acl


def test_mode_names_the_allowed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQHA_CHAOS_SECURITY", "tls")
    with pytest.raises(ValueError, match="'tls-acl'"):
        mode()
    monkeypatch.setenv("RMQHA_CHAOS_SECURITY", "tls-acl")
    assert mode() == "tls-acl"


def _one_shot_server(reply: bytes) -> tuple[str, threading.Thread]:
    """A loopback port whose first connection is answered with ``reply`` and closed."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(16)
                if reply:
                    conn.sendall(reply)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return address, thread


def test_ha_probe_fires_on_a_port_that_answers_plaintext() -> None:
    answered, t1 = _one_shot_server(b"\x00" * 12)  # what a plaintext HA master sends back
    refused, t2 = _one_shot_server(b"")  # a TLS-only port closes on a plaintext hello
    assert ha_plaintext_answer(answered) == b"\x00" * 12
    assert ha_plaintext_answer(refused) == b""
    for t in (t1, t2):
        t.join(5)
