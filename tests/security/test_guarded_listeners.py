"""Secure by default off loopback (issue 37, point 5), with real processes.

A broker, a name server and a proxy told to listen on the wildcard ``0.0.0.0`` (not
loopback) with neither TLS nor ACL refuse to start: the process exits non-zero before it
binds anything, and its error names the keys to set (``acl_enable``, ``tls.server.mode``,
``allow_insecure``).  The negative controls: the same broker and name server with
``allow_insecure = true`` start and listen on the wildcard (so the refusals above were the
rule, not a broken start), and a broker with ACL on starts without it, warning that ACL
over plaintext is replayable (a broker without ACL does not).  The rule's unit
(:func:`require_guarded_listener`) is shown on each address kind.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from cluster import Cluster, Process, free_port

from rmqha.errors import ConfigError
from rmqha.security.secret_policy import require_guarded_listener
from rmqha.testing.local_cluster import listening_sockets
from rmqha.testing.local_proxy import ProxyProc

WILDCARD = "0.0.0.0"
ACL = """accounts:
  - accessKey: appAccount
    secretKey: app-secret-key-1234
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
"""


def _refused(proc: Process) -> str:
    """The log of ``proc`` once it exited refusing to start (asserted)."""
    code = proc.wait_exit(30)
    text = proc.log_text()
    assert code != 0, f"{proc.name} exited 0:\n{text}"
    assert "neither TLS nor ACL" in text, text
    assert "allow_insecure = true" in text, text
    assert "listening on" not in text and "serving" not in text, f"{proc.name} served before refusing:\n{text}"
    return text


def test_a_broker_on_the_wildcard_without_tls_or_acl_refuses(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        c.start_controllers(1)
        c.start_namesrv()
        proc = c.start_broker("g1", wait=False, listen_host=WILDCARD)
        text = _refused(proc)
        assert "acl_enable = true (aclEnable)" in text and "tls.server.mode" in text, text


def test_a_name_server_on_the_wildcard_without_tls_refuses(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        proc = c.start_namesrv(wait=False, listen_host=WILDCARD)
        text = _refused(proc)
        assert 'tls_server_mode = "enforcing" (tls.server.mode)' in text, text


def test_a_proxy_on_the_wildcard_without_tls_or_acl_refuses(tmp_path: Path) -> None:
    """The check runs on the loaded config, before the proxy extra is imported: this
    venv (without grpc) shows the refusal, not a missing module."""
    with Cluster(tmp_path) as c:
        ns = c.start_namesrv()
        config = {"namesrv_addr": ns.address, "rocketmq_cluster_name": c.cluster_name,
                  "grpc_server_port": free_port(), "grpc_server_host": WILDCARD}
        proc = ProxyProc(c, "proxy0", "proxy", config, c.base_dir / "proxy0")
        c.processes.append(proc)
        proc.start()
        text = _refused(proc)
        assert "acl_enable = true (aclEnable)" in text, text


def _wildcard_ports(proc: Process) -> set[int]:
    assert proc.pid is not None
    return {s.port for s in listening_sockets(proc.pid) if s.wildcard}


def test_negative_control_allow_insecure_starts_them_on_the_wildcard(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        c.start_controllers(1)
        ns = c.start_namesrv(listen_host=WILDCARD, allow_insecure=True)
        broker = c.start_broker("g1", listen_host=WILDCARD, allow_insecure=True)
        for proc, port in ((ns, int(ns.config["listen_port"])), (broker, int(broker.config["listen_port"]))):
            c.wait_for(lambda p=proc, n=port: n in _wildcard_ports(p), what=f"{proc.name} on {WILDCARD}",
                       process=proc)
            assert "with neither TLS nor ACL (allow_insecure = true)" in proc.log_text()
        assert "can be replayed" not in broker.log_text()  # no ACL: no ACL replay warning


def test_a_broker_with_acl_starts_on_the_wildcard(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    os.chmod(acl, 0o600)
    with Cluster(tmp_path / "c") as c:
        c.start_controllers(1)
        c.start_namesrv()
        broker = c.start_broker("g1", listen_host=WILDCARD, acl_enable=True, acl_file=str(acl))
        port = int(broker.config["listen_port"])
        c.wait_for(lambda: port in _wildcard_ports(broker), what="broker on the wildcard", process=broker)
        # ACL over plaintext says it is replayable (issue 37 point 3).
        c.wait_for(lambda: broker.log_contains("can be replayed as it is"), what="the replay warning",
                   process=broker)


@pytest.mark.parametrize("address,refused", [
    ("0.0.0.0", True), ("::", True), ("10.1.2.3", True), ("broker.example", True),
    ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
])
def test_the_rule_on_each_address_kind(address: str, refused: bool) -> None:
    def check(**kw: bool) -> None:
        require_guarded_listener("p", [address], guards="KEYS", **kw)

    if refused:
        with pytest.raises(ConfigError, match=r"neither TLS nor ACL.*set KEYS, or allow_insecure"):
            check(guarded=False, allow_insecure=False)
    else:
        check(guarded=False, allow_insecure=False)
    check(guarded=True, allow_insecure=False)
    check(guarded=False, allow_insecure=True)
