"""rmqha.controller.raft over real processes: fast commits across leader kills and full restarts,
no divergence, no acknowledged commit lost.

Each node is this file run as a script (``python tests/integration/test_raft.py NODE ...``): a RaftNode
whose state machine chains a SHA-256 over every committed event and keeps each event's
key.  While it is leader a node commits events one at a time and appends the key of each
acknowledged one (``apply_sync`` returned) to its acks file.  The test kills the leader
with SIGKILL several times (restarting it on its journal) and kills every node at once
and restarts them all, then stops the writes and checks that all replicas reach the same
applied count with the same digest, that every acknowledged key was applied exactly once
by every node (each node writes the keys it applied when it stops), and that no node
logged pysyncobj's CRITICAL "truncating already-applied log entries".  The same run
without the pipelining guard (``unguarded``, rmqha.controller.raft's module doc) is the negative
control: it must break that check.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rmqha.errors import ConfigError, ControllerError, NotLeaderError  # noqa: E402
from rmqha.controller.raft import RaftNode, RaftSettings, is_loopback  # noqa: E402

TRUNCATION_LINE = "truncating already-applied log entries"


# --- the node process --------------------------------------------------------------------


def event_key(event: dict) -> str:
    """Who committed an event: node, process and sequence number (unique per run)."""
    return f"{event.get('node')}/{event.get('pid')}/{event.get('seq')}"


#: The sequence "number" of the event a leader commits once the writes are to stop: when
#: every node has applied one, every entry before it is applied everywhere too.
BARRIER = "barrier"


def is_barrier(key: str) -> bool:
    return key.endswith("/" + BARRIER)


class _Chain:
    def __init__(self) -> None:
        self.count = 0
        self.digest = "0" * 64
        self.keys: list[str] = []
        self.barriers = 0
        self.lock = threading.Lock()

    def apply(self, event: dict) -> int:
        with self.lock:
            data = (self.digest + json.dumps(event, sort_keys=True)).encode()
            self.digest = hashlib.sha256(data).hexdigest()
            self.count += 1
            self.keys.append(event_key(event))
            self.barriers += is_barrier(self.keys[-1])
            return self.count

    def snapshot(self) -> str:
        with self.lock:
            return json.dumps({"count": self.count, "digest": self.digest, "keys": self.keys})

    def restore(self, text: str) -> None:
        with self.lock:
            d = json.loads(text)
            self.count, self.digest, self.keys = d["count"], d["digest"], d.get("keys", [])
            self.barriers = sum(map(is_barrier, self.keys))

    def write_keys(self, path: str) -> None:
        """Every key applied, in order (written once, when the node stops)."""
        with self.lock:
            text = json.dumps(self.keys)
        with open(path + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(path + ".tmp", path)


def node_main(argv: list[str]) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    self_addr, peers, journal, status_path, stop_path, fast, acks_path, applied_path = argv
    chain = _Chain()
    if fast == "unguarded":  # pysyncobj's own fast mode, to show what the guard prevents
        from rmqha.controller.raft import _GuardedTransport

        _GuardedTransport.guard_enabled = False
    # "memory": pysyncobj's own default, the Raft log in memory only (no journal file).
    memory = {"durable": False, "extra": {"journalFile": None}} if fast == "memory" else {}
    node = RaftNode(
        RaftSettings(self_address=self_addr, peers=peers.split(","), journal_file=Path(journal),
                     fast=fast != "default", **memory),
        chain.apply, chain.snapshot, chain.restore,
    )
    node.start()
    running = True

    def on_term(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, on_term)
    pid = os.getpid()
    # Unbuffered appends: an ack recorded here survives this process's SIGKILL.
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    seq = 0
    last_status = 0.0
    barrier_done = False
    while running:
        if time.monotonic() - last_status > 0.05:
            _write_status(status_path, chain, node, pid)
            last_status = time.monotonic()
        stopping = os.path.exists(stop_path)
        if not node.is_leader or (stopping and barrier_done):
            time.sleep(0.01)
            continue
        seq += 1
        event = {"node": self_addr, "pid": pid, "seq": BARRIER if stopping else seq}
        try:
            node.apply_sync(event, timeout=2)
        except (ControllerError, NotLeaderError):  # leader lost mid-commit: retry later
            time.sleep(0.01)
            continue
        if stopping:
            barrier_done = True
        else:
            os.write(acks, f"{event_key(event)}\n".encode())
    node.stop()
    os.close(acks)
    chain.write_keys(applied_path)
    return 0


def _write_status(path: str, chain: _Chain, node: RaftNode, pid: int) -> None:
    with chain.lock:
        state = {"count": chain.count, "digest": chain.digest, "barriers": chain.barriers}
    with open(path + ".tmp", "w") as fh:
        json.dump({**state, "leader": node.is_leader, "term": node.term, "pid": pid}, fh)
    os.replace(path + ".tmp", path)


# --- the test ------------------------------------------------------------------------------


class RaftCluster:
    def __init__(self, tmp: Path, ports: list[int], mode: str = "fast") -> None:
        self.tmp = tmp
        self.addrs = [f"127.0.0.1:{p}" for p in ports]
        self.mode = mode
        self.procs: dict[int, subprocess.Popen] = {}
        self.stop_path = tmp / "stop"
        self.logs: list[Path] = []

    def status_path(self, i: int) -> Path:
        return self.tmp / f"status{i}.json"

    def acks_path(self, i: int) -> Path:
        """Keys of the commits node i acknowledged, over all its processes."""
        return self.tmp / f"acks{i}.log"

    def applied_path(self, i: int) -> Path:
        """Keys node i's last process applied, written when it stopped."""
        return self.tmp / f"applied{i}.json"

    def start(self, i: int) -> None:
        log_path = self.tmp / f"node{i}.{len(self.logs)}.log"
        self.logs.append(log_path)
        with open(log_path, "wb") as err:
            self.procs[i] = subprocess.Popen(
                [sys.executable, __file__, "NODE", self.addrs[i], ",".join(self.addrs),
                 str(self.tmp / f"journal{i}"), str(self.status_path(i)), str(self.stop_path),
                 self.mode, str(self.acks_path(i)), str(self.applied_path(i))],
                stderr=err, stdout=subprocess.DEVNULL, cwd=ROOT,
            )

    def status(self, i: int) -> dict | None:
        try:
            d = json.loads(self.status_path(i).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        proc = self.procs.get(i)
        if proc is None or proc.poll() is not None or d.get("pid") != proc.pid:
            return None
        return d

    def leader(self) -> int | None:
        for i in range(len(self.addrs)):
            s = self.status(i)
            if s and s["leader"]:
                return i
        return None

    def total(self) -> int:
        return max((s["count"] for i in range(len(self.addrs)) if (s := self.status(i))), default=0)

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(5)

    def restart_all(self) -> None:
        """Every node killed at once (SIGKILL), then every node started on its journal."""
        for i in self.procs:
            self.procs[i].send_signal(signal.SIGKILL)
        for i in list(self.procs):
            self.procs[i].wait(5)
            self.start(i)

    def acked(self) -> list[str]:
        return [key for i in range(len(self.addrs)) if self.acks_path(i).exists()
                for key in self.acks_path(i).read_text().split()]

    def applied(self) -> dict[int, list[str] | None]:
        return {i: json.loads(self.applied_path(i).read_text()) if self.applied_path(i).exists() else None
                for i in range(len(self.addrs))}

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class RaftRun:
    """What a run left: the final states if the replicas converged, every acknowledged
    key, the keys each node applied (None: it wrote none) and the nodes' logs."""

    converged: list[dict] | None
    acked: list[str]
    applied: dict[int, list[str] | None]
    log: str

    def durability_problems(self) -> list[str]:
        """Every acknowledged commit applied exactly once by every node, in one order."""
        if not self.acked:
            return ["nothing was acknowledged"]
        problems = []
        histories = set()
        for i, keys in sorted(self.applied.items()):
            if keys is None:
                problems.append(f"node {i} wrote no applied keys")
                continue
            # Barriers a leader elected after the check committed may trail on some nodes.
            keys = [k for k in keys if not is_barrier(k)]
            histories.add(tuple(keys))
            held = Counter(keys)
            lost = [k for k in self.acked if held[k] == 0]
            twice = [k for k, n in held.items() if n > 1]
            if lost:
                problems.append(f"node {i} lost {len(lost)} of {len(self.acked)} acknowledged commits "
                                f"(e.g. {lost[0]})")
            if twice:
                problems.append(f"node {i} applied {len(twice)} commits more than once (e.g. {twice[0]})")
        if len(histories) > 1:
            problems.append("the nodes applied different histories")
        return problems


def _converged(cluster: RaftCluster) -> list[dict] | None:
    """The states once every node applied one history ending past a barrier (so no entry
    from before the stop can still commit), else None."""
    states = [cluster.status(i) for i in range(len(cluster.addrs))]
    if any(s is None or s["barriers"] == 0 for s in states):
        return None
    return states if len({(s["count"], s["digest"]) for s in states}) == 1 else None


def run_cluster(tmp: Path, ports: list[int], commits: int, faults: list[str], mode: str = "fast",
                settle_s: float = 30) -> RaftRun:
    """Commit ``commits`` events in rounds; after each round but the last a fault:
    "leader" kills the leader and restarts it, "all" kills every node at once and restarts
    them all.  Then the writes stop and the replicas get ``settle_s`` to converge."""
    cluster = RaftCluster(tmp, ports, mode)
    converged = None
    try:
        for i in range(3):
            cluster.start(i)
        per_round = commits // (len(faults) + 1)
        for round_no in range(len(faults) + 1):
            target = per_round * (round_no + 1)
            wait_for(lambda: cluster.total() >= target, 60, f"{target} commits")
            if round_no == len(faults):
                break
            if faults[round_no] == "all":
                cluster.restart_all()
                continue
            leader = wait_for(lambda: (cluster.leader(),) if cluster.leader() is not None
                              else None, 20, "a leader")[0]
            cluster.kill(leader)
            cluster.start(leader)
        cluster.stop_path.write_text("stop")
        # A leader commits a barrier; every replica must converge on one history past it.
        try:
            converged = wait_for(lambda: _converged(cluster), settle_s, "replicas to agree on count and digest")
        except AssertionError:
            converged = None
    finally:
        cluster.stop_all()
    return RaftRun(converged, cluster.acked(), cluster.applied(), cluster.log_text())


def assert_clean(run: RaftRun, commits: int) -> None:
    assert run.converged is not None, "replicas did not agree on count and digest"
    assert run.converged[0]["count"] >= commits
    assert not run.durability_problems(), run.durability_problems()
    assert TRUNCATION_LINE not in run.log, run.log[-3000:]
    assert "CRITICAL" not in run.log, run.log[-3000:]


def test_fast_commits_survive_leader_kills_and_full_restarts(tmp_path, port_factory):
    run = run_cluster(tmp_path, [port_factory() for _ in range(3)], commits=1500,
                      faults=["leader", "all", "leader"])
    assert_clean(run, 1500)


def test_negative_control_a_log_in_memory_loses_commits_in_a_full_restart(tmp_path, port_factory):
    """The durability check must see loss where there is some: with pysyncobj's default
    (the log in memory, no journal) a full restart forgets every acknowledged commit."""
    run = run_cluster(tmp_path, [port_factory() for _ in range(3)], commits=300, faults=["all"], mode="memory")
    problems = run.durability_problems()
    assert any("lost" in p for p in problems), problems
    assert run.converged is not None  # the loss is forgetting, not a failure to agree


def test_negative_control_unguarded_fast_commits_truncate_applied_entries(tmp_path, port_factory):
    """The guard's check (no CRITICAL truncation in the nodes' logs) must fire without the
    guard: pysyncobj's pipelined appends truncate already-applied entries within a few
    hundred commits.  (The re-sent entries are identical, so nothing acknowledged is lost:
    two unguarded runs of 3000 commits with 6 leader kills and 2 full restarts kept every
    acknowledged commit; the log-in-memory control above is the one that loses commits.)"""
    cluster = RaftCluster(tmp_path, [port_factory() for _ in range(3)], "unguarded")
    try:
        for i in range(3):
            cluster.start(i)
        wait_for(lambda: TRUNCATION_LINE in cluster.log_text(), 30, "an unguarded node to truncate applied entries")
    finally:
        cluster.stop_all()
    assert "CRITICAL" in cluster.log_text()


@pytest.mark.slow
def test_fast_commits_soak_many_leader_kills(tmp_path, port_factory):
    faults = ["all" if k % 4 == 3 else "leader" for k in range(12)]
    run = run_cluster(tmp_path, [port_factory() for _ in range(3)], commits=30000, faults=faults)
    assert_clean(run, 30000)


def test_refuses_remote_peers_without_secret(tmp_path):
    assert is_loopback("127.0.0.1:1") and is_loopback("localhost:2") and not is_loopback("10.0.0.1:3")
    settings = RaftSettings(self_address="127.0.0.1:5000",
                            peers=["127.0.0.1:5000", "10.1.2.3:5000"],
                            journal_file=tmp_path / "j")
    with pytest.raises(ConfigError, match="cluster secret"):
        RaftNode(settings, lambda e: None, lambda: "{}", lambda s: None)


def _lone_settings(tmp_path: Path, port: int, **options: Any) -> RaftSettings:
    addr = f"127.0.0.1:{port}"
    return RaftSettings(self_address=addr, peers=[addr], journal_file=tmp_path / "journal",
                        **options)


def _started(settings: RaftSettings) -> tuple[RaftNode, _Chain]:
    chain = _Chain()
    node = RaftNode(settings, chain.apply, chain.snapshot, chain.restore)
    node.start()
    return node, chain


def test_single_node_commit_restart_keeps_state(tmp_path, port_factory):
    """Journal replay and log compaction (our JSON snapshot in the dump file) on restart."""
    settings = _lone_settings(tmp_path, port_factory(), log_compaction_min_entries=20)
    node, chain = _started(settings)
    try:
        wait_for(lambda: node.is_leader, 10, "leadership")
        results = [node.apply_sync({"i": i}, timeout=5) for i in range(50)]
        assert results == list(range(1, 51))
        digest = chain.digest
        wait_for(lambda: (tmp_path / "journal.dump").exists(), 10, "a compaction dump")
    finally:
        node.stop()
    node2, chain2 = _started(settings)
    try:
        wait_for(lambda: chain2.count == 50, 10, "journal replay")
        assert chain2.digest == digest
        wait_for(lambda: node2.is_leader, 10, "leadership")
        assert node2.apply_sync({"i": 50}, timeout=5) == 51
    finally:
        node2.stop()


def test_single_node_commits_without_waiting_for_the_tick(tmp_path, port_factory):
    """A lone node has no follower ack to wake its poller between appending a command and
    committing it; it wakes the poller itself, so an idle node can keep a slow tick.  With
    a 2 s tick, 20 commits one after another would take about 40 s if each waited for it."""
    node, _ = _started(_lone_settings(tmp_path, port_factory(), auto_tick_period=2.0))
    try:
        wait_for(lambda: node.is_leader, 20, "leadership")
        deadline = time.monotonic() + 15
        for i in range(20):
            assert node.apply_sync({"i": i}, timeout=max(0.1, deadline - time.monotonic())) == i + 1
    finally:
        node.stop()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "NODE":
    sys.exit(node_main(sys.argv[2:]))
