"""``rmqha demo``: a whole rmqha cluster on this machine, its master killed under load.

The demo starts 3 controllers (one Raft group), a name server and a broker group of 3
(one master, two slaves, every write acknowledged only once all replicas in the
SyncStateSet hold it) as separate processes on 127.0.0.1 in a temporary directory.  It
creates a topic and produces numbered messages with rmqha's Producer; partway it
SIGKILLs the master and shows the election as the controller reports it (old and new
master, master epoch, SyncStateSet) and the time until the first write is acknowledged
again.  Just before the kill the replication links to the slaves stall for a moment while
the producer keeps sending, so the master holds writes no slave has (none acknowledged:
every send waits for all replicas); the kill then takes that tail with it, as when a
master's host dies with its links stuck.  It then restarts the killed broker on its old
store and shows it rejoin as a slave, cutting exactly that tail: from where the new
master's epoch starts to where its own log ended.  Finally it
reads the whole topic back with rmqha's Consumer and prints what was sent, acknowledged,
consumed, duplicated and lost.  Acknowledged messages must all be there: the exit code is
1 if any is missing (or the failover did not happen), 130 after Ctrl-C, else 0.
Whatever the outcome, every process it started is stopped and the demo checks that none
of their ports still accepts connections.

The links are the demo's own: each broker advertises a relay in this process as its HA
address (:class:`rmqha.demo.relay.ReplicationLinks`), and a stall holds the master's bytes in the relay.
Freezing the slaves (SIGSTOP) would not do: on one machine the master's bytes wait in the
kernel's socket buffers, which outlive a SIGKILL, and the slaves read them once resumed,
so the new master would hold the whole tail and nothing would be cut.

The cluster runs secured as ``deploy/`` runs one (:mod:`rmqha.testing.secure_setup`): a CA
and one certificate per process made in the working directory's ``pki/`` as an operator
makes them (the code behind ``rmqha certs dev-cluster``); every controller, name server and
broker port ``tls.server.mode = enforcing`` with ``tls.server.need.client.auth = require``
and each process dialling its own links over TLS with its certificate (the brokers' HA
links run mutual TLS); brokers with ``aclEnable`` and a ``plain_acl.yml`` holding the
demo's account (PUB and SUB on its topic, SUB for its consumer group, nothing else) and an
admin account (the topic's creation, the demo's status requests).  The Producer and
Consumer present the client certificate and sign every request with the account.  The
cluster secret (``pki/cluster.secret``, copied to ``cluster.secret`` for admin commands
against the demo: ``--cluster-secret-file``) encrypts Raft traffic and signs control
requests.  ``--plaintext`` runs the cluster with the cluster secret only, for comparison.

With ``--grpc`` the same scenario runs with the load going through an ``rmqha proxy``
and RocketMQ 5's official Python client (:mod:`rmqha.demo.grpc_load`).

This module owns the scenario (:class:`Demo`); the rest is one module per job: the options
and names (:mod:`rmqha.demo.options`), the load (:mod:`rmqha.demo.load`), the relay
(:mod:`rmqha.demo.relay`), the output (:mod:`rmqha.demo.report`) and the entry point
(:mod:`rmqha.demo.run`); processes are :mod:`rmqha.testing.local_cluster`'s.
"""
from __future__ import annotations

import asyncio
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import CancelledError
from pathlib import Path
from types import FrameType
from typing import Any

from rmqha.client import Consumer
from rmqha.client.admin import TopicAdmin
from rmqha.errors import LocalClusterError, RemotingError, RmqhaError
from rmqha.testing.local_cluster import (
    QUICK_BROKER,
    QUICK_CONTROLLER,
    BrokerProc,
    Cluster,
    Leftovers,
    ReplicaInfo,
    free_port,
    port_open,
)
from rmqha.testing.secure_setup import Account, SecureSetup
from rmqha.security.secret import generate_secret_text
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.codes import RequestCode
from rmqha.demo.load import AckProgress, ProduceLoad, seq_of
from rmqha.demo.options import (
    ADMIN_KEY, ALL_ACK, APP_KEY, CLUSTER_NAME, GROUP, HA_ADVERTISED_KEY, QUEUES, TOPIC, DemoOptions,
)
from rmqha.demo.relay import ReplicationLinks, check_stall_timing, stall_cap_s
from rmqha.demo.report import Console, DemoSummary, ElectionEvent, ProgressBar, ids_text, warn

