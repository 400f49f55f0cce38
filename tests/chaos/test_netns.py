"""One chaos run across network namespaces: every process a test host with its own IP.

Seven namespaces on a bridge (10.213.7.0/24, made and removed by the test): three
controllers, a name server and three brokers, none on loopback, so the controllers' Raft
traffic needs the cluster secret and carries it (``raft_password``).  The test process
reaches them through the bridge.  Under load the master is SIGKILLed, a new one elected,
the old one restarted; the chaos checkers judge the history and the stores.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import harness as h
from cluster import QUICK_CONTROLLER, ControllerProc, NamesrvProc, free_port, free_port_pair, port_open
from harness import chaos_reports  # noqa: F401  (the fixture that prints the table)
from needs import require_root
from rmqha.testing.local_cluster import controller_config

SUBNET = "10.213.7"
SECRET = "chaos-netns-secret"
#: Without the secure mode, name servers and brokers serve plaintext without ACL on the
#: namespaces' private addresses: off loopback that needs allow_insecure (issue 37).
_PRIVATE_NET = {"allow_insecure": True}


class NetnsHosts:
    """Namespaces ``rmqha-<pid>-<i>`` with IPs SUBNET.(10+i) on one bridge."""

    def __init__(self, count: int) -> None:
        tag = os.getpid() % 100000
        self.bridge = f"rqb{tag}"
        self.names = [f"rmqha-{tag}-{i}" for i in range(count)]
        self.ips = [f"{SUBNET}.{10 + i}" for i in range(count)]

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def create(self) -> None:
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i, (ns, ip) in enumerate(zip(self.names, self.ips)):
            veth = f"{self.bridge}v{i}"
            self._ip("netns", "add", ns)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", veth, "master", self.bridge, "up")
            self._ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def remove(self) -> None:
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def launcher(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]


class NetnsRun(h.ChaosRun):
    """A chaos run whose processes live on the test hosts (no proxies: faults are signals)."""

    def __init__(self, base: Path, hosts: NetnsHosts) -> None:
        super().__init__(base, "netns: kill-master, secret on", expect_failover=True)
        self.hosts = hosts

    def start(self) -> None:
        c, hosts = self.cluster, self.hosts
        ports = [free_port() for _ in range(3)]
        peers = ";".join(f"n{i}-{hosts.ips[i]}:{ports[i]}" for i in range(3))
        raft = ";".join(f"n{i}-{hosts.ips[i]}:{ports[i] + 1}" for i in range(3))
        secure = self.secure  # RMQHA_CHAOS_SECURITY=tls-acl: mutual TLS and ACL here too
        for i in range(3):
            name = f"controller{i}"
            config = controller_config(c.base_dir / name, self_id=f"n{i}", peers=peers, raft_peers=raft,
                                       listen_host=hosts.ips[i], raft_password=SECRET, **QUICK_CONTROLLER,
                                       **c.secret_settings("controller"),
                                       **(secure.controller_keys(3)[i] if secure else {}))
            proc = ControllerProc(c, name, "controller", config, c.base_dir / name)
            proc.launcher = hosts.launcher(i)
            c.controllers.append(proc)
            c.processes.append(proc)
            proc.start()
        c.wait_for(lambda: c.controller_leader() is not None, 60, what="a controller leader across hosts")
        config = {"listen_port": free_port(), **c.namesrv_defaults, "listen_host": hosts.ips[3],
                  **c.secret_settings("namesrv"), **(secure.namesrv_keys() if secure else _PRIVATE_NET)}
        ns = NamesrvProc(c, "namesrv0", "namesrv", config, c.base_dir / "namesrv0")
        ns.launcher = hosts.launcher(3)
        c.namesrvs.append(ns)
        c.processes.append(ns)
        ns.start()
        c.wait_for(lambda: port_open(ns.address), 30, what="the name server on its host", process=ns)
        for i in range(3):
            b = c.add_broker(h.GROUP, listen_host=hosts.ips[4 + i], broker_ip=hosts.ips[4 + i],
                             listen_port=free_port_pair(), **self.acks,
                             **(secure.broker_keys(h.GROUP, f"{h.GROUP}-{i}") if secure else _PRIVATE_NET))
            b.launcher = hosts.launcher(4 + i)
            b.start()
            c.wait_broker_up(b)
            self.brokers.append(b)
        c.wait_role(self.brokers[0], "master", 60)
        ids = sorted(b.broker_id() or 0 for b in self.brokers)
        c.wait_for(lambda: (i := c.replica_info(h.GROUP)) is not None and i.sync_state_set == ids, 60,
                   what="the whole group in sync across hosts")
        if secure is not None:
            problems = secure.check_enforced(self.brokers[0].address)
            assert not problems, problems
        self.record_ids()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_across_network_namespaces_with_the_cluster_secret(tmp_path, chaos_reports):
    require_root("making network namespaces")  # skipped without root locally, a failure under CI
    hosts = NetnsHosts(7)
    hosts.remove()  # leftovers of an interrupted earlier run with the same pid
    try:
        hosts.create()
    except subprocess.CalledProcessError:
        hosts.remove()  # what was made before the step that failed
        raise
    run = NetnsRun(tmp_path, hosts)
    try:
        run.start()
        for ctl in run.cluster.controllers:
            assert ctl.config["raft_password"] == SECRET and not ctl.address.startswith("127.")
        run.start_load()
        run.run_load_for(1.5)
        h.kill_master(run)
        run.heal_and_settle()
        run.run_load_for(1.0)
        run.stop_load()
        report = run.check()
    finally:
        run.close()
        hosts.remove()
    chaos_reports.append(report)
    assert report.acked > 0 and report.lost == 0 and not report.problems, report.problems
