"""``rmqha demo --grpc`` (``make demo-grpc``) end to end: the demo's cluster with a proxy in
front, RocketMQ 5's official client sending and receiving through it while the master is
SIGKILLed; a subprocess, as a user runs it.

- a small ``--json`` run exits 0, shows a failover to a new master at a higher epoch,
  every acknowledged message received by the SimpleConsumer (none lost), the proxy among
  the processes and nothing left running or listening; it runs secured (the default): the
  proxy with its own certificate over mutual TLS to the cluster and TLS on its gRPC port,
  checking the client's account and signing as the demo's;
- the loss count is no formality: a receiver that missed one acknowledged message makes
  the summary count it lost and the verdict fail;
- without the 5.x client installed the flag stops at once with a message naming
  ``make demo-grpc`` (and ``client_missing`` is quiet where the client is installed).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from rmqha.demo import grpc_load
from rmqha.demo.grpc_load import GrpcDemo, client_missing
from rmqha.demo.options import APP_KEY, DemoOptions
from rmqha.demo.report import verdict
from rmqha.testing.local_cluster import live_processes_naming

MESSAGES = 600


def _processes_under(directory: Path) -> list[int]:
    return [pid for pid, _ in live_processes_naming(directory)]


def _run_demo(work: Path, timeout: float) -> tuple[int, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "rmqha", "demo", "--grpc", "--messages",
                             str(MESSAGES), "--json", "--dir", str(work)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the demo stops what it started, then we fail
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"the gRPC demo still ran after {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    finally:
        for pid in _processes_under(work):
            os.kill(pid, signal.SIGKILL)
    return proc.returncode, out, err


@pytest.mark.timeout(90)
def test_grpc_demo_loses_nothing_acknowledged_through_a_failover(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    code, out, err = _run_demo(work, timeout=75)
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    s = json.loads(out)  # nothing else on stdout
    assert s["ok"] is True and s["error"] is None and not s["interrupted"]
    assert s["proxy"].startswith("rmqha proxy 127.0.0.1:") and "rocketmq-python-client" in s["client"]
    assert s["sent"] == MESSAGES and 0 < s["acked"] <= MESSAGES
    assert s["lost"] == 0 and s["lost_sample"] == []
    assert s["consumed"] >= s["acked"]
    f = s["failover"]
    assert f["new_master_id"] not in (None, f["old_master_id"])
    assert f["new_epoch"] > f["old_epoch"] >= 1
    assert 0 < f["acked_at_kill"] < MESSAGES
    # A send made after the kill, to the same proxy address, was acknowledged.
    assert f["first_ack_s"] is not None and f["first_ack_s"] > 0
    assert s["rejoin"]["role"] == "slave" and sorted(s["rejoin"]["sync_state_set"]) == [1, 2, 3]
    assert s["processes_started"] == 8  # 3 controllers, a name server, 3 brokers, the proxy
    # Secured (the default): the proxy is a process of the cluster (its own certificate, on
    # its links and its gRPC port), checks the client's account and signs as the demo's.
    assert s["security"] == "mutual TLS + ACL"
    (proxy_config,) = work.glob("proxy*/proxy.toml")
    proxy = tomllib.loads(proxy_config.read_text())
    assert proxy["tls_server_mode"] == "enforcing" and proxy["tls_enable"] is True
    assert proxy["tls_client_cert_path"].endswith("client-proxy.crt")
    assert proxy["acl_enable"] is True and proxy["inner_access_key"] == APP_KEY
    assert s["leftover_processes"] == [] and s["leftover_ports"] == []
    assert _processes_under(work) == []


class _Acked:
    """What the summary reads of a load: the acknowledged sequence numbers."""

    def __init__(self, acked: set[int]) -> None:
        self.acked = acked


def test_a_missed_acknowledged_message_is_counted_lost_and_fails_the_demo() -> None:
    demo = GrpcDemo(DemoOptions(messages=10, grpc=True))
    demo.load = _Acked(set(range(10)))  # type: ignore[assignment]
    demo._record_reads(Counter({seq: 1 for seq in range(10)}), 1.0)
    assert demo.summary.lost == 0
    demo._record_reads(Counter({seq: 1 for seq in range(10) if seq != 7}), 1.0)
    assert demo.summary.lost == 1 and demo.summary.lost_sample == [7]
    assert "1 acknowledged message(s) missing, e.g. seq [7]" in verdict(demo.summary)


def test_the_flag_names_make_demo_grpc_when_the_client_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert client_missing() is None  # this venv has it

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(grpc_load.importlib.metadata, "version", not_installed)
    missing = client_missing()
    assert missing is not None and "make demo-grpc" in missing and "rocketmq-python-client" in missing