# The restarted broker's HA slave logs how much it cut (rmqha.ha.slave).
_TRUNCATE_LINE = re.compile(r"truncating at (\d+): dropping (\d+) bytes.*?\(local max (\d+)\)")
_DROP_ALL_LINE = re.compile(r"dropping (?:its|the) whole log \((\d+) bytes")
# ... and the broker where its store ended when it opened (rmqha.broker.broker).
_STORE_OPEN_LINE = re.compile(r"store open: .*? max offset (\d+)")



# --- the scenario ---------------------------------------------------------------------------


def secure_demo(base: Path, consumer_group: str) -> SecureSetup:
    """The secured demo's ``pki/`` (a CA, a certificate per process, the cluster secret) and
    ``plain_acl.yml`` in ``base``: the demo's account holds PUB and SUB on its topic and SUB
    for ``consumer_group``, nothing else; the admin account creates the topic."""
    app = Account.new(APP_KEY, topics={TOPIC: "PUB|SUB"}, groups=[consumer_group])
    return SecureSetup.make(base, cluster=CLUSTER_NAME, groups={GROUP: 3}, app=app, controllers=3,
                            admin_key=ADMIN_KEY)


class Demo:
    def __init__(self, opts: DemoOptions) -> None:
        self.opts = opts
        self.out = Console(opts.json)
        self.summary = DemoSummary(opts.messages, opts.body_bytes)
        self.cluster: Cluster | None = None
        self.loop: EventLoopThread | None = None
        self.load: ProduceLoad | None = None
        self.brokers: list[BrokerProc] = []
        self.links: ReplicationLinks | None = None
        #: Certificates and accounts (None: --plaintext).
        self.security: SecureSetup | None = None
        #: The consumer group reading the topic (the account holds SUB on it).
        self.consumer_group = f"demo-audit-{int(time.time())}"
        #: The longest the links may stall (stall_cap_s of the demo's timers).
        self._stall_cap = opts.stall_s
        #: The controller's last reported (master id, epoch, SyncStateSet) of the group.
        self._last_view: tuple[int | None, int, list[int]] = (None, 0, [])
        self._ticks = 0
        self._consume_stop = False
        #: The slaves' (log end, bytes read off the link) at the last look during a stall.
        self._settled_seen: list[tuple[int, int]] | None = None

    # --- steps ------------------------------------------------------------------------------

    def run(self) -> DemoSummary:
        opts, out, s = self.opts, self.out, self.summary
        started = time.monotonic()
        temp = opts.directory is None
        base = Path(tempfile.mkdtemp(prefix="rmqha-demo-")) if temp else Path(opts.directory or ".")
        base.mkdir(parents=True, exist_ok=True)
        s.directory = str(base)
        out.say("rmqha demo: a replicated commit log losing its master under load, losing nothing "
                "acknowledged")
        out.say(f"working directory: {base}  (configs, stores and one log per process)")
        broker_defaults = {**QUICK_BROKER, **ALL_ACK}
        stall = opts.stall
        restore = _handle_stop_signals()
        try:
            self._secure(base)
            if stall:
                check_stall_timing(opts.stall_s, broker_defaults, QUICK_CONTROLLER)
                self._stall_cap = stall_cap_s(broker_defaults, QUICK_CONTROLLER)
                self.links = ReplicationLinks()
            secret = self.security.cluster_secret if self.security else generate_secret_text()
            self.cluster = Cluster(base, cluster_name=CLUSTER_NAME, broker_defaults=broker_defaults,
                                   controller_defaults=QUICK_CONTROLLER, cluster_secret=secret)
            if self.security is not None:
                self.cluster.client_security = self.security.harness_security()
            self.loop = EventLoopThread("demo-clients")
            self._start_cluster()
            self._create_topic()
            self._produce_and_kill()
            self._restart_old_master()
            self._consume()
        except KeyboardInterrupt:
            s.interrupted = True
            out.end_progress()
            out.say("\ninterrupted: stopping everything the demo started ...")
        except (RmqhaError, OSError, TimeoutError) as exc:
            # The first line says what; the rest (every process's log tail) goes to stderr.
            text = f"{type(exc).__name__}: {exc}"
            s.error = text.splitlines()[0]
            out.end_progress()
            out.say(f"\nthe demo failed: {s.error}")
            warn(text)
        finally:
            # A second Ctrl-C must not cut the clean-up short.
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            self._stop_everything()
            restore()
        s.total_s = time.monotonic() - started
        s.ok = (not s.interrupted and s.error is None and s.lost == 0
                and s.failover.new_master_id is not None
                and s.failover.new_master_id != s.failover.old_master_id
                and s.failover.new_epoch > s.failover.old_epoch
                and not s.leftover_processes and not s.leftover_ports)
        # A failed run keeps its logs for a look; an interrupted one cleans up.
        s.kept = opts.keep or not temp or (not s.ok and not s.interrupted)
        if not s.kept:
            shutil.rmtree(base, ignore_errors=True)
        return s

    def _secure(self, base: Path) -> None:
        """Certificates and accounts in ``base`` (unless --plaintext), and the line saying
        how the cluster is secured."""
        s = self.summary
        if self.opts.plaintext:
            s.security = "cluster secret only"
            self.out.say("security: the cluster secret only (--plaintext): control requests signed, "
                         "HA links authenticated, Raft encrypted; no TLS, no ACL")
            return
        sec = self.security = secure_demo(base, self.consumer_group)
        s.security, s.certificates, s.acl_file = "mutual TLS + ACL", str(sec.pki), str(sec.acl_file)
        self.out.say(f"security: mutual TLS on every remoting port, HA link and Raft link, ACL on "
                     f"the brokers; certificates in {sec.pki}, accounts in {sec.acl_file}")

    def _client_options(self) -> dict[str, Any]:
        """The Producer's and Consumer's certificate and account (none: --plaintext)."""
        return self.security.client_options() if self.security is not None else {}

    def _start_cluster(self) -> None:
        c, out, sec = self._c, self.out, self.security
        out.say("\n[1/5] Starting the cluster: 3 controllers, 1 name server, broker group of 3")
        t0 = time.monotonic()
        c.start_controllers(3, wait=False, **({"per_node": sec.controller_keys(3)} if sec else {}))
        c.wait_controllers(c.controllers, 60)
        leader = c.controller_leader()
        for proc in c.controllers:
            mark = "  <- Raft leader" if proc.address == leader else ""
            out.say(f"      controller  {proc.node_id:<4} {proc.address:<16} pid {proc.pid}{mark}")
        ns = c.start_namesrv(**(sec.namesrv_keys() if sec else {}))
        out.say(f"      name server      {ns.address:<16} pid {ns.pid}")
        self.brokers = self._start_group()
        info = self._replica_info()
        for b in self.brokers:
            role = "master" if b.broker_id() == info.master_id else "slave"
            out.say(f"      broker {b.group} id {b.broker_id()} {b.address:<16} pid {b.pid:<7} "
                    f"{role}  (HA port {b.ha_address.rpartition(':')[2]})")
        out.say(f"      controller's view: master id {info.master_id}, master epoch "
                f"{info.master_epoch}, SyncStateSet {ids_text(info.sync_state_set)}  "
                f"(up in {time.monotonic() - t0:.1f} s)")
        self.summary.processes_started = len(c.processes)

    def _start_group(self) -> list[BrokerProc]:
        """What Cluster.start_group does, each broker with its own certificate (secured)
        and advertising a relay as its HA address (when the links stall)."""
        c, links, sec = self._c, self.links, self.security
        brokers = []
        for i in range(3):
            # A port given, not chosen, never moves: the relay fronts this one for good.
            proc = c.add_broker(GROUP, ha_listen_port=free_port(),
                                **(sec.broker_keys(GROUP, f"{GROUP}-{i}") if sec else {}))
            if links is not None:
                proc.config[HA_ADVERTISED_KEY] = links.front(proc.ha_address)
            proc.start()
            c.wait_broker_up(proc, 60)
            brokers.append(proc)
        c.wait_role(brokers[0], "master", 60)
        for b in brokers[1:]:
            c.wait_role(b, "slave", 60)
        ids = sorted(b.broker_id() or 0 for b in brokers)
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == ids,
                   60, what=f"SyncStateSet {ids} of {GROUP}")
        return brokers

    def _create_topic(self) -> None:
        c, out = self._c, self.out
        out.say(f"\n[2/5] Creating topic {TOPIC} with {QUEUES} queues on {GROUP}")

        async def create() -> None:
            admin_options = self.security.admin_options() if self.security is not None else {}
            async with TopicAdmin(c.namesrv_addresses, **admin_options) as admin:
                for change in await admin.create_topic(TOPIC, QUEUES, groups=[GROUP]):
                    if not change.ok:
                        raise RmqhaError(f"creating {TOPIC} on {change.broker_name} failed: "
                                         f"{change.remark}")

        self._run(create(), 30)
        c.wait_for(lambda: (r := c.route(TOPIC)) is not None
                   and any("0" in b["brokerAddrs"] for b in r["brokerDatas"]),
                   30, what=f"the name server's route of {TOPIC}")

    def _produce_and_kill(self) -> None:
        c, out, opts, s = self._c, self.out, self.opts, self.summary
        kill_after = max(1, min(opts.messages - 1, int(opts.messages * opts.kill_at)))
        out.say(f"\n[3/5] Producing {opts.messages:,} messages of {opts.body_bytes} bytes "
                f"({self._load_shape()}); a send is acknowledged once every replica in the "
                f"SyncStateSet has it.")
        if self.links is not None:
            out.say(f"      After {kill_after:,} acknowledged messages the links to the slaves stall "
                    f"for a moment, then the master gets SIGKILL.")
        else:
            out.say(f"      The master gets SIGKILL after {kill_after:,} acknowledged messages.")
        load = self.load = self._new_load()
        load.hold_at = kill_after
        bar = out.progress("produce", opts.messages)
        before = self._replica_info()
        master = c.broker_by_id(GROUP, before.master_id or 0)
        if master is None:
            raise RmqhaError(f"no running broker has the master's id {before.master_id}")
        load.start()
        progress = AckProgress(load, self.opts.step_timeout_s)
        while not load.done and load.settled < kill_after:
            self._tick(bar, load)
            progress.check(self._c)
        f = s.failover
        f.killed, f.killed_pid, f.acked_at_kill = master.name, master.pid or 0, len(load.acked)
        f.old_master_id, f.old_master_address = before.master_id, before.master_address
        f.old_epoch, f.old_sync_state_set = before.master_epoch, before.sync_state_set
        load.release()  # the kill lands in the middle of the load, with sends in flight
        if self.links is not None:
            self._stall_links(master, load, bar)
        f.acked_at_kill = len(load.acked)
        load.killed_address, load.kill_time = master.address, time.monotonic()
        master.kill()
        out.say(f"  >>> SIGKILL {master.name} (pid {f.killed_pid}): the master, id {f.old_master_id}, "
                f"master epoch {f.old_epoch}, after {f.acked_at_kill:,} acknowledged messages")
        self._watch_election(bar, load, before)
        progress = AckProgress(load, self.opts.step_timeout_s)
        while not load.done:
            self._tick(bar, load)
            self._watch_sync_state_set(load)
            progress.check(self._c)
        self._tick(bar, load)
        out.end_progress()
        load.result()
        self._record_load()
        extra = ""
        if s.send_errors:
            extra = f"; {s.send_errors:,} failed after the producer's retries ({load.last_error})"
        out.say(f"      {s.acked:,} of {s.sent:,} acknowledged in {s.produce_s:.1f} s "
                f"({s.produce_msgs_per_s:,.0f} msg/s, failover included){extra}")

    def _load_shape(self) -> str:
        return f"batches of {self.opts.batch}, {self.opts.in_flight} in flight"

    def _new_load(self) -> ProduceLoad:
        return ProduceLoad(self._l, self._c.namesrv_addresses, self.opts, self._client_options())

    def _stall_links(self, master: BrokerProc, load: ProduceLoad, bar: ProgressBar) -> None:
        """Stall the master's links to its slaves for stall_s while the producer keeps
        sending.  What the master appends and sends meanwhile reaches no slave, so those
        sends wait for acks that never come; the kill follows at once."""
        c, out, f, links = self._c, self.out, self.summary.failover, self.links
        assert links is not None
        slaves = [b for b in self.brokers if b is not master and b.alive]
        t0 = time.monotonic()
        stalled = links.stall()
        # Read after the stall began: every byte a slave can still get was written before.
        f.master_max_at_stall = int(c.broker_status(master)["maxOffset"])
        f.stalled = stalled > 0
        # At least stall_s, and on until every slave has stored the blocks that crossed
        # before the stall (a slave starved of CPU may not have read them yet) and the
        # master holds writes no slave has (a starved producer may send nothing for a
        # while), but never so long that a timer trips (stall_cap_s).
        crossed = links.forwarded_ends()
        stored = self._slaves_settled if links.opaque() else self._slaves_stored
        shortest, longest = t0 + self.opts.stall_s, t0 + self._stall_cap
        nudged = False
        while not load.done and time.monotonic() < longest:
            if time.monotonic() >= shortest and stored(slaves, crossed):
                if self._master_ahead(master, slaves):
                    break
                if not nudged:
                    # A producer whose whole window crossed before the stall waits for acks
                    # stuck in the stalled links and sends nothing: one more send, which the
                    # master appends and no slave can get, gives the kill a tail to cut.
                    nudged = True
                    threading.Thread(target=self._send_unackable, args=(master,), daemon=True).start()
            self._tick(bar, load, 0.01)
        ha = c.broker_status(master).get("ha") or {}
        f.slave_max_at_kill = [int(c.broker_status(b)["maxOffset"]) for b in slaves]
        f.crossed_at_stall = [crossed.get(b.broker_id() or 0) for b in slaves]
        f.stall_s = time.monotonic() - t0
        f.master_max_at_kill = int(ha.get("max_offset", f.master_max_at_stall))
        f.slave_acks_at_kill = [int(sl.get("ack_offset", -1)) for sl in ha.get("slaves", [])]
        have = max(f.slave_max_at_kill, default=0)
        f.tail_bytes = f.master_max_at_kill - have
        if f.tail_bytes > 0:
            out.say(f"  >>> the slaves' links stall for {f.stall_s:.1f} s, so the master holds writes "
                    f"nobody else has (its log ends at {f.master_max_at_kill:,}, the slaves' at "
                    f"{have:,}); they were never acknowledged")
        else:
            out.say(f"  >>> the slaves' links stalled for {f.stall_s:.1f} s, but the slaves already "
                    f"have all the master wrote ({f.master_max_at_kill:,}): nothing for the kill to take")

    def _slaves_stored(self, slaves: list[BrokerProc], crossed: dict[int, int | None]) -> bool:
        """Every slave's log reaches the end of what its link forwarded before the stall."""
        c = self._c
        for b in slaves:
            end = crossed.get(b.broker_id() or 0)
            if end is not None and int(c.broker_status(b)["maxOffset"]) < end:
                return False
        return True

    def _slaves_settled(self, slaves: list[BrokerProc], crossed: dict[int, int | None]) -> bool:
        """:meth:`_slaves_stored` for links the relay cannot read (TLS): the relay has
        handed the slaves' sockets all it forwarded, and each slave then answers twice in
        a row with the same log end and the same bytes read off its link.  A slave's HA
        link and its status requests share one event loop, and a link holding unread
        bytes or plaintext is served every loop turn: between two answers it would have
        moved.  (``crossed`` is empty: the relay could not read the links.)"""
        c, links = self._c, self.links
        assert links is not None
        if not links.flushed():
            self._settled_seen = None
            return False
        seen = [(int(st["maxOffset"]), int((st.get("ha") or {}).get("bytes_received", -1)))
                for st in (c.broker_status(b) for b in slaves)]
        settled, self._settled_seen = seen == self._settled_seen, seen
        return settled

    def _send_unackable(self, master: BrokerProc) -> None:
        """One send to ``master`` while its links stall: appended there, never acknowledged
        (the request times out; the kill that follows cuts it with the rest of the tail)."""
        try:
            self._c.request(master.address, RequestCode.SEND_MESSAGE, {
                "producerGroup": "demo-tail", "topic": TOPIC, "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0,
                "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "",
                "reconsumeTimes": 0}, b"written while the links stall", timeout=self._stall_cap)
        except (RmqhaError, TimeoutError, CancelledError):
            pass  # never answered SEND_OK by design: the master dies first

    def _master_ahead(self, master: BrokerProc, slaves: list[BrokerProc]) -> bool:
        c = self._c
        have = max((int(c.broker_status(b)["maxOffset"]) for b in slaves), default=0)
        return int(c.broker_status(master)["maxOffset"]) > have

    def _record_load(self) -> None:
        """Copy the producer's counters into the summary (also after an early stop)."""
        s, load = self.summary, self.load
        if load is None or not load.started_at:
            return
        end = load.finished_at or time.monotonic()
        s.sent, s.acked = load.sent, len(load.acked)
        s.not_acked, s.send_errors = load.not_acked, load.send_errors
        s.produce_s = end - load.started_at
        s.produce_msgs_per_s = s.acked / s.produce_s if s.produce_s > 0 else 0.0
        s.produce_mb_per_s = s.produce_msgs_per_s * self.opts.body_bytes / 1e6
        s.failover_s = s.failover.first_ack_s

    def _tick(self, bar: ProgressBar, load: ProduceLoad, pause: float = 0.05) -> None:
        elapsed = time.monotonic() - load.started_at
        rate = len(load.acked) / elapsed if elapsed > 0 else 0.0
        bar.update(len(load.acked), f"{rate:,.0f} msg/s")
        time.sleep(pause)

    def _watch_election(self, bar: ProgressBar, load: ProduceLoad, before: ReplicaInfo) -> None:
        """Print the controller's view each time it changes, until a new master is named
        and has acknowledged a write (or the producer has nothing left to send)."""
        f = self.summary.failover
        t0 = load.kill_time or time.monotonic()
        self._last_view = (before.master_id, before.master_epoch, before.sync_state_set)
        deadline = t0 + self.opts.step_timeout_s
        while True:
            # Ask often: the election itself takes tens of milliseconds.
            self._tick(bar, load, 0.005)
            lines = self._poll_view(t0)
            if f.first_ack_s is None and load.first_ack_after_kill is not None:
                f.first_ack_s = load.first_ack_after_kill - t0
                lines.append((f.first_ack_s, f"first write acknowledged by the new master "
                                             f"({load.after_kill_note})"))
            self._say_at(lines)
            if f.election_s is not None and (f.first_ack_s is not None or load.done):
                return
            if time.monotonic() > deadline:
                raise RmqhaError(f"no new master acknowledged a write within "
                                 f"{self.opts.step_timeout_s:.0f} s of the kill\n{self._c.describe()}")

    def _watch_sync_state_set(self, load: ProduceLoad) -> None:
        """After the election: report SyncStateSet changes (slaves catching up) as they
        come, asking the controller every few ticks."""
        self._ticks += 1
        if self._ticks % 4 == 0:
            self._say_at(self._poll_view(load.kill_time or 0.0))

    def _poll_view(self, t0: float) -> list[tuple[float, str]]:
        """Ask the controller; a line (seconds after ``t0``, text) if its view changed."""
        info = self._replica_info_or_none()
        after = time.monotonic() - t0
        if info is None:
            return []
        view = (info.master_id, info.master_epoch, info.sync_state_set)
        if view == self._last_view:
            return []
        self._last_view = view
        return [(after, self._election_event(after, info))]

    def _say_at(self, lines: list[tuple[float, str]]) -> None:
        for after, text in sorted(lines):
            self.out.say(f"      {'+' + format(after, '.2f') + ' s':>8}  {text}")

    def _election_event(self, after: float, info: ReplicaInfo) -> str:
        """Record one change of the controller's view; its description."""
        f = self.summary.failover
        f.events.append(ElectionEvent(after, info.master_id, info.master_address,
                                      info.master_epoch, info.sync_state_set))
        if info.master_id is None:
            return (f"controller: no master (epoch {info.master_epoch}), SyncStateSet "
                    f"{ids_text(info.sync_state_set)}")
        if info.master_id != f.old_master_id and f.election_s is None:
            f.election_s = after
            f.new_master_id, f.new_master_address = info.master_id, info.master_address
            f.new_epoch = info.master_epoch
            f.new_sync_state_set = info.sync_state_set
            return (f"controller elected id {info.master_id} ({info.master_address}): master "
                    f"epoch {f.old_epoch} -> {info.master_epoch}, SyncStateSet "
                    f"{ids_text(f.old_sync_state_set)} -> {ids_text(info.sync_state_set)}")
        if info.master_id == f.new_master_id:
            f.new_epoch = info.master_epoch
            f.new_sync_state_set = info.sync_state_set
        return (f"controller: master id {info.master_id}, epoch {info.master_epoch}, "
                f"SyncStateSet {ids_text(info.sync_state_set)}")

    def _restart_old_master(self) -> None:
        c, out, f, r = self._c, self.out, self.summary.failover, self.summary.rejoin
        old = c.broker_by_id(GROUP, f.old_master_id or 0)
        if old is None:
            raise RmqhaError(f"no broker process has id {f.old_master_id}")
        r.broker, r.broker_id = old.name, f.old_master_id
        out.say(f"\n[4/5] Restarting {old.name} (the old master, id {r.broker_id}) on its old store")
        t0 = time.monotonic()
        log_offset = len(old.log_text())
        old.start()
        timeout = self.opts.step_timeout_s
        c.wait_role(old, "slave", timeout)
        r.as_slave_s = time.monotonic() - t0
        # Truncation happens when its HA link first reaches the master, before any transfer.
        status = c.wait_for(lambda: (st := c.broker_status(old)).get("ha", {}).get("sessions", 0) >= 1
                            and st, timeout, what=f"{old.name}'s HA link to the new master", process=old)
        r.role, r.master_id = status.get("role"), status.get("masterId")
        r.master_epoch = int(status.get("masterEpoch") or 0)
        self._say_at([(r.as_slave_s, f"back as a slave of id {r.master_id} (master epoch "
                                     f"{r.master_epoch})")])
        ids = sorted(b.broker_id() or 0 for b in self.brokers)
        info = c.wait_for(lambda: (i := self._replica_info_or_none()) is not None
                          and i.sync_state_set == ids and i, timeout,
                          what=f"SyncStateSet {ids}", process=old)
        r.in_sync_s = time.monotonic() - t0
        r.sync_state_set = info.sync_state_set
        master = c.broker_by_id(GROUP, r.master_id or 0)
        theirs = [] if master is None else [
            {"epoch": e["epoch"], "startOffset": e["startOffset"]}
            for e in c.broker_epochs(master).get("epochList", [])]
        epoch_start = next((e["startOffset"] for e in theirs if e["epoch"] == f.new_epoch), None)
        r.new_epoch_start = epoch_start
        if self.links is not None:
            f.link_bytes_dropped = self.links.dropped_bytes
        self._read_truncation(old.log_text()[log_offset:], status, epoch_start)
        if r.truncated_bytes and r.log_end_before is not None and r.truncated_at is not None:
            out.say(f"      cut {r.truncated_bytes:,} bytes = {r.log_end_before:,} (where its log "
                    f"ended) - {r.truncated_at:,} (where epoch {f.new_epoch} starts on the new "
                    f"master): the tail only the old master had, never acknowledged")
        elif r.truncated_bytes:
            out.say(f"      dropped its whole log ({r.truncated_bytes:,} bytes): nothing in common "
                    f"with the new master's")
        elif r.log_end_before is not None:
            out.say(f"      nothing to cut: its log ended at {r.log_end_before:,}, exactly where "
                    f"epoch {f.new_epoch} starts (every byte it had written had reached a slave)")
        else:
            out.say("      nothing was cut (no truncation reported)")
        # A slave records an epoch when the first block of that epoch reaches it, and it can
        # join the SyncStateSet before that (its log ended exactly where the new epoch
        # starts, and the new master had confirmed nothing past it yet): wait until it holds
        # what the master had when the set was complete, then compare the whole maps.
        master_max = int(c.broker_status(master).get("maxOffset") or 0) if master is not None else 0

        def caught_up() -> list[dict[str, int]] | None:
            mine = [{"epoch": e["epoch"], "startOffset": e["startOffset"]}
                    for e in c.broker_epochs(old).get("epochList", [])]
            done = int(c.broker_status(old).get("maxOffset") or 0) >= master_max and mine == theirs
            return mine if done else None

        try:
            if master is None:
                raise LocalClusterError("no master to compare with")
            r.epoch_map = c.wait_for(caught_up, timeout, what=f"{old.name} to hold the master's log "
                                     f"up to {master_max:,} and its epochs", process=old)
        except LocalClusterError:
            r.epoch_map = [{"epoch": e["epoch"], "startOffset": e["startOffset"]}
                           for e in c.broker_epochs(old).get("epochList", [])]
        r.matches_master_epochs = bool(theirs) and theirs == r.epoch_map
        epochs = ", ".join(f"epoch {e['epoch']} from {e['startOffset']:,}" for e in r.epoch_map)
        same = "same as the master's" if r.matches_master_epochs else "DIFFERS from the master's"
        out.say(f"      its epoch map now: {epochs} ({same})")
        self._say_at([(r.in_sync_s, f"caught up: SyncStateSet {ids_text(r.sync_state_set)} "
                                    f"(SyncStateSet epoch {info.sync_state_set_epoch})")])

    def _read_truncation(self, log: str, status: dict[str, Any], epoch_start: int | None) -> None:
        """How much the rejoining broker cut, from its own log lines (where its store ended
        when it opened; the HA slave's truncation line) and its HA status."""
        r = self.summary.rejoin
        ha = status.get("ha") or {}
        m = _STORE_OPEN_LINE.search(log)
        if m:
            r.log_end_before = int(m.group(1))
        m = _TRUNCATE_LINE.search(log)
        if m:
            r.truncated_at, r.truncated_bytes, r.log_end_before = (int(g) for g in m.groups())
            return
        m = _DROP_ALL_LINE.search(log)
        if m:
            r.truncated_at, r.truncated_bytes = 0, int(m.group(1))
            return
        if ha.get("bytes_dropped") is not None:
            r.truncated_bytes = int(ha["bytes_dropped"])
        elif r.log_end_before is not None:
            r.truncated_bytes = 0
        if ha.get("last_truncate") is not None:
            r.truncated_at = int(ha["last_truncate"])
        elif r.truncated_bytes == 0:
            r.truncated_at = epoch_start

    def _consume(self) -> None:
        c, out, opts = self._c, self.out, self.opts
        assert self.load is not None
        acked = self.load.acked
        out.say(f"\n[5/5] Reading {TOPIC} back with a new consumer group")
        bar = out.progress("consume", max(1, len(acked)))
        counts: Counter[int] = Counter()
        t0 = time.monotonic()

        async def read() -> None:
            consumer = Consumer(c.namesrv_addresses, self.consumer_group, TOPIC, pull_batch=128,
                                long_poll_s=1.0, rebalance_interval_s=2.0, **self._client_options())
            await consumer.start()
            try:
                idle_since = time.monotonic()
                while not self._consume_stop:
                    got = await consumer.poll(0.5, 4096)
                    now = time.monotonic()
                    if got:
                        idle_since = now
                    for m in got:
                        seq = seq_of(m.body)
                        if seq is not None:
                            counts[seq] += 1
                    missing = len(acked) - sum(1 for q in acked if q in counts) if not got else -1
                    # Done once every acknowledged message is in and the topic stays quiet
                    # (unacknowledged or duplicated copies may trail); give up after a long
                    # silence with messages still missing.
                    if missing == 0 and now - idle_since >= 1.0:
                        return
                    if now - idle_since >= min(20.0, opts.step_timeout_s):
                        return
            finally:
                await consumer.close()

        fut = asyncio.run_coroutine_threadsafe(read(), self._l.loop)
        try:
            while not fut.done():
                elapsed = time.monotonic() - t0
                seen = len(counts)
                bar.update(min(seen, bar.total), f"{seen / elapsed if elapsed else 0:,.0f} msg/s")
                time.sleep(0.1)
            fut.result()
        finally:
            if not fut.done():
                # Interrupted: let the reader close its consumer (it checks the flag each poll).
                self._consume_stop = True
                try:
                    fut.result(10)
                except (TimeoutError, CancelledError, RmqhaError, OSError) as exc:
                    warn(f"the consumer did not stop cleanly: {exc!r}")
        bar.update(min(len(counts), bar.total))
        out.end_progress()
        self._record_reads(counts, time.monotonic() - t0)

    def _record_reads(self, counts: Counter[int], seconds: float) -> None:
        """What was read (sequence number -> times), against what was acknowledged."""
        s = self.summary
        assert self.load is not None
        acked = self.load.acked
        s.consume_s = seconds
        s.consumed = len(counts)
        s.consume_msgs_per_s = s.consumed / s.consume_s if s.consume_s > 0 else 0.0
        s.duplicates = sum(n - 1 for n in counts.values())
        lost = sorted(acked - set(counts))
        s.lost, s.lost_sample = len(lost), lost[:20]
        s.unacked_but_stored = len(set(counts) - acked)

    # --- clean-up ---------------------------------------------------------------------------

    def _stop_everything(self) -> None:
        s = self.summary
        if self.load is not None:
            self.load.stop()
            if not s.sent:
                self._record_load()
        if self.loop is not None:
            try:
                self.loop.run(_cancel_other_tasks(), 10)
            except (TimeoutError, RuntimeError) as exc:
                warn(f"client tasks did not stop cleanly: {exc!r}")
            self.loop.stop()
        if self.cluster is not None:
            s.processes_started = len(self.cluster.processes)
            self.cluster.stop_all(timeout=5.0)
            left: Leftovers = self.cluster.leftovers()
            s.leftover_processes, s.leftover_ports = left.processes, left.ports
        if self.links is not None:
            self.links.close()
            s.leftover_ports += [p for p in self.links.ports if port_open(f"127.0.0.1:{p}")]

    # --- helpers ----------------------------------------------------------------------------

    @property
    def _c(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def _l(self) -> EventLoopThread:
        assert self.loop is not None
        return self.loop

    def _run(self, coro: Any, timeout: float) -> Any:
        return self._l.run(coro, timeout)

    def _replica_info(self) -> ReplicaInfo:
        c = self._c
        return c.wait_for(lambda: c.replica_info(GROUP), 30, what=f"the controller's view of {GROUP}")

    def _replica_info_or_none(self) -> ReplicaInfo | None:
        try:
            return self._c.replica_info(GROUP)
        except (RemotingError, TimeoutError, OSError):
            return None


async def _cancel_other_tasks(timeout: float = 5.0) -> None:
    """Cancel whatever still runs on the demo's client loop (after an interrupt) and give
    it ``timeout`` seconds to unwind, so the loop closes with nothing pending."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


# --- signals, summary, entry point ----------------------------------------------------------


def _handle_stop_signals() -> Callable[[], None]:
    """Make SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (so the
    demo unwinds through its clean-up); returns a function restoring the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # SIGINT may have been inherited as ignored (a background job): take it back.
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: interrupt,
              signal.SIGHUP: interrupt}
    old = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}

    def restore() -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore
