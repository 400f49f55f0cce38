"""rmqha's one wrapper over pysyncobj: a typed, snake_case Raft node that commits JSON events.

What this module owns:

* the pysyncobj settings (:class:`RaftSettings`): always a journal file, a full-dump file
  for log compaction (our own JSON snapshot inside), no fork, and the *fast* commit mode;
* the security rule: pysyncobj peers exchange pickle, so a node whose peers are not all on
  loopback refuses to start unless a cluster secret (pysyncobj's ``password``) is set or
  its links run over mutual TLS (``RaftSettings.tls``, :mod:`rmqha.controller.raft_tls`:
  pickle then only comes from certified controllers of the group, each speaking as
  itself).  With a secret, pysyncobj authenticates every frame (Fernet: HMAC-SHA256,
  checked before anything is unpickled) and drops a connection whose frame fails; with
  both, the secret runs inside the TLS.  The controller asks for more
  (:mod:`rmqha.security.secret_policy`): a secret even on loopback unless told
  ``allow_insecure``;
* the port (:mod:`rmqha.controller.raft_port`): it listens on ``bind_host`` (the
  controller's ``listen_host``), never on pysyncobj's default wildcard, and drops links
  that do not identify within 10 s or stay silent for 20 s, with a cap per host;
* the commit path: :meth:`RaftNode.submit` takes a small dict, commits it as JSON text and
  resolves a future with what the state machine's ``apply`` returned for it.  Nothing
  arbitrary from the network is ever committed; the state machine sees plain dicts.

Fast commits.  pysyncobj's default batches appends on a 100 ms tick (~10 sync commits/s).
``appendEntriesUseBatch=False`` sends at once (sub-millisecond commits) but pipelines
append-entries, and 0.3.17 then logs CRITICAL "truncating already-applied log entries":
a success ack for an older batch moves the leader's ``nextIndex`` *back*, the leader
re-sends entries the follower already applied, and the follower truncates its log from the
message's ``prevLogIdx`` even though the entries are identical.  :class:`_GuardedTransport`
fixes both ends at the transport boundary without touching pysyncobj's code: on the leader
a success ack never lowers ``nextIndex``; on a follower an append that starts below the
last applied index is trimmed to start at it (committed entries are identical on every
leader, so nothing is lost, and nothing applied is ever truncated).  The guard reads
pysyncobj 0.3.17 internals, so other versions log a warning at start.  Measured here
(tests/integration/test_raft.py, 3 processes, 6000 commits, 3 leader kills): without the guard 3 of 3
runs logged the CRITICAL line; with it 0 of 4, and a 30000-commit soak with 10 leader
kills stays clean with identical replicas.
"""
from __future__ import annotations

import asyncio
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pysyncobj
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.journal import FileJournal
from pysyncobj.transport import TCPTransport

from rmqha.security.secret_policy import SECRET_KEYS_TEXT, is_loopback
from rmqha.errors import ConfigError, ControllerError, NotLeaderError
from rmqha.protocol.lease_timing import LEADER_FALLBACK_TIMEOUT_S, RAFT_TICK_S
from rmqha.controller.raft_journal import DurableJournal, SyncHook, durable_mkdir
from rmqha.controller.raft_port import bind_address, deadline_transport
from rmqha.net.peer_limit import DEFAULT_MAX_PER_PEER
from rmqha.controller.raft_tls import RaftTls, tls_transport

#: pysyncobj's constructor is patched for the journal factory one node at a time.
_CONSTRUCTING = threading.Lock()

log = logging.getLogger(__name__)

#: The guard below reads these pysyncobj internals; other versions must be re-checked.
_GUARDED_VERSIONS = ("0.3.17",)
PYSYNCOBJ_VERSION: str = getattr(pysyncobj, "__version__", "") or ""
try:
    from importlib.metadata import version as _dist_version

    PYSYNCOBJ_VERSION = _dist_version("pysyncobj")
except ImportError:  # pragma: no cover - importlib.metadata is stdlib on 3.11
    pass

_FAIL_TEXT = {
    FAIL_REASON.QUEUE_FULL: "commands queue full",
    FAIL_REASON.MISSING_LEADER: "no Raft leader",
    FAIL_REASON.DISCARDED: "discarded by a new leader",
    FAIL_REASON.NOT_LEADER: "not the Raft leader",
    FAIL_REASON.LEADER_CHANGED: "Raft leader changed before commit",
    FAIL_REASON.REQUEST_DENIED: "request denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown outcome",
}


