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
address (:class:`ReplicationLinks`), and a stall holds the master's bytes in the relay.
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

This module owns the demo's scenario and its output; processes are
:mod:`rmqha.testing.local_cluster`'s.
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn

from rmqha.ha import frames
from rmqha.ha.auth import PREFACE
from rmqha.ha.frame_mac import TAG as FRAME_TAG_BYTES
from rmqha.client import Consumer, Message, Producer
from rmqha.client.admin import TopicAdmin
from rmqha.errors import LocalClusterError, ProtocolError, RemotingError, RmqhaError, SendError
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
from rmqha.protocol.message import parse_offset_msg_id
from rmqha.security.secret import generate_secret_text
from rmqha.net.loop import EventLoopThread

TOPIC = "DemoTopic"
GROUP = "broker-a"
CLUSTER_NAME = "rmqha-demo"
#: The accounts of the secured demo's ``plain_acl.yml``: its clients', and an admin's.
APP_KEY = "demo-app"
ADMIN_KEY = "demo-admin"
QUEUES = 8
#: The broker settings that make the point of the demo: a send is acknowledged only once
#: every replica in the SyncStateSet holds it (RocketMQ's allAckInSyncStateSet), and never
#: with fewer than two copies, even while a new master's set is still itself alone.
ALL_ACK = {"all_ack_in_sync_state_set": True, "min_in_sync_replicas": 2, "slave_timeout_ms": 3000}
#: The first bytes of every body: the message's sequence number, so the reader can tell
#: which message it is and count duplicates without trusting any id.
_SEQ_DIGITS = 10

#: The first byte of a TLS connection (a handshake record); no HA dialect starts so: a
#: frame's length, an offset or the authenticated link's preface come first.
_TLS_HANDSHAKE = b"\x16"
# The restarted broker's HA slave logs how much it cut (rmqha.ha.slave).
_TRUNCATE_LINE = re.compile(r"truncating at (\d+): dropping (\d+) bytes.*?\(local max (\d+)\)")
_DROP_ALL_LINE = re.compile(r"dropping (?:its|the) whole log \((\d+) bytes")
# ... and the broker where its store ended when it opened (rmqha.broker.broker).
_STORE_OPEN_LINE = re.compile(r"store open: .*? max offset (\d+)")

#: The broker key that makes a broker tell slaves another HA address than the one it
#: listens on (the demo's relay in front of it).
HA_ADVERTISED_KEY = "ha_advertised_address"
#: A stall lasts at most this fraction of the shortest timer it could trip (see
#: :func:`check_stall_timing`).
_STALL_MARGIN = 4




def stall_cap_s(broker: dict[str, Any], controller: dict[str, Any]) -> float:
    """The longest stall that trips no timer and so cannot change the story: a side that
    hears nothing for ha_housekeeping_interval_ms drops the link, a member not caught up for
    ha_max_time_slave_not_catchup_ms is shrunk out of the SyncStateSet, a send waits
    slave_timeout_ms for its acks.  Heartbeats to the controller do not cross the relay,
    but its timeouts are kept clear as well, so no election can pick another node."""
    timers = _stall_timers(broker, controller)
    return min(timers.values()) / 1000 / _STALL_MARGIN


def check_stall_timing(stall_s: float, broker: dict[str, Any], controller: dict[str, Any]) -> None:
    """Refuse a stall longer than :func:`stall_cap_s` allows, naming the timer."""
    for name, ms in _stall_timers(broker, controller).items():
        if stall_s * 1000 * _STALL_MARGIN > ms:
            raise RmqhaError(f"a {stall_s:.2f} s stall is too long for {name} = {ms} ms "
                             f"(at most 1/{_STALL_MARGIN} of it)")


def _stall_timers(broker: dict[str, Any], controller: dict[str, Any]) -> dict[str, int]:
    timers = {
        "ha_housekeeping_interval_ms": broker.get("ha_housekeeping_interval_ms"),
        "ha_max_time_slave_not_catchup_ms": broker.get("ha_max_time_slave_not_catchup_ms"),
        "slave_timeout_ms": broker.get("slave_timeout_ms"),
        "controller_heartbeat_timeout_ms": broker.get("controller_heartbeat_timeout_ms"),
        "broker_heartbeat_timeout": controller.get("broker_heartbeat_timeout"),
    }
    return {name: ms for name, ms in timers.items() if isinstance(ms, int)}


