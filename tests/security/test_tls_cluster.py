"""A whole cluster over mutual TLS, as real processes on 127.0.0.1: a controller, a name
server and a broker group of two, every remoting port ``tls.server.mode=enforcing`` with
``tls.server.need.client.auth=require``, every process's own links ``tls.enable`` with
its certificate (made with ``rmqha certs dev-cluster``).

The group only gets a master and a slave if the brokers reach the controller over TLS
and the controller's answers come back; the name server is configured through a RocketMQ
``tls.properties`` file (``tls.config.file``).  A producer and a consumer with the
client's certificate then move a message, ``/metrics`` answers over HTTPS only, and a
plaintext connection to each port is closed without an answer.
"""
from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, free_port
from tls_pki import client_tls, config_keys, server_tls

from rmqha.client import BlockingConsumer, BlockingProducer, Message, SendStatus
from rmqha.errors import RemotingError, RemotingTimeoutError
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, client_context
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import client_context as ssl_client_context

CLUSTER = "rmqha-test"
GROUP = "broker-a"


def _identity_keys(pki: Path, identity: Identity) -> dict[str, Any]:
    """A process's config: enforcing mTLS on its port, TLS with its certificate on its links."""
    ca = pki / certs.CA_CERT
    server = server_tls(pki, identity, ca)
    client = client_tls(pki, identity, ca)
    keys = config_keys(server)
    keys.update({k: v for k, v in config_keys(client).items() if k.startswith("tls_client") or k == "tls_enable"})
    return keys


def _tls_properties(pki: Path, identity: Identity) -> Path:
    """RocketMQ's tls.properties for ``identity`` (the keys as RocketMQ spells them)."""
    stem, ca = pki / identity.file_stem(), pki / certs.CA_CERT
    path = pki / f"{identity.file_stem()}.tls.properties"
    path.write_text("\n".join([
        "# RocketMQ's TlsSystemConfig keys", "tls.server.mode=enforcing",
        "tls.server.need.client.auth=require", f"tls.server.certPath={stem}.crt",
        f"tls.server.keyPath={stem}.key", f"tls.server.trustCertPath={ca}", "tls.enable=true",
        f"tls.client.certPath={stem}.crt", f"tls.client.keyPath={stem}.key",
        f"tls.client.trustCertPath={ca}", "tls.client.authServer=true"]) + "\n")
    return path


def _plaintext_answer(loop: EventLoopThread, addr: str) -> str:
    async def ask() -> str:
        async with RemotingClient(addr, connect_timeout=3) as c:
            resp = await c.request(RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 3)
            return f"answered {resp.code}"
    try:
        return str(loop.run(ask(), 10))
    except RemotingTimeoutError as exc:
        # Silence is not a refusal: a TLS port shuts a plaintext peer out at once.
        return f"timed out: {exc}"
    except RemotingError as exc:
        return f"refused: {exc}"


def _https_get(url: str, context: ssl.SSLContext | None) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, ConnectionError, ssl.SSLError) as exc:
        return f"failed: {exc}"


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    d = tmp_path / "pki"
    certs.dev_cluster(d, cluster=CLUSTER, controllers=1, groups={GROUP: 2}, namesrv=1)
    return d


def test_cluster_over_mutual_tls(tmp_path: Path, pki: Path) -> None:
    admin = client_tls(pki, Identity.admin("admin"), pki / certs.CA_CERT)
    client = client_tls(pki, Identity.client("client"), pki / certs.CA_CERT)
    metrics_port = free_port()
    with Cluster(tmp_path / "cluster", cluster_name=CLUSTER) as c:
        c.client_security = ClientSecurity(client_context(admin))
        c.start_controllers(1, **_identity_keys(pki, Identity.controller("n0")))
        ns = c.start_namesrv(tls_config_file=str(_tls_properties(pki, Identity.namesrv("ns0"))))
        brokers = [c.start_broker(GROUP, **_identity_keys(pki, Identity.broker(CLUSTER, GROUP, f"{GROUP}-{i}")),
                                  **({"metrics_port": metrics_port, "https_enable": True} if i == 0 else {}))
                   for i in range(2)]
        c.wait_role(brokers[0], "master", 30)
        c.wait_role(brokers[1], "slave", 30)
        c.wait_for(lambda: c.route("TBW102") is not None, 30, what="the master registered over TLS")

        with BlockingProducer(ns.address, tls=client, retry_deadline_s=20) as p:
            sent = p.send("TopicTls", Message(b"through mTLS"))
        assert sent.status is SendStatus.SEND_OK
        with BlockingConsumer(ns.address, "g-tls", "TopicTls", tls=client) as consumer:
            got = c.wait_for(lambda: consumer.poll(0.5), 30, what="the message consumed")
        assert [m.body for m in got] == [b"through mTLS"]

        url = f"https://127.0.0.1:{metrics_port}/metrics"
        metrics = _https_get(url, ssl_client_context(client))
        assert "rmqha_" in metrics, metrics[:500]
        assert _https_get(url, None).startswith("failed")  # no client certificate (and no CA)
        assert _https_get(url.replace("https", "http"), None).startswith("failed")

        loop = EventLoopThread("plaintext-probe")
        try:
            for addr in [c.controller_addresses[0], ns.address, brokers[0].address]:
                assert _plaintext_answer(loop, addr).startswith("refused: "), addr
        finally:
            loop.stop()