class RaftRole(enum.IntEnum):
    """Raft role; values match RocketMQ's controller ``role`` metric (UNKNOWN=0 ...)."""

    UNKNOWN = 0
    CANDIDATE = 1
    FOLLOWER = 2
    LEADER = 3


# pysyncobj's _RAFT_STATE: FOLLOWER=0, CANDIDATE=1, LEADER=2.
_ROLE_OF_STATE = {0: RaftRole.FOLLOWER, 1: RaftRole.CANDIDATE, 2: RaftRole.LEADER}


@dataclass
class RaftSettings:
    """How one Raft node runs.  ``fast=False`` is pysyncobj's own algorithm (appends
    batched at each append period, no pipelining guard) with these timings: the benches'
    baselines, at pysyncobj's default timing or tuned."""

    self_address: str
    peers: list[str]
    journal_file: Path
    full_dump_file: Path | None = None
    password: str | None = None
    fast: bool = True
    #: Heartbeat/append period.  In fast mode appends go out at once; this only sets
    #: the heartbeat rate that keeps followers from starting elections.
    append_entries_period: float = 0.05
    raft_min_timeout: float = 0.4
    raft_max_timeout: float = 0.8
    auto_tick_period: float = RAFT_TICK_S
    connection_retry_time: float = 0.3
    connection_timeout: float = 1.5
    leader_fallback_timeout: float = LEADER_FALLBACK_TIMEOUT_S
    log_compaction_min_entries: int = 20000
    log_compaction_min_time: float = 600.0
    #: fsync the log before any message and the term/vote before any vote (rmqha.controller.raft_journal).
    durable: bool = True
    #: Called at every durable point ("log", "vote"): the crash tests' failpoint.
    on_sync: SyncHook | None = None
    #: Mutual TLS under every Raft link (None: plain TCP).
    tls: RaftTls | None = None
    #: The host the Raft port listens on (the controller's ``listen_host``); None: the
    #: self address's host.  Never a wildcard unless given one (rmqha.controller.raft_port).
    bind_host: str | None = None
    #: Accepted Raft links one host may hold open (rmqha.net.peer_limit).
    max_connections_per_peer: int = DEFAULT_MAX_PER_PEER
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        others = [p for p in self.peers if p != self.self_address]
        remote = [p for p in [self.self_address, *others, self.bind_address] if not is_loopback(p)]
        if remote and not self.password and self.tls is None:
            raise ConfigError(
                "Raft peers on non-loopback addresses "
                f"({', '.join(remote)}) need a cluster secret or TLS: pysyncobj exchanges "
                f"pickle, so set {SECRET_KEYS_TEXT} (or raft_password), or serve TLS "
                "(tls.server.mode with the cluster CA), or keep every peer on 127.0.0.1"
            )
        if self.tls is not None and PYSYNCOBJ_VERSION not in _GUARDED_VERSIONS:
            raise ConfigError(
                f"Raft over TLS reaches into pysyncobj's connections and was checked against "
                f"pysyncobj {', '.join(_GUARDED_VERSIONS)}, not {PYSYNCOBJ_VERSION or 'this version'}")
        if self.password:
            try:
                import cryptography  # noqa: F401  (pysyncobj's encryptor needs it)
            except ImportError:
                raise ConfigError(
                    "a Raft cluster secret needs the 'cryptography' package "
                    "(pip install cryptography)"
                ) from None

    @property
    def bind_address(self) -> str:
        """host:port the Raft port listens on."""
        return bind_address(self.bind_host, self.self_address)

    def to_conf(self, on_state_changed: Callable[[int, int], None]) -> SyncObjConf:
        dump = self.full_dump_file or Path(str(self.journal_file) + ".dump")
        kwargs: dict[str, Any] = dict(
            bindAddress=self.bind_address,
            journalFile=str(self.journal_file),
            fullDumpFile=str(dump),
            password=self.password,
            useFork=False,  # never fork a process that runs asyncio and threads
            dynamicMembershipChange=False,
            commandsWaitLeader=False,
            onStateChanged=on_state_changed,
            logCompactionMinEntries=self.log_compaction_min_entries,
            logCompactionMinTime=self.log_compaction_min_time,
            # In every mode (pysyncobj's own default is 30 s): how long a leader cut off
            # from its quorum keeps answering as leader bounds the master lease's margin.
            leaderFallbackTimeout=self.leader_fallback_timeout,
        )
        if not self.fast:
            kwargs.update(
                appendEntriesPeriod=self.append_entries_period,
                raftMinTimeout=self.raft_min_timeout,
                raftMaxTimeout=self.raft_max_timeout,
                # pysyncobj's tick (default 50 ms) bounds how soon a batched append leaves:
                # a shorter append period only counts with a tick as short.
                autoTickPeriod=min(self.auto_tick_period, self.append_entries_period),
            )
        if self.fast:
            alone = not [p for p in self.peers if p != self.self_address]
            kwargs.update(
                appendEntriesUseBatch=False,
                appendEntriesPeriod=self.append_entries_period,
                raftMinTimeout=self.raft_min_timeout,
                raftMaxTimeout=self.raft_max_timeout,
                # A lone node has no follower acks to wake its poller, so a commit would
                # wait a whole tick.  RaftNode wakes the poller itself when an append is
                # waiting to commit (see _wake_lone_commits); without the pipe notifier it
                # can't, and ticks often instead (500 wake-ups a second, 3-4% of a CPU idle).
                autoTickPeriod=(min(self.auto_tick_period, 0.002)
                                if alone and not pysyncobj_syncobj.PIPE_NOTIFIER_ENABLED
                                else self.auto_tick_period),
                connectionRetryTime=self.connection_retry_time,
                connectionTimeout=self.connection_timeout,
            )
        kwargs.update(self.extra)
        return SyncObjConf(**kwargs)


