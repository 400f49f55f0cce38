"""Attack 1: code execution through the Raft port, and the controller's refusal to start
without a cluster secret.

pysyncobj unpickles the first frame of any connection to the Raft port (RPC port + 1000
here: the harness gives each controller its own) unless it has a password.  The probe is a
pickle whose "payload" creates an empty marker file in the test's temp dir.  Against a
controller started with ``allow_insecure`` on loopback (negative control) the file
appears; against one with a cluster secret it does not, the controller drops the
connection and goes on committing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import Cluster, free_port
from raft_probe import send_probe
from security_wire import ask

from rmqha.protocol.codes import RequestCode, ResponseCode


def test_probe_runs_code_on_an_insecure_loopback_controller(tmp_path):
    """Negative control: without a secret the probe works (this is the hole)."""
    marker = tmp_path / "insecure-marker"
    with Cluster(tmp_path / "c", insecure=True) as c:
        (ctl,) = c.start_controllers(1)
        assert ctl.config["allow_insecure"] is True and "cluster_secret_file" not in ctl.config
        send_probe(ctl.raft_address, marker)
        assert marker.exists()


def test_probe_is_refused_by_a_controller_with_a_secret(tmp_path):
    marker = tmp_path / "secure-marker"
    with Cluster(tmp_path / "c") as c:
        (ctl,) = c.start_controllers(1)
        # The controller reads the whole frame, fails to authenticate it and hangs up.
        send_probe(ctl.raft_address, marker)
        assert not marker.exists()
        # It keeps working: a signed write commits, and the log says nothing was run.
        resp = ask(ctl.address, RequestCode.CONTROLLER_APPLY_BROKER_ID,
                   {"clusterName": "c", "brokerName": "after-probe", "appliedBrokerId": 1,
                    "registerCheckCode": "127.0.0.1:1;1"}, secret=c.cluster_secret,
                   channel=c.cluster_secret)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert ctl.alive and not marker.exists()


def _run_controller(tmp_path: Path, extra: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "controller.toml"
    cfg.write_text(f'controller_peers = "n0-127.0.0.1:{free_port()}"\ncontroller_self_id = "n0"\n'
                   f'controller_store_path = "{tmp_path / "store"}"\n{extra}')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQHA_CLUSTER_SECRET")}
    return subprocess.run([sys.executable, "-m", "rmqha", "controller", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def test_controller_without_secret_refuses_to_start_naming_the_key(tmp_path):
    proc = _run_controller(tmp_path, "")
    assert proc.returncode != 0
    assert "no cluster secret" in proc.stderr and "cluster_secret" in proc.stderr, proc.stderr
    assert "allow_insecure" in proc.stderr


def test_allow_insecure_is_refused_off_loopback(tmp_path):
    proc = _run_controller(tmp_path, 'allow_insecure = true\nlisten_host = "0.0.0.0"\n')
    assert proc.returncode != 0
    assert "0.0.0.0" in proc.stderr and "not loopback" in proc.stderr, proc.stderr


@pytest.mark.parametrize("key", ["cluster_secret", "raft_password"])
def test_secret_never_appears_in_the_logs_or_the_config_answer(tmp_path, key):
    secret = "very-secret-value-123"
    with Cluster(tmp_path / "c", insecure=True) as c:
        (ctl,) = c.start_controllers(1, **{key: secret})
        resp = ask(ctl.address, RequestCode.GET_CONTROLLER_CONFIG)
        assert resp.code == ResponseCode.SUCCESS
        text = resp.body.decode()
        assert "******" in text and secret not in text
        assert "control requests signed" in ctl.log_text()
    assert secret not in ctl.log_text()
