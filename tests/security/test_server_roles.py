"""Clients check the role a server's certificate names (issue 37, point 2), with real
name-server processes serving mutual TLS (``tls.server.mode=enforcing``, client
certificates required) from one cluster CA.

- an impostor name server (a real ``rmqha namesrv`` serving an application's certificate,
  ``rmqha:client/client``, from the cluster CA) is refused by rmqha's client before a
  request is written, the error naming ``rmqha:namesrv/<name>`` and what came; the same
  client gets the genuine name server's answer (negative control of the check), and a
  client that does not check roles (the old behaviour) takes the impostor's answer
  (negative control: the impostor would have been believed);
- an address dialled as a broker must show a broker certificate of the cluster and group
  the route named it with: a name server's certificate is refused naming
  ``rmqha:broker/...``; a broker certificate of group g1 is refused for a route naming
  g2 and taken for one naming g1;
- the CLI (``rmqha namesrv topics``-style requests) refuses the impostor with the same
  words;
- DELETE_TOPIC_IN_NAMESRV, a route change naming no broker, is refused with an
  application's certificate (NO_PERMISSION naming who may) and taken with an admin's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, NamesrvProc
from tls_pki import BROKER, CLIENT, NAMESRV, Pki, client_tls, config_keys, make_pki

from rmqha.client.route import ClientSession
from rmqha.errors import ClientError, ServerIdentityError, TopicNotFoundError
from rmqha.net.client_security import ClientSecurity, client_context
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.route import TopicRoute
from rmqha.security.identity import Identity
from rmqha.testing.tls_keys import process_tls

ADMIN = Identity.admin("admin")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _namesrv_as(c: Cluster, pki: Pki, identity: Identity) -> NamesrvProc:
    """A real name server serving mutual TLS with ``identity``'s certificate."""
    return c.start_namesrv(**config_keys(process_tls(pki.good, identity)))


def _security(pki: Pki, identity: Identity = CLIENT, *, checks_roles: bool = True) -> ClientSecurity:
    security = ClientSecurity.from_options(tls=client_tls(pki.good, identity))
    assert security is not None and security.checks_roles
    return dataclasses.replace(security, checks_roles=checks_roles)


def _route(session: ClientSession, topic: str = "T") -> Any:
    async def go() -> Any:
        try:
            return await session.route(topic)
        finally:
            await session.close()
    return asyncio.run(go())


def _request(session: ClientSession, addr: str, code: int, ext: dict[str, str] | None = None) -> RemotingCommand:
    async def go() -> RemotingCommand:
        try:
            return await session.request(addr, RemotingCommand.request(code, ext or {}))
        finally:
            await session.close()
    return asyncio.run(go())


def test_a_name_server_with_an_application_certificate_is_refused(tmp_path: Path, pki: Pki) -> None:
    with Cluster(tmp_path) as c:
        impostor = _namesrv_as(c, pki, CLIENT)
        genuine = _namesrv_as(c, pki, NAMESRV)
        with pytest.raises(ClientError) as refused:
            _route(ClientSession(impostor.address, security=_security(pki)))
        text = str(refused.value)
        assert "dialled as rmqha:namesrv/<name>" in text and str(CLIENT) in text, text
        # Negative controls: the genuine one answers; without the check the impostor does.
        with pytest.raises(TopicNotFoundError):
            _route(ClientSession(genuine.address, security=_security(pki)))
        with pytest.raises(TopicNotFoundError):
            _route(ClientSession(impostor.address, security=_security(pki, checks_roles=False)))


def test_a_broker_address_needs_a_broker_certificate_of_the_routed_group(tmp_path: Path, pki: Pki) -> None:
    with Cluster(tmp_path) as c:
        ns = _namesrv_as(c, pki, NAMESRV)
        as_broker = _namesrv_as(c, pki, BROKER)  # serves rmqha:broker/DefaultCluster/g1/g1-0
        code = RequestCode.GET_BROKER_CLUSTER_INFO
        # A name server's certificate at an address dialled as a broker.
        session = ClientSession("127.0.0.1:1", security=_security(pki))
        with pytest.raises(ServerIdentityError, match=r"dialled as rmqha:broker/<cluster>/<group>/<name>, "
                                                       r"but its certificate names rmqha:namesrv/ns0"):
            _request(session, ns.address, code)

        def routed(group: str) -> ClientSession:
            s = ClientSession("127.0.0.1:1", security=_security(pki))
            s.learn_brokers(TopicRoute.from_json("T", {"brokerDatas": [
                {"cluster": "DefaultCluster", "brokerName": group, "brokerAddrs": {"0": as_broker.address}}]}))
            return s

        with pytest.raises(ServerIdentityError, match=r"dialled as rmqha:broker/DefaultCluster/g2/<name>"):
            _request(routed("g2"), as_broker.address, code)
        # Negative control: the group the certificate names is taken.
        assert _request(routed("g1"), as_broker.address, code).code == ResponseCode.SUCCESS


def test_the_cli_refuses_an_impostor_name_server(tmp_path: Path, pki: Pki) -> None:
    tls = client_tls(pki.good, CLIENT)
    with Cluster(tmp_path) as c:
        impostor = _namesrv_as(c, pki, CLIENT)
        genuine = _namesrv_as(c, pki, NAMESRV)

        def clusters(addr: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "rmqha", "topic-list", "-n", addr, "--tls-ca", str(tls.client_trust_cert_path),
                 "--tls-cert", str(tls.client_cert_path), "--tls-key", str(tls.client_key_path)],
                capture_output=True, text=True, timeout=60)

        out = clusters(impostor.address)
        assert out.returncode != 0 and "dialled as rmqha:namesrv/<name>" in out.stdout + out.stderr, out
        genuine_out = clusters(genuine.address)  # negative control
        assert genuine_out.returncode == 0, genuine_out


def test_an_application_may_not_delete_a_topic_from_the_routes(tmp_path: Path, pki: Pki) -> None:
    with Cluster(tmp_path) as c:
        ns = _namesrv_as(c, pki, NAMESRV)
        ext = {"topic": "T"}
        app = _request(ClientSession(ns.address, security=_security(pki, CLIENT)),
                       ns.address, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext)
        assert app.code == ResponseCode.NO_PERMISSION, app
        assert str(CLIENT) in (app.remark or "") and "rmqha:admin/<name>" in (app.remark or ""), app.remark
        admin = _request(ClientSession(ns.address, security=_security(pki, ADMIN)),
                         ns.address, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext)
        assert admin.code == ResponseCode.SUCCESS, admin


def test_a_ready_ssl_context_checks_no_roles(pki: Pki) -> None:
    """Servers behind the system's CAs carry no rmqha identity: only a cluster CA makes
    clients check roles."""
    assert ClientSecurity.from_options(tls=True).checks_roles is False  # type: ignore[union-attr]
    context = client_context(client_tls(pki.good, CLIENT))
    assert ClientSecurity.from_options(tls=str(pki.ca)).checks_roles is True  # type: ignore[union-attr]
    assert context is not None
