"""The controllers' Raft log and vote are on disk before anything acts on them (issue 13.2).

At every durable point the code reports (the journal's sync, the vote's write) the test
copies the node's journal and vote files.  That checks the order (nothing leaves a node
before the point that covers it), not the syncs: the copy is taken by the code's own hook,
so it would hold the same bytes if the fsync calls were deleted.  The syncs themselves are
checked at the C library by tests/integration/test_power_loss_controllers.py.  A 3-node group
of real Raft nodes on loopback commits events, loses its leader (an election: votes) and
commits more, while every message a node sends is checked against its last copy:

- a vote granted for term T to candidate C: the copy says term T, voted for C, so a node
  that loses power and comes back can never vote for someone else in T (two leaders);
- an append acknowledged up to index I: the copy holds the log up to I, so an entry a
  majority acknowledged (committed) survives any one node's power loss.

Every copy is then reopened as pysyncobj opens a journal after a restart, intact.

The negative control makes the log's fsync a no-op (what pysyncobj does by itself): the
acknowledgements then run ahead of the last durable copy, and the check must say so.
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

from pysyncobj.journal import FileJournal
from pysyncobj.pickle import loads

from rmqha.controller import raft as raft_module
from rmqha.controller.raft import RaftNode, RaftSettings
from rmqha.controller.raft_journal import DurableJournal


class _Chain:
    def __init__(self) -> None:
        self.count = 0

    def apply(self, event: dict) -> int:
        self.count += 1
        return self.count

    def snapshot(self) -> str:
        return json.dumps({"count": self.count})

    def restore(self, text: str) -> None:
        self.count = json.loads(text)["count"]


class PowerLossImages:
    """The last durable copy of each node's journal and vote files."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[str, tuple[bytes, bytes]] = {}
        self.all: list[tuple[str, bytes, bytes]] = []

    def on_sync(self, kind: str, journal: DurableJournal) -> None:
        image = (journal.journal_file.read_bytes(), journal.meta_file.read_bytes()
                 if journal.meta_file.exists() else b"")
        with self.lock:
            self.last[str(journal.journal_file)] = image
            self.all.append((str(journal.journal_file), *image))


def _reopen(tmp: Path, image: tuple[bytes, bytes]) -> tuple[int, dict[str, Any]]:
    """(last log index, vote meta) of a journal restored from an image."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "journal"
    path.write_bytes(image[0])
    if image[1]:
        Path(str(path) + ".meta").write_bytes(image[1])
    j = FileJournal(str(path))
    try:
        last = j[len(j) - 1][1] if len(j) else 0
        return last, {"term": j.getCurrentTerm(), "voted": j.getVotedForNodeId()}
    finally:
        j._destroy()


def _commit_across_an_election(tmp_path: Path, port_factory: Any, monkeypatch: Any
                               ) -> tuple[list[str], dict[str, int], list[RaftNode], PowerLossImages]:
    """300 commits on 3 nodes with an election half-way, every vote and append
    acknowledgement checked against the sender's last durable copy: (violations, how many
    of each kind were checked, the nodes, the copies)."""
    images = PowerLossImages()
    violations: list[str] = []
    checked = {"vote": 0, "ack": 0}
    sent_lock = threading.Lock()
    serial = itertools.count()
    original_send = raft_module._DurableTransport.send

    def checked_send(self: Any, node: Any, message: Any) -> bool:
        result = original_send(self, node, message)
        if not isinstance(message, dict):
            return result
        journal = getattr(self._syncObj, "_SyncObj__raftLog", None)
        if not isinstance(journal, DurableJournal):
            return result
        kind = message.get("type")
        if kind == "response_vote" or (kind == "next_node_idx" and message.get("success")):
            with images.lock:
                image = images.last.get(str(journal.journal_file))
            if image is None:
                violations.append(f"{kind} sent before anything was made durable")
                return result
            with sent_lock:
                n = next(serial)  # one directory per check: the nodes' threads run at once
            last, meta = _reopen(tmp_path / "check" / str(n), image)
            if kind == "response_vote":
                with sent_lock:
                    checked["vote"] += 1
                if meta["term"] != message["term"] or meta["voted"] != node.id:
                    violations.append(f"vote for {node.id} in term {message['term']} sent, on disk: {meta}")
            else:
                with sent_lock:
                    checked["ack"] += 1
                if last < message["next_node_idx"] - 1:
                    violations.append(f"ack up to {message['next_node_idx'] - 1} sent, on disk up to {last}")
        return result

    monkeypatch.setattr(raft_module._DurableTransport, "send", checked_send)
    addrs = [f"127.0.0.1:{port_factory()}" for _ in range(3)]
    nodes = []
    for i, addr in enumerate(addrs):
        settings = RaftSettings(self_address=addr, peers=addrs, journal_file=tmp_path / f"n{i}" / "journal",
                                on_sync=images.on_sync)
        chain = _Chain()
        nodes.append(RaftNode(settings, chain.apply, chain.snapshot, chain.restore))
    try:
        for n in nodes:
            n.start()

        def leader() -> RaftNode:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for n in nodes:
                    if n.is_leader:
                        return n
                time.sleep(0.02)  # polling the nodes' roles, bounded by the deadline
            raise AssertionError("no Raft leader within 30 s")

        first = leader()
        for k in range(150):
            first.submit({"k": k}).result(10)
        first.stop()
        second = leader()
        assert second is not first
        for k in range(150, 300):
            second.submit({"k": k}).result(10)
    finally:
        for n in nodes:
            n.stop()

    return violations, checked, nodes, images


def test_votes_and_acknowledged_entries_are_durable_before_they_are_sent(tmp_path, port_factory, monkeypatch):
    violations, checked, nodes, images = _commit_across_an_election(tmp_path, port_factory, monkeypatch)
    assert not violations, violations[:5]
    # Both kinds of message were checked: votes (two elections) and acknowledgements.
    assert checked["vote"] >= 2 and checked["ack"] >= 100, checked
    assert all(n.journal is None or n.journal.syncs > 0 for n in nodes)
    # Every power-loss image opens as a journal (no torn state).
    for i, (_, journal_bytes, meta_bytes) in enumerate(images.all[::25]):
        _reopen(tmp_path / "images" / str(i), (journal_bytes, meta_bytes))
        if meta_bytes:
            assert "currentTerm" in loads(meta_bytes)


def test_negative_control_acknowledgements_ahead_of_an_unsynced_log_are_caught(tmp_path, port_factory, monkeypatch):
    """The log never fsynced (votes still are): acknowledged entries are not in the last
    durable copy, and the check reports them."""
    monkeypatch.setattr(DurableJournal, "sync", lambda self: None)
    violations, checked, _, _ = _commit_across_an_election(tmp_path, port_factory, monkeypatch)
    assert checked["ack"] >= 100, checked
    assert [v for v in violations if v.startswith("ack up to")], violations[:5]