@dataclass
class DemoOptions:
    messages: int = 100_000
    body_bytes: int = 256
    batch: int = 32
    in_flight: int = 4
    #: The master is killed once this fraction of the messages is acknowledged.
    kill_at: float = 0.4
    directory: Path | None = None
    keep: bool = False
    json: bool = False
    #: Longest wait for any one step (a new master, a rejoin, the last message).
    step_timeout_s: float = 60.0
    #: Stall the replication links just before the kill, so the master holds a tail.
    stall: bool = True
    #: How long the links stall at least before the kill (the producer keeps sending
    #: meanwhile); longer, up to stall_cap_s, until the master holds writes no slave has.
    stall_s: float = 0.3
    #: The load goes through an ``rmqha proxy`` with RocketMQ 5's official client
    #: (:mod:`rmqha.demo.grpc_load`) instead of rmqha's own over remoting.
    grpc: bool = False
    #: No TLS and no ACL: the cluster secret only (for comparison).
    plaintext: bool = False


@dataclass
class ElectionEvent:
    """One change of the controller's view of the group, seconds after the kill."""

    after_s: float
    master_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: list[int]


@dataclass
class Failover:
    killed: str = ""
    killed_pid: int = 0
    acked_at_kill: int = 0
    old_master_id: int | None = None
    old_master_address: str | None = None
    old_epoch: int = 0
    old_sync_state_set: list[int] = field(default_factory=list)
    new_master_id: int | None = None
    new_master_address: str | None = None
    new_epoch: int = 0
    new_sync_state_set: list[int] = field(default_factory=list)
    #: The links to the slaves stalled before the kill (see DemoOptions.stall).
    stalled: bool = False
    stall_s: float | None = None
    #: The master's max offset just after the links stalled: no slave can have more.
    master_max_at_stall: int | None = None
    #: As seen at the end of the stall, just before the kill: the master's max offset, its
    #: slaves' acks and the slaves' own max offsets.
    master_max_at_kill: int | None = None
    slave_acks_at_kill: list[int] = field(default_factory=list)
    slave_max_at_kill: list[int] = field(default_factory=list)
    #: Where the last whole block that crossed each slave's link before the stall ends, in
    #: the order of slave_max_at_kill (None: the relay could not follow that stream).
    crossed_at_stall: list[int | None] = field(default_factory=list)
    #: master_max_at_kill - max(slave_max_at_kill): on no slave, never acknowledged.
    tail_bytes: int | None = None
    #: Bytes the stalled links held when the master died, dropped with it.
    link_bytes_dropped: int = 0
    #: SIGKILL -> the controller names another master.
    election_s: float | None = None
    #: SIGKILL -> the first send acknowledged by the new master.
    first_ack_s: float | None = None
    events: list[ElectionEvent] = field(default_factory=list)


@dataclass
class Rejoin:
    broker: str = ""
    broker_id: int | None = None
    role: str | None = None
    master_id: int | None = None
    master_epoch: int = 0
    #: Where its log ended when it came back, where it was cut, and how much was cut.
    log_end_before: int | None = None
    truncated_at: int | None = None
    truncated_bytes: int | None = None
    #: Where the new master's epoch starts in its own epoch map.
    new_epoch_start: int | None = None
    epoch_map: list[dict[str, int]] = field(default_factory=list)
    matches_master_epochs: bool = False
    as_slave_s: float | None = None
    in_sync_s: float | None = None
    sync_state_set: list[int] = field(default_factory=list)


