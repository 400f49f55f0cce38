"""The interop tests' cluster: started as README's "Running it" tells an operator, in two modes.

Real ``python -m rmqha controller|namesrv|broker --config FILE`` processes
(:mod:`rmqha.testing.local_cluster`): 3 controllers, a name server and one broker group of 3
whose master acknowledges a send only once every SyncStateSet member holds it (and never
with fewer than two copies).  Two modes (:class:`Mode`):

- ``plaintext``: the cluster secret only (Raft encrypted, control requests signed, HA links
  authenticated), no TLS, no ACL: what a Java client meets without any setting;
- ``tls-acl``: as ``deploy/`` and ``make chaos`` run it (:mod:`rmqha.testing.secure_setup`):
  mutual TLS (enforcing, client certificate required) on every remoting port, HA and Raft
  link, and ACL 1.0 on the brokers with one application account that holds exactly the
  module's grants (:class:`Grants`) and an admin account for the harness.  Java drivers get
  RocketMQ's client TLS system properties (:meth:`InteropCluster.java_props`) and the
  account's keys for ``AclClientRPCHook`` (:meth:`InteropCluster.java_env`).

A Java driver reads ``INTEROP_NAMESRV`` (and ``INTEROP_ACCESS_KEY`` / ``INTEROP_SECRET_KEY``
when set) from its environment: ``io.rmqha.interop.Connect`` turns them into a client.
Starting both modes' clusters takes about 10-20 s each on two busy cores.
"""
from __future__ import annotations

import enum
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interop_support import run_driver, start_driver

from rmqha.errors import LocalClusterError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.headers import CreateTopicHeader
from rmqha.testing.local_cluster import QUICK_BROKER, QUICK_CONTROLLER, QUICK_NAMESRV, BrokerProc, Cluster
from rmqha.testing.secure_setup import Account, SecureSetup

CLUSTER_NAME = "rmqha-interop"
GROUP = "broker-a"
REPLICAS = 3
APP_KEY = "interop-app"
ADMIN_KEY = "interop-admin"
#: A send is acknowledged once every SyncStateSet member holds it, never with fewer than two
#: copies (the demo's and deploy/'s policy): what "acknowledged" means in every test here.
ALL_ACK: dict[str, Any] = {"all_ack_in_sync_state_set": True, "min_in_sync_replicas": 2,
                           "slave_timeout_ms": 3000}
#: Transaction checks within seconds, not RocketMQ's 6 s / 60 s (the check-back tests wait
#: for them); everything else is the brokers' default.
QUICK_CHECKS: dict[str, Any] = {"transaction_timeout_ms": 2000, "transaction_check_interval_ms": 1000,
                                "transaction_check_max": 120}
#: Longest wait for the cluster to come up on two busy cores.
START_TIMEOUT_S = 90.0


class Mode(enum.Enum):
    PLAINTEXT = "plaintext"
    TLS_ACL = "tls-acl"


@dataclass(frozen=True)
class Grants:
    """What the application account of the ``tls-acl`` mode holds: topic -> ``PUB``, ``SUB``
    or ``PUB|SUB``, and SUB on the consumer groups; everything else is DENY.  A test
    module lists its own by overriding the ``interop_grants`` fixture."""

    topics: Mapping[str, str] = field(default_factory=dict)
    groups: Sequence[str] = ()


