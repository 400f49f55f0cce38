"""TLS contexts, certificates naming identities, reload and one-port TLS/plaintext, with
real handshakes between asyncio servers and clients on 127.0.0.1."""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rmqha.errors import AuthenticationError, ConfigError
from rmqha.security import certs
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import (
    ClientAuth,
    ConnectionKind,
    ReloadingContext,
    TlsMode,
    TlsSettings,
    accept_connection,
    classify_first_byte,
    client_context,
    peer_identity,
    require_peer,
    server_context,
)

T = TypeVar("T")
CONTROLLER = Identity.controller("n0")
BROKER = Identity.broker("DefaultCluster", "g1", "g1-0")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    certs.dev_cluster(d, controllers=1, groups={"g1": 1}, namesrv=1)
    return d


def _settings(d: Path, stem: str, ca: Path | None = None,
              client_auth: ClientAuth = ClientAuth.REQUIRE) -> TlsSettings:
    trust = str(ca or d / certs.CA_CERT)
    return TlsSettings(server_mode=TlsMode.ENFORCING, server_need_client_auth=client_auth,
                       client_enable=True).for_identity_files(
        str(d / f"{stem}.crt"), str(d / f"{stem}.key"), trust)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _echo_identity(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    ssl_object = writer.get_extra_info("ssl_object")
    try:
        peer = str(require_peer(ssl_object, roles={Role.BROKER}, group="g1"))
    except AuthenticationError as exc:
        peer = f"refused: {exc}"
    writer.write(peer.encode() + b"\n")
    await writer.drain()
    writer.close()


async def _exchange(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                    handler: Handler = _echo_identity) -> tuple[Identity, str]:
    """Connect once; the server's identity as the client saw it, and the server's line."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_ctx), 10)
        seen = peer_identity(writer.get_extra_info("ssl_object"))
        line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return seen, line.decode().strip()
    finally:
        server.close()
        await server.wait_closed()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))


# --- certificates ------------------------------------------------------------------------


def test_certificates_name_their_identity_and_addresses(pki: Path) -> None:
    cert = certs.read_cert(pki / "broker-DefaultCluster-g1-g1-0.crt")
    assert certs.cert_identity(cert) == BROKER
    from cryptography import x509
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert (pki / certs.CA_KEY).stat().st_mode & 0o777 == 0o600
    assert (pki / "controller-n0.key").stat().st_mode & 0o777 == 0o600
    assert (pki / certs.SECRET_FILE).stat().st_mode & 0o777 == 0o600


def test_ca_is_never_replaced_and_identities_never_mixed(pki: Path, tmp_path: Path) -> None:
    before = (pki / certs.CA_KEY).read_bytes()
    with pytest.raises(ConfigError, match="already exists"):
        certs.init_ca(pki)
    assert (pki / certs.CA_KEY).read_bytes() == before
    with pytest.raises(ConfigError, match="belongs to another identity"):
        certs.issue(pki, Identity.controller("n9"), stem="controller-n0")
    with pytest.raises(ConfigError, match="run `rmqha certs init"):
        certs.issue(tmp_path, CONTROLLER)


# --- handshakes --------------------------------------------------------------------------


def test_right_ca_and_identities_are_accepted(pki: Path) -> None:
    server = server_context(_settings(pki, "controller-n0"))
    client = client_context(_settings(pki, "broker-DefaultCluster-g1-g1-0"))
    seen, line = _run(_exchange(server, client))
    assert seen == CONTROLLER and line == str(BROKER)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2 == client.minimum_version


def test_wrong_identity_is_refused_after_the_handshake(pki: Path) -> None:
    server = server_context(_settings(pki, "controller-n0"))
    client = client_context(_settings(pki, "client-client"))  # a client, not a g1 broker
    seen, line = _run(_exchange(server, client))
    assert seen == CONTROLLER
    assert line == "refused: peer is rmqha:client/client; only broker may connect here"


async def _server_side_error(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> str:
    """Why the server refused one connection (the client side only sees it closed)."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    context = ReloadingContext(lambda: server_ctx, [])
    try:
        connect = asyncio.ensure_future(asyncio.open_connection("127.0.0.1", port, ssl=client_ctx))
        sock, _ = await loop.sock_accept(listener)
        try:
            await accept_connection(sock, asyncio.Protocol, TlsMode.ENFORCING, context, timeout=5)
        except ssl.SSLError as exc:
            return str(exc)
        finally:
            connect.cancel()
        return "accepted"
    finally:
        listener.close()


def _expect_refused(server: ssl.SSLContext, client: ssl.SSLContext, reason: str) -> None:
    """The client's connection fails; ``reason`` is in the error of whichever side refused."""
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)) as info:
        _, line = _run(_exchange(server, client))
        if not line:
            raise ConnectionError("the server closed the connection")
    if isinstance(info.value, ssl.SSLError):
        assert reason in str(info.value)
    else:
        assert reason in str(_run(_server_side_error(server, client)))


