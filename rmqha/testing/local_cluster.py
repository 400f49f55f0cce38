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

The processes are :mod:`rmqha.testing.processes`'s and the ports :mod:`rmqha.testing.ports`'s;
this module names them too (``__all__``), as the harness's one face.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rmqha.protocol.control_headers import GetReplicaInfoHeader, ReplicaInfoAnswer
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
from rmqha.testing.ports import (
    PORT_CLASH_RETRIES,
    PORT_FREE_TIMEOUT,
    PORT_TAKEN,
    _children_naming,
    free_port,
    free_port_pair,
    ListenSocket,
    listening_sockets,
    live_processes_naming,
    pid_listens,
    port_open,
    taken_port,
)
from rmqha.testing.processes import (
    DEFAULT_TIMEOUT,
    BrokerProc,
    ControllerProc,
    NamesrvProc,
    PortChoice,
    Process,
    write_toml,
)

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

#: Errors a polled condition may raise while the cluster is still getting there.
_NOT_YET = (RemotingError, OSError, KeyError, ValueError)



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
        resp = self.controller_request(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                       GetReplicaInfoHeader(broker_name=group).build())
        if resp.code != ResponseCode.SUCCESS:
            return None
        h = ReplicaInfoAnswer.parse(resp.ext_fields)
        body = resp.json_body() or {}
        return ReplicaInfo(
            master_id=h.master_broker_id,
            master_address=h.master_address or None,
            master_epoch=h.master_epoch,
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


__all__ = [
    "DEFAULT_TIMEOUT", "PORT_CLASH_RETRIES", "PORT_FREE_TIMEOUT", "PORT_TAKEN", "QUICK_BROKER",
    "QUICK_CONTROLLER", "QUICK_NAMESRV", "BrokerProc", "Cluster", "ControllerProc", "Leftovers",
    "NamesrvProc", "PortChoice", "Process", "ReplicaInfo", "_children_naming", "controller_config",
    "free_port", "free_port_pair", "ListenSocket", "listening_sockets", "live_processes_naming",
    "pid_listens", "port_open", "taken_port", "write_toml",
]