@dataclass
class InteropCluster:
    """One running cluster and what a Java driver (or rmqha's Python client) needs to use it."""

    mode: Mode
    cluster: Cluster
    base_dir: Path
    security: SecureSetup | None = None
    brokers: list[BrokerProc] = field(default_factory=list)
    group: str = GROUP

    @property
    def namesrv(self) -> str:
        return ";".join(self.cluster.namesrv_addresses)

    @property
    def secured(self) -> bool:
        return self.security is not None

    # --- what a Java driver gets ----------------------------------------------------------

    def java_props(self) -> list[str]:
        """JVM system properties: RocketMQ's client TLS settings (``TlsSystemConfig``; they
        are read once, when the class loads, so they go on the command line) and where the
        client writes its own log.  ``tls.test.mode.enable=false`` makes TlsHelper use the
        given key pair and ``tls.client.authServer=true`` makes it check the brokers' and
        name server's certificates against the cluster's CA; the key is PKCS#8 PEM (what
        Netty's SslContextBuilder reads)."""
        props = {"rocketmq.log.root": str(self.base_dir / "java-logs"),  # rmq.client.logback.xml's
                 "rocketmq.log.level": "INFO"}
        if self.security is not None:
            tls = self.security.client_tls()
            props.update({
                "tls.enable": "true",
                "tls.test.mode.enable": "false",
                "tls.client.authServer": "true",
                "tls.client.trustCertPath": str(tls.client_trust_cert_path),
                "tls.client.certPath": str(tls.client_cert_path),
                "tls.client.keyPath": str(tls.client_key_path),
                # Not /etc/rocketmq/tls.properties: nothing of the machine's may change the test.
                "tls.config.file": str(self.base_dir / "no-tls.properties"),
            })
        return [f"-D{key}={value}" for key, value in props.items()]

    def java_env(self) -> dict[str, str]:
        """Environment of a driver: the name server, and the account (tls-acl) that
        ``Connect`` hands to ``AclClientRPCHook``."""
        env = {"INTEROP_NAMESRV": self.namesrv, "INTEROP_MODE": self.mode.value}
        if self.security is not None:
            env.update(INTEROP_ACCESS_KEY=self.security.app.access_key,
                       INTEROP_SECRET_KEY=self.security.app.secret_key)
        return env

    def java_admin_env(self) -> dict[str, str]:
        """The same with the admin account (DefaultMQAdminExt, mqadmin)."""
        env = self.java_env()
        if self.security is not None:
            env.update(INTEROP_ACCESS_KEY=self.security.admin.access_key,
                       INTEROP_SECRET_KEY=self.security.admin.secret_key)
        return env

    def run(self, main_class: str, *args: str, timeout: float = 150.0, check: bool = True,
            admin: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a driver against this cluster to its end."""
        env = self.java_admin_env() if admin else self.java_env()
        return run_driver(main_class, *args, timeout=timeout, check=check, env=env,
                          jvm_args=self.java_props())

    def start(self, main_class: str, *args: str, admin: bool = False) -> subprocess.Popen[str]:
        """Start a driver in the background (its stderr in ``logs/java-<class>.log``)."""
        env = self.java_admin_env() if admin else self.java_env()
        log = self.cluster.log_dir / f"java-{main_class.rsplit('.', 1)[-1]}.log"
        return start_driver(main_class, *args, env=env, jvm_args=self.java_props(), stderr=log)

    # --- what rmqha's own Python clients get ------------------------------------------------

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of rmqha's Producer/Consumer: the application's account and
        certificate (tls-acl), nothing (plaintext)."""
        return self.security.client_options() if self.security is not None else {}

    def admin_options(self) -> dict[str, Any]:
        return self.security.admin_options() if self.security is not None else {}

    # --- administration -------------------------------------------------------------------

    def master(self) -> BrokerProc:
        master = self.cluster.wait_for(lambda: self.cluster.master_of(self.group), 30,
                                       what=f"a master of {self.group}")
        assert master is not None  # wait_for returns only a truthy value
        return master

    def create_topic(self, topic: str, queues: int = 4, *, attributes: str | None = None) -> None:
        """UPDATE_AND_CREATE_TOPIC on the master (as the admin account over the admin
        certificate in tls-acl), then wait until the name server routes it."""
        ext = CreateTopicHeader(topic=topic, read_queue_nums=queues, write_queue_nums=queues).build()
        if attributes:
            ext["attributes"] = attributes
        self._admin_request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext, b"", f"topic {topic}")
        self.cluster.wait_for(
            lambda: (r := self.cluster.route(topic)) is not None
            and any("0" in b["brokerAddrs"] for b in r["brokerDatas"])
            and sum(q["writeQueueNums"] for q in r["queueDatas"]) == queues,
            30, what=f"the name server's route of {topic}")

    def create_group(self, group: str, **config: Any) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on the master (``config``:
        :class:`SubscriptionGroupConfig`'s fields, e.g. ``consume_message_orderly=True``)."""
        body = SubscriptionGroupConfig(group_name=group, **config).to_rocketmq()
        self._admin_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body,
                            f"group {group}")

    def _admin_request(self, code: int, ext: Mapping[str, Any], body: Any, what: str) -> None:
        master = self.master()
        resp = self.cluster.request(master.address, code, ext, body, timeout=5.0)
        if resp.code != ResponseCode.SUCCESS:
            raise LocalClusterError(f"creating {what} on {master.address} refused: "
                                    f"{resp.code} {resp.remark}")

    # --- faults ---------------------------------------------------------------------------

    def kill_master(self, timeout: float = 30.0) -> tuple[BrokerProc, BrokerProc]:
        """SIGKILL the master; wait until the controllers elect another and it serves as
        master; (killed, new master)."""
        old = self.master()
        old.kill()
        def new_master() -> BrokerProc | None:
            m = self.cluster.master_of(self.group)
            return m if m is not None and m is not old and self.cluster.broker_role(m) == "master" else None
        new = self.cluster.wait_for(new_master, timeout,
                                    what=f"a new master of {self.group} after killing {old.name}")
        assert new is not None
        return old, new

    def heal(self, timeout: float = 60.0) -> None:
        """Start every stopped broker again on its store and wait until the SyncStateSet
        holds all of them: the next test finds the group whole."""
        for proc in self.brokers:
            if not proc.alive:
                proc.start()
                self.cluster.wait_broker_up(proc, timeout)
        ids = sorted(b.broker_id() or 0 for b in self.brokers)
        self.cluster.wait_for(
            lambda: (i := self.cluster.replica_info(self.group)) is not None and i.sync_state_set == ids,
            timeout, what=f"SyncStateSet {ids} of {self.group} again")