def test_expired_certificates_are_refused(pki: Path, tmp_path: Path) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    for f in (certs.CA_CERT, certs.CA_KEY):
        (tmp_path / f).write_bytes((pki / f).read_bytes())
    certs.issue(tmp_path, BROKER, days=1, now=old)
    certs.issue(tmp_path, CONTROLLER, days=1, now=old)
    good_server = server_context(_settings(pki, "controller-n0"))
    good_client = client_context(_settings(pki, "broker-DefaultCluster-g1-g1-0"))
    expired_server = server_context(_settings(tmp_path, "controller-n0"))
    expired_client = client_context(_settings(tmp_path, "broker-DefaultCluster-g1-g1-0"))
    _expect_refused(expired_server, good_client, "certificate has expired")
    _expect_refused(good_server, expired_client, "certificate has expired")


def test_certificates_of_another_ca_are_refused(pki: Path, tmp_path: Path) -> None:
    certs.dev_cluster(tmp_path, controllers=1, groups={"g1": 1}, namesrv=0)
    good_server = server_context(_settings(pki, "controller-n0"))
    good_client = client_context(_settings(pki, "broker-DefaultCluster-g1-g1-0"))
    foreign_server = server_context(_settings(tmp_path, "controller-n0", ca=pki / certs.CA_CERT))
    foreign_client = client_context(_settings(tmp_path, "broker-DefaultCluster-g1-g1-0",
                                              ca=pki / certs.CA_CERT))
    _expect_refused(foreign_server, good_client, "certificate verify failed")
    _expect_refused(good_server, foreign_client, "certificate verify failed")


def test_client_without_certificate_is_refused_when_required(pki: Path) -> None:
    server = server_context(_settings(pki, "controller-n0"))
    bare = TlsSettings(client_enable=True, client_trust_cert_path=str(pki / certs.CA_CERT))
    _expect_refused(server, client_context(bare), "peer did not return a certificate")
    optional = server_context(_settings(pki, "controller-n0", client_auth=ClientAuth.OPTIONAL))
    _, line = _run(_exchange(optional, client_context(bare)))
    assert line == "refused: the TLS peer presented no verified certificate"


# --- reload and one port for both ----------------------------------------------------


class _Greeter(asyncio.Protocol):
    """Says which kind of connection it is and, over TLS, who the peer is."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        ssl_object = transport.get_extra_info("ssl_object")
        who = str(peer_identity(ssl_object)) if ssl_object else "plaintext"
        transport.write(who.encode() + b"\n")
        transport.close()


async def _one_port(mode: TlsMode, context: ReloadingContext | None,
                    clients: list[ssl.SSLContext | None]) -> list[str]:
    """A raw accept loop on one port; each client connects in turn and reads one line."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    refusals: list[str] = []

    async def serve() -> None:
        while True:
            sock, _ = await loop.sock_accept(listener)
            try:
                await accept_connection(sock, _Greeter, mode, context, timeout=5)
            except (AuthenticationError, ssl.SSLError, ConnectionError) as exc:
                refusals.append(str(exc))

    task = asyncio.ensure_future(serve())
    answers = []
    try:
        for client in clients:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
                if client is None:
                    writer.write(b"\x00\x00\x00\x10")  # a remoting frame opens with its length
                line = await asyncio.wait_for(reader.readline(), 5)
                answers.append(line.decode().strip() or "closed")
                writer.close()
            except (ssl.SSLError, ConnectionError) as exc:
                answers.append(f"failed: {type(exc).__name__}")
    finally:
        task.cancel()
        listener.close()
    return answers + refusals


def test_permissive_port_serves_tls_and_plaintext(pki: Path) -> None:
    ctx = ReloadingContext.server(_settings(pki, "controller-n0"))
    client = client_context(_settings(pki, "broker-DefaultCluster-g1-g1-0"))
    answers = _run(_one_port(TlsMode.PERMISSIVE, ctx, [client, None, client]))
    assert answers == [str(BROKER), "plaintext", str(BROKER)]


def test_enforcing_port_closes_plaintext_and_disabled_port_closes_tls(pki: Path) -> None:
    ctx = ReloadingContext.server(_settings(pki, "controller-n0"))
    client = client_context(_settings(pki, "broker-DefaultCluster-g1-g1-0"))
    enforcing = _run(_one_port(TlsMode.ENFORCING, ctx, [None, client]))
    assert enforcing[0].startswith(("closed", "failed"))  # a reset when the byte was unread
    assert enforcing[1:] == [str(BROKER), "a plaintext connection arrived, but this port enforces TLS"]
    disabled = _run(_one_port(TlsMode.DISABLED, None, [client, None]))
    assert disabled[1] == "plaintext" and disabled[0].startswith(("closed", "failed"))
    assert disabled[2] == "a TLS handshake arrived, but TLS is disabled on this port"


