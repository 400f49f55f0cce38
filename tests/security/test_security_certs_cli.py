"""``rmqha certs``: init, issue, dev-cluster, show and secret, run in-process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqha.cli import main
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.secret import load_cluster_secret


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_init_issue_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "pki")
    assert _json(capsys, "certs", "init", "--dir", d) == {"ca": f"{d}/ca.crt"}
    out = _json(capsys, "certs", "issue", "--dir", d, "--role", "broker", "--cluster", "C1",
                "--group", "g1", "--name", "b0", "--ip", "127.0.0.1", "--ip", "10.0.0.5",
                "--dns", "broker-0.local", "--days", "30")
    assert isinstance(out, dict)
    issued = out["issued"][0]
    assert issued["identity"] == "rmqha:broker/C1/g1/b0"
    assert Path(issued["key"]).stat().st_mode & 0o777 == 0o600
    shown = _json(capsys, "certs", "show", issued["cert"])
    assert isinstance(shown, list) and shown[0]["identity"] == "rmqha:broker/C1/g1/b0"
    assert shown[0]["issuer"] == "CN=rmqha cluster CA,O=rmqha"
    assert main(["certs", "issue", "--dir", d, "--role", "controller", "--name", "n0"]) == 0
    assert "rmqha:controller/n0" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["certs", "issue", "--role", "broker", "--name", "b0", "--group", "g1"], "--role broker needs --cluster"),
    (["certs", "issue", "--role", "client", "--name", "app", "--group", "g1"],
     "--cluster and --group are for brokers only"),
    (["certs", "issue", "--role", "client", "--name", "a/b"], "identity name 'a/b' is not allowed"),
    (["certs", "issue", "--role", "client", "--name", "app", "--ip", "localhost"],
     "--ip 'localhost' is not an IP address"),
    (["certs", "init"], "already exists"),
    (["certs", "dev-cluster", "--groups", "g1"], "--groups 'g1': expected GROUP:BROKERS"),
])
def test_bad_commands_say_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        argv: list[str], message: str) -> None:
    certs.init_ca(tmp_path)
    assert main([*argv, "--dir", str(tmp_path)]) == 1
    assert message in capsys.readouterr().err


def test_issue_needs_a_ca(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "issue", "--dir", str(tmp_path), "--role", "client", "--name", "app"]) == 1
    assert "run `rmqha certs init" in capsys.readouterr().err


def test_dev_cluster_makes_everything_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "dev"
    out = _json(capsys, "certs", "dev-cluster", "--dir", str(d), "--controllers", "3",
                "--groups", "g1:3", "--groups", "g2:2", "--namesrv", "2")
    assert isinstance(out, dict)
    names = [i["identity"] for i in out["issued"]]
    assert names == (["rmqha:controller/n0", "rmqha:controller/n1", "rmqha:controller/n2",
                      "rmqha:namesrv/ns0", "rmqha:namesrv/ns1"]
                     + [f"rmqha:broker/DefaultCluster/g1/g1-{i}" for i in range(3)]
                     + [f"rmqha:broker/DefaultCluster/g2/g2-{i}" for i in range(2)]
                     + ["rmqha:client/client", "rmqha:admin/admin"])
    for entry in out["issued"]:
        cert = certs.read_cert(entry["cert"])
        assert str(certs.cert_identity(cert)) == entry["identity"]
    secret = load_cluster_secret(file=d / "cluster.secret", env={})
    ca_before = (d / "ca.key").read_bytes()
    # Run again: CA and secret kept, certificates renewed.
    assert main(["certs", "dev-cluster", "--dir", str(d), "--controllers", "1", "--namesrv", "0"]) == 0
    assert (d / "ca.key").read_bytes() == ca_before
    assert load_cluster_secret(file=d / "cluster.secret", env={}) == secret
    assert Identity.parse(names[0]) == Identity.controller("n0")


def test_secret_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.secret"
    assert main(["certs", "secret", "--out", str(out)]) == 0
    text = out.read_text().strip()
    assert text not in capsys.readouterr().out and out.stat().st_mode & 0o777 == 0o600
    assert main(["certs", "secret", "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err and out.read_text().strip() == text


def test_parser_does_not_import_cryptography_and_shows_the_real_defaults() -> None:
    import subprocess
    import sys

    from rmqha.cli import certs as cli_certs
    assert (cli_certs._CA_DAYS, cli_certs._CERT_DAYS) == (certs.CA_DAYS, certs.CERT_DAYS)
    code = ("import sys, rmqha.cli as c; c.build_parser(); "
            "print(any(m.startswith('cryptography.x509') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
