"""TLS on the remoting layer: :class:`RemotingServer` with ``tls.server.*`` settings and
:class:`RemotingClient` with a :class:`ClientSecurity`, over real sockets on 127.0.0.1,
on both event loops.

The server's handler answers with the identity it sees on the connection
(``conn.peer_identity``), so each test shows both that a request got through and who the
server took the peer for.  Every refusal has its negative control in the same test: the
same server answers a client that differs only in the one thing refused.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from needs import unavailable
from tls_pki import (
    BROKER,
    CLIENT,
    CONTROLLER,
    NAMESRV,
    Pki,
    client_tls,
    make_pki,
    server_tls,
)

from rmqha.errors import ConfigError, RemotingError
from rmqha.net import loop as event_loop
from rmqha.net.blocking import BlockingRemotingClient
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, client_context
from rmqha.net.connection import Connection
from rmqha.net.server import RemotingServer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security import certs
from rmqha.security.identity import Role
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings

PING = RequestCode.GET_BROKER_HA_STATUS


@pytest.fixture(autouse=True, params=[k.value for k in event_loop.LoopKind])
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "uvloop" and event_loop._uvloop is None:
        unavailable("uvloop (a dependency on this platform) is not installed")
    monkeypatch.setenv(event_loop.ENV, request.param)
    return str(request.param)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def _who(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    """Who the server sees: the certificate's identity, or how the connection came."""
    seen = str(conn.peer_identity) if conn.peer_identity else ("tls" if conn.tls else "plaintext")
    return cmd.response(ResponseCode.SUCCESS, seen)


async def _ask(addr: str, tls: TlsSettings | None) -> str:
    """The server's remark for one request, or ``refused: <why>``."""
    security = ClientSecurity(client_context(tls)) if tls is not None else None
    try:
        async with RemotingClient(addr, connect_timeout=5, security=security) as c:
            resp = await c.request(RemotingCommand.request(PING), 5)
            return str(resp.remark)
    except RemotingError as exc:
        return f"refused: {exc}"


def _serve(tls: TlsSettings | None, body: Callable[[RemotingServer], Awaitable[Any]],
           handler: Any = _who) -> Any:
    async def main() -> Any:
        async with RemotingServer("127.0.0.1", 0, {PING: handler}, tls=tls) as server:
            return await body(server)
    return event_loop.run(asyncio.wait_for(main(), 60))


