"""The controllers' Raft log and vote survive a power loss of every controller (issue 40.2).

Three real controller processes run with the power-loss shim
(:mod:`rmqha.testing.power_loss`): what survives is what their fsync/fdatasync/msync and
directory fsync calls made durable, recorded at the C library, so deleting one of those
calls loses what it covered.  The group commits broker-id applications (each answered
SUCCESS only once a majority holds it), loses its leader to a power cut (an election: new
votes), commits more, and then the whole group loses power at once.  Checked on the
images:

- every term and vote a node acted on is in its image (read from the live side file,
  with the shim's lock held so that no vote is half written): a node that comes back can
  never vote twice in a term, nor forget it granted one;
- restarted on the images, the group elects and answers every committed application.

Negative controls (the same test, with one sync recorded as not made, as if deleted from
the code): the journal's msync+fdatasync (committed applications forgotten), the vote's
temp-file fsync and the Raft directory's fsync (votes forgotten).  Each must make the
check fail; ``test_*_is_caught`` asserts that it does.
"""
from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

import pytest
from mutated_source import mutated_package
from pysyncobj.pickle import loads

from rmqha.controller.client import ControllerClient
from rmqha.testing.controllers import ControllerGroup
from rmqha.testing.power_loss import PowerLossDisk, cut_together

SECRET = "power-loss-tests-secret"
TOKEN = "t0ken"
CLUSTER = "pl"
#: Names applied before and after the leader's power loss.
FIRST = [f"a{i}" for i in range(5)]
SECOND = [f"b{i}" for i in range(5)]


def _client(addresses: list[str]) -> ControllerClient:
    return ControllerClient(addresses, cluster_secret=SECRET, request_timeout=3, admin_token=TOKEN)


async def _apply(addresses: list[str], names: list[str]) -> None:
    async with _client(addresses) as c:
        for name in names:
            await c.apply_broker_id(CLUSTER, name, 1, f"127.0.0.1:1;{name}")


async def _next_ids(addresses: list[str], names: list[str]) -> dict[str, int]:
    async with _client(addresses) as c:
        return {name: await c.get_next_broker_id(CLUSTER, name) for name in names}


def _vote(store: Path) -> tuple[int, object] | None:
    """(term, voted for) in a controller's side file, None when it is missing or empty."""
    meta = store / "raft" / "journal.meta"
    if not meta.exists() or meta.stat().st_size == 0:
        return None
    raw = loads(meta.read_bytes())
    return raw["currentTerm"], raw["votedForNodeId"]


def _keeps(image: tuple[int, object] | None, acted_on: tuple[int, object] | None) -> bool:
    """Whether the image still binds the node to what it acted on: the same term and vote,
    or a later term (an election between the read and the cut; no vote in the old term
    is possible from there)."""
    if acted_on is None:
        return True
    return image is not None and (image == acted_on or image[0] > acted_on[0])


class Lost(AssertionError):
    """What the check found missing after the power loss."""


def _back(group: ControllerGroup) -> bool:
    """The restarted group serves with a leader; :class:`Lost` if a node ended instead."""
    dead = [node for node in group.nodes if not node.alive]
    if dead:
        raise Lost(f"the controllers did not start on their images: {dead[0].log_tail(3)}")
    return group.cluster.controller_leader() is not None and all(n.listens(n.address) for n in group.nodes)


