"""TLS through the proxy: RocketMQ 5's client over TLS to the gRPC port, the proxy over
mutual TLS to a cluster whose every remoting port enforces it.

The cluster (a controller, a name server, one broker) runs ``tls.server.mode=enforcing``
with ``tls.server.need.client.auth=require`` on every port; the proxy serves its gRPC port
``enforcing`` with a certificate of the cluster CA and reaches the name server and broker
with ``tls.enable`` and its own client certificate.  The official client (``tls_enable``;
it checks the server against grpc's default roots, pointed at the cluster CA with
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``) sends and receives through it.  Refused: a plaintext
client, a proxy whose certificate another CA signed, a proxy whose links are plaintext
(the cluster closes them), and, on a port that requires client certificates, a client
without one.  The unit tests cover the config rules and the certificate reload.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster import Cluster
from proxy_harness import closing, create_topic, message, receive_until
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from tls_pki import client_tls, config_keys, server_tls

from rmqha.errors import ConfigError
from rmqha.net.client_security import ClientSecurity, client_context
from rmqha.proxy.config import ProxyConfig, load_proxy_config
from rmqha.proxy.grpc_tls import PortCertificates
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings
from rmqha.testing import local_proxy
from rmqha.testing.local_proxy import ProxyProc

CLUSTER = "rmqha-test"
GROUP = "broker-a"
PROXY = Identity.client("proxy")


def _mtls_keys(pki: Path, identity: Identity) -> dict[str, Any]:
    """Enforcing mutual TLS on the process's port, TLS with its certificate on its links."""
    ca = pki / certs.CA_CERT
    keys = config_keys(server_tls(pki, identity, ca))
    keys.update({k: v for k, v in config_keys(client_tls(pki, identity, ca)).items()
                 if k.startswith("tls_client") or k == "tls_enable"})
    return keys


def _grpc_port_keys(pki: Path, ca: Path, auth: ClientAuth = ClientAuth.NONE) -> dict[str, Any]:
    keys = config_keys(server_tls(pki, PROXY, ca, client_auth=auth))
    return {k: v for k, v in keys.items() if k.startswith("tls_server")}


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The cluster's CA (with a certificate for the proxy) and a foreign one."""
    base = Path(tmp_path_factory.mktemp("pki"))
    good, foreign = base / "good", base / "foreign"
    for d in (good, foreign):
        certs.dev_cluster(d, cluster=CLUSTER, controllers=1, groups={GROUP: 1}, namesrv=1)
        certs.issue(d, PROXY, ips=["127.0.0.1"], dns=["localhost"])
    # grpc reads its default roots once per process: the official client trusts the cluster CA.
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(good / certs.CA_CERT)
    return good, foreign


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, pkis: tuple[Path, Path]) -> Any:
    pki, _ = pkis
    base = Path(tmp_path_factory.mktemp("tls-cluster"))
    with Cluster(base, cluster_name=CLUSTER) as c:
        c.client_security = ClientSecurity(client_context(
            client_tls(pki, Identity.admin("admin"), pki / certs.CA_CERT)))
        c.start_controllers(1, **_mtls_keys(pki, Identity.controller("n0")))
        c.start_namesrv(**_mtls_keys(pki, Identity.namesrv("ns0")))
        broker = c.start_broker(GROUP, **_mtls_keys(pki, Identity.broker(CLUSTER, GROUP, f"{GROUP}-0")))
        c.wait_role(broker, "master", 30)
        create_topic(c, "tls_topic")
        yield c


def _proxy(cluster: Cluster, **keys: Any) -> ProxyProc:
    return local_proxy.start_proxy(cluster, log_level="DEBUG", rpc_timeout_ms=2000,
                                   min_invisible_time_mills_for_recv=1000,
                                   grpc_client_consumer_min_long_polling_timeout_millis=1000, **keys)


def _client_config(proxy: ProxyProc) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(proxy.address, Credentials(), request_timeout=5)


def _start_producer(proxy: ProxyProc, tls: bool) -> Any:
    from rocketmq import Producer

    p = Producer(_client_config(proxy), ["tls_topic"], tls_enable=tls)
    p.startup()
    return p


def _send_refused(proxy: ProxyProc, tls: bool) -> str:
    """What becomes of one send (the client's startup only logs a route it cannot get)."""
    from rocketmq import Producer

    p = Producer(_client_config(proxy), ["tls_topic"], tls_enable=tls)
    p.startup()
    try:
        p.send(message("tls_topic", b"should not arrive"))
    except Exception as exc:  # noqa: BLE001 - the client raises plain Exception
        return f"refused: {exc}"
    finally:
        p.shutdown()
    return "sent"


def test_official_client_over_tls_through_mtls_cluster(tls_cluster: Cluster, pkis: tuple[Path, Path]) -> None:
    from rocketmq import FilterExpression, SimpleConsumer

    pki, _ = pkis
    proxy = _proxy(tls_cluster, **{**_mtls_keys(pki, PROXY), **_grpc_port_keys(pki, pki / certs.CA_CERT)})
    producer = _start_producer(proxy, tls=True)
    consumer = SimpleConsumer(_client_config(proxy), "g_tls", {"tls_topic": FilterExpression()},
                              await_duration=2, tls_enable=True)
    consumer.startup()
    with closing(producer, consumer):
        receipt = producer.send(message("tls_topic", b"over TLS twice"))
        got = receive_until(consumer, lambda ms: len(ms) >= 1)
    assert receipt.message_id
    assert [m.body for m in got] == [b"over TLS twice"]
    assert _send_refused(proxy, tls=False).startswith("refused"), "plaintext client admitted"
    assert _query_route(proxy, None) == "refused: StatusCode.UNAVAILABLE"
    assert _query_route(proxy, grpc.ssl_channel_credentials(_ca(pki))).startswith("OK")
    proxy.stop()


def test_proxy_with_plaintext_links_cannot_reach_a_tls_cluster(tls_cluster: Cluster,
                                                               pkis: tuple[Path, Path]) -> None:
    """Negative control of the links: the same proxy without ``tls.enable`` gets no route."""
    pki, _ = pkis
    proxy = _proxy(tls_cluster, **_grpc_port_keys(pki, pki / certs.CA_CERT))
    assert _send_refused(proxy, tls=True).startswith("refused")
    # The client got through to the proxy; the proxy did not get through to the cluster.
    answer = _query_route(proxy, grpc.ssl_channel_credentials(_ca(pki)))
    assert answer.startswith("INTERNAL_SERVER_ERROR") and "no name server answered" in answer, answer
    proxy.stop()


def test_client_refuses_a_certificate_of_another_ca(tls_cluster: Cluster, pkis: tuple[Path, Path]) -> None:
    pki, foreign = pkis
    keys = {**_mtls_keys(pki, PROXY), **_grpc_port_keys(foreign, pki / certs.CA_CERT)}
    proxy = _proxy(tls_cluster, **keys)
    assert _send_refused(proxy, tls=True).startswith("refused")
    assert _query_route(proxy, grpc.ssl_channel_credentials(_ca(pki))) == "refused: StatusCode.UNAVAILABLE"
    # Positive control: a client trusting the other CA is served by the same proxy.
    assert _query_route(proxy, grpc.ssl_channel_credentials(_ca(foreign))).startswith("OK")
    proxy.stop()


def _ca(pki: Path) -> bytes:
    return (pki / certs.CA_CERT).read_bytes()


def _query_route(proxy: ProxyProc, credentials: grpc.ChannelCredentials | None) -> str:
    """One raw QueryRoute: its status code's name, or how the call failed (None: plaintext)."""
    request = spb.QueryRouteRequest(topic=pb.Resource(name="tls_topic"))
    with (grpc.insecure_channel(proxy.address) if credentials is None
          else grpc.secure_channel(proxy.address, credentials)) as channel:
        try:
            resp = MessagingServiceStub(channel).QueryRoute(
                request, metadata=[("x-mq-client-id", "raw-tls")], timeout=10)
        except grpc.RpcError as exc:
            return f"refused: {exc.code()}"
    return f"{pb.Code.Name(resp.status.code)} {resp.status.message}".strip()


def test_port_requiring_client_certificates(tls_cluster: Cluster, pkis: tuple[Path, Path]) -> None:
    pki, foreign = pkis
    keys = {**_mtls_keys(pki, PROXY),
            **_grpc_port_keys(pki, pki / certs.CA_CERT, ClientAuth.REQUIRE)}
    proxy = _proxy(tls_cluster, **keys)
    ca = _ca(pki)

    def pair(d: Path) -> tuple[bytes, bytes]:
        stem = d / Identity.client("client").file_stem()
        return (Path(f"{stem}.key").read_bytes(), Path(f"{stem}.crt").read_bytes())

    assert _query_route(proxy, grpc.ssl_channel_credentials(ca, *pair(pki))).startswith("OK")
    assert _query_route(proxy, grpc.ssl_channel_credentials(ca)).startswith("refused")
    assert _query_route(proxy, grpc.ssl_channel_credentials(ca, *pair(foreign))).startswith("refused")
    proxy.stop()


def test_renewed_certificate_served_without_restart(tls_cluster: Cluster, pkis: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """The port's files replaced (here by a pair of the other CA): new connections get the
    new certificate, old trust no longer works."""
    pki, foreign = pkis
    stem = PROXY.file_stem()
    for suffix in (".crt", ".key"):
        (tmp_path / f"{stem}{suffix}").write_bytes((pki / f"{stem}{suffix}").read_bytes())
    proxy = _proxy(tls_cluster, **{**_mtls_keys(pki, PROXY),
                                   **_grpc_port_keys(tmp_path, pki / certs.CA_CERT)})
    assert _query_route(proxy, grpc.ssl_channel_credentials(_ca(pki))).startswith("OK")
    for suffix in (".key", ".crt"):
        (tmp_path / f"{stem}{suffix}.new").write_bytes((foreign / f"{stem}{suffix}").read_bytes())
        (tmp_path / f"{stem}{suffix}.new").replace(tmp_path / f"{stem}{suffix}")
    tls_cluster.wait_for(lambda: _query_route(proxy, grpc.ssl_channel_credentials(
        _ca(foreign))).startswith("OK"), 15, what="the renewed certificate served")
    assert _query_route(proxy, grpc.ssl_channel_credentials(_ca(pki))) == "refused: StatusCode.UNAVAILABLE"
    assert proxy.log_contains("TLS certificate re-read")
    proxy.stop()


# --- config and reload, no processes -----------------------------------------------------


def test_permissive_and_missing_files_are_refused(tmp_path: Path, pkis: tuple[Path, Path]) -> None:
    pki, _ = pkis
    good = {k: v for k, v in _grpc_port_keys(pki, pki / certs.CA_CERT).items()}
    assert load_proxy_config(None, namesrv_addr="a:1", **good).tls.server_mode is TlsMode.ENFORCING
    with pytest.raises(ConfigError, match="permissive is not possible"):
        load_proxy_config(None, namesrv_addr="a:1", **{**good, "tls_server_mode": "permissive"})
    with pytest.raises(ConfigError, match="tls.server.certPath"):
        load_proxy_config(None, namesrv_addr="a:1", tls_server_mode="enforcing")
    path = tmp_path / "tls.properties"
    path.write_text("tls.server.mode=enforcing\ntls.server.certPath=/nonexistent.crt\n"
                    f"tls.server.keyPath={good['tls_server_key_path']}\n")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_proxy_config(None, namesrv_addr="a:1", tls_config_file=str(path))
    assert ProxyConfig(namesrv_addr="a:1").tls.server_mode is TlsMode.DISABLED


def test_certificates_reread_when_files_change(tmp_path: Path, pkis: tuple[Path, Path]) -> None:
    pki, _ = pkis
    d = tmp_path / "port"
    d.mkdir()
    for name in (certs.CA_CERT, certs.CA_KEY):
        (d / name).write_bytes((pki / name).read_bytes())
    issued = certs.issue(d, PROXY, ips=["127.0.0.1"])
    s = TlsSettings(server_mode=TlsMode.ENFORCING, server_cert_path=str(issued.cert_path),
                    server_key_path=str(issued.key_path))
    port = PortCertificates(s, recheck_interval_s=0.0)
    port.credentials()
    assert port.fetch() is None and port.generation == 0  # nothing changed
    time.sleep(0.01)
    certs.issue(d, PROXY, ips=["127.0.0.1"])  # renewed: a new key and certificate
    assert port.fetch() is not None and port.generation == 1
    issued.key_path.write_text("not a key\n")  # half-written renewal: keep the previous pair
    assert port.fetch() is None and port.generation == 1