class _DurableTransport(TCPTransport):
    """Makes the journal durable before any message leaves (see :mod:`rmqha.controller.raft_journal`)."""

    def send(self, node: Any, message: Any) -> bool:
        journal = getattr(self._syncObj, "_SyncObj__raftLog", None)
        if isinstance(journal, DurableJournal):
            journal.sync()
        return bool(super().send(node, message))


class _GuardedTransport(_DurableTransport):
    """pysyncobj's TCP transport with the pipelining guard described in the module doc."""

    guard_enabled = True

    def setOnMessageReceivedCallback(self, callback: Callable[[Any, dict], None]) -> None:  # noqa: N802
        syncobj = self._syncObj

        def guarded(node: Any, message: dict) -> None:
            if not self.guard_enabled or not isinstance(message, dict):
                callback(node, message)
                return
            kind = message.get("type")
            if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
                next_index = syncobj._SyncObj__raftNextIndex
                before = next_index.get(node)
                callback(node, message)
                if before is not None and next_index.get(node, 0) < before:
                    next_index[node] = before
                return
            if kind == "append_entries" and "prevLogIdx" in message and "transmission" not in message:
                message = _trim_applied(syncobj, message)
            callback(node, message)

        super().setOnMessageReceivedCallback(guarded)


def _trim_applied(syncobj: SyncObj, message: dict) -> dict:
    """Make an append that starts below the follower's last applied entry start at it."""
    applied = syncobj.raftLastApplied
    prev = message["prevLogIdx"]
    if prev >= applied or message.get("term", 0) < syncobj.raftCurrentTerm:
        return message
    local = syncobj._SyncObj__getEntries(prev, applied - prev + 1)
    if len(local) != applied - prev + 1 or local[0][2] != message["prevLogTerm"]:
        return message  # not a pure re-send: let pysyncobj's own checks answer it
    local_terms = {entry[1]: entry[2] for entry in local}
    entries = message.get("entries", [])
    for entry in entries:
        if entry[1] <= applied and local_terms.get(entry[1]) != entry[2]:
            return message  # a real conflict below applied: leave it visible
    trimmed = dict(message)
    trimmed["prevLogIdx"] = applied
    trimmed["prevLogTerm"] = local[-1][2]
    trimmed["entries"] = [e for e in entries if e[1] > applied]
    return trimmed


class _EventLog(SyncObjConsumer):
    """The replicated method and the snapshot hooks, as a pysyncobj consumer."""

    def __init__(
        self,
        apply: Callable[[dict], Any],
        snapshot: Callable[[], str],
        restore: Callable[[str], None],
    ) -> None:
        self._apply_fn = apply
        self._snapshot_fn = snapshot
        self._restore_fn = restore
        super().__init__()

    @replicated
    def commit_event(self, payload: str) -> Any:
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            log.error("skipping a committed event that is not JSON: %.200r", payload)
            return {"ok": False, "reason": "event is not JSON"}
        return self._apply_fn(event)

    def _serialize(self) -> str:
        return self._snapshot_fn()

    def _deserialize(self, data: Any) -> None:
        if isinstance(data, str):
            self._restore_fn(data)
        else:
            log.error("ignoring a Raft snapshot that is not rmqha JSON (%s)", type(data).__name__)


