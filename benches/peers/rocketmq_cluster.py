"""A real Apache RocketMQ 5 cluster in controller mode on loopback, started from the jars
that ``benches/peers/maven`` pins (RocketMQ 5.5.0).

One name server with the controller embedded (``enableControllerInNamesrv=true``, a DLedger
group of one: rmqha's peer cluster also runs one controller; it serves brokers on its
DLedger port, the name server's port answers only name-server requests) and one broker group of
three brokers in controller mode (``enableControllerMode=true``, ``brokerId=-1``: the
controller hands out ids and elects the master).  ``allAckInSyncStateSet=true``: the master
(a SYNC_MASTER once elected) answers a send when every broker of the SyncStateSet holds it,
which is rmqha's ``all_ack_in_sync_state_set``; ``minInSyncReplicas`` stays 1 as in rmqha, so
after a master kill the shrunk set (two brokers) keeps acknowledging.  Flush is RocketMQ's
default (ASYNC_FLUSH), as rmqha's.

Every process is ``java -cp ... <Main> -c <file>.conf`` with ``ROCKETMQ_HOME`` set to a
directory made here and ``user.home`` pointed at the node's own directory (RocketMQ writes its
logs under ``~/logs/rocketmqlogs`` and the controller its store under ``~``), each with its
own store and a stdout log beside it.  Ports come from the harness's ``free_port``: a broker
uses listenPort - 2 (its fast channel), listenPort and listenPort + 1 (HA), so four
consecutive ones are taken for each.  The cluster is asked about itself over RocketMQ's
remoting protocol with rmqha's own client (GET_REPLICA_INFO at the embedded controller,
GET_ROUTEINFO_BY_TOPIC at the name server).
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peers.base import free_port, wait_port
from peers.jvm import Heap, JvmProc
from rmqha.errors import RemotingError
from rmqha.net.client import RemotingClient
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand

CLUSTER = "rocketmq-peer"
GROUP = "broker-a"
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
#: 128 MiB commitlog files (1 GiB by default: only the file size differs, not the path).
COMMITLOG_FILE_BYTES = 128 * 1024 * 1024
WAIT_IN_SEND_QUEUE_MS = 1000


def write_conf(path: Path, values: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


@dataclass
class ReplicaState:
    """The controller's view of the group: the master's address and the SyncStateSet."""

    master_address: str | None
    master_epoch: int
    sync_state_set: list[int]


class RocketmqCluster:
    """Name server (+ controller) and a three-broker group, each a JVM started by pid."""

    def __init__(self, workdir: Path, heaps: Mapping[str, Heap], brokers: int = 3,
                 seed_stores: Mapping[str, Path] | None = None) -> None:
        self.workdir = workdir
        self.heaps = heaps
        self.n_brokers = brokers
        #: broker name -> a store directory copied in as its ``storePathRootDir`` before its
        #: first start (a store another program wrote, opened by RocketMQ).
        self.seed_stores = dict(seed_stores or {})
        self.home = workdir / "rocketmq-home"
        self.namesrv: JvmProc | None = None
        self.namesrv_port = 0
        #: The embedded controller answers on its DLedger port, not the name server's.
        self.controller_port = 0
        self.brokers: dict[str, JvmProc] = {}
        self.broker_ports: dict[str, int] = {}
        self._loop: EventLoopThread | None = None
        self._clients: dict[str, RemotingClient] = {}

    @property
    def namesrv_address(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def controller_address(self) -> str:
        return f"127.0.0.1:{self.controller_port}"

    def broker_address(self, name: str) -> str:
        return f"127.0.0.1:{self.broker_ports[name]}"

    # -- processes ---------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {"ROCKETMQ_HOME": str(self.home)}

    def start(self, timeout: float = 180.0) -> None:
        (self.home / "conf").mkdir(parents=True, exist_ok=True)
        self.namesrv_port = free_port()
        raft_port = self.controller_port = free_port()
        ns_dir = self.workdir / "namesrv"
        conf = write_conf(ns_dir / "namesrv.conf", {
            "listenPort": self.namesrv_port,
            "enableControllerInNamesrv": "true",
            "controllerDLegerGroup": "peer-controllers",
            "controllerDLegerPeers": f"n0-127.0.0.1:{raft_port}",
            "controllerDLegerSelfId": "n0",
            "controllerStorePath": ns_dir / "controller-store",
            "mappedFileSize": 64 * 1024 * 1024,
            # The broker group's master is elected from what its brokers report every second.
            "scanNotActiveBrokerInterval": 1000,
        })
        self.namesrv = JvmProc("namesrv", "rocketmq", NAMESRV_MAIN, ["-c", str(conf)],
                               self.heaps["namesrv"], ns_dir / "namesrv.out", self._env(),
                               {"user.home": str(ns_dir)}).start()
        wait_port(self.namesrv_port, timeout, "RocketMQ name server", self.namesrv.proc,
                  self.namesrv.log)
        for i in range(self.n_brokers):
            self._start_broker(f"{GROUP}-{i}")
        for name, proc in self.brokers.items():
            wait_port(self.broker_ports[name], timeout, f"RocketMQ broker {name}", proc.proc, proc.log)
        self.wait_in_sync(timeout)

    def _start_broker(self, name: str) -> None:
        base = free_port(4)  # fast channel, (spare), listen, HA
        port = base + 2
        self.broker_ports[name] = port
        node = self.workdir / name
        seed = self.seed_stores.get(name)
        if seed is not None and not (node / "store").exists():
            shutil.copytree(seed, node / "store")
        conf = write_conf(node / "broker.conf", {
            "brokerClusterName": CLUSTER,
            "brokerName": GROUP,
            "brokerId": -1,
            "brokerRole": "SLAVE",
            "enableControllerMode": "true",
            "controllerAddr": self.controller_address,
            "namesrvAddr": self.namesrv_address,
            "allAckInSyncStateSet": "true",
            "inSyncReplicas": self.n_brokers,
            "minInSyncReplicas": 1,
            "flushDiskType": "ASYNC_FLUSH",
            "listenPort": port,
            "haListenPort": port + 1,
            "brokerIP1": "127.0.0.1",
            "brokerIP2": "127.0.0.1",
            "storePathRootDir": node / "store",
            "storePathCommitLog": node / "store" / "commitlog",
            "mappedFileSizeCommitLog": COMMITLOG_FILE_BYTES,
            "autoCreateTopicEnable": "false",
            # A send waiting longer than this in the broker's queue is refused ("broker busy",
            # TIMEOUT_CLEAN_QUEUE); the default 200 ms refused windowed sends of the quick run
            # on a loaded machine, and RocketMQ's FAQ raises it for exactly that.
            "waitTimeMillsInSendQueue": WAIT_IN_SEND_QUEUE_MS,
        })
        self.brokers[name] = JvmProc(name, "rocketmq", BROKER_MAIN, ["-c", str(conf)],
                                     self.heaps["broker"], node / "broker.out", self._env(),
                                     {"user.home": str(node)}).start()

    def restart(self, name: str, timeout: float = 180.0) -> None:
        """Start a killed broker again on its own store and port."""
        proc = self.brokers[name]
        proc.start()
        wait_port(self.broker_ports[name], timeout, f"RocketMQ broker {name}", proc.proc, proc.log)

    def stop(self) -> None:
        self._close_clients()
        for proc in self.brokers.values():
            proc.kill()
        if self.namesrv is not None:
            self.namesrv.kill()

    # -- asking the cluster --------------------------------------------------------------

    def request(self, addr: str, code: int, ext: Mapping[str, Any] | None = None,
                body: Any = b"", timeout: float = 3.0) -> RemotingCommand:
        if self._loop is None:
            self._loop = EventLoopThread("rocketmq-peer")
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = RemotingClient(addr, connect_timeout=1.0)
        return self._loop.run(client.request(RemotingCommand.request(code, ext, body), timeout),
                              timeout + 2)

    def _close_clients(self) -> None:
        if self._loop is None:
            return
        for client in self._clients.values():
            try:
                self._loop.run(client.close(), timeout=5)
            except (RemotingError, OSError, TimeoutError):
                pass  # the server behind it is gone; nothing to close cleanly
        self._clients.clear()
        self._loop.stop()
        self._loop = None

    def replica_state(self) -> ReplicaState | None:
        """GET_REPLICA_INFO of the group at the embedded controller (None while unknown)."""
        resp = self.request(self.controller_address, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                            {"brokerName": GROUP})
        if resp.code != ResponseCode.SUCCESS:
            return None
        body = resp.json_body() or {}
        return ReplicaState(resp.ext_fields.get("masterAddress") or None,
                            int(resp.ext_fields.get("masterEpoch", 0) or 0),
                            sorted(int(i) for i in body.get("syncStateSet", [])))

    def master(self) -> str | None:
        """The name of the live broker the controller names master."""
        state = self.replica_state()
        if state is None or state.master_address is None:
            return None
        for name, proc in self.brokers.items():
            if proc.alive and self.broker_address(name) == state.master_address:
                return name
        return None

    def wait_in_sync(self, timeout: float = 120.0, size: int | None = None) -> ReplicaState:
        """Until a live master leads a SyncStateSet of ``size`` (all brokers by default)."""
        want = self.n_brokers if size is None else size
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                state = self.replica_state()
            except (RemotingError, TimeoutError, OSError) as exc:
                last = exc
                state = None
            if state is not None:
                last = state
                if self.master() is not None and len(state.sync_state_set) == want:
                    return state
            self._check_alive()
            time.sleep(0.2)
        raise TimeoutError(f"RocketMQ group {GROUP} not in sync ({want} brokers) within "
                           f"{timeout:g}s; last: {last!r}\n{self.describe()}")

    def _check_alive(self) -> None:
        dead = [p for p in [self.namesrv, *self.brokers.values()]
                if p is not None and p.proc is not None and p.proc.poll() is not None
                and p.proc.returncode != -9]
        if dead:
            raise RuntimeError(f"RocketMQ process exited: {dead[0].name} "
                               f"({dead[0].proc.returncode if dead[0].proc else '?'})\n{self.describe()}")

    def describe(self) -> str:
        procs = [p for p in [self.namesrv, *self.brokers.values()] if p is not None]
        return "\n".join(f"--- {p.name} ({'alive' if p.alive else 'dead'}) {p.log}\n{p.log_tail(15)}"
                         for p in procs)

    def create_topic(self, topic: str, queues: int = 8, timeout: float = 60.0) -> None:
        """UPDATE_AND_CREATE_TOPIC at the master (its slaves copy the topic config), then
        wait for the name server's route."""
        master = self.master()
        if master is None:
            raise RuntimeError(f"no master of {GROUP} to create {topic} on")
        resp = self.request(self.broker_address(master), RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
            "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0, "order": "false"})
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"creating {topic} on {master}: {resp.code} {resp.remark}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            route = self.request(self.namesrv_address, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            if route.code == ResponseCode.SUCCESS:
                return
            time.sleep(0.2)
        raise TimeoutError(f"no route of {topic} at the name server within {timeout:g}s")
