"""rmqha's clients against a name server and broker whose ports enforce TLS with client
certificates (``tls.server.mode=enforcing``, ``tls.server.need.client.auth=require``).

The name server and broker run in the test's loop on real sockets (the broker is the
messaging tests' :class:`LocalBroker`, its client port a TLS :class:`RemotingServer`);
``Producer`` / ``Consumer`` / ``BlockingProducer`` and the ``rmqha send`` command connect
with ``tls=``.  Each refusal (plaintext, a foreign CA, an expired certificate) is shown
next to the same operation succeeding with the cluster's certificate, and a permissive
pair serves a plaintext and a TLS producer alike.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_messaging import LocalBroker, consume, run
from tls_pki import (
    BROKER,
    CLIENT,
    NAMESRV,
    Pki,
    client_tls,
    config_keys,
    make_pki,
    server_tls,
)

from rmqha.client import BlockingProducer, Message, Producer, SendStatus
from rmqha.client.blocking_link import BlockingLink
from rmqha.errors import ClientError, RemotingError, RemotingTimeoutError
from rmqha.namesrv.config import NamesrvConfig
from rmqha.namesrv.server import NameServer
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, client_context
from rmqha.net.server import RemotingServer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings, server_context
from rmqha.security.tls import client_context as ssl_client_context
from rmqha.testing.local_cluster import free_port

TOPIC = "TopicTls"
#: Refused sends give up fast (a refusal is final here; retrying only costs time).
FAST_FAIL = {"retry_deadline_s": 2.0, "max_attempts": 2, "send_timeout_s": 2.0}


#: The broker test_messaging's LocalBroker registers as (cluster "c"): the name server
#: takes a registration only from the broker its certificate names.
LINK_BROKER = Identity.broker("c", "broker-a", "broker-a-0")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    made = make_pki(tmp_path_factory.mktemp("pki"))
    certs.issue(made.good, LINK_BROKER, ips=["127.0.0.1"])
    return made


class TlsEnv:
    """A name server and a broker with the same TLS mode, the broker registered over TLS."""

    def __init__(self, base: Path, pki: Pki, mode: TlsMode = TlsMode.ENFORCING) -> None:
        auth = ClientAuth.REQUIRE if mode is TlsMode.ENFORCING else ClientAuth.OPTIONAL
        self.base, self.pki, self.mode, self.auth = base, pki, mode, auth
        self.ns: NameServer | None = None
        self.broker: LocalBroker | None = None

    async def __aenter__(self) -> TlsEnv:
        ns_tls = server_tls(self.pki.good, NAMESRV, self.pki.ca, mode=self.mode, client_auth=self.auth)
        self.ns = NameServer(NamesrvConfig(listen_port=free_port(), drop_on_disconnect=False,
                                           **config_keys(ns_tls)))
        await self.ns.start()
        links = ClientSecurity(client_context(client_tls(self.pki.good, LINK_BROKER, self.pki.ca)))
        # The broker serves the certificate of the group it registers as: clients take a
        # broker only with a certificate of the group its route names.
        self.broker = LocalBroker(self.base, "broker-a", self.ns.address, links=links,
                                  tls=server_tls(self.pki.good, LINK_BROKER, self.pki.ca,
                                                 mode=self.mode, client_auth=self.auth))
        await self.broker.start()
        await self.request(self.broker.address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6})
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.broker is not None:
            await self.broker.stop()
        if self.ns is not None:
            await self.ns.stop()

    @property
    def namesrv(self) -> str:
        assert self.ns is not None
        return self.ns.address

    def client(self, directory: Path | None = None) -> TlsSettings:
        """The client identity's settings from ``directory`` (default: the good one)."""
        return client_tls(directory or self.pki.good, CLIENT, self.pki.ca)

    async def request(self, addr: str, code: int, ext: dict[str, Any],
                      tls: TlsSettings | None | bool = True) -> RemotingCommand:
        settings = self.client() if tls is True else tls or None
        security = ClientSecurity(client_context(settings)) if settings else None
        async with RemotingClient(addr, security=security) as c:
            return (await c.request(RemotingCommand.request(code, ext), 5)).check_success(code)


async def _send(env: TlsEnv, tls: Any, body: bytes = b"x") -> str:
    """SEND_OK, or what the producer raised."""
    try:
        async with Producer(env.namesrv, tls=tls, **FAST_FAIL) as p:
            return (await p.send(TOPIC, Message(body))).status.value
    except (ClientError, RemotingError) as exc:
        return f"failed: {exc}"