@dataclass
class DemoSummary:
    messages: int
    body_bytes: int
    sent: int = 0
    acked: int = 0
    not_acked: int = 0
    send_errors: int = 0
    consumed: int = 0
    duplicates: int = 0
    lost: int = 0
    lost_sample: list[int] = field(default_factory=list)
    unacked_but_stored: int = 0
    #: "mutual TLS + ACL", or "cluster secret only" (--plaintext); where the certificates
    #: and accounts are (secured).
    security: str = ""
    certificates: str | None = None
    acl_file: str | None = None
    #: Which clients carried the load, and the proxy they went through (gRPC demo).
    client: str = "rmqha Producer and Consumer over remoting"
    proxy: str | None = None
    #: gRPC demo: sends the demo repeated after the client's own attempts failed, receives
    #: that failed, and acks the proxy refused (those messages come again).
    send_retries: int = 0
    receive_errors: int = 0
    acks_refused: int = 0
    produce_s: float = 0.0
    produce_msgs_per_s: float = 0.0
    produce_mb_per_s: float = 0.0
    consume_s: float = 0.0
    consume_msgs_per_s: float = 0.0
    failover_s: float | None = None
    failover: Failover = field(default_factory=Failover)
    rejoin: Rejoin = field(default_factory=Rejoin)
    processes_started: int = 0
    leftover_processes: list[str] = field(default_factory=list)
    leftover_ports: list[int] = field(default_factory=list)
    directory: str = ""
    kept: bool = False
    total_s: float = 0.0
    interrupted: bool = False
    error: str | None = None
    ok: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --- output ---------------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr, drawn by rich.

    On a terminal it is a live bar (redrawn a few times a second, the demo's other lines
    scrolling above it); anywhere else (a pipe, a file, a CI log) nothing is redrawn: only
    the final line is written, as plain text without escape codes.
    """

    def __init__(self, label: str, total: int, *, console: RichConsole | None = None,
                 enabled: bool = True) -> None:
        self.label, self.total = label, max(total, 1)
        self.console = console if console is not None else RichConsole(
            file=sys.stderr, highlight=False, emoji=False)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal and not self.console.is_dumb_terminal
        self.done = 0
        self.suffix = ""
        self._progress: Progress | None = None
        if self.live:
            # The demo's lines go to stdout: when that is the same terminal, rich prints
            # them above the bar; when it is a pipe they must stay on stdout untouched.
            stdout_tty = sys.stdout.isatty()
            self._progress = Progress(
                TextColumn("{task.description:<10}"), BarColumn(bar_width=30),
                TaskProgressColumn(), MofNCompleteColumn(), TextColumn("{task.fields[suffix]}"),
                console=self.console, transient=True, refresh_per_second=5,
                redirect_stdout=stdout_tty, redirect_stderr=False)
            self._task = self._progress.add_task(label, total=self.total, suffix="")
            self._progress.start()

    def line(self) -> str:
        """The bar as one plain line (what a pipe gets at the end)."""
        pct = min(100, self.done * 100 // self.total)
        return f"{self.label:<10} {pct:3d}% {self.done:,}/{self.total:,} {self.suffix}".rstrip()

    def update(self, done: int, suffix: str = "") -> None:
        self.done, self.suffix = done, suffix
        if self._progress is not None:
            self._progress.update(self._task, completed=min(done, self.total), suffix=suffix)

    def finish(self) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.update(self._task, completed=min(self.done, self.total), suffix=self.suffix)
            self._progress.stop()  # transient: the live bar leaves the screen ...
            self._progress = None
        # ... and one final line stays, on a terminal and in a log alike.
        self.console.file.write(self.line() + "\n")
        self.console.file.flush()


class Console:
    """The demo's human output (stdout), kept clear of a live progress bar on stderr."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: ProgressBar | None = None

    def say(self, text: str = "") -> None:
        if self.quiet:
            return
        # With a live bar on the same terminal, rich has taken over stdout and prints
        # this above the bar.
        print(text, flush=True)

    def progress(self, label: str, total: int) -> ProgressBar:
        self.bar = ProgressBar(label, total, enabled=not self.quiet)
        return self.bar

    def end_progress(self) -> None:
        if self.bar is not None:
            self.bar.finish()
            self.bar = None


def warn(text: str) -> None:
    print(f"rmqha demo: {text}", file=sys.stderr, flush=True)


def _ids(ids: list[int]) -> str:
    return "{" + ", ".join(str(i) for i in ids) + "}"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


# --- the producer ---------------------------------------------------------------------------


def numbered_body(seq: int, size: int) -> bytes:
    head = str(seq).zfill(_SEQ_DIGITS).encode()
    return head + b"." * max(0, size - len(head))


