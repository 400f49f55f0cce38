"""Start, kill and restart real controller processes on loopback (tests, benchmarks, demos).

``ControllerGroup(tmp_dir, size=3).start()`` writes one TOML config per controller (free
loopback ports for RPC and Raft, journals under ``tmp_dir``) and runs each as
``python -m rmqha.cli.controller --config FILE``.  ``wait_leader()`` returns the leader's
index once a controller says it is leader; ``kill(i)`` sends SIGKILL, ``pause(i)`` /
``resume(i)`` SIGSTOP/SIGCONT (a partition that keeps sockets open), ``restart(i)`` starts
it again on the same journal and ports.  ``stop()`` always terminates everything it
started; use it in a ``finally`` or as a context manager.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rmqha.codes import RequestCode, ResponseCode
from rmqha.errors import RmqhaError
from rmqha.remoting import BlockingRemotingClient, RemotingCommand


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


#: Settings that make failure detection quick enough for tests.
FAST_TEST_SETTINGS: dict[str, Any] = {
    "scan_not_active_broker_interval": 200,
    "scan_inactive_master_interval": 300,
    "new_leader_heartbeat_wait": 1000,
    "broker_heartbeat_timeout": 3000,
}


class ControllerGroup:
    def __init__(self, directory: Path, size: int = 3, settings: dict[str, Any] | None = None,
                 python: str = sys.executable,
                 per_node: dict[int, dict[str, Any]] | None = None) -> None:
        self.directory = Path(directory)
        self.size = size
        self.settings = {**FAST_TEST_SETTINGS, **(settings or {})}
        self.per_node = per_node or {}
        self.python = python
        self.ids = [f"n{i}" for i in range(size)]
        self.rpc_ports = [free_port() for _ in range(size)]
        self.raft_ports = [free_port() for _ in range(size)]
        self.procs: dict[int, subprocess.Popen] = {}
        self._log_files: list[Path] = []

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.rpc_ports]

    @property
    def address_list(self) -> str:
        return ";".join(self.addresses)

    def config_path(self, i: int) -> Path:
        return self.directory / f"controller-{self.ids[i]}.toml"

    def write_config(self, i: int) -> Path:
        values = {
            "controller_group": "test-group",
            "controller_peers": ";".join(f"{pid}-{a}" for pid, a in zip(self.ids, self.addresses)),
            "raft_peers": ";".join(f"{pid}-127.0.0.1:{p}" for pid, p in zip(self.ids, self.raft_ports)),
            "controller_self_id": self.ids[i],
            "controller_store_path": str(self.directory / self.ids[i]),
            **self.settings,
            **self.per_node.get(i, {}),
        }
        path = self.config_path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items()
                                if v is not None))
        return path

    def start(self, wait: bool = True) -> ControllerGroup:
        for i in range(self.size):
            self.start_one(i)
        if wait:
            self.wait_leader()
        return self

    def start_one(self, i: int) -> None:
        path = self.write_config(i)
        log = self.directory / f"controller-{self.ids[i]}.{len(self._log_files)}.log"
        self._log_files.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log, "wb") as out:
            self.procs[i] = subprocess.Popen(
                [self.python, "-m", "rmqha.cli.controller", "--config", str(path),
                 "--log-level", "INFO"],
                stdout=out, stderr=subprocess.STDOUT, env=env)

    def restart(self, i: int) -> None:
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            raise RuntimeError(f"controller {i} is still running")
        self.start_one(i)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def pause(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGCONT)

    def alive(self, i: int) -> bool:
        proc = self.procs.get(i)
        return proc is not None and proc.poll() is None

    def metadata(self, i: int, timeout: float = 1.0) -> dict[str, str] | None:
        """GET_METADATA_INFO of controller i, or None if it does not answer."""
        if not self.alive(i):
            return None
        try:
            with BlockingRemotingClient(self.addresses[i], connect_timeout=timeout) as c:
                resp = c.request(RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO),
                                 timeout)
        except RmqhaError:
            return None
        except TimeoutError:
            return None
        return resp.ext_fields if resp.code == ResponseCode.SUCCESS else None

    def wait_leader(self, timeout: float = 30.0, exclude: set[int] | None = None) -> int:
        """Index of the controller that says it is leader (and that the others agree on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self.size):
                if exclude and i in exclude:
                    continue
                meta = self.metadata(i, 0.5)
                if meta and meta.get("isLeader") == "true":
                    return i
            time.sleep(0.05)
        raise TimeoutError(f"no controller leader within {timeout}s; logs: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        text = "\n".join(f"== {p.name}\n" + p.read_text(errors="replace")[-chars:]
                         for p in self._log_files if p.exists())
        return text[-chars * 2:]

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self._log_files if p.exists())

    def stop(self) -> None:
        for i, proc in self.procs.items():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
                    proc.terminate()
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def __enter__(self) -> ControllerGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