def test_producer_and_consumer_with_the_right_certificates(pki: Pki, tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        async with TlsEnv(tmp_path, pki) as env:
            good = env.client()
            out = {"good": await _send(env, good, b"over tls")}
            out["after good"] = env.broker.log.max_offset
            out |= {"plaintext": await _send(env, None),
                   "foreign": await _send(env, env.client(pki.foreign)),
                   "expired": await _send(env, env.client(pki.expired)),
                   "no certificate": await _send(env, client_tls(pki.good, None, pki.ca))}
            try:  # the broker itself, not only the name server, refuses plaintext
                await env.request(env.broker.address, RequestCode.GET_BROKER_HA_STATUS, {},
                                  tls=None)
                out["broker plaintext"] = "answered"
            except RemotingError as exc:
                out["broker plaintext"] = f"failed: {exc}"
            # Measured before consuming: a consumer's committed offset is itself a record.
            out["stored"] = env.broker.log.max_offset
            got = await consume(env.namesrv, "g-tls", TOPIC, 1, tls=good)
            out["consumed"] = [m.body for m in got]
            return out

    out = run(main())
    assert out["good"] == SendStatus.SEND_OK.value, out["good"]
    for case in ("plaintext", "foreign", "expired", "no certificate", "broker plaintext"):
        assert out[case].startswith("failed: "), (case, out[case])
    assert out["consumed"] == [b"over tls"]
    # The refused sends stored nothing: the log ends where the one good send left it.
    assert out["after good"] > 0 and out["stored"] == out["after good"], (out["after good"], out["stored"])


def test_permissive_pair_serves_plaintext_and_tls_clients(pki: Pki, tmp_path: Path) -> None:
    async def main() -> list[str]:
        async with TlsEnv(tmp_path, pki, TlsMode.PERMISSIVE) as env:
            return [await _send(env, env.client()), await _send(env, None),
                    await _send(env, client_tls(pki.good, None, pki.ca))]

    assert run(main()) == [SendStatus.SEND_OK.value] * 3


def test_blocking_producer_sends_over_tls_on_its_blocking_links(pki: Pki, tmp_path: Path) -> None:
    """The second send of a thread goes over a blocking socket (the route is cached):
    that path speaks TLS too."""
    async def main() -> list[str]:
        async with TlsEnv(tmp_path, pki) as env:
            loop = asyncio.get_running_loop()

            def send_three() -> tuple[list[str], int]:
                with BlockingProducer(env.namesrv, tls=env.client(), **FAST_FAIL) as p:
                    statuses = [p.send(TOPIC, Message(b"b%d" % i)).status.value for i in range(3)]
                    # The thread's own blocking links: the send path this test is about.
                    mine = getattr(p._loop._local, "mine", None)
                    return statuses, len(mine.links) if mine else 0
            statuses, links = await loop.run_in_executor(None, send_three)
            return statuses + [f"links={links}"]

    assert run(main()) == [SendStatus.SEND_OK.value] * 3 + ["links=1"]


def _cli_send(namesrv: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rmqha", "send", "-n", namesrv, "-t", TOPIC,
                           "--timeout", "2", "--retry-deadline-s", "2", *flags, "from the cli"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_send_with_tls_flags(pki: Pki, tmp_path: Path) -> None:
    cert = pki.good / CLIENT.file_stem()
    flags = ["--tls-ca", str(pki.ca), "--tls-cert", f"{cert}.crt", "--tls-key", f"{cert}.key"]

    async def main() -> tuple[Any, Any, Any]:
        async with TlsEnv(tmp_path, pki) as env:
            loop = asyncio.get_running_loop()
            good = await loop.run_in_executor(None, _cli_send, env.namesrv, *flags)
            plain = await loop.run_in_executor(None, _cli_send, env.namesrv)
            half = await loop.run_in_executor(None, _cli_send, env.namesrv, "--tls-cert", f"{cert}.crt")
            return good, plain, half

    good, plain, half = run(main())
    assert good.returncode == 0 and "SEND_OK" in good.stdout, good.stderr[-2000:]
    assert plain.returncode != 0 and "SEND_OK" not in plain.stdout
    assert half.returncode != 0 and "--tls-cert needs --tls-key and --tls-ca" in half.stderr


def test_blocking_link_over_tls_keeps_its_deadline(pki: Pki) -> None:
    """A TLS server that never answers: the link gives up at its deadline (an SSL read
    would retry a kernel receive timeout forever, so TLS links time out differently)."""
    async def never(cmd: RemotingCommand, conn: Any) -> None:
        await asyncio.Event().wait()

    async def main() -> tuple[str, float, str]:
        tls = server_tls(pki.good, BROKER, pki.ca)
        security = ClientSecurity(client_context(client_tls(pki.good, CLIENT, pki.ca)))
        async with RemotingServer("127.0.0.1", 0, {RequestCode.GET_BROKER_HA_STATUS: never,
                                                   RequestCode.GET_BROKER_EPOCH_CACHE: _ok},
                                  tls=tls) as server:
            def ask() -> tuple[str, float, str]:
                with BlockingLink(server.address, security=security) as link:
                    ok = link.request(RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE), 5)
                    start = time.monotonic()
                    try:
                        link.request(RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 1.0)
                        outcome = "answered"
                    except RemotingTimeoutError:
                        outcome = "timed out"
                    return outcome, time.monotonic() - start, str(ok.remark)
            return await asyncio.get_running_loop().run_in_executor(None, ask)

    outcome, took, ok = run(main())
    assert ok == str(CLIENT)  # the control: the link works over TLS
    assert outcome == "timed out" and 0.9 <= took < 3.0, (outcome, took)


def test_blocking_link_over_tls_gives_up_a_write_the_peer_does_not_read(pki: Pki) -> None:
    """A TLS peer that completes its handshake and then reads nothing: a request too big
    for the socket buffers times out at its deadline (the write's kernel timeout ends it,
    as a read's does) and closes the link; the control, a small request to a peer that
    answers nothing, times out on its read."""
    server_ctx = server_context(server_tls(pki.good, BROKER, pki.ca))
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[ssl.SSLSocket] = []

    def accept() -> None:
        for _ in range(2):
            conn, _addr = listener.accept()
            accepted.append(server_ctx.wrap_socket(conn, server_side=True))  # then never reads

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    security = ClientSecurity(client_context(client_tls(pki.good, CLIENT, pki.ca)))
    addr = "127.0.0.1:%d" % listener.getsockname()[1]
    outcomes: list[tuple[str, float]] = []
    try:
        with BlockingLink(addr, security=security) as link:
            for body in (b"x" * (64 << 20), b"small"):
                start = time.monotonic()
                try:
                    link.request(RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS,
                                                         body=body), 1.0)
                    outcomes.append(("answered", time.monotonic() - start))
                except RemotingTimeoutError:
                    outcomes.append(("timed out", time.monotonic() - start))
                assert not link.connected
    finally:
        thread.join(10)
        listener.close()
        for conn in accepted:
            conn.close()
    assert [o for o, _ in outcomes] == ["timed out", "timed out"], outcomes
    assert all(0.9 <= took < 3.0 for _, took in outcomes), outcomes


