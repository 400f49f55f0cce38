"""Every process stops at once on a bad configuration, naming the key or the port.

Real ``python -m rmqha <process> --config FILE`` processes: an unknown key, a bad value
and each port the process binds (held busy by a listening socket in the test) must end the
process with exit code 1 within a few seconds, with a one-line message (no traceback) that
names the key or the port.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import free_port, free_port_pair, write_toml

#: A process that stops on a bad config takes an interpreter start and an import or two.
QUICK_S = 10.0


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port with a listening socket on it for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def run_process(kind: str, config: dict, tmp_path: Path, suffix: str = ".toml") -> tuple[int, str]:
    path = tmp_path / f"{kind}{suffix}"
    if suffix == ".toml":
        write_toml(path, config)
    else:
        path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rmqha", kind, "--config", str(path)],
                          capture_output=True, text=True, timeout=QUICK_S * 3, cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert elapsed < QUICK_S, f"{kind} took {elapsed:.1f}s to stop"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr


def controller_config(tmp_path: Path, **extra) -> dict:
    rpc, raft = free_port(), free_port()
    return {"controller_peers": f"n0-127.0.0.1:{rpc}", "raft_peers": f"n0-127.0.0.1:{raft}",
            "controller_self_id": "n0", "controller_store_path": str(tmp_path / "c"), **extra}


def broker_config(tmp_path: Path, **extra) -> dict:
    # The controller address is never dialled: every case fails before that.
    return {"broker_name": "b", "store_dir": str(tmp_path / "store"), "listen_port": free_port_pair(),
            "controller_addr": [f"127.0.0.1:{free_port()}"], **extra}


def namesrv_config(**extra) -> dict:
    return {"listen_port": free_port(), **extra}


# --- unknown keys and bad values ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["controller", "namesrv", "broker"])
def test_unknown_key_is_named(kind, tmp_path):
    base = {"controller": controller_config(tmp_path), "namesrv": namesrv_config(),
            "broker": broker_config(tmp_path)}[kind]
    code, err = run_process(kind, {**base, "listenPortt": 1234}, tmp_path)
    assert code == 1
    assert f"rmqha {kind}: error:" in err and "unknown configuration key 'listenPortt'" in err


@pytest.mark.parametrize("kind,key,value", [
    ("controller", "raft_min_timeout", "soon"),
    ("controller", "enableElectUncleanMaster", "maybe"),
    ("namesrv", "brokerChannelExpiredTime", "-"),
    ("namesrv", "metrics_port", 70000),
    ("broker", "flushDiskType", "SOMETIMES"),
    ("broker", "listen_port", "ten"),
    ("broker", "metrics_port", -5),
])
def test_bad_value_names_the_key(kind, key, value, tmp_path):
    base = {"controller": controller_config(tmp_path), "namesrv": namesrv_config(),
            "broker": broker_config(tmp_path)}[kind]
    # RocketMQ key=value files too, not only TOML.
    code, err = run_process(kind, {**base, key: value}, tmp_path, suffix=".properties"
                            if isinstance(value, str) else ".toml")
    assert code == 1
    named = {"flushDiskType": "flush", "metrics_port": "metrics_port"}.get(key, key)
    assert named in err, err


def test_environment_override_with_bad_value_names_the_variable(tmp_path):
    path = write_toml(tmp_path / "ns.toml", namesrv_config())
    proc = subprocess.run([sys.executable, "-m", "rmqha", "namesrv", "--config", str(path)],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "RMQHA_LISTEN_PORT": "nine"})
    assert proc.returncode == 1
    assert "RMQHA_LISTEN_PORT" in proc.stderr and "Traceback" not in proc.stderr


# --- ports in use ----------------------------------------------------------------------

def test_controller_busy_ports_are_named(tmp_path, busy_port):
    rpc, raft = free_port(), free_port()
    cases = {
        "RPC port": {"controller_peers": f"n0-127.0.0.1:{busy_port}", "raft_peers": f"n0-127.0.0.1:{raft}"},
        "raft port": {"controller_peers": f"n0-127.0.0.1:{rpc}", "raft_peers": f"n0-127.0.0.1:{busy_port}"},
        "metrics_port": {"controller_peers": f"n0-127.0.0.1:{rpc}", "raft_peers": f"n0-127.0.0.1:{raft}",
                         "metrics_port": busy_port},
    }
    for what, ports in cases.items():
        config = {"controller_self_id": "n0", "controller_store_path": str(tmp_path / "c"), **ports}
        code, err = run_process("controller", config, tmp_path)
        assert code == 1, what
        assert what in err and f"127.0.0.1:{busy_port}" in err, (what, err)


def test_namesrv_busy_ports_are_named(tmp_path, busy_port):
    code, err = run_process("namesrv", {"listen_port": busy_port}, tmp_path)
    assert code == 1 and "listen_port" in err and f"127.0.0.1:{busy_port}" in err, err
    code, err = run_process("namesrv", namesrv_config(metrics_port=busy_port), tmp_path)
    assert code == 1 and "metrics_port" in err and f"127.0.0.1:{busy_port}" in err, err


def test_broker_busy_ports_are_named(tmp_path, busy_port):
    code, err = run_process("broker", broker_config(tmp_path, listen_port=busy_port, ha_listen_port=free_port()),
                            tmp_path)
    assert code == 1 and "listen_port" in err and f"127.0.0.1:{busy_port}" in err, err
    code, err = run_process("broker", broker_config(tmp_path, ha_listen_port=busy_port), tmp_path)
    assert code == 1 and "ha_listen_port" in err and f"127.0.0.1:{busy_port}" in err, err
    code, err = run_process("broker", broker_config(tmp_path, metrics_port=busy_port), tmp_path)
    assert code == 1 and "metrics_port" in err and f"127.0.0.1:{busy_port}" in err, err
