"""Controller clients check that the server's certificate names a controller (issue 37,
point 2 for the controllers), with real processes serving mutual TLS from one cluster CA.

- the genuine controller (``rmqha:controller/n0``) is taken by the controller client
  (the broker's and the CLI's, :class:`rmqha.controller.client.ControllerClient`);
- an address dialled as a controller that shows an application's certificate (a real
  ``rmqha namesrv`` serving ``rmqha:client/client``) or a name server's is refused before a
  request is written, the error naming ``rmqha:controller/<name>`` and what came; the
  CLI (``rmqha get-controller-metadata``) refuses it in the same words;
- negative control: the same client without role checks (the old behaviour) gets an
  answer from the impostor, so the check is what stops it.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cluster import Cluster
from tls_pki import CLIENT, CONTROLLER, NAMESRV, Pki, client_tls, config_keys, make_pki

from rmqha.controller.client import BlockingControllerClient
from rmqha.errors import ControllerError, ServerIdentityError
from rmqha.net.client_security import ClientSecurity
from rmqha.protocol.codes import RequestCode
from rmqha.security.identity import Identity
from rmqha.testing.tls_keys import process_tls

ADMIN = Identity.admin("admin")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("ctlroles")) as c:
        c.client_security = _security(pki)
        # Generous waits: a loaded two-core machine starts a process in tens of seconds.
        c.wait_controllers(c.start_controllers(1, wait=False, **config_keys(process_tls(pki.good, CONTROLLER))), 90)
        c.as_client = c.start_namesrv(wait=False, **config_keys(process_tls(pki.good, CLIENT)))
        c.as_namesrv = c.start_namesrv(wait=False, **config_keys(process_tls(pki.good, NAMESRV)))
        for ns in (c.as_client, c.as_namesrv):
            c.wait_for(lambda ns=ns: ns.listens(ns.address), 90, what=f"{ns.name} listening", process=ns)
        yield c


def _security(pki: Pki, *, checks_roles: bool = True) -> ClientSecurity:
    security = ClientSecurity.from_options(tls=client_tls(pki.good, ADMIN))
    assert security is not None and security.checks_roles
    return dataclasses.replace(security, checks_roles=checks_roles)


def test_the_genuine_controller_is_taken(live: Cluster, pki: Pki) -> None:
    with BlockingControllerClient(live.controller_addresses[0], security=_security(pki)) as client:
        meta = client.get_metadata()
    assert meta.leader_address, meta


@pytest.mark.parametrize(("impostor", "shown"), [("as_client", "rmqha:client/client"),
                                                  ("as_namesrv", "rmqha:namesrv/ns0")])
def test_another_role_at_a_controller_address_is_refused(live: Cluster, pki: Pki, impostor: str,
                                                         shown: str) -> None:
    address = getattr(live, impostor).address
    with BlockingControllerClient(address, security=_security(pki)) as client:
        with pytest.raises(ServerIdentityError, match=rf"dialled as rmqha:controller/<name>, but its "
                                                      rf"certificate names {shown}"):
            client.request_to(address, RequestCode.CONTROLLER_GET_METADATA_INFO)
        with pytest.raises(ControllerError, match=r"dialled as rmqha:controller/<name>"):
            client.get_metadata()
    # Negative control: without the check the impostor answers (whatever it says).
    with BlockingControllerClient(address, security=_security(pki, checks_roles=False)) as client:
        assert client.request_to(address, RequestCode.CONTROLLER_GET_METADATA_INFO).is_response


def test_the_cli_refuses_an_impostor_controller(live: Cluster, pki: Pki) -> None:
    tls = client_tls(pki.good, ADMIN)

    def metadata(addr: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rmqha", "get-controller-metadata", "-a", addr,
             "--tls-ca", str(tls.client_trust_cert_path), "--tls-cert", str(tls.client_cert_path),
             "--tls-key", str(tls.client_key_path)], capture_output=True, text=True, timeout=60)

    out = metadata(live.as_client.address)
    assert out.returncode != 0 and "dialled as rmqha:controller/<name>" in out.stdout + out.stderr, out
    genuine = metadata(live.controller_addresses[0])  # negative control
    assert genuine.returncode == 0, genuine
