"""A cluster for the mqadmin tests, in two modes, and one mqadmin JVM that runs their commands.

The cluster is started as README's "Running it" tells an operator: 3 controllers, a name
server and one broker group of 2 (a master and a slave, so ``electMaster`` has someone to
elect), as real processes (:mod:`rmqha.testing.local_cluster`), in two modes:

- ``plaintext``: the cluster secret only (control requests signed, Raft encrypted);
- ``tls-acl``: mutual TLS (enforcing, client certificate required) on every port and ACL
  1.0 on the brokers (:mod:`rmqha.testing.secure_setup`): mqadmin gets the admin
  certificate through RocketMQ's TLS system properties and the admin account through
  ``$ROCKETMQ_HOME/conf/tools.yml``, as an operator configures it.

Written for these tests while the shared interop fixture was not there yet; a later merge
may fold it into that one.

:class:`MqAdmin` is one JVM of ``io.rmqha.interop.admin.AdminSession`` (mqadmin's own
``MQAdminStartup.main0`` per command): loading mqadmin's classes costs 15-20 s of wall time
on two busy cores, paid once per module instead of once per command.
"""
from __future__ import annotations

import enum
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interop_support import classpath, java

from rmqha.testing.local_cluster import QUICK_BROKER, QUICK_CONTROLLER, QUICK_NAMESRV, BrokerProc, Cluster
from rmqha.testing.secure_setup import ADMIN, Account, SecureSetup

CLUSTER_NAME = "rmqha-admin"
GROUP = "broker-a"
REPLICAS = 2
START_TIMEOUT_S = 90.0
#: What one mqadmin command may take on two busy cores (a JVM shared by the module).
COMMAND_TIMEOUT_S = 60.0
#: How often a command whose request timed out in the client is tried.
ATTEMPTS = 3
CLIENT_TIMEOUTS = ("RemotingTimeoutException", "RemotingConnectException", "RemotingTooMuchRequestException")


class Mode(enum.Enum):
    PLAINTEXT = "plaintext"
    TLS_ACL = "tls-acl"


@dataclass
class AdminCluster:
    mode: Mode
    cluster: Cluster
    base_dir: Path
    security: SecureSetup | None
    brokers: list[BrokerProc] = field(default_factory=list)

    @property
    def namesrv(self) -> str:
        return ";".join(self.cluster.namesrv_addresses)

    @property
    def controllers(self) -> list[str]:
        return self.cluster.controller_addresses

    def master(self) -> BrokerProc:
        master = self.cluster.wait_for(lambda: self.cluster.master_of(GROUP), 30, what=f"a master of {GROUP}")
        assert master is not None
        return master

    def java_props(self) -> list[str]:
        """RocketMQ's client TLS settings (``TlsSystemConfig``, read once at class load) with
        the operator's certificate, and where the client writes its log."""
        props = {"rocketmq.client.logRoot": str(self.base_dir / "java-logs"),
                 "rocketmq.client.logLevel": "WARN"}
        if self.security is not None:
            tls = self.security.client_tls(ADMIN)
            props.update({
                "tls.enable": "true", "tls.test.mode.enable": "false", "tls.client.authServer": "true",
                "tls.client.trustCertPath": str(tls.client_trust_cert_path),
                "tls.client.certPath": str(tls.client_cert_path),
                "tls.client.keyPath": str(tls.client_key_path),
                "tls.config.file": str(self.base_dir / "no-tls.properties"),
            })
        return [f"-D{key}={value}" for key, value in props.items()]

    def rocketmq_home(self) -> Path:
        """``ROCKETMQ_HOME`` with ``conf/tools.yml`` holding the admin account (tls-acl)."""
        home = self.base_dir / "rocketmq-home"
        (home / "conf").mkdir(parents=True, exist_ok=True)
        text = ""
        if self.security is not None:
            text = f"accessKey: {self.security.admin.access_key}\nsecretKey: {self.security.admin.secret_key}\n"
        (home / "conf" / "tools.yml").write_text(text)
        return home