def seq_of(body: bytes) -> int | None:
    head = body[:_SEQ_DIGITS]
    return int(head) if len(head) == _SEQ_DIGITS and head.isdigit() else None


class ProduceLoad:
    """Numbered messages sent in batches by ``in_flight`` concurrent senders of one
    :class:`Producer`, on the demo's client loop; counters read from the main thread."""

    #: How the first send acknowledged after the kill got there (the demo says it).
    after_kill_note = "the producer retried by itself"

    def __init__(self, loop: EventLoopThread, namesrv: list[str], opts: DemoOptions,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.loop = loop
        self.namesrv = namesrv
        self.opts = opts
        #: The Producer's certificate and account (secured demo).
        self.client_options = dict(client_options or {})
        self.sent = 0
        self.acked: set[int] = set()
        self.not_acked = 0
        self.send_errors = 0
        self.last_error = ""
        self.started_at = 0.0
        self.finished_at: float | None = None
        #: Set by the main thread just before it kills the master.
        self.kill_time: float | None = None
        self.killed_address: str | None = None
        self.first_ack_after_kill: float | None = None
        #: Senders start no batch at or past this sequence number until :meth:`release`:
        #: a fast producer could otherwise finish between two looks of the main thread,
        #: and the master would be killed after the load instead of in the middle of it.
        self.hold_at: int | None = None
        self._released = asyncio.Event()
        self._next = 0
        self._future: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._producer: Producer | None = None

    @property
    def done(self) -> bool:
        return self._future is not None and self._future.done()

    @property
    def settled(self) -> int:
        """Messages whose send has an outcome (acknowledged, refused or failed)."""
        return len(self.acked) + self.not_acked + self.send_errors

    def release(self) -> None:
        """Let the senders past :attr:`hold_at` (from the main thread)."""
        self.loop.loop.call_soon_threadsafe(self._released.set)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self.loop.loop)

    def result(self) -> None:
        """Re-raise what made the load fail (SendErrors are counted, not raised)."""
        if self._future is not None and self._future.done():
            self._future.result()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the senders and wait until the producer is closed (for an early exit)."""
        if self._future is None or self._future.done():
            return

        async def cancel() -> None:
            # The flag as well as the cancel: asyncio.wait_for (3.11) can swallow a
            # cancellation that races with a response, and the sender would go on.
            self._stopping = True
            if self._task is not None:
                self._task.cancel()
                await asyncio.wait([self._task], timeout=timeout)

        try:
            self.loop.run(cancel(), timeout + 1)
        except (TimeoutError, RuntimeError) as exc:  # a stuck close must not stop the clean-up
            warn(f"the producer did not stop cleanly: {exc!r}")

    async def _run(self) -> None:
        self._task = asyncio.current_task()
        await self._open()
        try:
            self._tasks = [asyncio.ensure_future(self._sender()) for _ in range(self.opts.in_flight)]
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._close()
            self.finished_at = time.monotonic()

    async def _open(self) -> None:
        self._producer = Producer(self.namesrv, "demo-producer", send_timeout_s=3.0,
                                  backoff_s=0.02, max_backoff_s=0.2, retry_deadline_s=30.0,
                                  compress_over_bytes=-1, **self.client_options)

    async def _close(self) -> None:
        if self._producer is not None:
            await self._producer.close()

    async def _take(self, n: int) -> range | None:
        """The next ``n`` sequence numbers to send (fewer at the end), counted as sent;
        None once all are taken or the load stops.  Waits at :attr:`hold_at`."""
        while self._next < self.opts.messages and not self._stopping:
            if self.hold_at is not None and self._next >= self.hold_at \
                    and not self._released.is_set():
                await self._released.wait()
                continue
            seqs = range(self._next, min(self._next + n, self.opts.messages))
            self._next = seqs.stop
            self.sent += len(seqs)
            return seqs
        return None

    async def _sender(self) -> None:
        assert self._producer is not None
        opts = self.opts
        while (seqs := await self._take(opts.batch)) is not None:
            try:
                results = await self._producer.send_batch(
                    TOPIC, [Message(numbered_body(s, opts.body_bytes)) for s in seqs])
            except SendError as exc:
                self.send_errors += len(seqs)
                self.last_error = str(exc)
                continue
            now = time.monotonic()
            for seq, r in zip(seqs, results):
                if not r.ok:
                    self.not_acked += 1
                    continue
                self.acked.add(seq)
                if self.kill_time is not None and self.first_ack_after_kill is None:
                    try:
                        host, _ = parse_offset_msg_id(r.offset_msg_id)
                    except ProtocolError:
                        host = ""
                    if host and host != self.killed_address:
                        self.first_ack_after_kill = now


class _AckProgress:
    """Fails a produce phase in which no send is acknowledged for ``timeout_s``: every send
    ends within the producer's retry deadline, but a cluster that refuses them all would
    keep the demo going batch after batch, saying nothing."""

    def __init__(self, load: ProduceLoad, timeout_s: float) -> None:
        self.load = load
        self.timeout_s = timeout_s
        self._acked = len(load.acked)
        self._since = time.monotonic()

    def check(self, cluster: Cluster) -> None:
        acked, now = len(self.load.acked), time.monotonic()
        if acked != self._acked:
            self._acked, self._since = acked, now
        elif now - self._since > self.timeout_s:
            raise RmqhaError(f"no send acknowledged for {self.timeout_s:.0f} s (last send error: "
                             f"{self.load.last_error or 'none'})\n{cluster.describe()}")


# --- the replication links -----------------------------------------------------------------


class _Link:
    """One relayed HA connection (slave <-> master); what the master sends once the link
    is stalled is counted, never forwarded (a stalled link is not resumed: its master dies).

    The relay reads the frames it forwards (framed dialect) when it can: the slave's broker
    id from its handshake, and the log end of the last whole block that went to it, which is
    what the slave will have stored once it has read everything it was sent.  Over TLS (the
    secured demo: the brokers' HA links are mutual TLS) it sees ciphertext only: it forwards
    and holds the bytes all the same, but knows neither (:attr:`opaque`)."""

    def __init__(self, slave_writer: asyncio.StreamWriter, master_writer: asyncio.StreamWriter) -> None:
        self.slave_writer = slave_writer
        self.master_writer = master_writer
        self.stalled = False
        self.held_bytes = 0
        #: The link is TLS: the relay cannot read its frames.
        self.opaque = False
        self.slave_id: int | None = None
        #: Log end of the last whole TRANSFER_DATA block forwarded (None: not known, e.g.
        #: the slave speaks the rocketmq dialect).
        self.forwarded_end: int | None = 0
        # Any block a broker may send (its own limit is configurable): the relay only counts.
        self._to_slave_frames = frames.framed.decoder(frames.Direction.MASTER_TO_SLAVE, max_frame_bytes=1 << 30)
        self._to_master_frames: Any = frames.framed.decoder(frames.Direction.SLAVE_TO_MASTER)
        # An authenticated link (the cluster secret) wraps the frames: the relay has no keys,
        # so it reads past the handshake and the tags (the two ends check them).
        self._from_slave = _SealedView(messages=2)
        self._to_slave: _SealedView | None = None

    def saw_from_slave(self, data: bytes) -> None:
        if self._to_master_frames is None:
            return
        if self._from_slave.sealed is None and data[:1] == _TLS_HANDSHAKE:
            self.opaque = True  # a ClientHello: no frame of this link is readable here
            self._to_master_frames, self.forwarded_end = None, None
            return
        try:
            for frame in self._to_master_frames.feed(self._from_slave.feed(data)):
                if isinstance(frame, frames.HandshakeSlave):
                    self.slave_id = frame.broker_id
                    self._to_master_frames = None  # all it was read for
                    return
        except ProtocolError:
            self._to_master_frames = None
            self.forwarded_end = None

    def forwarded_to_slave(self, data: bytes) -> None:
        if self.forwarded_end is None:
            return
        if self._to_slave is None:
            self._to_slave = _SealedView(messages=1, sealed=self._from_slave.sealed)
        try:
            for frame in self._to_slave_frames.feed(self._to_slave.feed(data)):
                if type(frame) is frames.TransferData and len(frame.data):
                    self.forwarded_end = max(self.forwarded_end,
                                             frame.block_start_offset + len(frame.data))
        except ProtocolError:
            self.forwarded_end = None


class _SealedView:
    """The framed-dialect bytes of one direction of an HA link, as a relay without the keys
    sees them: an authenticated link (it opens with :data:`rmqha.ha.auth.PREFACE`) carries
    length-prefixed handshake messages, then every frame followed by its MAC tag; the view
    drops those and passes the frames on.  A link that does not open with the preface is
    passed through as it is."""

    def __init__(self, messages: int, sealed: bool | None = None) -> None:
        self.sealed = sealed
        self._messages = messages
        self._buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        if self.sealed is None:
            if len(buf) < len(PREFACE):
                return b""
            self.sealed = bytes(buf[:len(PREFACE)]) == PREFACE
            if self.sealed:
                del buf[:len(PREFACE)]
        if not self.sealed:
            out = bytes(buf)
            buf.clear()
            return out
        return self._frames(buf)

    def _frames(self, buf: bytearray) -> bytes:
        out = bytearray()
        while self._messages and len(buf) >= 2:
            (n,) = struct.unpack_from(">H", buf, 0)
            if len(buf) < 2 + n:
                return bytes(out)
            del buf[:2 + n]
            self._messages -= 1
        while not self._messages and len(buf) >= 4:
            (n,) = struct.unpack_from(">i", buf, 0)
            if n < 4:
                raise ProtocolError(f"an authenticated HA frame of {n} bytes")
            if len(buf) < n + FRAME_TAG_BYTES:
                break
            out += buf[:n]
            del buf[:n + FRAME_TAG_BYTES]
        return bytes(out)


class ReplicationLinks:
    """The HA links of the demo's brokers, relayed through this process.

    One relay listens in front of each broker's HA port; the broker advertises the relay's
    address, so every slave reaches its master through it.  :meth:`stall` stops the
    master-to-slave bytes of the links open at that moment (acks still flow, so the
    producer goes on sending and the master on appending).  When the master dies, a
    stalled link drops what it held and resets the slave's side: those bytes never reach
    a slave, as when a host dies with its links stuck.  A later link (to the new master)
    is never stalled.  The relay forwards bytes: over TLS it holds ciphertext it cannot
    read, and the stall is the same.  Runs on its own event loop thread.
    """

    def __init__(self) -> None:
        self._loop = EventLoopThread("demo-links")
        self._servers: list[asyncio.Server] = []
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.ports: list[int] = []
        #: Bytes held by stalled links when their master side ended (never delivered).
        self.dropped_bytes = 0

    def front(self, target: str) -> str:
        """Start a relay to ``target`` (host:port); the address slaves should dial."""
        host, _, port = target.rpartition(":")
        server = self._loop.run(asyncio.start_server(
            lambda r, w: self._accept(r, w, host, int(port)), "127.0.0.1", 0), 10)
        self._servers.append(server)
        relay_port = int(server.sockets[0].getsockname()[1])
        self.ports.append(relay_port)
        return f"127.0.0.1:{relay_port}"

    def stall(self) -> int:
        """Stall every open link; how many were stalled."""
        async def stall() -> int:
            for link in self._links:
                link.stalled = True
            return len(self._links)
        return int(self._loop.run(stall(), 5))

    def forwarded_ends(self) -> dict[int, int | None]:
        """Slave broker id -> log end of the last whole block its stalled link forwarded
        (None when the relay could not follow the stream)."""
        async def ends() -> dict[int, int | None]:
            return {link.slave_id: link.forwarded_end for link in self._links
                    if link.stalled and link.slave_id is not None}
        return dict(self._loop.run(ends(), 5))

    def opaque(self) -> bool:
        """Whether a stalled link is one the relay cannot read (TLS)."""
        async def any_opaque() -> bool:
            return any(link.stalled and link.opaque for link in self._links)
        return bool(self._loop.run(any_opaque(), 5))

    def flushed(self) -> bool:
        """Whether every stalled link has handed the kernel all it forwarded to its slave
        (on loopback the bytes are then in the slave's socket)."""
        async def flushed() -> bool:
            return all(link.slave_writer.transport.get_write_buffer_size() == 0
                       for link in self._links if link.stalled)
        return bool(self._loop.run(flushed(), 5))

    def close(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
            for link in list(self._links):
                link.slave_writer.transport.abort()
                link.master_writer.transport.abort()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5)
            for server in self._servers:
                await server.wait_closed()
        try:
            self._loop.run(close(), 10)
        except (TimeoutError, RuntimeError, OSError) as exc:
            warn(f"the replication links did not close cleanly: {exc!r}")
        self._loop.stop()

    async def _accept(self, slave_reader: asyncio.StreamReader, slave_writer: asyncio.StreamWriter,
                      host: str, port: int) -> None:
        try:
            master_reader, master_writer = await asyncio.open_connection(host, port)
        except OSError:
            slave_writer.transport.abort()  # as if the master's port refused: the slave retries
            return
        link = _Link(slave_writer, master_writer)
        self._links.add(link)
        tasks = [asyncio.ensure_future(self._to_master(link, slave_reader)),
                 asyncio.ensure_future(self._to_slave(link, master_reader))]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)
            self._links.discard(link)

    async def _to_master(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(1 << 20):
                link.saw_from_slave(data)
                link.master_writer.write(data)
                await link.master_writer.drain()
        except (OSError, ConnectionError):
            pass  # the slave's side broke: same as its end
        link.master_writer.close()

    async def _to_slave(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(1 << 20):
                if link.stalled:
                    link.held_bytes += len(data)
                    continue
                link.forwarded_to_slave(data)
                link.slave_writer.write(data)
                await link.slave_writer.drain()
        except (OSError, ConnectionError):
            pass  # the master's side broke: same as its end
        if link.stalled:
            # The master is gone: a stalled link's bytes die with it; the slave sees a reset.
            self.dropped_bytes += link.held_bytes
            link.slave_writer.transport.abort()
        else:
            link.slave_writer.close()


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
                f"{info.master_epoch}, SyncStateSet {_ids(info.sync_state_set)}  "
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
        progress = _AckProgress(load, self.opts.step_timeout_s)
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
        progress = _AckProgress(load, self.opts.step_timeout_s)
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
        while not load.done and time.monotonic() < longest:
            if (time.monotonic() >= shortest and stored(slaves, crossed)
                    and self._master_ahead(master, slaves)):
                break
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
                    f"{_ids(info.sync_state_set)}")
        if info.master_id != f.old_master_id and f.election_s is None:
            f.election_s = after
            f.new_master_id, f.new_master_address = info.master_id, info.master_address
            f.new_epoch = info.master_epoch
            f.new_sync_state_set = info.sync_state_set
            return (f"controller elected id {info.master_id} ({info.master_address}): master "
                    f"epoch {f.old_epoch} -> {info.master_epoch}, SyncStateSet "
                    f"{_ids(f.old_sync_state_set)} -> {_ids(info.sync_state_set)}")
        if info.master_id == f.new_master_id:
            f.new_epoch = info.master_epoch
            f.new_sync_state_set = info.sync_state_set
        return (f"controller: master id {info.master_id}, epoch {info.master_epoch}, "
                f"SyncStateSet {_ids(info.sync_state_set)}")

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
        self._say_at([(r.in_sync_s, f"caught up: SyncStateSet {_ids(r.sync_state_set)} "
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


def _rows(s: DemoSummary) -> Iterator[tuple[str, str, str]]:
    f, r = s.failover, s.rejoin
    yield "messages sent", f"{s.sent:,}", ""
    yield "acknowledged (all-ack)", f"{s.acked:,}", "every replica in the SyncStateSet had it"
    yield "not acknowledged", f"{s.not_acked + s.send_errors:,}", \
        "failed after the producer's retries, or replicas too slow" if s.not_acked + s.send_errors else ""
    yield "consumed (distinct)" if s.proxy is None else "received (distinct)", f"{s.consumed:,}", \
        "" if s.proxy is None else "by the SimpleConsumer, from the first send on"
    twice = "a retried send stored twice (same message id)" if s.proxy is None else \
        "a repeated send stored twice, or a delivery whose ack did not hold"
    yield "duplicates", f"{s.duplicates:,}", twice if s.duplicates else ""
    yield "lost (acknowledged, not read)", f"{s.lost:,}", "MUST be 0" if s.lost else ""
    if s.unacked_but_stored:
        yield "stored without an ack", f"{s.unacked_but_stored:,}", "its ack was lost in the failover"
    if s.proxy is not None:
        yield "client", "RocketMQ 5", f"{s.client} via {s.proxy}, the only address they know"
        yield "sends repeated by the demo", f"{s.send_retries:,}", \
            "after the client's own attempts failed" if s.send_retries else ""
        yield "receives failed / acks refused", f"{s.receive_errors:,} / {s.acks_refused:,}", \
            "their messages are delivered again after their invisible time" if s.acks_refused else ""
    yield "failover: election", _s(f.election_s), "SIGKILL -> controller names a new master"
    yield "failover: first acked write", _s(f.first_ack_s), "SIGKILL -> new master acknowledges"
    yield "master epoch", f"{f.old_epoch} -> {f.new_epoch}", \
        f"master id {f.old_master_id} -> {f.new_master_id}"
    if f.stalled:
        tail = "-" if f.tail_bytes is None else f"{f.tail_bytes:,} bytes"
        yield "unreplicated tail at kill", tail, \
            f"written while the links stalled {_s(f.stall_s)}; lost with the master, never acked"
    cut = "-" if r.truncated_bytes is None else f"{r.truncated_bytes:,} bytes"
    yield "old master cut on rejoin", cut, f"back in sync after {_s(r.in_sync_s)}"
    yield "produce throughput", f"{s.produce_msgs_per_s:,.0f} msg/s", \
        f"{s.produce_mb_per_s:.1f} MB/s of bodies over {s.produce_s:.1f} s, failover included"
    yield "consume throughput", f"{s.consume_msgs_per_s:,.0f} msg/s", f"over {s.consume_s:.1f} s" + (
        "" if s.proxy is None else ", from before the first send to the last message received")
    left = len(s.leftover_processes)
    ports = ", ".join(map(str, s.leftover_ports)) or "none"
    yield "processes stopped", f"{s.processes_started - left} of {s.processes_started}", \
        f"ports still open: {ports}"
    yield "wall time", f"{s.total_s:.1f} s", ""


def format_summary(s: DemoSummary) -> str:
    rows = list(_rows(s))
    w1 = max(len(a) for a, _, _ in rows)
    w2 = max(len(b) for _, b, _ in rows)
    lines = ["", "Summary"]
    lines += [f"  {a:<{w1}}  {b:>{w2}}  {c}".rstrip() for a, b, c in rows]
    return "\n".join(lines)


def verdict(s: DemoSummary) -> str:
    if s.interrupted:
        return "interrupted."
    problems = []
    if s.error:
        problems.append(s.error.splitlines()[0])
    if s.lost:
        problems.append(f"{s.lost:,} acknowledged message(s) missing, e.g. seq {s.lost_sample[:5]}")
    f = s.failover
    if s.error is None and (f.new_master_id is None or f.new_epoch <= f.old_epoch):
        problems.append("no failover to a new master with a higher epoch was seen")
    if s.leftover_processes or s.leftover_ports:
        problems.append(f"left behind: processes {s.leftover_processes}, ports {s.leftover_ports}")
    if problems:
        return "FAILED: " + "; ".join(problems)
    return "OK: every acknowledged message was read back after the failover."


def run_demo(opts: DemoOptions) -> int:
    """Run the demo; the process exit code (0 ok, 1 failed, 130 interrupted)."""
    if opts.grpc:
        from rmqha.demo.grpc_load import GrpcDemo  # it imports this module

        s = GrpcDemo(opts).run()
    else:
        s = Demo(opts).run()
    if opts.json:
        print(json.dumps(s.to_json(), indent=None, sort_keys=True), flush=True)
    else:
        if not s.interrupted:
            print(format_summary(s))
        else:
            left = len(s.leftover_processes)
            print(f"stopped {s.processes_started - left} of {s.processes_started} processes; "
                  f"ports still open: {', '.join(map(str, s.leftover_ports)) or 'none'}")
        print(verdict(s))
        if s.kept:
            print(f"configs, stores and logs kept in {s.directory}")
        sys.stdout.flush()
    if s.interrupted:
        return 130
    return 0 if s.ok else 1
