"""A real rmqha cluster on this machine: controller, name-server and broker processes on loopback.

This module owns starting, stopping, killing and restarting those processes for tests,
benchmarks and ``rmqha demo``.  Every process is ``python -m rmqha <kind> --config FILE``
with a generated TOML config, free 127.0.0.1 ports, its own directory under the cluster's
``base_dir`` and its stdout/stderr in ``logs/<name>.log`` (kept across restarts, each start
marked), so a failed wait can show what every process said.  Each child runs in its own
process group: a Ctrl-C in the terminal reaches only the program that owns the
:class:`Cluster`, which then stops its children itself.  A :class:`Cluster` is a context
manager and always kills (SIGKILL) what it started; :meth:`Cluster.stop_all` stops them
gracefully first (SIGTERM, then SIGKILL after a deadline).

Timers default to :data:`QUICK_BROKER`, :data:`QUICK_NAMESRV` and :data:`QUICK_CONTROLLER`,
so a killed master is replaced within about a second.

Ports: a port is chosen before the process that binds it starts, and another process on
the machine (a test on another worker) may take it in between.  A process that exits at
start for that reason is started again on fresh ports by whatever wait notices it (a
controller with its whole group), up to :data:`PORT_CLASH_RETRIES` starts; a port the
caller gave (an explicit ``listen_port``, a restart on the same ports) never moves: a start
waits for it to be free (:class:`PortChoice`).  A start is waited for until the process
itself listens, not merely until something answers on its port.

Security: a cluster runs with a cluster secret generated for it (or the one given as
``cluster_secret``), written to ``<base_dir>/cluster.secret`` (mode 0600) and named by every
process's ``cluster_secret_file``, so Raft traffic is encrypted and control requests are
signed as in production, and brokers authenticate their HA links with it.
:meth:`Cluster.request` signs the requests that need it, as an
operator holding the secret would; tools get the file (:attr:`Cluster.secret_file`).
``insecure=True`` runs without a secret (controllers get ``allow_insecure``).

Typical use::

    with Cluster(tmp_dir) as c:
        c.start_controllers(3)                      # waits for a Raft leader
        ns = c.start_namesrv()                      # or start_namesrv_with_controller()
        a, b, d = c.start_group("broker-a", 3, in_sync=True)  # a master (id 1), b/d slaves
        c.request(a.address, RequestCode.SEND_MESSAGE, ext, body)  # any remoting request
        a.kill()                                    # SIGKILL; pause()/resume() = SIGSTOP/SIGCONT
        new = c.wait_for(lambda: c.master_of("broker-a"), what="a new master")
        a.start()                                   # same store dir and ports
        b.restart_on_new_port()                     # same store dir, new client/HA ports

Queries: :meth:`Cluster.replica_info` and :meth:`Cluster.sync_state_data` (controller),
:meth:`Cluster.route` and :meth:`Cluster.group_route` (name server),
:meth:`Cluster.broker_status` (role, epochs, offsets, HA links) and
:meth:`Cluster.broker_epochs` (epoch map).  Waits never sleep a fixed time as
synchronisation: :meth:`Cluster.wait_for` polls a condition until a deadline and raises
:class:`~rmqha.errors.LocalClusterError` with every process's log tail;
:meth:`Cluster.holds` checks that something stays true.  :meth:`Cluster.leftovers` says
which started processes still run and which of their ports still accept connections.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import LocalClusterError, RemotingError
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity
from rmqha.security.channel_auth import key_from_text
from rmqha.security.identity import Identity, Role
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import RequestAuthenticator, request_auth
from rmqha.security.secret import generate_secret_text

T = TypeVar("T")

#: Broker timers for a cluster on one machine.  A SIGKILLed process is seen at once (its
#: connections close); the timeouts below only matter for frozen processes and are kept
#: clear of scheduling stalls on busy cores (a spurious failover would add epochs).
QUICK_BROKER: dict[str, Any] = {
    "broker_heartbeat_interval_ms": 200,
    "controller_heartbeat_timeout_ms": 3000,
    # Near the safe minimum (1556 ms for 3 s): a 1.4 s master lease, 7 heartbeat rounds.
    "master_lease_margin_ms": 1600,
    "sync_broker_metadata_period_ms": 300,
    "check_sync_state_set_period_ms": 300,
    "register_name_server_period_ms": 500,
    "namesrv_broker_timeout_ms": 5000,
    "rpc_timeout_ms": 2000,
    "segment_bytes": 64 << 20,
    "ha_send_heartbeat_interval_ms": 200,
    "ha_housekeeping_interval_ms": 3000,
    "ha_max_time_slave_not_catchup_ms": 4000,
}
QUICK_NAMESRV: dict[str, Any] = {
    "broker_expire_ms": 5000,
    "scan_not_active_broker_interval_ms": 200,
}
#: Controller timers, by the controller config's field names.
QUICK_CONTROLLER: dict[str, Any] = {
    "scan_not_active_broker_interval": 200,
    "scan_inactive_master_interval": 500,
    "new_leader_heartbeat_wait": 800,
    "broker_heartbeat_timeout": 3000,
}

DEFAULT_TIMEOUT = 20.0

#: Errors a polled condition may raise while the cluster is still getting there.
_NOT_YET = (RemotingError, OSError, KeyError, ValueError)


#: Ports handed out by this process: a port is chosen before its process binds it, so
#: two choices in a row must not return the same one.
_handed_out: set[int] = set()
#: Our own generator, seeded from the OS: a test that seeds the global one (Hypothesis does)
#: must not make two concurrent runs choose the same ports in the same order.
_port_rng = random.Random()


def _below_ephemeral_range() -> range:
    """Ports under the kernel's ephemeral range (Linux ip_local_port_range; else the
    IANA default 49152): the kernel never gives those to an outgoing connection or a
    bind to port 0, so nothing takes a chosen port between its choice and its bind."""
    low = 49152
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return range(max(1024, low - 16384), max(1025, low))


def _bindable(port: int, host: str = "127.0.0.1", *, reuse: bool = False) -> bool:
    """Whether ``host:port`` can be bound now; with ``reuse`` as a server binds it
    (SO_REUSEADDR: a port whose old connections linger in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(count: int = 1) -> int:
    """A TCP port p free on 127.0.0.1 right now (with ``count``, p .. p+count-1 all free),
    never handed out before by this process.

    Chosen below the ephemeral range: a port the kernel picks for ``bind(0)`` (the usual
    trick) is one it may give any outgoing connection a moment later, before the process
    that was to listen on it has started, and on a busy machine that happens."""
    ports = _below_ephemeral_range()
    for _ in range(500):
        p = _port_rng.randrange(ports.start, ports.stop - count + 1)
        block = range(p, p + count)
        if any(q in _handed_out for q in block) or not all(_bindable(q) for q in block):
            continue
        _handed_out.update(block)
        return p
    raise LocalClusterError(f"no {count} consecutive free ports found in {ports}")


#: How many starts in a row a process (a controller group: all its nodes) gets when each
#: exits because a port it was given was taken.
PORT_CLASH_RETRIES = 3
#: What a process logs when a port it was configured with is bound by someone else.
PORT_TAKEN = "is not free (Address already in use)"
#: A line naming a ``host:port`` that could not be bound because another socket holds it:
#: a start's preflight (:data:`PORT_TAKEN`) or a server's own bind a moment later
#: ("cannot listen on host:port: ... address already in use").
_TAKEN_LINE = re.compile(r"[^\s:(]+:(\d+)(?: is not free|:) .*address already in use", re.IGNORECASE)
#: How long a start waits for the ports it was given (not chosen for it) to be free.
PORT_FREE_TIMEOUT = 10.0
#: How much of a start's output is searched for a port-taken line.
_START_OUTPUT_BYTES = 1 << 20


def taken_port(text: str) -> int | None:
    """The port the last port-taken line of ``text`` (a process's output) names, if any."""
    found = _TAKEN_LINE.findall(text)
    return int(found[-1]) if found else None


def free_port_pair() -> int:
    """A port p with p and p+1 both free (a broker's client and default HA port)."""
    return free_port(2)


def port_open(addr: str, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def pid_listens(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` itself holds a socket listening on TCP ``port`` (Linux
    /proc, in the process's own network namespace); None where /proc cannot tell.

    A connection to the port is no proof: another process may have taken the port
    before this one's bind, and it accepts connections meanwhile."""
    if not Path("/proc/self/net/tcp").exists():
        return None
    try:
        sockets = {_link(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        return any(_listening(Path(f"/proc/{pid}/net/{table}"), port) & sockets
                   for table in ("tcp", "tcp6"))
    except (OSError, IndexError, ValueError):
        return False  # it exited meanwhile (a zombie has no network to show)


def _listening(table: Path, port: int) -> set[str]:
    """The sockets (as /proc/PID/fd links name them) listening on ``port`` in a
    /proc/net/tcp table (slow to read on a busy machine: a few ms)."""
    found = set()
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()  # sl local_address rem_address st ... uid timeout inode
        if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
            found.add(f"socket:[{fields[9]}]")
    return found


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""  # closed meanwhile


def live_processes_naming(directory: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live process but this one whose command line names
    ``directory`` (Linux /proc; zombies left out): what a test checks a run left behind."""
    needle = str(directory).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != "Z":
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def _children_naming(directory: Path) -> tuple[list[int], list[int]]:
    """Pids of this process's children running ``-m rmqha ... --config <directory>/...``,
    and pids of its children whose command line is not readable yet (Linux /proc;
    elsewhere none are found).

    A child is in the second list while it is between ``exec`` and its new program's
    first instruction: ``Popen`` returns once the exec has closed the child's
    close-on-exec pipe, but the kernel sets the new command line a little later, and on
    a loaded machine a scan often lands in between (seen in CI)."""
    me, needle = os.getpid(), b"--config\0" + str(directory).encode() + b"/"
    found: list[int] = []
    starting: list[int] = []
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return [], []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        # stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) < 2 or fields[1] != str(me):
            continue
        if b"rmqha\0" in cmdline and needle in cmdline:
            found.append(int(entry.name))
        elif not cmdline and fields[0] != "Z":  # a zombie's is empty for good
            starting.append(int(entry.name))
    return found, starting


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

    def __init__(self, cluster: Cluster, name: str, kind: str, config: dict[str, Any], workdir: Path) -> None:
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


@dataclass
class ReplicaInfo:
    """The controller's view of a broker group (GET_REPLICA_INFO)."""

    master_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int


@dataclass
class Leftovers:
    """What a cluster left behind: processes still running, ports still accepting."""

    processes: list[str]
    ports: list[int]

    def __bool__(self) -> bool:
        return bool(self.processes or self.ports)


class Cluster:
    """Starts and stops processes under one directory; queries them; waits with deadlines."""

    def __init__(self, base_dir: Path | str, *, cluster_name: str = "rmqha-local",
                 broker_defaults: Mapping[str, Any] = QUICK_BROKER,
                 namesrv_defaults: Mapping[str, Any] = QUICK_NAMESRV,
                 controller_defaults: Mapping[str, Any] = QUICK_CONTROLLER,
                 python: str = sys.executable, cluster_secret: str | None = None,
                 insecure: bool = False) -> None:
        self.base_dir = Path(base_dir)
        self.log_dir = self.base_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if insecure and cluster_secret:
            raise LocalClusterError("a cluster is either insecure or has a cluster_secret, not both")
        self.insecure = insecure
        #: The secret every process of this cluster shares (None when insecure).
        self.cluster_secret: str | None = None if insecure else (cluster_secret or generate_secret_text())
        #: The file holding it, named by every process's ``cluster_secret_file``.
        self.secret_file: Path | None = None
        if self.cluster_secret is not None:
            self.secret_file = self.base_dir / "cluster.secret"
            self.secret_file.touch(mode=0o600)
            self.secret_file.chmod(0o600)
            self.secret_file.write_text(self.cluster_secret + "\n", encoding="utf-8")
        #: Signs what :meth:`request` sends, as a holder of the secret.
        self.auth: RequestAuthenticator = request_auth(self.cluster_secret)
        self.cluster_name = cluster_name
        self.broker_defaults = dict(broker_defaults)
        self.namesrv_defaults = dict(namesrv_defaults)
        self.controller_defaults = dict(controller_defaults)
        self.python = python
        self.processes: list[Process] = []
        self.controllers: list[ControllerProc] = []
        self.namesrvs: list[NamesrvProc] = []
        self.brokers: list[BrokerProc] = []
        self._loop: EventLoopThread | None = None
        self._clients: dict[str, RemotingClient] = {}
        #: TLS of the harness's own requests (set it before the first for a TLS cluster).
        self.client_security: ClientSecurity | None = None

    # --- context manager ------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process and close every client; safe to call twice."""
        for proc in reversed(self.processes):
            try:
                proc.kill()
            except (OSError, subprocess.SubprocessError) as e:  # keep killing the others
                print(f"could not kill {proc.name}: {e}", file=sys.stderr)
        self._kill_strays()
        self._close_clients()

    def _kill_strays(self) -> None:
        """Kill children started for this cluster that no Process holds: an interrupt
        (Ctrl-C) landing inside ``Popen`` after the fork loses the handle."""
        known = {p.pid for p in self.processes if p.pid is not None}
        deadline = time.monotonic() + 2.0  # a child finishes its exec in milliseconds
        while True:
            found, starting = _children_naming(self.base_dir)
            for pid in found:
                if pid in known:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass  # it ended by itself meanwhile
            if not starting or time.monotonic() > deadline:
                return
            time.sleep(0.005)  # look again once the exec has set the command line

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every process gracefully: SIGTERM to all at once, SIGKILL to whatever still
        runs after ``timeout``; then close the clients."""
        for proc in self.processes:
            try:
                proc.terminate()
            except OSError as e:  # reaped between poll() and the signal; keep going
                print(f"could not signal {proc.name}: {e}", file=sys.stderr)
        deadline = time.monotonic() + timeout
        for proc in self.processes:
            if proc.proc is None:
                continue
            try:
                proc.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self.close()

    def _close_clients(self) -> None:
        if self._loop is not None:
            for client in self._clients.values():
                try:
                    self._loop.run(client.close(), timeout=5)
                except (RemotingError, OSError, TimeoutError):
                    pass  # the process behind it is dead; nothing to close cleanly
            self._clients.clear()
            self._loop.stop()
            self._loop = None

    def leftovers(self) -> Leftovers:
        """Started processes still running, and their ports that still accept connections."""
        running = [p.name for p in self.processes if p.alive]
        ports = sorted({port for p in self.processes for port in p.ports()
                        if port_open(f"127.0.0.1:{port}", 0.2)})
        return Leftovers(running, ports)

    # --- starting processes ---------------------------------------------------------------

    def secret_settings(self, kind: str) -> dict[str, Any]:
        """The security keys a process of ``kind`` ("controller", "namesrv", "broker") gets."""
        if self.secret_file is not None:
            return {"cluster_secret_file": str(self.secret_file)}
        return {"allow_insecure": True} if kind == "controller" else {}

    @property
    def embedded_controllers(self) -> list[str]:
        """Controllers hosted by name servers (enable_controller_in_namesrv)."""
        return [addr for ns in self.namesrvs if (addr := ns.controller_address) is not None]

    @property
    def controller_addresses(self) -> list[str]:
        return [c.address for c in self.controllers] + self.embedded_controllers

    @property
    def namesrv_addresses(self) -> list[str]:
        return [n.address for n in self.namesrvs]

    def add_controllers(self, n: int = 1, *, per_node: Mapping[int, Mapping[str, Any]] | None = None,
                        **overrides: Any) -> list[ControllerProc]:
        """Create (do not start) an n-node controller group with free RPC and Raft ports.

        ``overrides`` apply to every node, ``per_node[i]`` to node i only."""
        new: list[ControllerProc] = []
        for i in range(n):
            name = f"controller{len(self.controllers)}"
            config = controller_config(self.base_dir / name, self_id=f"n{i}", peers="", raft_peers="",
                                       **{**self.secret_settings("controller"),
                                          **self.controller_defaults, **overrides,
                                          **(per_node or {}).get(i, {})})
            proc = ControllerProc(self, name, "controller", config, self.base_dir / name)
            self.controllers.append(proc)
            self.processes.append(proc)
            new.append(proc)
        PortChoice(new, _choose_controller_ports(new), partial(_choose_controller_ports, new, again=True))
        return new

    def start_controllers(self, n: int = 1, *, wait: bool = True, **overrides: Any) -> list[ControllerProc]:
        """Start an n-node controller group (1, 3 or 5); with ``wait`` see
        :meth:`wait_controllers`."""
        new = self.add_controllers(n, **overrides)
        for proc in new:
            proc.start()
        if wait:
            self.wait_controllers(new)
        return new

    def wait_controllers(self, group: list[ControllerProc], timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until ``group`` has a leader and every node serves.  A node that exits at
        start because another process bound one of its ports after they were chosen (tests
        on several workers share 127.0.0.1) gets the whole group started again on fresh
        ports (:class:`PortChoice`, as every wait does); once it serves, its ports stay
        (brokers and name servers are told them)."""
        self.wait_for(lambda: self.controller_leader() is not None
                      and all(proc.listens(proc.address) for proc in group),
                      timeout, what="a controller leader")
        for proc in group:
            proc.port_choice.keep()

    def start_namesrv(self, *, wait: bool = True, **overrides: Any) -> NamesrvProc:
        """Start a name server on a free port (or ``listen_port``); with ``wait`` until it
        listens."""
        name = f"namesrv{len(self.namesrvs)}"
        config = {**self.secret_settings("namesrv"), **self.namesrv_defaults, **overrides}
        chosen = "listen_port" not in config
        if chosen:
            config["listen_port"] = free_port()
        proc = NamesrvProc(self, name, "namesrv", config, self.base_dir / name)
        if chosen:
            PortChoice([proc], proc.picked_ports(), proc.choose_ports)
        self.namesrvs.append(proc)
        self.processes.append(proc)
        proc.start()
        if wait:
            self.wait_for(lambda: proc.listens(proc.address), what=f"{name} listening", process=proc)
        return proc

    def start_namesrv_with_controller(self, **overrides: Any) -> NamesrvProc:
        """A name server hosting a one-node controller (``enable_controller_in_namesrv``)
        on free ports (with ``listen_port`` given, none of them moves)."""
        name = f"namesrv{len(self.namesrvs)}"
        rpc, raft = free_port(), free_port()
        controller = controller_config(self.base_dir / name / "controller", self_id="n0",
                                       peers=f"n0-127.0.0.1:{rpc}", raft_peers=f"n0-127.0.0.1:{raft}",
                                       **{**self.secret_settings("controller"),
                                          **self.controller_defaults})
        proc = self.start_namesrv(wait=False, enable_controller_in_namesrv=True, controller=controller, **overrides)
        self.wait_for(lambda: proc.listens(proc.address), what=f"{proc.name} listening", process=proc)
        self.wait_for(lambda: self.controller_leader() is not None, what="the embedded controller to lead",
                      process=proc)
        return proc

    def broker_config(self, group: str, name: str, **overrides: Any) -> dict[str, Any]:
        """The config of broker ``name`` of ``group``; ``listen_port`` only if given
        (:meth:`add_broker` chooses one)."""
        config: dict[str, Any] = {
            "cluster": self.cluster_name,
            "broker_name": group,
            "store_dir": str(self.base_dir / name / "store"),
            "controller_addr": self.controller_addresses,
            "namesrv_addr": self.namesrv_addresses,
            **self.secret_settings("broker"),
            **self.broker_defaults,
        }
        config.update(overrides)
        return config

    def add_broker(self, group: str = "broker-a", **overrides: Any) -> BrokerProc:
        """Create (do not start) a broker of ``group``; name ``<group>-<n>``."""
        n = sum(1 for b in self.brokers if b.group == group)
        name = f"{group}-{n}"
        config = self.broker_config(group, name, **overrides)
        chosen = "listen_port" not in config
        if chosen:
            config["listen_port"] = free_port_pair()
        proc = BrokerProc(self, name, "broker", config, self.base_dir / name)
        if chosen:
            PortChoice([proc], proc.picked_ports(), proc.choose_ports)
        self.brokers.append(proc)
        self.processes.append(proc)
        return proc

    def start_broker(self, group: str = "broker-a", *, wait: bool = True,
                     env: Mapping[str, str] | None = None, **overrides: Any) -> BrokerProc:
        """Start a broker; with ``wait`` until its client port answers."""
        proc = self.add_broker(group, **overrides)
        proc.start(env=env)
        if wait:
            self.wait_broker_up(proc)
        return proc

    def wait_broker_up(self, proc: BrokerProc, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.wait_for(lambda: proc.listens(proc.address), timeout, what=f"{proc.name} listening", process=proc)

    def wait_role(self, proc: BrokerProc, role: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until the broker reports ``role`` ("master", "slave" or "fenced")."""
        self.wait_for(lambda: self.broker_role(proc) == role, timeout, what=f"{proc.name} to be {role}",
                      process=proc)

    def start_group(self, group: str = "broker-a", n: int = 3, *, in_sync: bool = False,
                    timeout: float = 30.0, **overrides: Any) -> list[BrokerProc]:
        """Start ``n`` brokers of one group one after the other: the first is master (id 1),
        the others slaves (ids 2..n).  With ``in_sync`` also wait until the controller's
        SyncStateSet holds all of them (every slave caught up)."""
        brokers = [self.start_broker(group, **overrides) for _ in range(n)]
        self.wait_role(brokers[0], "master", timeout)
        for b in brokers[1:]:
            self.wait_role(b, "slave", timeout)
        if in_sync:
            ids = sorted(b.broker_id() or 0 for b in brokers)
            self.wait_for(lambda: (info := self.replica_info(group)) is not None and info.sync_state_set == ids,
                          timeout, what=f"SyncStateSet {ids} of {group}")
        return brokers

    # --- waiting --------------------------------------------------------------------------

    def wait_for(self, condition: Callable[[], T], timeout: float = DEFAULT_TIMEOUT, *,
                 what: str = "condition", interval: float = 0.05, process: Process | None = None) -> T:
        """Poll ``condition`` until it returns a truthy value (returned) or the deadline.

        A condition that raises RemotingError/OSError/KeyError/ValueError counts as "not
        yet".  If ``process`` is given and it exits, the wait fails at once (unless it
        exited because a port was taken: every poll starts such processes again, see
        :class:`PortChoice`).  The failure (:class:`LocalClusterError`) carries every
        process's log tail.
        """
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            try:
                value = condition()
                if value:
                    return value
            except _NOT_YET as exc:
                last_error = exc
            self.recover_port_clashes()
            if process is not None and process.proc is not None and not process.alive:
                raise LocalClusterError(
                    f"{process.name} exited with {process.returncode} while waiting for {what}\n{self.describe()}"
                )
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"timed out after {timeout}s waiting for {what} (last error: {last_error!r})\n{self.describe()}"
                )
            time.sleep(interval)

    def recover_port_clashes(self) -> None:
        """Start again every process that exited at start because another process took one
        of its ports (:class:`PortChoice`); every wait does this while it polls."""
        for proc in list(self.processes):
            proc.recover_port_clash()

    def holds(self, condition: Callable[[], Any], duration: float, *, what: str = "condition",
              interval: float = 0.1) -> None:
        """Raise unless ``condition`` stays truthy for ``duration`` seconds (checked every
        ``interval``).  For "nothing happens" checks (no election, no role change); not a
        synchronisation."""
        deadline = time.monotonic() + duration
        while True:
            value = condition()
            if not value:
                raise LocalClusterError(f"{what} stopped holding ({value!r})\n{self.describe()}")
            if time.monotonic() >= deadline:
                return
            time.sleep(interval)

    def describe(self, lines: int = 30) -> str:
        """Every process's state and log tail (for failure messages)."""
        parts = []
        for proc in self.processes:
            parts.append(f"----- {proc!r} log {proc.log_path} -----\n{proc.log_tail(lines)}")
        return "\n".join(parts)

    # --- talking to processes -------------------------------------------------------------

    def request(self, addr: str, code: int, ext: Mapping[str, Any] | None = None,
                body: Any = b"", timeout: float = 3.0) -> RemotingCommand:
        """Send one request to ``addr`` and return the response (any code); one that needs
        proof of the cluster secret is signed with it."""
        if self._loop is None:
            self._loop = EventLoopThread("cluster-client")
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = RemotingClient(addr, connect_timeout=1.0,
                                                          security=self.control_security(addr))
        cmd = self.auth.sign(RemotingCommand.request(code, ext, body))
        return self._loop.run(client.request(cmd, timeout), timeout + 2)

    def control_security(self, addr: str) -> ClientSecurity | None:
        """A controller's or name server's link is an authenticated channel when the
        cluster has a secret (their writes need one); a broker's client port is plain."""
        control = ({p.address for p in self.controllers} | {p.address for p in self.namesrvs}
                   | set(self.embedded_controllers))
        if self.cluster_secret is None or addr not in control:
            return self.client_security
        key = key_from_text(self.cluster_secret, Identity.admin("local-cluster"),
                            (Role.CONTROLLER, Role.NAMESRV))
        return (self.client_security or ClientSecurity()).with_channel(key)

    def controller_metadata(self, addr: str, timeout: float = 1.0) -> dict[str, str] | None:
        """GET_METADATA_INFO of one controller (its ext fields), None if it does not answer."""
        try:
            resp = self.request(addr, RequestCode.CONTROLLER_GET_METADATA_INFO, timeout=timeout)
        except (RemotingError, TimeoutError):
            return None
        return dict(resp.ext_fields) if resp.code == ResponseCode.SUCCESS else None

    def controller_leader(self) -> str | None:
        """Address of the controller leader: a live controller that says it leads, else
        the leader a live controller names."""
        dead = {proc.address for proc in self.controllers if not proc.alive}
        named: str | None = None
        for addr in self.controller_addresses:
            if addr in dead:
                continue
            meta = self.controller_metadata(addr)
            if meta is None:
                continue
            if meta.get("isLeader") == "true":
                return addr
            named = named or meta.get("controllerLeaderAddress") or None
        return named if named not in dead else None

    def controller_request(self, code: int, ext: Mapping[str, Any] | None = None, body: Any = b"") -> RemotingCommand:
        leader = self.controller_leader()
        if leader is None:
            raise RemotingError("no controller leader")
        return self.request(leader, code, ext, body)

    def replica_info(self, group: str) -> ReplicaInfo | None:
        """GET_REPLICA_INFO of a group from the controller leader (None if unknown)."""
        resp = self.controller_request(RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": group})
        if resp.code != ResponseCode.SUCCESS:
            return None
        ext = resp.ext_fields
        body = resp.json_body() or {}
        master_id = ext.get("masterBrokerId")
        return ReplicaInfo(
            master_id=int(master_id) if master_id not in (None, "", "null") else None,
            master_address=ext.get("masterAddress") or None,
            master_epoch=int(ext.get("masterEpoch", 0) or 0),
            sync_state_set=sorted(int(i) for i in body.get("syncStateSet", [])),
            sync_state_set_epoch=int(body.get("syncStateSetEpoch", 0) or 0),
        )

    def sync_state_data(self, group: str) -> dict[str, Any]:
        """GET_SYNC_STATE_DATA of one group: the BrokerReplicasInfo entry (ids, addresses, alive)."""
        resp = self.controller_request(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=[group])
        resp.check_success()
        return (resp.json_body() or {}).get("replicasInfoTable", {}).get(group, {})

    def route(self, topic: str, namesrv: NamesrvProc | None = None) -> dict[str, Any] | None:
        ns = namesrv or self.namesrvs[0]
        resp = self.request(ns.address, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        resp.check_success()
        return resp.json_body()

    def group_route(self, group: str, namesrv: NamesrvProc | None = None) -> dict[str, Any] | None:
        """The name server's view of one broker group: brokerAddrs {"id": addr}, haAddrs, masterEpoch."""
        ns = namesrv or self.namesrvs[0]
        resp = self.request(ns.address, RequestCode.GET_BROKER_MEMBER_GROUP,
                            {"clusterName": self.cluster_name, "brokerName": group})
        if resp.code != ResponseCode.SUCCESS:
            return None
        body = resp.json_body() or {}
        return {**body.get("brokerMemberGroup", {}), **{k: v for k, v in body.items() if k != "brokerMemberGroup"}}

    def broker_epochs(self, broker: BrokerProc) -> dict[str, Any]:
        """GET_BROKER_EPOCH_CACHE of one broker: epochList, maxOffset, brokerId."""
        resp = self.request(broker.address, RequestCode.GET_BROKER_EPOCH_CACHE)
        resp.check_success()
        return resp.json_body()

    def broker_status(self, broker: BrokerProc) -> dict[str, Any]:
        """GET_BROKER_HA_STATUS of one broker: role, epoch, offsets, HA link state."""
        resp = self.request(broker.address, RequestCode.GET_BROKER_HA_STATUS)
        resp.check_success()
        return resp.json_body()

    def broker_role(self, broker: BrokerProc) -> str | None:
        """"master", "slave" or "fenced" as the broker itself reports (None if unreachable)."""
        try:
            return self.broker_status(broker).get("role")
        except (RemotingError, TimeoutError):
            return None

    def master_of(self, group: str) -> BrokerProc | None:
        """The live broker process the controller names master of ``group``."""
        info = self.replica_info(group)
        if info is None or info.master_address is None:
            return None
        for proc in self.brokers:
            if proc.group == group and proc.alive and proc.address == info.master_address:
                return proc
        return None

    def broker_by_id(self, group: str, broker_id: int) -> BrokerProc | None:
        """The broker process of ``group`` whose settled id is ``broker_id``."""
        for proc in self.brokers:
            if proc.group == group and proc.broker_id() == broker_id:
                return proc
        return None


def _choose_controller_ports(group: list[ControllerProc], *, again: bool = False) -> set[int]:
    """Fresh RPC and Raft ports for every node of ``group``, written into each node's
    peers; the ports chosen.  ``again``: the journals a start on the old ones left in the
    harness's own directories go too (they name the old peers)."""
    rpc = [free_port() for _ in group]
    raft = [free_port() for _ in group]
    peers = ";".join(f"{proc.node_id}-127.0.0.1:{port}" for proc, port in zip(group, rpc))
    raft_peers = ";".join(f"{proc.node_id}-127.0.0.1:{port}" for proc, port in zip(group, raft))
    for proc in group:
        proc.config.update(controller_peers=peers, raft_peers=raft_peers)
        if again and Path(proc.config["controller_store_path"]).is_relative_to(proc.workdir):
            shutil.rmtree(proc.config["controller_store_path"], ignore_errors=True)
    return {*rpc, *raft}


def controller_config(workdir: Path, *, self_id: str, peers: str, raft_peers: str,
                      **overrides: Any) -> dict[str, Any]:
    """A controller config dict (ControllerConfig's key names).

    ``peers`` is ``id-host:port;...`` of the RPC addresses, ``raft_peers`` the same for
    pysyncobj.  Timers come from ``overrides`` (a :class:`Cluster` passes its defaults).
    """
    config: dict[str, Any] = {
        "controller_peers": peers,
        "controller_self_id": self_id,
        "raft_peers": raft_peers,
        "controller_store_path": str(workdir / "data"),
    }
    config.update(overrides)
    return config
