"""The chaos suite's cluster, workload, faults and checkers (issue 12).

A :class:`ChaosRun` starts real processes on loopback: 3 controllers, a name server and a
broker group of 3 (all-ack, ``min_in_sync_replicas = 2`` unless a negative control says
otherwise).  Every broker reaches the controllers through its own TCP proxies and its
slaves reach it through a proxy on its HA port (``ha_advertised_address``), so a fault can
partition a master from the controllers only, or cut one replication link, or all.

While a fault runs, several producers send unique values and record every outcome, a
tailing consumer group reads the topic as it grows, and a monitor samples what every
broker claims (role, master epoch) and what the controller says.  After the fault is
healed and the group is whole again, every process is stopped and the checkers read the
stores themselves:

- no acknowledged value is missing from the final log (``lost``);
- nothing was read or stored that was never sent (``phantoms``);
- a value is stored twice only if its send was retried or its outcome unknown;
- the replicas are byte-prefix-consistent (each log a prefix of the longest);
- one master per epoch, in the controllers' view and in what brokers claim, at every sample;
- never two brokers acknowledging writes at once (probes also send straight to every
  broker, past the routes, so a master nobody routes to still shows): each broker reports when (on the host's
  CLOCK_MONOTONIC, shared by its processes) it gave its first and last acknowledgement as
  master of each epoch, and an older epoch's window must close before a newer epoch's
  opens on another broker; and no sample finds two brokers accepting writes (master
  with a live lease, ``acceptingWrites``);
- every acknowledged value is held by at least ``min_in_sync_replicas`` final stores;
- the tailing group never read a record the final log does not hold at that queue offset
  (a record later truncated) and never skipped one it does hold;
- broker ids never changed.

Negative controls (all-ack off, unclean election on) must come out as ``lost > 0``:
otherwise the checker is blind.
"""
from __future__ import annotations

import random
import struct
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cluster import BrokerProc, Cluster, free_port_pair
from rmqha.client import BlockingConsumer, BlockingProducer, SendStatus
from rmqha.protocol.codes import RequestCode
from rmqha.errors import ClientError, RemotingError, RmqhaError
from rmqha.store import CommitLog
from tcp_proxy import TcpProxy

GROUP = "broker-a"
TOPIC = "chaos"
#: Where the probes write (see ChaosRun._probe).
PROBE_TOPIC = "chaos-probe"
#: The settings that make the guarantee: every SyncStateSet member, and never fewer than two.
SAFE_ACKS: dict[str, Any] = {"all_ack_in_sync_state_set": True, "min_in_sync_replicas": 2,
                             "slave_timeout_ms": 3000}


@dataclass
class Outcome:
    value: str
    status: str  # "acked", "unknown" (stored or not: a timeout or an unconfirmed answer)
    attempts: int = 1


@dataclass
class Read:
    value: str
    queue_id: int
    queue_offset: int


@dataclass
class Report:
    scenario: str
    sent: int = 0
    acked: int = 0
    unknown: int = 0
    lost: int = 0
    duplicates: int = 0
    bad_duplicates: int = 0
    phantoms: int = 0
    failover_s: float | None = None
    #: From the fault to the first acknowledgement by a master of a newer epoch.
    new_master_ack_s: float | None = None
    #: Longest time two brokers both acknowledged writes (0 = never at once).
    ack_overlap_s: float = 0.0
    #: Monitor samples in which two brokers were accepting writes.
    two_writer_samples: int = 0
    problems: list[str] = field(default_factory=list)

    def row(self) -> str:
        fo = "-" if self.failover_s is None else f"{self.failover_s:.2f}"
        nm = "-" if self.new_master_ack_s is None else f"{self.new_master_ack_s:.2f}"
        return (f"| {self.scenario} | {self.sent} | {self.acked} | {self.unknown} | {self.lost} | "
                f"{self.duplicates} | {fo} | {nm} | {self.ack_overlap_s:.3f} / {self.two_writer_samples} | "
                f"{'ok' if not self.problems else '; '.join(self.problems)} |")


TABLE_HEAD = ("| scenario | sent | acked | unknown | lost | duplicates | failover s | new master ack s "
              "| two ackers s / samples | checks |\n"
              "|---|---|---|---|---|---|---|---|---|---|")