def test_enforcing_with_client_auth_takes_only_good_certificates(
        pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    """With TLS 1.3 a client learns only that the server closed; the server's log says why."""
    caplog.set_level(logging.INFO, logger="rmqha.net.server")
    tls = server_tls(pki.good, BROKER, pki.ca)

    async def body(server: RemotingServer) -> dict[str, str]:
        return {
            "good": await _ask(server.address, client_tls(pki.good, CLIENT, pki.ca)),
            "plaintext": await _ask(server.address, None),
            "no cert": await _ask(server.address, client_tls(pki.good, None, pki.ca)),
            "foreign CA": await _ask(server.address, client_tls(pki.foreign, CLIENT, pki.ca)),
            "expired": await _ask(server.address, client_tls(pki.expired, CLIENT, pki.ca)),
            "good again": await _ask(server.address, client_tls(pki.good, CLIENT, pki.ca)),
        }

    seen = _serve(tls, body)
    assert seen["good"] == seen["good again"] == str(CLIENT)
    for case in ("plaintext", "no cert", "foreign CA", "expired"):
        assert seen[case].startswith("refused: "), (case, seen[case])
    for why in ("a plaintext connection arrived, but this port enforces TLS",
                "peer did not return a certificate", "certificate verify failed",
                "certificate has expired"):
        assert why in caplog.text, why


def test_client_refuses_a_server_with_a_foreign_or_expired_certificate(pki: Pki) -> None:
    client = client_tls(pki.good, CLIENT, pki.ca)
    answers = {}
    for name, directory in (("good", pki.good), ("foreign", pki.foreign), ("expired", pki.expired)):
        tls = server_tls(directory, BROKER, pki.ca)
        answers[name] = _serve(tls, lambda server: _ask(server.address, client))
    assert answers["good"] == str(CLIENT)
    assert "certificate verify failed" in answers["foreign"]
    assert "certificate has expired" in answers["expired"]


def test_both_sides_know_the_peer_identity(pki: Pki) -> None:
    tls = server_tls(pki.good, BROKER, pki.ca)
    security = ClientSecurity(client_context(client_tls(pki.good, CONTROLLER, pki.ca)))

    async def body(server: RemotingServer) -> tuple[str, Any, Any]:
        async with RemotingClient(server.address, security=security) as c:
            resp = await c.request(RemotingCommand.request(PING), 5)
            conn = await c.connection()
            return str(resp.remark), conn.peer_identity, conn.tls

    remark, server_seen_by_client, tls_on = _serve(tls, body)
    assert remark == str(CONTROLLER) and server_seen_by_client == BROKER and tls_on


def test_permissive_serves_tls_and_plaintext_on_one_port(pki: Pki) -> None:
    tls = server_tls(pki.good, BROKER, pki.ca, mode=TlsMode.PERMISSIVE,
                     client_auth=ClientAuth.OPTIONAL)

    async def body(server: RemotingServer) -> list[str]:
        return [await _ask(server.address, client_tls(pki.good, CLIENT, pki.ca)),
                await _ask(server.address, None),
                await _ask(server.address, client_tls(pki.good, None, pki.ca))]

    assert _serve(tls, body) == [str(CLIENT), "plaintext", "tls"]


def test_disabled_server_takes_plaintext_only(pki: Pki) -> None:
    async def body(server: RemotingServer) -> list[str]:
        return [await _ask(server.address, None),
                await _ask(server.address, client_tls(pki.good, CLIENT, pki.ca))]

    plain, tls = _serve(TlsSettings(), body)
    assert plain == "plaintext" and tls.startswith("refused: ")


def test_require_peer_refuses_other_roles_with_no_permission(pki: Pki) -> None:
    async def brokers_only(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, str(conn.require_peer(roles={Role.BROKER})))

    tls = server_tls(pki.good, CONTROLLER, pki.ca, mode=TlsMode.PERMISSIVE,
                     client_auth=ClientAuth.OPTIONAL)

    async def code(addr: str, client: TlsSettings | None) -> tuple[int, str]:
        security = ClientSecurity(client_context(client)) if client else None
        async with RemotingClient(addr, security=security) as c:
            resp = await c.request(RemotingCommand.request(PING), 5)
            return resp.code, str(resp.remark)

    async def body(server: RemotingServer) -> list[tuple[int, str]]:
        return [await code(server.address, client_tls(pki.good, BROKER, pki.ca)),
                await code(server.address, client_tls(pki.good, CLIENT, pki.ca)),
                await code(server.address, None)]

    broker, client, plain = _serve(tls, body, brokers_only)
    assert broker == (ResponseCode.SUCCESS, str(BROKER))
    assert client[0] == plain[0] == ResponseCode.NO_PERMISSION
    assert "only broker may connect" in client[1] and "no verified certificate" in plain[1]


def _replace(src: Path, dst: Path) -> None:
    """Copy ``src`` over ``dst`` the way a renewal does: a new file renamed into place."""
    tmp = dst.with_name(dst.name + ".new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def test_renewed_server_files_serve_new_connections(pki: Pki, tmp_path: Path) -> None:
    """The server's certificate, key and trust file are replaced while it runs: a new
    connection gets the new certificate and the new trust, without a restart."""
    cert, key, trust = tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "trust.pem"
    shutil.copyfile(pki.good / f"{CONTROLLER.file_stem()}.crt", cert)
    shutil.copyfile(pki.good / f"{CONTROLLER.file_stem()}.key", key)
    shutil.copyfile(pki.foreign / certs.CA_CERT, trust)  # at first only the foreign CA
    tls = TlsSettings(server_mode=TlsMode.ENFORCING, server_cert_path=str(cert),
                      server_key_path=str(key), server_trust_cert_path=str(trust),
                      server_need_client_auth=ClientAuth.REQUIRE)
    client = client_tls(pki.good, CLIENT, pki.ca)

    async def server_name(addr: str) -> Any:
        async with RemotingClient(addr, security=ClientSecurity(client_context(client))) as c:
            await c.request(RemotingCommand.request(PING), 5)
            return (await c.connection()).peer_identity

    async def body(server: RemotingServer) -> tuple[str, Any]:
        before = await _ask(server.address, client)
        _replace(pki.good / f"{NAMESRV.file_stem()}.crt", cert)
        _replace(pki.good / f"{NAMESRV.file_stem()}.key", key)
        _replace(pki.ca, trust)
        deadline = asyncio.get_running_loop().time() + 15
        seen: Any = None
        while asyncio.get_running_loop().time() < deadline:
            try:
                seen = await server_name(server.address)
            except RemotingError:
                seen = None
            if seen == NAMESRV:
                break
            await asyncio.sleep(0.2)
        return before, seen

    before, after = _serve(tls, body)
    assert before.startswith("refused: ")  # the good client's CA was not trusted yet
    assert after == NAMESRV


def test_blocking_client_over_tls(pki: Pki) -> None:
    tls = server_tls(pki.good, BROKER, pki.ca)
    security = ClientSecurity(client_context(client_tls(pki.good, CLIENT, pki.ca)))

    async def body(server: RemotingServer) -> list[str]:
        def blocking(sec: ClientSecurity | None) -> str:
            try:
                with BlockingRemotingClient(server.address, security=sec) as c:
                    return str(c.request(RemotingCommand.request(PING), 5).remark)
            except RemotingError as exc:
                return f"refused: {exc}"
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(None, blocking, security),
                await loop.run_in_executor(None, blocking, None)]

    good, plain = _serve(tls, body)
    assert good == str(CLIENT) and plain.startswith("refused: ")


def test_server_tls_needs_its_files() -> None:
    with pytest.raises(ConfigError, match="tls.server.certPath is not set"):
        RemotingServer("127.0.0.1", 0, tls=TlsSettings(server_mode=TlsMode.ENFORCING))
    # Disabled needs nothing (the control: the settings alone are not the error).
    assert RemotingServer("127.0.0.1", 0, tls=TlsSettings()).tls_context is None