class RaftNode:
    """One member of a Raft group committing JSON events into a state machine.

    ``apply(event) -> result`` runs on pysyncobj's thread for every committed event, in
    log order, on every member (also when replaying the journal after a restart); it must
    be deterministic and must not raise.  ``snapshot() -> str`` and ``restore(str)`` save
    and load the whole state as JSON text for log compaction.
    ``on_role_change(role, term)`` runs on pysyncobj's thread.
    """

    def __init__(
        self,
        settings: RaftSettings,
        apply: Callable[[dict], Any],
        snapshot: Callable[[], str],
        restore: Callable[[str], None],
        on_role_change: Callable[[RaftRole, int], None] | None = None,
    ) -> None:
        settings.check()
        self.settings = settings
        self._on_role_change = on_role_change
        self._consumer = _EventLog(apply, snapshot, restore)
        self._obj: SyncObj | None = None
        #: The durable journal (None unless ``settings.durable``): its ``syncs`` count fsyncs.
        self.journal: DurableJournal | None = None
        self._role = RaftRole.UNKNOWN
        self._lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._obj is not None:
            return
        durable_mkdir(self.settings.journal_file.parent)
        others = [p for p in self.settings.peers if p != self.settings.self_address]
        conf = self.settings.to_conf(self._state_changed)
        transport_class: type[TCPTransport] = _DurableTransport if self.settings.durable else TCPTransport
        if self.settings.fast:
            if PYSYNCOBJ_VERSION not in _GUARDED_VERSIONS:
                log.warning("pysyncobj %s is not a version the fast-commit guard was checked "
                            "against (%s)", PYSYNCOBJ_VERSION, ", ".join(_GUARDED_VERSIONS))
            transport_class = _GuardedTransport
        transport_class = deadline_transport(transport_class, self.settings.max_connections_per_peer)
        if self.settings.tls is not None:
            transport_class = tls_transport(transport_class, self.settings.tls)
        self._role = RaftRole.FOLLOWER
        with _CONSTRUCTING:
            # pysyncobj opens its journal inside the constructor and may send right after:
            # the durable wrapper must be in place from the first byte.
            original = pysyncobj_syncobj.createJournal
            if self.settings.durable:
                pysyncobj_syncobj.createJournal = self._durable_journal
            try:
                self._obj = SyncObj(
                    self.settings.self_address, others, conf,
                    consumers=[self._consumer], transportClass=transport_class,
                )
            finally:
                pysyncobj_syncobj.createJournal = original
        if self.settings.fast and not others:
            self._wake_lone_commits(self._obj)

    @staticmethod
    def _wake_lone_commits(obj: SyncObj) -> None:
        """A lone leader appends a command at the end of one tick and commits it at the
        start of the next, which waits for the tick's timeout (no follower ack comes to
        wake the poller): after a tick that left an append uncommitted, wake the poller
        so the next tick is now.  Commits take a fraction of a millisecond instead of a
        tick, and an idle node keeps pysyncobj's normal tick.  Only as leader: before its
        election a restarted node may hold entries it cannot commit yet (its leader's
        no-op commits them), and waking it every tick for those would spin."""
        notifier = getattr(obj, "_SyncObj__pipeNotifier", None)
        last_index = getattr(obj, "_SyncObj__getCurrentLogIndex", None)
        if notifier is None or last_index is None:
            # No pipe notifier: RaftSettings.to_conf ticks every 2 ms.  A pysyncobj without
            # this internal (the version guard warns at start) commits on its tick.
            return

        def commit_next_tick() -> None:
            if obj._isLeader() and obj.raftCommitIndex < last_index():
                notifier.notify()

        obj.addOnTickCallback(commit_next_tick)

    def _durable_journal(self, journal_file: str | None) -> Any:
        if journal_file is None:
            raise ConfigError("a durable Raft log needs a journal file")
        self.journal = DurableJournal(FileJournal(journal_file), Path(journal_file),
                                      on_sync=self.settings.on_sync)
        return self.journal

    def stop(self) -> None:
        obj, self._obj = self._obj, None
        if obj is not None:
            # Wait for the tick thread so the journal is closed and the port free before
            # a restart in the same process.
            obj.destroy_synchronous()
        self._role = RaftRole.UNKNOWN

    def _state_changed(self, old: int, new: int) -> None:
        role = _ROLE_OF_STATE.get(new, RaftRole.UNKNOWN)
        self._role = role
        term = self.term
        log.info("raft %s: role %s -> %s (term %d)", self.settings.self_address,
                 _ROLE_OF_STATE.get(old, RaftRole.UNKNOWN).name, role.name, term)
        if self._on_role_change is not None:
            try:
                self._on_role_change(role, term)
            except Exception:  # never let a listener kill pysyncobj's tick thread
                log.exception("role-change listener failed")

    # --- state -----------------------------------------------------------------------

    def _require(self) -> SyncObj:
        if self._obj is None:
            raise ControllerError("Raft node is not running")
        return self._obj

    @property
    def address(self) -> str:
        return self.settings.self_address

    @property
    def role(self) -> RaftRole:
        return self._role if self._obj is not None else RaftRole.UNKNOWN

    @property
    def is_leader(self) -> bool:
        return self._obj is not None and self._obj._isLeader()

    @property
    def leader(self) -> str | None:
        """The leader's Raft address as this node believes it, or None."""
        if self._obj is None:
            return None
        node = self._obj._getLeader()
        return None if node is None else str(node.id if hasattr(node, "id") else node)

    @property
    def term(self) -> int:
        return self._obj.raftCurrentTerm if self._obj is not None else 0

    @property
    def commit_index(self) -> int:
        return self._obj.raftCommitIndex if self._obj is not None else 0

    @property
    def last_applied(self) -> int:
        return self._obj.raftLastApplied if self._obj is not None else 0

    @property
    def has_quorum(self) -> bool:
        return self._obj is not None and self._obj.hasQuorum

    @property
    def is_ready(self) -> bool:
        """True once the journal has been replayed up to the leader's commit index."""
        return self._obj is not None and self._obj.isReady()

    def status(self) -> dict[str, Any]:
        obj = self._require()
        raw = obj.getStatus()
        return {
            "self": self.address,
            "role": self.role.name,
            "leader": self.leader,
            "term": raw.get("raft_term"),
            "commit_index": raw.get("commit_idx"),
            "last_applied": raw.get("last_applied"),
            "has_quorum": raw.get("has_quorum"),
            "log_len": raw.get("log_len"),
        }

    # --- commits ---------------------------------------------------------------------

    def submit(self, event: dict) -> Future:
        """Commit ``event`` (a JSON-able dict) on the leader; the future gets apply()'s
        result, or NotLeaderError / ControllerError if it could not be committed.  Never
        forwarded: a follower refuses, so nothing is committed that a non-leader
        validated."""
        fut: Future = Future()
        obj = self._require()
        if not obj._isLeader():
            fut.set_exception(NotLeaderError("this controller is not the Raft leader", self.leader))
            return fut
        payload = json.dumps(event, separators=(",", ":"), sort_keys=True)

        def done(result: Any, error: int) -> None:
            if fut.done():
                return
            if error == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            elif error in (FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED,
                           FAIL_REASON.DISCARDED, FAIL_REASON.MISSING_LEADER):
                fut.set_exception(NotLeaderError(
                    f"commit failed: {_FAIL_TEXT.get(error, error)}", self.leader))
            else:
                fut.set_exception(ControllerError(f"commit failed: {_FAIL_TEXT.get(error, error)}"))

        self._consumer.commit_event(payload, callback=done)
        return fut

    async def apply(self, event: dict, timeout: float = 5.0) -> Any:
        """Commit ``event`` and await its apply() result (asyncio)."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(event)), timeout)
        except asyncio.TimeoutError:
            raise ControllerError(f"commit not done within {timeout:.1f}s (no quorum?)") from None

    def apply_sync(self, event: dict, timeout: float = 5.0) -> Any:
        """Blocking :meth:`apply` for threads that are not an event loop."""
        fut = self.submit(event)
        try:
            return fut.result(timeout)
        except TimeoutError:
            raise ControllerError(f"commit not done within {timeout:.1f}s (no quorum?)") from None

    def wait_leader(self, timeout: float) -> str:
        """Block until some leader is known; returns its address."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader
            if leader is not None:
                return leader
            time.sleep(0.01)
        raise ControllerError(f"no Raft leader within {timeout:.1f}s")
