"""The chaos suite's cluster, workload, faults and evidence (issue 12).

A :class:`ChaosRun` starts real processes on loopback: 3 controllers, a name server and a
broker group of 3 (all-ack, ``min_in_sync_replicas = 2`` unless a negative control says
otherwise).  Each controller sits behind a TCP proxy that it advertises
(``advertised_address``), so a broker reaches the controllers only through the proxies,
the leader it is told of included; its slaves reach a broker through a proxy on its HA port
(``ha_advertised_address``).  So a fault can partition a master from the controllers only
(its links through the controllers' proxies cut, told apart by the sockets it dials from),
or cut one replication link, or all; and each partition scenario checks in /proc that no
connection of the cut process reaches a process on the other side
(:meth:`ChaosRun.assert_cut_off`).

While a fault runs, several producers send unique values and record every outcome with
its client-side times (and, for a SEND_OK, the commitlog offset it names); a tailing
consumer group reads the topic as it grows and every read is kept; probes send straight
to every broker, past the routes, and keep the times of every SEND_OK (so a master nobody
routes to still shows); a sampler per broker asks its status (role, master epoch,
accepting writes, log end) and one asks the controller for the group's master, epoch and
SyncStateSet, every answer kept with the times of the request and of the answer, every
failure counted and every malformed answer kept.  A workload thread that dies of an
exception nobody expected is recorded.  After the fault is healed and the group is whole
again, every process is stopped and the final stores are read.

The evidence is judged by the pure functions of :mod:`judge` (see there for each check and
why it is sound); tests/chaos/test_judge.py feeds each one evidence that must make it
fire.  With ``RMQHA_CHAOS_SECURITY=tls-acl`` (``make chaos``) the cluster runs with mutual
TLS on every port and ACL on the brokers, and the workload and the harness present
certificates and accounts (:mod:`secure_mode`).  The end-to-end negative controls (all-ack
off, unclean election, the lease off) must come out as loss, uncovered acknowledgements or
two ackers: otherwise the checkers are blind.
"""
from __future__ import annotations

import random
import re
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster import BrokerProc, Cluster, Process, free_port_pair
from secure_mode import mode as security_mode, secure_cluster
from judge import (
    TABLE_HEAD,
    Evidence,
    MalformedStatus,
    Outcome,
    OutcomeStatus,
    ProbeAck,
    Read,
    Report,
    StoredRecord,
    judge,
    parse_broker_status,
    parse_replica_info,
)
from rmqha.client import BlockingConsumer, BlockingProducer, SendStatus
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ClientError, RemotingError, RmqhaError, SendError
from rmqha.protocol.message import parse_offset_msg_id
from rmqha.store import CommitLog
from rmqha.testing.ports import Link, links_to, tcp_sockets
from tcp_proxy import CutMode, TcpProxy

GROUP = "broker-a"
TOPIC = "chaos"
#: The tailing consumer's group.
TAIL_GROUP = "chaos-tail"
#: Where the probes write (see ChaosRun._probe).
PROBE_TOPIC = "chaos-probe"
#: The settings that make the guarantee: every SyncStateSet member, and never fewer than two.
SAFE_ACKS: dict[str, Any] = {"all_ack_in_sync_state_set": True, "min_in_sync_replicas": 2,
                             "slave_timeout_ms": 3000}
#: Pause between status samples of one source (each sampler asks again after an answer).
SAMPLE_INTERVAL_S = 0.05
#: A status answer slower than this counts as a failed sample (a frozen or cut process).
SAMPLE_TIMEOUT_S = 1.0
#: Refusals given before anything is stored: on a send's only attempt, a definite failure.
_REFUSED_BEFORE_STORING = {ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION,
                           ResponseCode.TOPIC_NOT_EXIST}
_ATTEMPTS = re.compile(r"after (\d+) attempt")


