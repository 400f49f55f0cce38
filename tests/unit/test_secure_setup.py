"""``rmqha.testing.secure_setup``: the certificates and accounts the demo, the chaos suite's
secure mode and the security cost bench run with.  Every process named gets its own pair,
and the application account holds what it was made with and is refused the rest."""
from __future__ import annotations

from pathlib import Path

import pytest

from rmqha.errors import AclPermissionError
from rmqha.protocol.codes import RequestCode
from rmqha.security.acl import AclConfig, check_request
from rmqha.security.certs import cert_identity, read_cert
from rmqha.security.identity import Identity
from rmqha.security.signature import sign
from rmqha.testing.secure_setup import Account, SecureSetup


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> SecureSetup:
    # %DLQ%billing: a name YAML cannot take unquoted (it once stopped the brokers from starting).
    app = Account.new("app-account", topics={"Orders": "PUB|SUB", "Audit": "SUB", "%DLQ%billing": "SUB"},
                      groups=["billing"])
    return SecureSetup.make(Path(tmp_path_factory.mktemp("secure")), cluster="c1", groups={"g": 2},
                            app=app, controllers=3, admin_key="ops-admin")


def _check(setup: SecureSetup, account: Account, code: int, fields: dict[str, str]) -> None:
    config = AclConfig.parse(setup.acl_file.read_text())
    signed = sign(fields, b"x", account.access_key, account.secret_key)
    check_request(config, code, signed, b"x", "127.0.0.1")


def test_each_process_has_its_own_certificate(setup: SecureSetup) -> None:
    expected = {
        **{f"n{i}": Identity.controller(f"n{i}") for i in range(3)},
        "ns0": Identity.namesrv("ns0"),
        "g-1": Identity.broker("c1", "g", "g-1"),
    }
    keys = {**{f"n{i}": k for i, k in setup.controller_keys(3).items()}, "ns0": setup.namesrv_keys(),
            "g-1": setup.broker_keys("g", "g-1")}
    for name, config in keys.items():
        cert = config["tls_server_cert_path"]
        assert cert == config["tls_client_cert_path"] and Path(config["tls_server_key_path"]).is_file()
        assert cert_identity(read_cert(cert)) == expected[name], name
        assert config["tls_server_mode"] == "enforcing" and config["tls_server_need_client_auth"] == "require"
    assert setup.broker_keys("g", "g-1")["acl_enable"] is True and "acl_enable" not in setup.namesrv_keys()
    assert len(setup.cluster_secret) >= 16
    assert cert_identity(read_cert(setup.client_options()["tls"].client_cert_path)) == Identity.client("client")
    assert cert_identity(read_cert(setup.admin_options()["tls"].client_cert_path)) == Identity.admin("admin")


def test_the_application_account_holds_what_it_was_given_and_nothing_else(setup: SecureSetup) -> None:
    app = setup.app
    _check(setup, app, RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": "Orders"})
    _check(setup, app, RequestCode.PULL_MESSAGE, {"topic": "Audit", "consumerGroup": "billing"})
    _check(setup, app, RequestCode.PULL_MESSAGE, {"topic": "%DLQ%billing", "consumerGroup": "billing"})
    with pytest.raises(AclPermissionError, match="no PUB permission for topic:Audit"):
        _check(setup, app, RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": "Audit"})
    with pytest.raises(AclPermissionError, match="no PUB default permission for topic:Other"):
        _check(setup, app, RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": "Other"})
    with pytest.raises(AclPermissionError, match="no SUB default permission for group:other"):
        _check(setup, app, RequestCode.PULL_MESSAGE, {"topic": "Orders", "consumerGroup": "other"})
    with pytest.raises(AclPermissionError, match="needs an admin account"):
        _check(setup, app, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Orders"})
    _check(setup, setup.admin, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Orders"})
