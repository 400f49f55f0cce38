"""The processes of a local cluster: one ``python -m rmqha <kind> --config FILE`` child each
(:class:`ControllerProc`, :class:`NamesrvProc`, :class:`BrokerProc` over :class:`Process`),
with a generated TOML config (:func:`write_toml`), its own directory and log, started,
stopped, killed, paused and restarted; and who chose their ports and what happens when
another process takes one before they bind it (:class:`PortChoice`).

:class:`rmqha.testing.local_cluster.Cluster` starts them together and waits on them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rmqha.errors import LocalClusterError
from rmqha.testing.ports import (
    _START_OUTPUT_BYTES,
    PORT_CLASH_RETRIES,
    PORT_FREE_TIMEOUT,
    _bindable,
    free_port,
    free_port_pair,
    pid_listens,
    port_open,
    taken_port,
)

#: How long a wait on one process lasts unless told otherwise.
DEFAULT_TIMEOUT = 20.0


class ClusterHome(Protocol):
    """What a process uses of the :class:`rmqha.testing.local_cluster.Cluster` that started
    it (which imports this module, so it is named by this Protocol, not imported)."""

    log_dir: Path
    python: str

    def describe(self, lines: int = 30) -> str: ...


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_toml(path: Path, values: Mapping[str, Any]) -> Path:
    """Write a flat TOML file (nested mappings become ``[tables]``; None values are left out)."""
    flat = [f"{k} = {_toml_value(v)}" for k, v in values.items()
            if v is not None and not isinstance(v, Mapping)]
    lines = flat[:]
    for k, v in values.items():
        if isinstance(v, Mapping):
            lines.append(f"\n[{k}]")
            lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items() if vv is not None)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class PortChoice:
    """Who chose the ports of processes started together, and what happens when another
    process on this machine takes one before they bind it (test workers share 127.0.0.1).

    Ports in :attr:`chosen` were picked by the harness: a process that exits at start
    because one was taken is started again, with the others of its choice (a controller
    group names every node's ports in each node's config), on fresh ones from ``choose``.
    Any other port was given by the caller and is meant: a start waits for it to be free
    and never moves it.  Each process starts with a choice of its own that chose nothing.
    """

    def __init__(self, procs: Sequence[Process], chosen: set[int] | None = None,
                 choose: Callable[[], set[int]] | None = None) -> None:
        self.procs = procs
        self.chosen = chosen or set()
        self._choose = choose
        #: Starts so far that may find a port taken (harness restarts included).
        self.attempts = 1
        for proc in procs:
            proc.port_choice = self

    def keep(self) -> None:
        """The caller starts one of these again: from now on every port is meant."""
        for proc in self.procs:
            PortChoice([proc])

    def start_again(self, victim: Process, port: int) -> None:
        """``victim`` exited because ``port`` was taken: start it (and the others of this
        choice that run) again, on fresh ports if the harness chose that one."""
        if self.attempts >= PORT_CLASH_RETRIES:
            raise LocalClusterError(
                f"{victim.name} found a port taken (the last: {port}) at {self.attempts} starts "
                f"in a row\n{victim.cluster.describe()}")
        self.attempts += 1
        again = [proc for proc in self.procs if proc is victim or proc.alive]
        for proc in again:
            proc.stop()
        if port in self.chosen and self._choose is not None:
            self.chosen = self._choose()
        for proc in again:
            proc.launch()


class Process:
    """One ``python -m rmqha KIND --config FILE`` process, restartable, log kept in a file."""

    def __init__(self, cluster: ClusterHome, name: str, kind: str, config: dict[str, Any], workdir: Path) -> None:
        self.cluster = cluster
        self.name = name
        self.kind = kind
        self.config = dict(config)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"{kind}.toml"
        self.log_path = cluster.log_dir / f"{name}.log"
        self.env: dict[str, str] = {}
        #: Words before the command, e.g. ``["ip", "netns", "exec", "ns1"]`` to run the
        #: process on a test host of its own (a network namespace with its own address).
        self.launcher: list[str] = []
        #: The Python that runs it (None: the cluster's); a proxy may need another venv.
        self.python: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: Which of its ports the harness chose (they may move) and which are meant.
        self.port_choice = PortChoice([self])
        self._start_env: dict[str, str] = {}
        self._log_offset = 0  # where the current start's output begins in the log
        self._searched = 0  # the start whose output was searched for a taken port

    # --- life cycle -----------------------------------------------------------------------

    def start(self, *, env: Mapping[str, str] | None = None, **config_overrides: Any) -> Process:
        """Start (or start again) with the current config plus ``config_overrides``.

        ``env`` adds environment variables for this start only (e.g. RMQHA_FAILPOINTS).
        A start again means the ports it had (see :class:`PortChoice`): it waits for
        them to be free, and they never move.
        """
        if self.alive:
            raise LocalClusterError(f"{self.name} is already running (pid {self.pid})")
        if self.starts:
            self.port_choice.keep()
        self.config.update(config_overrides)
        self._start_env = dict(env or {})
        return self.launch()

    def launch(self) -> Process:
        """Run the process with its config and this start's environment, once the ports
        it was given are free (a restart can race the kernel or another's brief bind)."""
        self._wait_ports_free()
        write_toml(self.config_path, self.config)
        full_env = dict(os.environ)
        full_env.update({"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
        # Failpoints of an earlier start must not leak into this one, nor a secret of the
        # caller's shell into a cluster that has its own (``env`` may still set one).
        for name in ("RMQHA_FAILPOINTS", "RMQHA_CLUSTER_SECRET", "RMQHA_CLUSTER_SECRET_FILE"):
            full_env.pop(name, None)
        full_env.update(self.env)
        full_env.update(self._start_env)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            log.write(f"\n===== start #{self.starts} of {self.name} at {time.time():.3f} "
                      f"env={self._start_env} =====\n".encode())
            self.proc = subprocess.Popen(
                [*self.launcher, self.python or self.cluster.python, "-m", "rmqha", self.kind, "--config",
                 str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, env=full_env,
                # Its own process group: a terminal's Ctrl-C goes to the owner only, which
                # then stops the children in order instead of having them die half-way.
                process_group=0,
            )
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        """SIGKILL and reap (a crash: no shutdown code runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """Ask the process to stop (SIGCONT first: a paused process cannot act on SIGTERM)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc is None:
            return None
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.proc.returncode

    def pause(self) -> None:
        """SIGSTOP: the process freezes with its sockets open (a hung or partitioned node)."""
        if self.proc is None or not self.alive:
            raise LocalClusterError(f"{self.name} is not running")
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is None:
            raise LocalClusterError(f"{self.name} was never started")
        self.proc.send_signal(signal.SIGCONT)

    def restart(self, *, env: Mapping[str, str] | None = None, **config_overrides: Any) -> Process:
        """Kill (SIGKILL) if running, then start again with the same directories."""
        self.kill()
        return self.start(env=env, **config_overrides)

    def wait_exit(self, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Wait for the process to end by itself; its exit code.  An exit because a port
        was taken at start is not the end: it is started again (:class:`PortChoice`)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None:
                raise LocalClusterError(f"{self.name} was never started")
            try:
                code = self.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise LocalClusterError(
                    f"{self.name} still running after {timeout}s\n{self.cluster.describe()}"
                ) from None
            if not self.recover_port_clash():
                return code

    def listens(self, addr: str) -> bool:
        """Whether this process (not another that took its port) accepts connections at
        ``addr`` (where /proc cannot tell: whether anything does)."""
        pid = self.pid
        if pid is None or not self.alive or not port_open(addr):
            return False
        return pid_listens(pid, int(addr.rpartition(":")[2])) is not False

    def recover_port_clash(self) -> bool:
        """If this process exited at start because another took one of its ports, start it
        again (see :class:`PortChoice`) and say so; LocalClusterError when it has found a
        port taken :data:`PORT_CLASH_RETRIES` times in a row."""
        port = self._taken_port()
        if port is None:
            return False
        self.port_choice.start_again(self, port)
        return True

    def _taken_port(self) -> int | None:
        """The port this start's output says was taken, once the process has exited
        (each start's output is searched once)."""
        if self.proc is None or self.alive or self._searched == self.starts:
            return None
        self._searched = self.starts
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            # A clash stops a start early: its line is among the first a start writes.
            return taken_port(log.read(_START_OUTPUT_BYTES).decode(errors="replace"))

    def _wait_ports_free(self) -> None:
        """Wait until the ports this process was given (not chosen for it) can be bound;
        LocalClusterError naming them after :data:`PORT_FREE_TIMEOUT`."""
        if self.launcher:
            return  # it runs on a host of its own: its ports are not this host's
        host = _loopback_or_own(self.config)
        meant = [p for p in self.ports() if p not in self.port_choice.chosen]
        deadline = time.monotonic() + PORT_FREE_TIMEOUT
        while busy := [p for p in meant if not _bindable(p, host, reuse=True)]:
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"{self.name}: port(s) {busy} on {host} still taken after "
                    f"{PORT_FREE_TIMEOUT}s; they were given, not chosen, so they do not move\n"
                    f"{self.cluster.describe()}")
            time.sleep(0.05)

    def ports(self) -> list[int]:
        """Every port this process listens on by its config (for leftover checks)."""
        return [p for p in (self.config.get("metrics_port"),) if isinstance(p, int) and p > 0]

    # --- output ---------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_contains(self, needle: str) -> bool:
        return needle in self.log_text()

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"exited {self.returncode}"
        return f"<{self.kind} {self.name} pid={self.pid} {state}>"


def _peer_address(peers: str, own: str) -> str:
    for item in peers.split(";"):
        pid, _, addr = item.partition("-")
        if pid == own:
            return addr
    raise KeyError(own)


class ControllerProc(Process):
    @property
    def node_id(self) -> str:
        return str(self.config["controller_self_id"])

    @property
    def address(self) -> str:
        """The controller's RPC address (its entry in controller_peers)."""
        return _peer_address(self.config["controller_peers"], self.node_id)

    @property
    def raft_address(self) -> str:
        return _peer_address(self.config["raft_peers"], self.node_id)

    def ports(self) -> list[int]:
        return [int(self.address.rpartition(":")[2]), int(self.raft_address.rpartition(":")[2]),
                *super().ports()]


def _loopback_or_own(config: Mapping[str, Any]) -> str:
    """The host a process listens on (127.0.0.1 unless its config names another)."""
    host = str(config.get("listen_host") or "127.0.0.1")
    return "127.0.0.1" if host == "0.0.0.0" else host


class NamesrvProc(Process):
    @property
    def address(self) -> str:
        return f"{_loopback_or_own(self.config)}:{self.config['listen_port']}"

    @property
    def controller_address(self) -> str | None:
        """The RPC address of the controller it hosts (None if it hosts none)."""
        embedded = self.config.get("controller")
        if not isinstance(embedded, Mapping):
            return None
        return _peer_address(embedded["controller_peers"], embedded["controller_self_id"])

    def _controller_ports(self) -> list[int]:
        embedded = self.config.get("controller")
        if not isinstance(embedded, Mapping):
            return []
        return [int(_peer_address(embedded[key], embedded["controller_self_id"]).rpartition(":")[2])
                for key in ("controller_peers", "raft_peers")]

    def ports(self) -> list[int]:
        return [int(self.config["listen_port"]), *super().ports(), *self._controller_ports()]

    def picked_ports(self) -> set[int]:
        """The ports :meth:`choose_ports` picks, as the config has them now."""
        return {int(self.config["listen_port"]), *self._controller_ports()}

    def choose_ports(self) -> set[int]:
        """A fresh client port (and RPC and Raft ports of the controller it hosts), written
        into its config; the ports chosen."""
        self.config["listen_port"] = free_port()
        embedded = self.config.get("controller")
        if isinstance(embedded, Mapping):
            own = embedded["controller_self_id"]
            self.config["controller"] = {**embedded,
                                         "controller_peers": f"{own}-127.0.0.1:{free_port()}",
                                         "raft_peers": f"{own}-127.0.0.1:{free_port()}"}
        return self.picked_ports()


class BrokerProc(Process):
    @property
    def host(self) -> str:
        """The address it listens on (127.0.0.1 unless its config names another)."""
        return _loopback_or_own(self.config)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.config['listen_port']}"

    @property
    def ha_address(self) -> str:
        return f"{self.host}:{self.config.get('ha_listen_port') or self.config['listen_port'] + 1}"

    def ports(self) -> list[int]:
        return [int(self.address.rpartition(":")[2]), int(self.ha_address.rpartition(":")[2]),
                *super().ports()]

    def choose_ports(self) -> set[int]:
        """A fresh client port (and HA port = client + 1 unless one is set), written into
        its config; the ports chosen."""
        self.config["listen_port"] = free_port_pair()
        return self.picked_ports()

    def picked_ports(self) -> set[int]:
        """The ports :meth:`choose_ports` picks, as the config has them now: the client port
        and, when it is client + 1 by default, the HA port."""
        listen = int(self.config["listen_port"])
        return {listen} if self.config.get("ha_listen_port") else {listen, listen + 1}

    @property
    def store_dir(self) -> Path:
        return Path(self.config["store_dir"])

    @property
    def group(self) -> str:
        return str(self.config["broker_name"])

    @property
    def commitlog_dir(self) -> Path:
        return self.store_dir / "commitlog"

    def segment_files(self) -> list[Path]:
        """The commitlog's segment files, oldest first (named by their start offset)."""
        if not self.commitlog_dir.exists():
            return []
        return sorted(p for p in self.commitlog_dir.iterdir() if p.name.isdigit())

    def meta_text(self) -> str | None:
        """Content of ``.broker.meta`` (None if absent)."""
        try:
            return (self.store_dir / ".broker.meta").read_text()
        except FileNotFoundError:
            return None

    def broker_id(self) -> int | None:
        """The id settled in ``.broker.meta`` (None if not settled yet)."""
        text = self.meta_text()
        return int(text.strip().split("#")[2]) if text else None

    def restart_on_new_port(self, **overrides: Any) -> Process:
        """Kill, then start on a fresh client port (and HA port = client + 1); those are
        the harness's choice, so a clash at start moves them again."""
        self.kill()
        self.config.update(ha_listen_port=0, **overrides)
        PortChoice([self], self.choose_ports(), self.choose_ports)
        self._start_env = {}
        return self.launch()