def error_outcome(value: str, exc: ClientError | RemotingError, sent_at: float, done_at: float) -> Outcome:
    """The outcome of a send that raised: a definite failure only when its one attempt was
    refused before storing (or found no route); otherwise stored or not, nobody knows."""
    found = _ATTEMPTS.search(str(exc))
    attempts = int(found.group(1)) if found else 1
    definite = (isinstance(exc, SendError) and attempts == 1
                and (exc.status == "NO_ROUTE" or exc.code in _REFUSED_BEFORE_STORING))
    status = OutcomeStatus.FAILED if definite else OutcomeStatus.UNKNOWN
    return Outcome(value, status, attempts, sent_at, done_at)


class ChaosRun:
    """One cluster, one workload, one fault; see the module docstring."""

    def __init__(self, base: Path, name: str, *, acks: dict[str, Any] | None = None,
                 controller: dict[str, Any] | None = None, producers: int = 3, seed: int = 1,
                 broker_env: dict[int, dict[str, str]] | None = None,
                 tmpfs_store: tuple[int, int] | None = None, expect_failover: bool = False,
                 idempotent: bool = False, send_timeout_s: float = 2.0, retry_deadline_s: float = 8.0,
                 advertise_proxies: bool = True) -> None:
        tls_acl = security_mode() == "tls-acl"
        self.name = name = f"{name} [tls+acl]" if tls_acl else name
        #: (broker index, bytes): that broker's store is a tmpfs of that size (disk full).
        self.tmpfs_store = tmpfs_store
        self.mounts: list[Path] = []
        #: Environment for the first start of broker i (failpoints armed from the start).
        self.broker_env = broker_env or {}
        self.cluster = Cluster(base)
        #: RMQHA_CHAOS_SECURITY=tls-acl: certificates and accounts (see secure_mode).
        self.secure = secure_cluster(base / "security", cluster=self.cluster.cluster_name, group=GROUP,
                                     brokers=3, controllers=3, topic=TOPIC,
                                     consumer_group=TAIL_GROUP) if tls_acl else None
        #: What the workload's producers and consumer add (credentials, TLS).
        self.client_options: dict[str, Any] = self.secure.client_options() if self.secure else {}
        if self.secure is not None:
            self.cluster.client_security = self.secure.harness_security()
        self.acks = dict(SAFE_ACKS if acks is None else acks)
        self.controller_overrides = controller or {}
        self.producers = producers
        #: The producers' settings: idempotent or not, and how soon a send is retried.
        self.producer_options: dict[str, Any] = {"idempotent": idempotent, "send_timeout_s": send_timeout_s,
                                                 "retry_deadline_s": retry_deadline_s}
        self.rng = random.Random(seed)
        self.brokers: list[BrokerProc] = []
        self.ha_proxies: dict[str, TcpProxy] = {}
        #: One proxy in front of each controller's RPC port: the address it advertises.
        self.ctl_proxies: list[TcpProxy] = []
        #: Controllers advertise their proxies (off only in the partition check's control).
        self.advertise_proxies = advertise_proxies
        #: Everything recorded as it happens (brokers and ids are filled in at start).
        self.ev = Evidence(name, need=int(self.acks.get("min_in_sync_replicas", 1)), brokers=[],
                           expect_failover=expect_failover, idempotent=idempotent)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    # --- cluster ----------------------------------------------------------------------------

    def start(self) -> None:
        c = self.cluster
        secure = self.secure
        self.start_controllers()
        c.start_namesrv(**(secure.namesrv_keys() if secure else {}))
        controllers = [f"127.0.0.1:{p.port}" for p in self.ctl_proxies]
        for i in range(3):
            listen = free_port_pair()
            ha = TcpProxy("127.0.0.1", listen + 1)
            ha.start()
            b = c.add_broker(GROUP, listen_port=listen, ha_advertised_address=f"127.0.0.1:{ha.port}",
                             controller_addr=controllers, **self.acks,
                             **(secure.broker_keys(GROUP, f"{GROUP}-{i}") if secure else {}))
            self.ha_proxies[b.name] = ha
            if self.tmpfs_store is not None and self.tmpfs_store[0] == i:
                self.mount_tmpfs(b.store_dir, self.tmpfs_store[1])
            b.start(env=self.broker_env.get(i))
            c.wait_broker_up(b)
            self.brokers.append(b)
        c.wait_role(self.brokers[0], "master", 30)
        ids = sorted(b.broker_id() or 0 for b in self.brokers)
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == ids, 30,
                   what="the whole group in sync")
        # Every cut of a replication link is a cut of this proxy: the slaves must dial it.
        via_proxy = self.ha_proxies[self.brokers[0].name].accepted
        assert via_proxy >= 2, f"{via_proxy} slaves replicate through the master's HA proxy, not 2"
        if secure is not None:  # the run is as secured as its name says, or it is no evidence
            master = self.brokers[0].address
            host, _, port = master.rpartition(":")
            problems = secure.check_enforced(master, f"{host}:{int(port) + 1}")
            assert not problems, problems
        self.record_ids()

    def start_controllers(self) -> None:
        """Three controllers, each behind a proxy it advertises (so the leader a controller
        names is reached through a proxy too)."""
        c, secure = self.cluster, self.secure
        nodes = c.add_controllers(3, **self.controller_overrides,
                                  **({"per_node": secure.controller_keys(3)} if secure else {}))
        for node in nodes:
            proxy = TcpProxy(*_split(node.address))
            proxy.start()
            self.ctl_proxies.append(proxy)
            if self.advertise_proxies:
                node.config["advertised_address"] = f"127.0.0.1:{proxy.port}"
        for node in nodes:
            node.start()
        c.wait_controllers(nodes)
        for node, proxy in zip(nodes, self.ctl_proxies):
            proxy.target = _split(node.address)  # a port clash may have moved the group

    def cut_from_controllers(self, b: BrokerProc, mode: CutMode) -> None:
        """Cut every link of ``b`` to the controllers (all pass the proxies)."""
        pid = b.pid
        assert pid is not None, f"{b.name} is not running"
        for p in self.ctl_proxies:
            p.cut_clients(_dialled_from(pid), mode)

    def assert_cut_off(self, cut: BrokerProc, other_side: list[Process]) -> None:
        """No established connection of ``cut`` ends in a process of ``other_side``: the
        partition really cuts every path (a link past the proxies would not be cut)."""
        links = self.links_past_the_cut(cut, other_side)
        assert not links, (f"{cut.name} still reaches the other side of the partition past the cut proxies: "
                           + "; ".join(str(x) for x in links))

    @staticmethod
    def links_past_the_cut(cut: BrokerProc, other_side: list[Process]) -> list[Link]:
        assert cut.pid is not None, f"{cut.name} is not running"
        return links_to(cut.pid, {p.pid: p.name for p in other_side if p.pid is not None})

    def record_ids(self) -> None:
        """The group as started: its brokers and their ids (which must never change)."""
        self.ev.brokers = [b.name for b in self.brokers]
        self.ev.addresses.update({b.address: b.name for b in self.brokers})
        self.ev.ids_before = {b.name: b.broker_id() for b in self.brokers}

    def mount_tmpfs(self, path: Path, size: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        self.mounts.append(path)

    def grow_tmpfs(self, path: Path, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)

    def master(self) -> BrokerProc:
        return self.cluster.wait_for(lambda: self.cluster.master_of(GROUP), 30, what="a master")

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self.cluster.close()
        for path in self.mounts:
            subprocess.run(["umount", "-l", str(path)], check=False)
        for p in [*self.ha_proxies.values(), *self.ctl_proxies]:
            p.stop()

    # --- workload ---------------------------------------------------------------------------

    def start_load(self) -> None:
        ns = self.cluster.namesrv_addresses
        for i in range(self.producers):
            self._spawn(self._produce, ns, i)
        # The topic is made by the first send; a consumer started before the name server
        # routes it would find no queue until its next route refresh (and read nothing).
        self.cluster.wait_for(lambda: self.cluster.route(TOPIC) is not None, 30,
                              what="a route for the checked topic, for the tailing consumer")
        self._spawn(self._tail, ns)
        self._spawn(self._sample_controller)
        for b in self.brokers:
            self._spawn(self._sample_broker, b)
            self._spawn(self._probe, b)

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        def recorded() -> None:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - whatever killed a workload thread is a finding
                with self._lock:
                    self.ev.thread_errors.append(f"{fn.__name__}: {traceback.format_exc(limit=6)}")

        t = threading.Thread(target=recorded, daemon=True, name=fn.__name__)
        t.start()
        self._threads.append(t)

    def _produce(self, ns: list[str], pid: int) -> None:
        seq = 0
        with BlockingProducer(ns, group=f"chaos-p{pid}", **self.producer_options, **self.client_options) as p:
            while not self._stop.is_set():
                value = f"p{pid}-{seq:07d}"
                seq += 1
                sent_at = time.monotonic()
                try:
                    r = p.send(TOPIC, value.encode())
                    done_at = time.monotonic()
                    if r.status is SendStatus.SEND_OK:
                        store, offset = parse_offset_msg_id(r.offset_msg_id)
                        out = Outcome(value, OutcomeStatus.ACKED, r.attempts, sent_at, done_at, offset, store)
                    else:  # stored, not confirmed by the replicas in time
                        out = Outcome(value, OutcomeStatus.UNKNOWN, r.attempts, sent_at, done_at)
                except (ClientError, RemotingError) as exc:
                    out = error_outcome(value, exc, sent_at, time.monotonic())
                with self._lock:
                    self.ev.outcomes.append(out)

    def _probe(self, b: BrokerProc) -> None:
        """Sends straight to one broker's address, bypassing routes, every 20 ms, and keeps
        the client-side times of every SEND_OK: whoever acknowledges shows up, even a
        master no producer's route points at any more.  A separate topic, outside the
        checked workload."""
        ext = {"producerGroup": "chaos-probe", "topic": PROBE_TOPIC, "defaultTopic": "TBW102",
               "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0, "bornTimestamp": "1", "flag": 0,
               "properties": "", "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}
        while not self._stop.wait(0.02):
            pid = b.pid
            if pid is None or not b.alive:
                continue
            sent_at = time.monotonic()
            try:
                resp = self.cluster.request(b.address, RequestCode.SEND_MESSAGE, ext, b"probe", timeout=1.0)
            except (RmqhaError, OSError, TimeoutError):
                continue  # frozen, dead or cut: nothing acknowledged
            acked_at = time.monotonic()
            if resp.code == ResponseCode.SUCCESS and b.pid == pid:
                with self._lock:
                    self.ev.probe_acks.append(ProbeAck(b.name, pid, sent_at, acked_at))

    def _tail(self, ns: list[str]) -> None:
        consumer: BlockingConsumer | None = None
        try:
            consumer = BlockingConsumer(ns, TAIL_GROUP, TOPIC, long_poll_s=1.0, rebalance_interval_s=1.0,
                                        heartbeat_interval_s=1.0, **self.client_options)
            while not self._stop.is_set():
                for m in consumer.poll(timeout=0.5):
                    with self._lock:
                        self.ev.reads.append(Read(m.body.decode(), m.queue_id, m.queue_offset))
        except (RmqhaError, OSError) as exc:
            with self._lock:
                self.ev.tail_errors.append(f"the tailing consumer failed: {exc}")
        finally:
            if consumer is not None:
                consumer.close()

    def _sample_broker(self, b: BrokerProc) -> None:
        """Status samples of one broker; a sample is kept only if one process answered it
        (the same pid before the request and after the answer)."""
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            pid = b.pid
            if pid is None or not b.alive:
                continue  # dead on purpose: nothing to ask
            t0 = time.monotonic()
            try:
                resp = self.cluster.request(b.address, RequestCode.GET_BROKER_HA_STATUS, timeout=SAMPLE_TIMEOUT_S)
            except (RmqhaError, OSError, TimeoutError):
                self._sample_failed(b.name)
                continue
            t1 = time.monotonic()
            if b.pid != pid:
                continue
            try:
                if resp.code != ResponseCode.SUCCESS:
                    raise MalformedStatus(f"{b.name} answered its status with code {resp.code}: {resp.remark}")
                sample = parse_broker_status(b.name, pid, t0, t1, resp.json_body())
            except ValueError as exc:  # MalformedStatus, or a body that is not JSON
                self._sample_malformed(str(exc))
                continue
            with self._lock:
                self.ev.broker_samples.append(sample)
                self.ev.monitor.ok[b.name] += 1
                self.ev.addresses[b.address] = b.name

    def _sample_controller(self) -> None:
        """GET_REPLICA_INFO of the group from the controller leader: master, epoch, set."""
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            t0 = time.monotonic()
            try:
                resp = self.cluster.controller_request(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                                       {"brokerName": GROUP})
            except (RmqhaError, OSError, TimeoutError):
                self._sample_failed("controller")
                continue
            t1 = time.monotonic()
            if resp.code == ResponseCode.CONTROLLER_NOT_LEADER:
                self._sample_failed("controller")  # asked a leader that lost its place meanwhile
                continue
            try:
                if resp.code != ResponseCode.SUCCESS:
                    raise MalformedStatus(f"controller answered replica info with code {resp.code}: {resp.remark}")
                sample = parse_replica_info(t0, t1, resp.ext_fields, resp.json_body())
            except ValueError as exc:
                self._sample_malformed(str(exc))
                continue
            with self._lock:
                self.ev.controller_samples.append(sample)
                self.ev.monitor.ok["controller"] += 1

    def _sample_failed(self, source: str) -> None:
        with self._lock:
            self.ev.monitor.errors[source] += 1

    def _sample_malformed(self, what: str) -> None:
        with self._lock:
            self.ev.monitor.malformed.append(what)

    def run_load_for(self, seconds: float) -> None:
        """Let the load run (it runs in its own threads): pacing a scenario, not waiting
        for a condition; every wait for a state goes through ``Cluster.wait_for``."""
        self._stop.wait(seconds)

    def acked_count(self) -> int:
        with self._lock:
            return sum(1 for o in self.ev.outcomes if o.status is OutcomeStatus.ACKED)

    def wait_for_unique_tail(self, master: BrokerProc, *, acked: bool = False) -> None:
        """After every link of ``master`` is cut: wait until it holds writes no slave can
        have (it appended past its end at the cut), and with ``acked`` until one of them was
        acknowledged: a send begun after the cut, which needs more acknowledgements than
        the producers had in flight at the cut.  A fixed pause is not enough on a busy
        machine, where the producers may not get to send at all for a while."""
        c = self.cluster
        acked_at_cut = self.acked_count()
        at_cut = int(c.broker_status(master)["maxOffset"])
        c.wait_for(lambda: int(c.broker_status(master)["maxOffset"]) > at_cut, 30,
                   what=f"{master.name} to append past what its slaves can have")
        if acked:
            c.wait_for(lambda: self.acked_count() > acked_at_cut + self.producers, 30,
                       what=f"{master.name} to acknowledge a send begun after its links were cut")

    def mark_fault(self) -> None:
        with self._lock:
            self.ev.fault_at = time.monotonic()

    def mark_target(self, master: BrokerProc) -> None:
        """The master the fault takes down: with ``expect_failover`` the controller must
        name another master in a newer epoch after it last named this one."""
        self.ev.faulted_master = master.broker_id()

    # --- healing and checking ---------------------------------------------------------------

    def heal_and_settle(self) -> None:
        for p in [*self.ha_proxies.values(), *self.ctl_proxies]:
            if p.is_cut:
                p.restore()
        c = self.cluster
        for b in self.brokers:
            if b.proc is not None and not b.alive:
                b.start()
            elif b.alive:
                b.resume()
        for ctl in c.controllers:
            if not ctl.alive:
                ctl.start()
            else:
                ctl.resume()
        ids = sorted(x for x in self.ev.ids_before.values() if x is not None)
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == ids, 60,
                   what="the group whole and in sync after healing")

    def stop_load(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
            if t.is_alive():
                self.ev.thread_errors.append(f"{t.name} still running 60 s after the load was stopped")
        self._threads.clear()

    def check(self) -> Report:
        c = self.cluster
        master = self.master()
        target = int(c.broker_status(master)["maxOffset"])
        c.wait_for(lambda: all(int(c.broker_status(b)["maxOffset"]) >= target for b in self.brokers), 60,
                   what="every replica at the master's end")
        seg = int(self.brokers[0].config["segment_bytes"])
        for b in self.brokers:
            b.stop(10)
        for b in self.brokers:
            self.ev.logs[b.name], self.ev.raw[b.name] = _read_store(b, seg)
        self.ev.ids_after = {b.name: b.broker_id() for b in self.brokers}
        return judge(self.ev)


def _read_store(b: BrokerProc, seg: int) -> tuple[list[StoredRecord], bytes]:
    """A stopped broker's records of the checked topic and its commitlog bytes."""
    cl = CommitLog(b.commitlog_dir, segment_bytes=seg, prefault=False)
    try:
        records = [StoredRecord(m.body.decode("utf-8", "replace"), m.queue_id, m.queue_offset,
                                m.physical_offset, m.size)
                   for m in cl.iter_messages() if m.topic == TOPIC]
        raw = b"".join(bytes(cl.read(s, min(s + seg, cl.max_offset) - s))
                       for s in range(cl.min_offset, cl.max_offset, seg))
    finally:
        cl.close()
    return records, raw


def _dialled_from(pid: int) -> Callable[[tuple[str, int]], bool]:
    """Whether a proxy's client (host, port) is a socket of process ``pid`` (from /proc)."""
    return lambda peer: peer[1] in {row.local.port for row in tcp_sockets(pid)}


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


# --- faults: each runs while the load does, and leaves the cluster to heal_and_settle --------


def kill_master(run: ChaosRun) -> None:
    m = run.master()
    run.mark_target(m)
    m.kill()
    run.mark_fault()  # acks from here on can only come from a new master
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master")
    run.run_load_for(1.0)


def pause_master(run: ChaosRun) -> None:
    """SIGSTOP past the controller's heartbeat timeout, then SIGCONT: the old master wakes
    up holding records no one else has, while consumers tail the group."""
    m = run.master()
    run.mark_target(m)
    m.pause()
    run.mark_fault()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master while the old one is frozen")
    run.run_load_for(1.0)
    m.resume()
    run.run_load_for(1.5)


def kill_controller_leader(run: ChaosRun) -> None:
    c = run.cluster
    leader = c.controller_leader()
    proc = next(x for x in c.controllers if x.address == leader)
    run.mark_fault()
    proc.kill()
    c.wait_for(lambda: c.controller_leader() not in (None, leader), 30, what="a new controller leader")
    run.run_load_for(1.0)
    proc.start()
    m = run.master()
    run.mark_target(m)
    m.kill()  # and an election under the new leader
    c.wait_for(lambda: (x := c.master_of(GROUP)) is not None and x is not m, 30, what="a new master")
    run.run_load_for(1.0)


def pause_controller_leader(run: ChaosRun) -> None:
    """SIGSTOP the controller leader (a frozen node keeps its sockets open), let another
    lead, kill the master under the new leader, then SIGCONT the old leader."""
    c = run.cluster
    leader = c.controller_leader()
    proc = next(x for x in c.controllers if x.address == leader)
    proc.pause()
    run.mark_fault()
    c.wait_for(lambda: c.controller_leader() not in (None, leader), 30, what="a new controller leader")
    m = run.master()
    run.mark_target(m)
    m.kill()
    c.wait_for(lambda: (x := c.master_of(GROUP)) is not None and x is not m, 30, what="a new master")
    run.run_load_for(1.0)
    proc.resume()
    run.run_load_for(1.0)


def partition_master_from_controllers(run: ChaosRun) -> None:
    """Every link of the master to the controllers silently dropped (the leader it was told
    of included: that is a proxy too), its clients and slaves untouched."""
    m = run.master()
    run.mark_target(m)
    run.cut_from_controllers(m, "blackhole")
    run.mark_fault()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master elected behind the partition")
    run.assert_cut_off(m, run.cluster.controllers)
    run.run_load_for(1.5)
    run.assert_cut_off(m, run.cluster.controllers)


def reset_master_controller_links(run: ChaosRun) -> None:
    """The master's links to the controllers reset (and new ones refused) while it lives:
    the controllers see its connection close, but a closed connection is not a death (the
    controller finds its port still open), so the election waits for the heartbeat
    timeout, which the master's lease does not outlast."""
    m = run.master()
    run.mark_target(m)
    run.cut_from_controllers(m, "close")
    run.mark_fault()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master elected after the links reset")
    run.assert_cut_off(m, run.cluster.controllers)
    run.run_load_for(1.5)
    run.assert_cut_off(m, run.cluster.controllers)


def cut_one_slave_link(run: ChaosRun) -> None:
    """One slave's replication link silently dropped (told apart by the broker id in its
    framed handshake) while the other flows: the set shrinks to the master and one slave,
    which still makes two copies; healed after it shrank."""
    m = run.master()
    victim = next(b for b in run.brokers if b is not m)
    pid = victim.pid
    assert pid is not None
    # Told apart by the socket it dials from (its handshake is encrypted under TLS).
    run.ha_proxies[m.name].blackhole_clients(_dialled_from(pid))
    run.mark_fault()
    run.cluster.wait_for(lambda: run.ev.ids_before[victim.name] not in run.cluster.replica_info(GROUP).sync_state_set,
                         30, what=f"the set to drop {victim.name}, whose link is cut")
    assert len(run.cluster.replica_info(GROUP).sync_state_set) == 2
    run.assert_cut_off(victim, [m])
    run.run_load_for(1.0)


def cut_master_links(run: ChaosRun) -> None:
    """Every slave's replication link to the master silently dropped (the proxy in front of
    the master's HA port), then healed: the set shrinks, sends wait or are refused."""
    m = run.master()
    run.mark_fault()
    run.ha_proxies[m.name].cut("blackhole")
    run.run_load_for(2.0)
    run.assert_cut_off(m, [b for b in run.brokers if b is not m])


def cut_all_links_then_kill(run: ChaosRun, *, acked_alone: bool = False) -> None:
    """The master keeps taking sends while no slave hears it, then dies: whatever it held
    alone must not have been acknowledged (``acked_alone``: the negative control, whose
    master acknowledges by itself, waits until it has done so)."""
    m = run.master()
    run.mark_target(m)
    run.mark_fault()
    run.ha_proxies[m.name].cut("blackhole")
    run.wait_for_unique_tail(m, acked=acked_alone)
    run.assert_cut_off(m, [b for b in run.brokers if b is not m])
    run.run_load_for(1.0)
    m.kill()
    run.ha_proxies[m.name].restore()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master")
    run.run_load_for(1.0)


def restart_master_on_new_port(run: ChaosRun) -> None:
    m = run.master()
    run.mark_target(m)
    run.mark_fault()
    m.kill()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master")
    # Its HA proxy pointed at the old port: the new HA port is dialled directly.
    m.restart_on_new_port(ha_advertised_address="")
    run.run_load_for(1.5)


def stall_replication(run: ChaosRun) -> None:
    """Every slave's link to the master silently dropped for 2.5 s, then healed, while the
    producers' send timeout is short (the idempotence scenarios run with 0.5 s): every send
    of that window is stored, waits for copies, times out at its client and is retried on
    the same master.  Without idempotence each retry is stored again (the negative
    control's duplicates); with it each is answered with its original's result."""
    m = run.master()
    run.mark_fault()
    run.ha_proxies[m.name].cut("blackhole")
    run.run_load_for(2.5)
    run.ha_proxies[m.name].restore()
    run.run_load_for(1.5)


def slave_disk_full(run: ChaosRun) -> None:
    """Slave 2's store is a small tmpfs: it fills up under the load (its next segment
    cannot be allocated), it falls out of the set, and the group keeps two copies with the
    other slave; healed by growing the filesystem."""
    slave = run.brokers[2]
    sid = run.ev.ids_before[slave.name]
    run.mark_fault()
    run.cluster.wait_for(lambda: not slave.alive or sid not in run.cluster.replica_info(GROUP).sync_state_set,
                         90, what="the slave with a full disk to leave the SyncStateSet")
    assert "No space left on device" in slave.log_text()
    run.run_load_for(1.0)
    run.grow_tmpfs(slave.store_dir, 256 << 20)
    if not slave.alive:
        slave.start()


def random_mix(run: ChaosRun) -> None:
    faults = [kill_master, pause_master, cut_master_links, partition_master_from_controllers]
    for _ in range(3):
        fault = run.rng.choice(faults)
        fault(run)
        run.heal_and_settle()
        run.run_load_for(0.5)


def run_scenario(base: Path, name: str, fault: Callable[[ChaosRun], None], *,
                 acks: dict[str, Any] | None = None, controller: dict[str, Any] | None = None,
                 warmup_s: float = 1.5, seed: int = 1,
                 broker_env: dict[int, dict[str, str]] | None = None,
                 tmpfs_store: tuple[int, int] | None = None, failover: bool = False,
                 idempotent: bool = False, send_timeout_s: float = 2.0, retry_deadline_s: float = 8.0) -> Report:
    """One run of ``fault`` under load, judged.  ``failover``: the fault moves the master,
    so the judge requires a newer epoch with another master after it.  ``idempotent``: the
    producers are, and the judge then finds any value stored twice a problem;
    ``send_timeout_s`` short forces retries (of sends stored but waiting for copies)."""
    run = ChaosRun(base, name, acks=acks, controller=controller, seed=seed, broker_env=broker_env,
                   tmpfs_store=tmpfs_store, expect_failover=failover, idempotent=idempotent,
                   send_timeout_s=send_timeout_s, retry_deadline_s=retry_deadline_s)
    try:
        run.start()
        run.start_load()
        run.run_load_for(warmup_s)
        fault(run)
        run.heal_and_settle()
        run.run_load_for(1.0)
        run.stop_load()
        return run.check()
    finally:
        run.close()


#: Every report of this pytest run, in order (both chaos modules add to it).
ALL_REPORTS: list[Report] = []


@pytest.fixture(scope="module")
def chaos_reports(request: pytest.FixtureRequest):
    """Each scenario's report; at the end of a module the table of every scenario run so
    far is printed and written to reports/chaos.md (``make chaos`` shows it; README's
    Reliability section quotes it)."""
    yield ALL_REPORTS
    if not ALL_REPORTS:
        return
    table = "\n".join([TABLE_HEAD, *(r.row() for r in ALL_REPORTS)])
    out = Path(__file__).resolve().parents[2] / "reports" / "chaos.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table + "\n", encoding="utf-8")
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        terminal.write_line("")
        terminal.write_line(table)


__all__ = ["ALL_REPORTS", "TABLE_HEAD", "ChaosRun", "Report", "chaos_reports", "error_outcome", "run_scenario"]