def test_blocking_link_handshake_checks_certificates_and_keeps_its_deadline(pki: Pki) -> None:
    """The blocking link's handshake (its TLS in memory): the cluster's certificates get an
    answer naming the client; a server the CA did not sign, and no client certificate, are
    refused; a peer that never answers the handshake times out at the request's deadline."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never speaks

    def outcome(addr: str, tls: TlsSettings, timeout: float = 5.0) -> tuple[str, float]:
        start = time.monotonic()
        with BlockingLink(addr, security=ClientSecurity(client_context(tls))) as link:
            try:
                got = link.request(RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE),
                                   timeout)
                return f"answered {got.remark}", time.monotonic() - start
            except RemotingTimeoutError as exc:
                return f"timed out: {exc}", time.monotonic() - start
            except RemotingError as exc:
                return f"refused: {exc}", time.monotonic() - start

    async def main() -> dict[str, tuple[str, float]]:
        tls = server_tls(pki.good, BROKER, pki.ca)
        async with RemotingServer("127.0.0.1", 0, {RequestCode.GET_BROKER_EPOCH_CACHE: _ok},
                                  tls=tls) as server:
            cases = {"good": client_tls(pki.good, CLIENT, pki.ca),
                     "foreign CA": client_tls(pki.foreign, CLIENT),
                     "no certificate": client_tls(pki.good, None, pki.ca)}
            loop = asyncio.get_running_loop()
            out = {name: await loop.run_in_executor(None, outcome, server.address, settings)
                   for name, settings in cases.items()}
            out["silent"] = await loop.run_in_executor(
                None, outcome, "127.0.0.1:%d" % silent.getsockname()[1], cases["good"], 1.0)
            return out

    try:
        out = run(main())
    finally:
        silent.close()
    assert out["good"][0] == f"answered {CLIENT}", out
    assert out["foreign CA"][0].startswith("refused: TLS handshake with"), out
    assert "certificate verify failed" in out["foreign CA"][0], out
    assert out["no certificate"][0].startswith("refused: "), out
    assert out["silent"][0].startswith("timed out: TLS handshake with 127.0.0.1:"), out
    assert 0.9 <= out["silent"][1] < 3.0, out


async def _ok(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, str(conn.peer_identity))


def _get(url: str, context: ssl.SSLContext | None) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, ConnectionError, ssl.SSLError) as exc:
        return f"failed: {exc}"


def test_status_page_over_https(pki: Pki) -> None:
    """``https_enable``: the status page takes HTTPS with the name server's certificate
    (client certificates as the remoting port asks), and plain HTTP no longer."""
    tls = server_tls(pki.good, NAMESRV, pki.ca)
    port = free_port()

    async def main() -> list[str]:
        ns = NameServer(NamesrvConfig(listen_port=free_port(), status_port=port, https_enable=True,
                                      **config_keys(tls)))
        await ns.start()
        try:
            loop = asyncio.get_running_loop()
            url = f"https://127.0.0.1:{port}/status.json"
            with_cert = ssl_client_context(client_tls(pki.good, CLIENT, pki.ca))
            without = ssl_client_context(client_tls(pki.good, None, pki.ca))
            return [await loop.run_in_executor(None, _get, url, with_cert),
                    await loop.run_in_executor(None, _get, url, without),
                    await loop.run_in_executor(None, _get, url.replace("https", "http"), None)]
        finally:
            await ns.stop()

    good, no_cert, plain = run(main())
    assert good.startswith("{") and "groups" in good, good[:300]
    assert no_cert.startswith("failed") and plain.startswith("failed")