def _run(tmp_path: Path, skip: tuple[str, ...], env: dict[str, str] | None = None) -> None:
    group = ControllerGroup(tmp_path, 3, settings={"admin_token": TOKEN}, cluster_secret=SECRET)
    for node in group.nodes:
        node.env.update(env or {})
    stores = [Path(node.config["controller_store_path"]) for node in group.nodes]
    disks = [PowerLossDisk(store, tmp_path / f"shadow{i}", skip) for i, store in enumerate(stores)]
    try:
        for disk, node in zip(disks, group.nodes):
            disk.start(node)
        group.cluster.wait_controllers(group.nodes, timeout=60)  # three starts at once, under load
        asyncio.run(_apply(group.addresses, FIRST))
        leader = group.wait_leader()
        disks[leader].cut(group.nodes[leader])
        survivors = [i for i in range(3) if i != leader]
        group.wait_leader(timeout=60, exclude={leader})
        asyncio.run(_apply([group.addresses[i] for i in survivors], SECOND))
        for i in survivors:
            assert disks[i].syncs(), f"the shim recorded no sync of controller {i}"

        with ExitStack() as frozen:  # no vote half written while the live files are read
            for i in survivors:
                frozen.enter_context(disks[i].frozen())
            acted_on = {i: _vote(stores[i]) for i in survivors}
        cut_together([(disks[i], group.nodes[i]) for i in survivors])
        forgotten = {i: (acted_on[i], _vote(stores[i])) for i in survivors
                     if not _keeps(_vote(stores[i]), acted_on[i])}
        if forgotten:
            raise Lost(f"votes forgotten at the power loss (acted on, image): {forgotten}")

        for node in group.nodes:
            node.start()
        group.cluster.wait_for(lambda: _back(group), 60, what="the controllers back on their images")
        answers = asyncio.run(_next_ids(group.addresses, FIRST + SECOND))
        forgotten_ids = {name: n for name, n in answers.items() if n != 2}
        if forgotten_ids:
            raise Lost(f"committed applications forgotten (next id 1, not 2): {forgotten_ids}")
    finally:
        group.stop()


def test_raft_log_and_votes_survive_a_power_loss_of_every_controller(tmp_path):
    _run(tmp_path, ())


@pytest.mark.parametrize("skip, what", [
    # About 25 s here (the group waits for nodes that cannot open an empty journal).
    pytest.param(("raft/journal",), "committed applications forgotten|did not start", marks=pytest.mark.slow),
    (("raft/journal.meta.tmp",), "votes forgotten"),
    (("raft",), "votes forgotten"),
], ids=["journal-sync", "vote-file-sync", "raft-dir-sync"])
def test_negative_control_a_skipped_sync_is_caught(tmp_path, skip, what):
    with pytest.raises(Lost, match=what):
        _run(tmp_path, skip)


def test_negative_control_the_vote_fsync_deleted_from_the_code_is_caught(tmp_path):
    """The control without the shim's help: the code's own fsync of the vote's temp file
    deleted (a copy of rmqha on the children's PYTHONPATH)."""
    code = mutated_package(tmp_path, "controller/raft_journal.py",
                           "        os.write(fd, data)\n        os.fsync(fd)\n", "        os.write(fd, data)\n")
    with pytest.raises(Lost, match="votes forgotten"):
        _run(tmp_path, (), {"PYTHONPATH": str(code)})


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def test_cleanly_stopped_controllers_have_synced_every_file_and_name(tmp_path):
    """After a graceful stop the image of each controller equals its directory: no file,
    rename or mkdir of the Raft store is left unsynced."""
    group = ControllerGroup(tmp_path, 3, settings={"admin_token": TOKEN}, cluster_secret=SECRET)
    stores = [Path(node.config["controller_store_path"]) for node in group.nodes]
    disks = [PowerLossDisk(store, tmp_path / f"shadow{i}") for i, store in enumerate(stores)]
    try:
        for disk, node in zip(disks, group.nodes):
            disk.start(node)
        group.cluster.wait_controllers(group.nodes, timeout=60)  # three starts at once, under load
        asyncio.run(_apply(group.addresses, FIRST))
    finally:
        group.stop()
    for i, (disk, store) in enumerate(zip(disks, stores)):
        assert group.nodes[i].returncode == 0, group.nodes[i].log_tail()
        image = tmp_path / f"image{i}"
        disk.build_image(image)
        live, kept = _tree(store), _tree(image)
        lost = sorted(name for name in live if kept.get(name, b"<missing>") != live[name])
        assert not lost and set(kept) == set(live), f"controller {i}: unsynced at a clean stop: {lost}"