def start_interop_cluster(base: Path, mode: Mode, grants: Grants) -> tuple[Cluster, SecureSetup | None,
                                                                          list[BrokerProc]]:
    """Controllers, name server and the broker group, each with its certificate (tls-acl)."""
    security = None
    if mode is Mode.TLS_ACL:
        app = Account.new(APP_KEY, topics=grants.topics, groups=list(grants.groups))
        security = SecureSetup.make(base / "security", cluster=CLUSTER_NAME, groups={GROUP: REPLICAS},
                                    app=app, controllers=3, admin_key=ADMIN_KEY)
    cluster = Cluster(base, cluster_name=CLUSTER_NAME,
                      broker_defaults={**QUICK_BROKER, **ALL_ACK, **QUICK_CHECKS},
                      namesrv_defaults=QUICK_NAMESRV, controller_defaults=QUICK_CONTROLLER,
                      cluster_secret=security.cluster_secret if security else None)
    try:
        if security is not None:
            cluster.client_security = security.harness_security()
        cluster.start_controllers(3, wait=False, **({"per_node": security.controller_keys(3)} if security else {}))
        cluster.wait_controllers(cluster.controllers, START_TIMEOUT_S)
        ns = cluster.start_namesrv(wait=False, **(security.namesrv_keys() if security else {}))
        cluster.wait_for(lambda: ns.listens(ns.address), START_TIMEOUT_S, what=f"{ns.name} listening",
                         process=ns)
        brokers = []
        for i in range(REPLICAS):
            keys = security.broker_keys(GROUP, f"{GROUP}-{i}") if security else {}
            proc = cluster.start_broker(GROUP, wait=False, **keys)
            cluster.wait_broker_up(proc, START_TIMEOUT_S)
            brokers.append(proc)
        cluster.wait_role(brokers[0], "master", START_TIMEOUT_S)
        for proc in brokers[1:]:
            cluster.wait_role(proc, "slave", START_TIMEOUT_S)
        ids = sorted(b.broker_id() or 0 for b in brokers)
        cluster.wait_for(lambda: (i := cluster.replica_info(GROUP)) is not None and i.sync_state_set == ids,
                         START_TIMEOUT_S, what=f"SyncStateSet {ids} of {GROUP}")
    except BaseException:
        cluster.close()
        raise
    return cluster, security, brokers