def start_admin_cluster(base: Path, mode: Mode) -> AdminCluster:
    security = None
    if mode is Mode.TLS_ACL:
        app = Account.new("admin-test-app", topics={}, groups=[])
        security = SecureSetup.make(base / "security", cluster=CLUSTER_NAME, groups={GROUP: REPLICAS},
                                    app=app, controllers=3, admin_key="admin-test-operator")
    cluster = Cluster(base, cluster_name=CLUSTER_NAME, broker_defaults=QUICK_BROKER,
                      namesrv_defaults=QUICK_NAMESRV, controller_defaults=QUICK_CONTROLLER,
                      cluster_secret=security.cluster_secret if security else None)
    try:
        if security is not None:
            cluster.client_security = security.harness_security()
        cluster.add_controllers(3, **({"per_node": security.controller_keys(3)} if security else {}))
        for controller in cluster.controllers:
            controller.start()
        cluster.wait_controllers(cluster.controllers, START_TIMEOUT_S)
        ns = cluster.start_namesrv(wait=False, **(security.namesrv_keys() if security else {}))
        cluster.wait_for(lambda: ns.listens(ns.address), START_TIMEOUT_S, what="the name server listening",
                         process=ns)
        brokers = []
        for i in range(REPLICAS):
            keys = security.broker_keys(GROUP, f"{GROUP}-{i}") if security else {}
            proc = cluster.start_broker(GROUP, wait=False, **keys)
            cluster.wait_broker_up(proc, START_TIMEOUT_S)
            brokers.append(proc)
        cluster.wait_role(brokers[0], "master", START_TIMEOUT_S)
        cluster.wait_role(brokers[1], "slave", START_TIMEOUT_S)
        ids = sorted(b.broker_id() or 0 for b in brokers)
        cluster.wait_for(lambda: (i := cluster.replica_info(GROUP)) is not None and i.sync_state_set == ids,
                         START_TIMEOUT_S, what=f"SyncStateSet {ids} of {GROUP}")
    except BaseException:
        cluster.close()
        raise
    return AdminCluster(mode, cluster, base, security, brokers)


@dataclass(frozen=True)
class AdminResult:
    """What one mqadmin command printed."""

    argv: list[str]
    out: str
    err: str
    ms: int

    @property
    def text(self) -> str:
        return self.out + self.err

    def rows(self) -> list[list[str]]:
        """The output's lines split on whitespace (mqadmin's tables are padded columns)."""
        return [line.split() for line in self.out.splitlines() if line.strip()]

    def __str__(self) -> str:
        return f"mqadmin {' '.join(self.argv)} ({self.ms} ms)\nout:\n{self.out}\nerr:\n{self.err[-3000:]}"


class MqAdmin:
    """One mqadmin JVM for a test module: :meth:`run` sends a command, returns its output."""

    def __init__(self, target: AdminCluster) -> None:
        self.target = target
        env = {**os.environ, "ROCKETMQ_HOME": str(target.rocketmq_home()),
               "HOME": str(target.base_dir)}  # the client's own log files stay in the test dir
        cmd = [java(), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               *target.java_props(), "-cp", classpath(), "io.rmqha.interop.admin.AdminSession"]
        self.stderr = (target.base_dir / "mqadmin-session.log").open("a")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, bufsize=1, env=env)

    def run(self, *argv: str, timeout: float = COMMAND_TIMEOUT_S) -> AdminResult:
        """Run one command; one whose request timed out in the client (mqadmin waits 3 s, a
        cold JVM on two busy cores can miss that) is run again, up to :data:`ATTEMPTS` times
        (every command of these tests is idempotent)."""
        for _ in range(ATTEMPTS - 1):
            result = self._run_once(argv, timeout)
            if not any(e in result.err for e in CLIENT_TIMEOUTS):
                return result
        return self._run_once(argv, timeout)

    def _run_once(self, argv: tuple[str, ...], timeout: float) -> AdminResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(list(argv)) + "\n")
        self.proc.stdin.flush()
        line = _read_line(self.proc, timeout)
        data: dict[str, Any] = json.loads(line)
        return AdminResult(data["argv"], data["out"], data["err"], int(data["ms"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The session's next line, or an AssertionError once ``timeout`` passes (the JVM is
    killed then: a hung command must not hang the suite)."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise AssertionError(f"mqadmin gave no answer within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the mqadmin session ended (exit {proc.wait()})")
    return line