def test_first_byte_rules() -> None:
    assert classify_first_byte(b"\x16\x03\x01", TlsMode.PERMISSIVE) is ConnectionKind.TLS
    assert classify_first_byte(b"\x00", TlsMode.PERMISSIVE) is ConnectionKind.PLAINTEXT
    assert classify_first_byte(b"\x16", TlsMode.ENFORCING) is ConnectionKind.TLS
    assert classify_first_byte(b"\x00", TlsMode.DISABLED) is ConnectionKind.PLAINTEXT
    with pytest.raises(AuthenticationError, match="closed the connection"):
        classify_first_byte(b"", TlsMode.PERMISSIVE)


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_reloaded_certificate_serves_the_next_connection(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for f in (certs.CA_CERT, certs.CA_KEY):
        (tmp_path / f).write_bytes((pki / f).read_bytes())
    first = certs.read_cert(certs.issue(tmp_path, CONTROLLER, stem="server").cert_path).serial_number
    ctx = ReloadingContext.server(_settings(tmp_path, "server"), recheck_interval_s=0)
    port = 0
    client = client_context(_settings(pki, "broker-DefaultCluster-g1-g1-0"))

    async def serial() -> int:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        serial = writer.get_extra_info("ssl_object").getpeercert()["serialNumber"]
        writer.close()
        return int(serial, 16)

    async def main() -> list[int]:
        nonlocal port
        # Each accepted connection takes ctx.get(), so a reload serves the next one.
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]

        async def accept() -> None:
            while True:
                sock, _ = await loop.sock_accept(listener)
                try:
                    await accept_connection(sock, asyncio.Protocol, TlsMode.ENFORCING, ctx)
                except (ssl.SSLError, ConnectionError):
                    pass

        task = asyncio.ensure_future(accept())
        try:
            serials = [await serial()]
            renewed = certs.issue(tmp_path, CONTROLLER, stem="server")
            _bump(renewed.cert_path)
            serials.append(await serial())
            # A half-written key: the rebuild fails and the previous context stays.
            renewed.key_path.write_text("not a key")
            _bump(renewed.key_path)
            serials.append(await serial())
            return serials
        finally:
            task.cancel()
            listener.close()

    caplog.set_level(logging.ERROR, logger="rmqha.security.tls")
    serials = _run(main())
    assert serials[0] == first and serials[1] != first and serials[2] == serials[1]
    assert ctx.generation == 1 and "keeping the previous one" in caplog.text


# --- settings ----------------------------------------------------------------------------


def test_settings_from_rocketmq_keys(pki: Path) -> None:
    props = {"tls.server.mode": "enforcing", "tls.server.need.client.auth": "require",
             "tls.server.certPath": "/c.pem", "tls.server.keyPath": "/k.pem",
             "tls.server.trustCertPath": "/ca.pem", "tls.server.authClient": "true",
             "tls.enable": "true", "tls.client.authServer": "true",
             "tls.client.trustCertPath": "/ca.pem", "brokerName": "ignored"}
    s = TlsSettings.from_properties(props, "broker.conf")
    assert s.server_mode is TlsMode.ENFORCING and s.server_need_client_auth is ClientAuth.REQUIRE
    assert s.client_enable and s.client_auth_server and s.server_cert_path == "/c.pem"
    assert TlsSettings.from_properties({}).server_mode is TlsMode.DISABLED


@pytest.mark.parametrize("props, message", [
    ({"tls.server.mode": "strict"}, "tls.server.mode='strict' in f: expected one of disabled"),
    ({"tls.server.need.client.auth": "always"}, "expected one of none, optional, require"),
    ({"tls.client.authserver": "true"}, "unknown TLS key 'tls.client.authserver'"),
    ({"tls.enable": "yes"}, "tls.enable='yes' in f: expected true or false"),
    ({"tls.test.mode.enable": "true"}, "rmqha has no TLS test mode"),
])
def test_bad_settings_name_the_key(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        TlsSettings.from_properties(props, "f")


def test_missing_or_bad_files_name_the_key(pki: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls.server.certPath is not set"):
        server_context(TlsSettings(server_mode=TlsMode.ENFORCING))
    with pytest.raises(ConfigError, match="tls.client.trustCertPath is not set"):
        client_context(TlsSettings(client_enable=True))
    bad = _settings(pki, "controller-n0", ca=tmp_path / "missing-ca.pem")
    with pytest.raises(ConfigError, match="tls.server.trustCertPath=.*missing-ca.pem cannot be loaded"):
        server_context(bad)
    mixed = TlsSettings(server_cert_path=str(pki / "controller-n0.crt"),
                        server_key_path=str(pki / "client-client.key"))
    with pytest.raises(ConfigError, match="cannot be loaded"):
        server_context(mixed)