class ChaosRun:
    """One cluster, one workload, one fault; see the module docstring."""

    def __init__(self, base: Path, name: str, *, acks: dict[str, Any] | None = None,
                 controller: dict[str, Any] | None = None, producers: int = 3, seed: int = 1,
                 broker_env: dict[int, dict[str, str]] | None = None,
                 tmpfs_store: tuple[int, int] | None = None) -> None:
        self.name = name
        #: (broker index, bytes): that broker's store is a tmpfs of that size (disk full).
        self.tmpfs_store = tmpfs_store
        self.mounts: list[Path] = []
        #: Environment for the first start of broker i (failpoints armed from the start).
        self.broker_env = broker_env or {}
        self.cluster = Cluster(base)
        self.acks = dict(SAFE_ACKS if acks is None else acks)
        self.controller_overrides = controller or {}
        self.producers = producers
        self.rng = random.Random(seed)
        self.brokers: list[BrokerProc] = []
        self.ha_proxies: dict[str, TcpProxy] = {}
        self.ctl_proxies: dict[str, list[TcpProxy]] = {}
        self.outcomes: list[Outcome] = []
        self.reads: list[Read] = []
        #: (time, broker -> (role, master epoch, accepting writes), controller's (master, epoch)).
        self.samples: list[tuple[float, dict[str, tuple[str, int, bool]], tuple[int | None, int] | None]] = []
        #: broker -> {master epoch: [first, last] acknowledgement}, read before the stop.
        self.ack_windows: dict[str, dict[int, list[float]]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.ids: dict[str, int | None] = {}
        self.fault_at: float | None = None
        self.first_ack_after_fault: float | None = None

    # --- cluster ----------------------------------------------------------------------------

    def start(self) -> None:
        c = self.cluster
        c.start_controllers(3, **self.controller_overrides)
        c.start_namesrv()
        for i in range(3):
            listen = free_port_pair()
            ha = TcpProxy("127.0.0.1", listen + 1)
            ha.start()
            ctl = [TcpProxy(*_split(addr)) for addr in c.controller_addresses]
            for p in ctl:
                p.start()
            b = c.add_broker(GROUP, listen_port=listen, ha_advertised_address=f"127.0.0.1:{ha.port}",
                             controller_addr=[f"127.0.0.1:{p.port}" for p in ctl], **self.acks)
            self.ha_proxies[b.name] = ha
            self.ctl_proxies[b.name] = ctl
            if self.tmpfs_store is not None and self.tmpfs_store[0] == i:
                self.mount_tmpfs(b.store_dir, self.tmpfs_store[1])
            b.start(env=self.broker_env.get(i))
            c.wait_broker_up(b)
            self.brokers.append(b)
        c.wait_role(self.brokers[0], "master", 30)
        ids = sorted(b.broker_id() or 0 for b in self.brokers)
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == ids, 30,
                   what="the whole group in sync")
        self.ids = {b.name: b.broker_id() for b in self.brokers}

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
        for p in [*self.ha_proxies.values(), *(x for ps in self.ctl_proxies.values() for x in ps)]:
            p.stop()

    # --- workload ---------------------------------------------------------------------------

    def start_load(self) -> None:
        ns = self.cluster.namesrv_addresses
        for i in range(self.producers):
            self._spawn(self._produce, ns, i)
        self._spawn(self._tail, ns)
        self._spawn(self._monitor)
        for b in self.brokers:
            self._spawn(self._probe, b)

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name=fn.__name__)
        t.start()
        self._threads.append(t)

    def _produce(self, ns: list[str], pid: int) -> None:
        seq = 0
        with BlockingProducer(ns, group=f"chaos-p{pid}", retry_deadline_s=8.0, send_timeout_s=2.0) as p:
            while not self._stop.is_set():
                value = f"p{pid}-{seq:07d}"
                seq += 1
                try:
                    r = p.send(TOPIC, value.encode())
                    status = "acked" if r.status is SendStatus.SEND_OK else "unknown"
                    out = Outcome(value, status, r.attempts)
                except (ClientError, RemotingError) as exc:
                    # Refused or timed out after retries: stored or not, nobody knows.
                    out = Outcome(value, "unknown", 2 if "attempt" in str(exc) else 1)
                with self._lock:
                    self.outcomes.append(out)
                    if (out.status == "acked" and self.fault_at is not None
                            and self.first_ack_after_fault is None):
                        self.first_ack_after_fault = time.monotonic()

    def _probe(self, b: BrokerProc) -> None:
        """Sends straight to one broker's address, bypassing routes, every 20 ms: whoever
        acknowledges shows up in its acknowledgement windows, even a master no producer's
        route points at any more.  A separate topic, outside the checked workload."""
        ext = {"producerGroup": "chaos-probe", "topic": PROBE_TOPIC, "defaultTopic": "TBW102",
               "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0, "bornTimestamp": "1", "flag": 0,
               "properties": "", "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}
        while not self._stop.wait(0.02):
            if not b.alive:
                continue
            try:
                self.cluster.request(b.address, RequestCode.SEND_MESSAGE, ext, b"probe", timeout=1.0)
            except (RmqhaError, OSError, TimeoutError):
                pass  # frozen, dead or cut: nothing acknowledged

    def _tail(self, ns: list[str]) -> None:
        consumer: BlockingConsumer | None = None
        try:
            consumer = BlockingConsumer(ns, "chaos-tail", TOPIC, long_poll_s=1.0, rebalance_interval_s=1.0)
            while not self._stop.is_set():
                for m in consumer.poll(timeout=0.5):
                    with self._lock:
                        self.reads.append(Read(m.body.decode(), m.queue_id, m.queue_offset))
        except (RmqhaError, OSError) as exc:
            with self._lock:
                self.reads.append(Read(f"!tail failed: {exc}", -1, -1))
        finally:
            if consumer is not None:
                consumer.close()

    def _monitor(self) -> None:
        c = self.cluster
        while not self._stop.is_set():
            claims: dict[str, tuple[str, int, bool]] = {}
            for b in self.brokers:
                if not b.alive:
                    continue
                try:
                    st = c.broker_status(b)
                except (RmqhaError, OSError, KeyError, ValueError):
                    continue
                claims[b.name] = (str(st.get("role")), int(st.get("masterEpoch") or 0),
                                  bool(st.get("acceptingWrites")))
            view = None
            try:
                info = c.replica_info(GROUP)
                if info is not None:
                    view = (info.master_id, info.master_epoch)
            except (RmqhaError, OSError, KeyError, ValueError):
                pass
            with self._lock:
                self.samples.append((time.monotonic(), claims, view))
            self._stop.wait(0.05)

    def run_load_for(self, seconds: float) -> None:
        """Let the load run (it runs in its own threads): pacing a scenario, not waiting
        for a condition; every wait for a state goes through ``Cluster.wait_for``."""
        self._stop.wait(seconds)

    def acked_count(self) -> int:
        with self._lock:
            return sum(1 for o in self.outcomes if o.status == "acked")

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
            self.fault_at = time.monotonic()
            self.first_ack_after_fault = None

    # --- healing and checking ---------------------------------------------------------------

    def heal_and_settle(self) -> None:
        for p in [*self.ha_proxies.values(), *(x for ps in self.ctl_proxies.values() for x in ps)]:
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
        ids = sorted(x for x in self.ids.values() if x is not None)
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == ids, 60,
                   what="the group whole and in sync after healing")

    def stop_load(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        self._threads.clear()

    def check(self) -> Report:
        c = self.cluster
        master = self.master()
        target = int(c.broker_status(master)["maxOffset"])
        c.wait_for(lambda: all(int(c.broker_status(b)["maxOffset"]) >= target for b in self.brokers), 60,
                   what="every replica at the master's end")
        seg = int(self.brokers[0].config["segment_bytes"])
        for b in self.brokers:
            windows = c.broker_status(b).get("ackWindows") or {}
            self.ack_windows[b.name] = {int(e): [float(t) for t in w] for e, w in windows.items()}
        for b in self.brokers:
            b.stop(10)
        logs: dict[str, list[tuple[str, int, int]]] = {}
        raw: dict[str, bytes] = {}
        for b in self.brokers:
            cl = CommitLog(b.commitlog_dir, segment_bytes=seg, prefault=False)
            try:
                logs[b.name] = [(m.body.decode("utf-8", "replace"), m.queue_id, m.queue_offset)
                                for m in cl.iter_messages() if m.topic == TOPIC]
                raw[b.name] = b"".join(bytes(cl.read(s, min(s + seg, cl.max_offset) - s))
                                       for s in range(cl.min_offset, cl.max_offset, seg))
            finally:
                cl.close()
        return self.judge(logs, raw, {b.name: b.broker_id() for b in self.brokers})

    def judge(self, logs: dict[str, list[tuple[str, int, int]]], raw: dict[str, bytes],
              final_ids: dict[str, int | None]) -> Report:
        r = Report(self.name)
        sent = {o.value: o for o in self.outcomes}
        r.sent = len(self.outcomes)
        r.acked = sum(1 for o in self.outcomes if o.status == "acked")
        r.unknown = r.sent - r.acked
        longest = max(raw.values(), key=len)
        for name, data in raw.items():
            if longest[:len(data)] != data:
                r.problems.append(f"{name}'s log is not a prefix of the longest replica")
        final = max(logs.values(), key=len)
        counts = Counter(v for v, _, _ in final)
        holders = Counter(v for rows in logs.values() for v in {v for v, _, _ in rows})
        need = int(self.acks.get("min_in_sync_replicas", 1))
        for value, o in sent.items():
            if o.status == "acked" and counts[value] == 0:
                r.lost += 1
            elif o.status == "acked" and holders[value] < need:
                r.problems.append(f"{value} acknowledged but held by {holders[value]} < {need} stores")
        r.phantoms = sum(1 for v in counts if v not in sent)
        r.duplicates = sum(n - 1 for n in counts.values() if n > 1)
        r.bad_duplicates = sum(1 for v, n in counts.items()
                               if n > 1 and v in sent and sent[v].status == "acked" and sent[v].attempts == 1)
        if r.phantoms:
            r.problems.append(f"{r.phantoms} stored values never sent")
        if r.bad_duplicates:
            r.problems.append(f"{r.bad_duplicates} values stored twice though sent once and acked")
        # The tailing group: nothing read that the final log lacks there, nothing skipped.
        at = {(q, off): v for v, q, off in final}
        failed = [x.value for x in self.reads if x.value.startswith("!")]
        if failed:
            r.problems.append(failed[0])
        read_at = {(x.queue_id, x.queue_offset): x.value for x in self.reads if x.queue_id >= 0}
        truncated = [k for k, v in read_at.items() if at.get(k) != v]
        if truncated:
            r.problems.append(f"tailing group read {len(truncated)} records the final log does not hold "
                              f"there (e.g. queue {truncated[0][0]} offset {truncated[0][1]})")
        furthest: dict[int, int] = defaultdict(lambda: -1)
        for q, off in read_at:
            furthest[q] = max(furthest[q], off)
        skipped = [(q, off) for (q, off) in at if off <= furthest[q] and (q, off) not in read_at]
        if skipped:
            r.problems.append(f"tailing group skipped {len(skipped)} stored records "
                              f"(e.g. queue {skipped[0][0]} offset {skipped[0][1]})")
        # One master per epoch, as brokers claim it and as the controller says it.
        claimed: dict[int, set[str]] = defaultdict(set)
        viewed: dict[int, set[int | None]] = defaultdict(set)
        for _, claims, view in self.samples:
            for name, (role, epoch, _) in claims.items():
                if role == "master":
                    claimed[epoch].add(name)
            if sum(1 for _, _, accepting in claims.values() if accepting) > 1:
                r.two_writer_samples += 1
            if view is not None:
                viewed[view[1]].add(view[0])
        for epoch, names in claimed.items():
            if len(names) > 1:
                r.problems.append(f"brokers {sorted(names)} all claimed master at epoch {epoch}")
        for epoch, masters in viewed.items():
            if len(masters) > 1:
                r.problems.append(f"controller named masters {sorted(map(str, masters))} at epoch {epoch}")
        if final_ids != self.ids:
            r.problems.append(f"broker ids changed: {self.ids} -> {final_ids}")
        if r.two_writer_samples:
            r.problems.append(f"{r.two_writer_samples} samples found two brokers accepting writes")
        self._judge_ack_windows(r)
        if self.fault_at is not None and self.first_ack_after_fault is not None:
            r.failover_s = self.first_ack_after_fault - self.fault_at
        if r.lost:
            r.problems.insert(0, f"{r.lost} acknowledged values lost")
        return r


    def _judge_ack_windows(self, r: Report) -> None:
        """Two brokers never acknowledging at once, and the first ack on a new master.

        A restarted broker forgot its windows (a killed process acknowledged nothing after
        it died, so nothing is missed that could overlap)."""
        windows = [(epoch, name, w[0], w[1]) for name, per in self.ack_windows.items()
                   for epoch, w in per.items()]
        for e1, b1, _, last1 in windows:
            for e2, b2, first2, _ in windows:
                if b1 != b2 and e1 < e2 and last1 > first2:
                    r.ack_overlap_s = max(r.ack_overlap_s, last1 - first2)
        if r.ack_overlap_s > 0:
            r.problems.append(f"two brokers acknowledged writes at once for {r.ack_overlap_s:.3f}s")
        if self.fault_at is None:
            return
        before = [e for e, _, first, _ in windows if first <= self.fault_at]
        if not before:
            return
        later = [first for e, _, first, _ in windows if e > max(before)]
        if later:
            r.new_master_ack_s = min(later) - self.fault_at


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


# --- faults: each runs while the load does, and leaves the cluster to heal_and_settle --------


def kill_master(run: ChaosRun) -> None:
    m = run.master()
    m.kill()
    run.mark_fault()  # acks from here on can only come from a new master
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master")
    run.run_load_for(1.0)


def pause_master(run: ChaosRun) -> None:
    """SIGSTOP past the controller's heartbeat timeout, then SIGCONT: the old master wakes
    up holding records no one else has, while consumers tail the group."""
    m = run.master()
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
    m.kill()
    c.wait_for(lambda: (x := c.master_of(GROUP)) is not None and x is not m, 30, what="a new master")
    run.run_load_for(1.0)
    proc.resume()
    run.run_load_for(1.0)


def partition_master_from_controllers(run: ChaosRun) -> None:
    m = run.master()
    for p in run.ctl_proxies[m.name]:
        p.cut("blackhole")
    run.mark_fault()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master elected behind the partition")
    run.run_load_for(1.5)


def reset_master_controller_links(run: ChaosRun) -> None:
    """The master's links to the controllers reset (and new ones refused) while it lives:
    the controllers see its connection close, but a closed connection is not a death (the
    controller finds its port still open), so the election waits for the heartbeat
    timeout, which the master's lease does not outlast."""
    m = run.master()
    for p in run.ctl_proxies[m.name]:
        p.cut("close")
    run.mark_fault()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master elected after the links reset")
    run.run_load_for(1.5)


def cut_one_slave_link(run: ChaosRun) -> None:
    """One slave's replication link silently dropped (told apart by the broker id in its
    framed handshake) while the other flows: the set shrinks to the master and one slave,
    which still makes two copies; healed after it shrank."""
    m = run.master()
    victim = next(b for b in run.brokers if b is not m)
    vid = struct.pack(">q", int(run.ids[victim.name] or 0))
    # framed HANDSHAKE_SLAVE: length, type 1, timestamp, epoch, flags, then broker_id.
    run.ha_proxies[m.name].blackhole_clients(
        lambda data: data[4:8] == b"\x00\x00\x00\x01" and data[28:36] == vid)
    run.mark_fault()
    run.cluster.wait_for(lambda: run.ids[victim.name] not in run.cluster.replica_info(GROUP).sync_state_set,
                         30, what=f"the set to drop {victim.name}, whose link is cut")
    assert len(run.cluster.replica_info(GROUP).sync_state_set) == 2
    run.run_load_for(1.0)


def cut_master_links(run: ChaosRun) -> None:
    """Every slave's replication link to the master silently dropped (the proxy in front of
    the master's HA port), then healed: the set shrinks, sends wait or are refused."""
    m = run.master()
    run.mark_fault()
    run.ha_proxies[m.name].cut("blackhole")
    run.run_load_for(2.0)


def cut_all_links_then_kill(run: ChaosRun, *, acked_alone: bool = False) -> None:
    """The master keeps taking sends while no slave hears it, then dies: whatever it held
    alone must not have been acknowledged (``acked_alone``: the negative control, whose
    master acknowledges by itself, waits until it has done so)."""
    m = run.master()
    run.mark_fault()
    run.ha_proxies[m.name].cut("blackhole")
    run.wait_for_unique_tail(m, acked=acked_alone)
    run.run_load_for(1.0)
    m.kill()
    run.ha_proxies[m.name].restore()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master")
    run.run_load_for(1.0)


def restart_master_on_new_port(run: ChaosRun) -> None:
    m = run.master()
    run.mark_fault()
    m.kill()
    run.cluster.wait_for(lambda: (x := run.cluster.master_of(GROUP)) is not None and x is not m, 30,
                         what="a new master")
    # Its HA proxy pointed at the old port: the new HA port is dialled directly.
    m.restart_on_new_port(ha_advertised_address="")
    run.run_load_for(1.5)


def slave_disk_full(run: ChaosRun) -> None:
    """Slave 2's store is a small tmpfs: it fills up under the load (its next segment
    cannot be allocated), it falls out of the set, and the group keeps two copies with the
    other slave; healed by growing the filesystem."""
    slave = run.brokers[2]
    sid = run.ids[slave.name]
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
                 tmpfs_store: tuple[int, int] | None = None) -> Report:
    run = ChaosRun(base, name, acks=acks, controller=controller, seed=seed, broker_env=broker_env,
                   tmpfs_store=tmpfs_store)
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


__all__ = ["ALL_REPORTS", "TABLE_HEAD", "ChaosRun", "Report", "chaos_reports", "run_scenario"]
