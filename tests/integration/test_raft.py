"""rmqha.controller.raft over real processes: fast commits across leader kills, no divergence.

Each node is this file run as a script (``python tests/integration/test_raft.py NODE ...``): a RaftNode
whose state machine chains a SHA-256 over every committed event.  While it is leader a
node commits events one at a time.  The test kills the leader with SIGKILL several times
(restarting it on its journal), then stops the writes and checks that all replicas reach
the same applied count with the same digest, and that no node logged pysyncobj's
CRITICAL "truncating already-applied log entries".
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
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rmqha.errors import ConfigError, ControllerError, NotLeaderError  # noqa: E402
from rmqha.controller.raft import RaftNode, RaftSettings, is_loopback  # noqa: E402

TRUNCATION_LINE = "truncating already-applied log entries"


# --- the node process --------------------------------------------------------------------


class _Chain:
    def __init__(self) -> None:
        self.count = 0
        self.digest = "0" * 64
        self.lock = threading.Lock()

    def apply(self, event: dict) -> int:
        with self.lock:
            data = (self.digest + json.dumps(event, sort_keys=True)).encode()
            self.digest = hashlib.sha256(data).hexdigest()
            self.count += 1
            return self.count

    def snapshot(self) -> str:
        with self.lock:
            return json.dumps({"count": self.count, "digest": self.digest})

    def restore(self, text: str) -> None:
        with self.lock:
            d = json.loads(text)
            self.count, self.digest = d["count"], d["digest"]


def node_main(argv: list[str]) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    self_addr, peers, journal, status_path, stop_path, fast = argv
    chain = _Chain()
    if fast == "unguarded":  # pysyncobj's own fast mode, to show what the guard prevents
        from rmqha.controller.raft import _GuardedTransport

        _GuardedTransport.guard_enabled = False
    node = RaftNode(
        RaftSettings(self_address=self_addr, peers=peers.split(","), journal_file=Path(journal),
                     fast=fast != "default"),
        chain.apply, chain.snapshot, chain.restore,
    )
    node.start()
    running = True

    def on_term(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, on_term)
    committed = 0
    seq = 0
    last_status = 0.0
    pid = os.getpid()
    while running:
        now = time.monotonic()
        if now - last_status > 0.05:
            tmp = status_path + ".tmp"
            with open(tmp, "w") as fh:
                with chain.lock:
                    state = {"count": chain.count, "digest": chain.digest}
                json.dump({**state, "leader": node.is_leader, "term": node.term,
                           "committed": committed, "pid": pid}, fh)
            os.replace(tmp, status_path)
            last_status = now
        if node.is_leader and not os.path.exists(stop_path):
            seq += 1
            try:
                node.apply_sync({"node": self_addr, "pid": pid, "seq": seq}, timeout=2)
                committed += 1
            except (ControllerError, NotLeaderError):  # leader lost mid-commit: retry later
                time.sleep(0.01)
        else:
            time.sleep(0.01)
    node.stop()
    return 0


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

    def start(self, i: int) -> None:
        log_path = self.tmp / f"node{i}.{len(self.logs)}.log"
        self.logs.append(log_path)
        with open(log_path, "wb") as err:
            self.procs[i] = subprocess.Popen(
                [sys.executable, __file__, "NODE", self.addrs[i], ",".join(self.addrs),
                 str(self.tmp / f"journal{i}"), str(self.status_path(i)), str(self.stop_path),
                 self.mode],
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


def run_cluster(tmp: Path, ports: list[int], commits: int, kills: int, mode: str = "fast") -> None:
    cluster = RaftCluster(tmp, ports, mode)
    try:
        for i in range(3):
            cluster.start(i)
        per_round = commits // (kills + 1)
        for round_no in range(kills + 1):
            target = per_round * (round_no + 1)
            wait_for(lambda: cluster.total() >= target, 60, f"{target} commits")
            if round_no < kills:
                leader = wait_for(lambda: (cluster.leader(),) if cluster.leader() is not None
                                  else None, 20, "a leader")[0]
                cluster.kill(leader)
                cluster.start(leader)
        cluster.stop_path.write_text("stop")
        # Let in-flight commits finish, then every replica must converge on one history.
        def converged():
            states = [cluster.status(i) for i in range(3)]
            if any(s is None for s in states):
                return None
            if len({(s["count"], s["digest"]) for s in states}) == 1:
                return states
            return None
        states = wait_for(converged, 30, "replicas to agree on count and digest")
        assert states[0]["count"] >= commits
    finally:
        cluster.stop_all()
    text = cluster.log_text()
    assert TRUNCATION_LINE not in text, text[-3000:]
    assert "CRITICAL" not in text, text[-3000:]


def test_fast_commits_across_leader_kills_agree(tmp_path, port_factory):
    run_cluster(tmp_path, [port_factory() for _ in range(3)], commits=1500, kills=2)


@pytest.mark.slow
def test_fast_commits_soak_many_leader_kills(tmp_path, port_factory):
    run_cluster(tmp_path, [port_factory() for _ in range(3)], commits=30000, kills=10)


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
