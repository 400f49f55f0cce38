"""A broker with flush = sync keeps everything it acknowledged through a power loss (issue 40.2).

The broker process runs with the power-loss shim (:mod:`rmqha.testing.power_loss`): what
survives the cut is what its fsync/fdatasync/msync and directory fsync calls made durable,
recorded at the C library, and the restart after it reads a new boot id (a reboot, so
recovery trusts nothing of the old page cache).  The broker becomes master (broker id
negotiated and written, epoch entry written), answers SEND_OK to every message (with
flush = sync: once fsynced), flushes its consume queues and their checkpoint, and loses
power.  Restarted on the image it must have:

- the same broker id (``.broker.meta``), or it would register as someone else;
- every epoch entry it had (``epochFileCheckpoint``), or it could not prove its log;
- every acknowledged message, served by queue offset through the consume queues
  (either rebuilt from the commitlog or as flushed, but consistent);
- both checkpoints (the commitlog's flushed offset, the consume queues' indexed offset)
  as they were once they passed the sends (read from the image before the restart).

Negative controls (the same run with one kind of sync recorded as not made, as if deleted
from the code) must each make the check fail: the commitlog segments' fdatasync, each
checkpoint's fdatasync, the broker id file's fsync and the epoch file's fsync.  The
consume queue files' fdatasync is the exception, and the test says so: without it the
restart finds the files short and rebuilds them from the commitlog, losing nothing (what
it checks is that the rebuild happens, where the durable run needs none).  A last test
stops a broker cleanly and requires its image to equal its directory.
"""
from __future__ import annotations

import time
import zlib
from pathlib import Path

import pytest
from cluster import BrokerProc, Cluster
from mutated_source import mutated_package

from rmqha.errors import LocalClusterError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import decode_records
from rmqha.store.checkpoint import _CHECKPOINT, CHECKPOINT_FILE, DISPATCH_CHECKPOINT_FILE, DispatchCheckpoint
from rmqha.store.segments import sidecar_path
from rmqha.testing.power_loss import PowerLossDisk

TOPIC = "durable"
SENDS = 60


class Lost(AssertionError):
    """What the check found missing after the power loss."""


def _send(cluster: Cluster, addr: str, n: int, topic: str = TOPIC) -> list[bytes]:
    bodies = []
    for i in range(n):
        body = b"%06d" % i + b"p" * 3000
        resp = cluster.request(addr, RequestCode.SEND_MESSAGE, {
            "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "",
            "reconsumeTimes": 0}, body)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert topic != TOPIC or int(resp.ext_fields["queueOffset"]) == i
        bodies.append(body)
    return bodies


def _read_queue(cluster: Cluster, addr: str, n: int) -> dict[int, bytes]:
    """Queue offset -> body of what the broker serves of queue 0, from 0 until a gap or n."""
    got: dict[int, bytes] = {}
    while len(got) < n:
        resp = cluster.request(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "cg", "topic": TOPIC, "queueId": 0, "queueOffset": len(got),
            "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0})
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            break
        for rec in decode_records(resp.body):
            got[rec.queue_offset] = rec.body
    return got


def _indexed(broker: BrokerProc) -> int:
    """The commitlog offset the consume queues' checkpoint says they hold durably (-1: none)."""
    return _indexed_in(broker.store_dir / "consumequeue" / DISPATCH_CHECKPOINT_FILE)


def _indexed_in(path: Path) -> int:
    state = DispatchCheckpoint(path).read()
    return -1 if state is None else state.offset


def _durable_copy(disk: PowerLossDisk, live: Path, dest: Path) -> Path:
    """What of ``live`` a power loss now would keep (the shim's copy of its inode at its last
    sync; an empty file when never synced), written to ``dest``."""
    kept = disk.shadow / "ino" / str(live.stat().st_ino) if live.exists() else None
    dest.write_bytes(kept.read_bytes() if kept is not None and kept.exists() else b"")
    return dest


def _checkpoints_durable(disk: PowerLossDisk, broker: BrokerProc, end: int, scratch: Path) -> bool:
    """Both checkpoints past ``end`` in what the shim holds as synced, not only in the page
    cache: a checkpoint written but not yet fdatasynced when the cut comes is lost by right."""
    store = broker.store_dir
    flushed = _durable_copy(disk, Path(sidecar_path(str(store / "commitlog"), CHECKPOINT_FILE)),
                            scratch / "commitlog.checkpoint")
    indexed = _durable_copy(disk, store / "consumequeue" / DISPATCH_CHECKPOINT_FILE, scratch / "cq.checkpoint")
    return _flushed_in(flushed) >= end and _indexed_in(indexed) >= end


def _flushed(store: Path) -> int:
    """The flushed offset the commitlog's checkpoint holds (0: missing, empty or corrupt)."""
    return _flushed_in(Path(sidecar_path(str(store / "commitlog"), CHECKPOINT_FILE)))


def _flushed_in(path: Path) -> int:
    raw = path.read_bytes()[:_CHECKPOINT.size] if path.exists() else b""
    if len(raw) != _CHECKPOINT.size:
        return 0
    magic, flushed, _min, _flags, crc = _CHECKPOINT.unpack(raw)
    return flushed if magic == b"RMQHACP1" and zlib.crc32(raw[:-4]) == crc else 0


def _epochs(cluster: Cluster, broker: BrokerProc) -> list[tuple[int, int]]:
    return [(e["epoch"], e["startOffset"]) for e in cluster.broker_epochs(broker)["epochList"]]


def _run(tmp_path: Path, skip: tuple[str, ...], env: dict[str, str] | None = None) -> bool:
    """Raises :class:`Lost` for anything acknowledged that did not survive; True when the
    restart had to rebuild the topic's consume queue from the commitlog."""
    with Cluster(tmp_path) as cluster:
        cluster.start_controllers(1)
        broker = cluster.add_broker("broker-a", flush="sync", consume_queue_flush_interval_s=0.2)
        broker.env.update(env or {})
        disk = PowerLossDisk(broker.store_dir, tmp_path / "shadow", skip)
        disk.start(broker)
        cluster.wait_role(broker, "master", 60)
        broker_id = broker.broker_id()
        bodies = _send(cluster, broker.address, SENDS)
        epochs = _epochs(cluster, broker)
        end = cluster.broker_status(broker)["maxOffset"]
        # The consume queues flushed and checkpointed past every send: the checkpoint now
        # promises their entries (so losing them, not the checkpoint, is what is checked).
        # (The queues flush as records are dispatched: another topic's sends drive it.)
        # Likewise both checkpoints (written at most once a second) pass the sends.
        cluster.wait_for(lambda: min(_indexed(broker), _flushed(broker.store_dir)) >= end
                         or _send(cluster, broker.address, 1, "nudge") and False,
                         60, what="both checkpoints past the sends")
        # ... and synced: the shim's copies past them too, or a cut in the moment between a
        # checkpoint's write and its fdatasync loses it by right.  A control that skips a
        # checkpoint's sync never gets there: after 10 s it is cut anyway, and caught below.
        scratch = tmp_path / "durable-checkpoints"
        scratch.mkdir(exist_ok=True)
        try:
            cluster.wait_for(lambda: _checkpoints_durable(disk, broker, end, scratch), 10,
                             what="both checkpoints synced past the sends")
        except LocalClusterError:
            pass

        disk.cut(broker)
        if _flushed(broker.store_dir) < end:
            raise Lost(f"commitlog checkpoint lost: {_flushed(broker.store_dir)} after the cut, {end} before")
        if _indexed(broker) < end:
            raise Lost(f"consume queue checkpoint lost: {_indexed(broker)} after the cut, {end} before")
        disk.start(broker)
        try:
            cluster.wait_for(lambda: not broker.alive or cluster.broker_role(broker) == "master",
                             60, what="the broker back as master (or its exit)")
        except LocalClusterError:
            raise Lost(f"the broker did not start as master on its image:\n{broker.log_tail()}") from None
        if not broker.alive:
            raise Lost(f"the broker did not start on its power-loss image:\n{broker.log_tail()}")
        if broker.broker_id() != broker_id:
            raise Lost(f"broker id changed: {broker_id} -> {broker.broker_id()}")
        # A new master may serve up to its confirm offset for a moment: poll, with a deadline.
        def missing() -> list[int]:
            served = _read_queue(cluster, broker.address, SENDS)
            return [i for i, body in enumerate(bodies) if served.get(i) != body]

        try:
            cluster.wait_for(lambda: not missing(), 10, what="every acknowledged message served")
        except LocalClusterError:
            pass  # judged just below, on what is served now
        lost = missing()
        if lost:
            raise Lost(f"acknowledged messages not served after the power loss: {len(lost)} "
                       f"of {SENDS} (first {lost[:5]})")
        after = _epochs(cluster, broker)
        if after[:len(epochs)] != epochs:
            raise Lost(f"epoch entries lost: {epochs} before, {after} after")
        this_start = broker.log_text().rsplit("===== start #", 1)[-1]
        return f"consume queue {TOPIC}/0" in this_start and "rebuilding it from the commitlog" in this_start


def test_everything_acknowledged_survives_a_power_loss(tmp_path):
    assert not _run(tmp_path, ()), "the consume queue was rebuilt though its flush was durable"


def test_consume_queues_lost_unsynced_are_rebuilt_from_the_commitlog(tmp_path):
    """The queues' fdatasync is not what keeps a message: their files lost at a power loss
    are found short or blank and rebuilt from the commitlog (the check after a reboot), so
    the control here is that the rebuild happens, where the durable run needs none."""
    assert _run(tmp_path, ("consumequeue/*/*/0*",)), "the consume queue was not rebuilt"


@pytest.mark.parametrize("skip, what", [
    (("commitlog/0*",), "acknowledged messages"),
    # The other durable things' controls run in `make soak` (13 s each): make test keeps
    # the commitlog's here and the flusher's below, inside its ten minutes.
    pytest.param(("commitlog.checkpoint",), "commitlog checkpoint lost", marks=pytest.mark.slow),
    pytest.param(("consumequeue/checkpoint",), "consume queue checkpoint lost", marks=pytest.mark.slow),
    pytest.param((".broker.meta*",), "broker id|did not start", marks=pytest.mark.slow),
    pytest.param(("epochFileCheckpoint*",), "epoch entries|did not start", marks=pytest.mark.slow),
], ids=["commitlog", "commitlog-checkpoint", "consume-queue-checkpoint", "broker-id", "epoch-file"])
def test_negative_control_a_skipped_sync_is_caught(tmp_path, skip, what):
    with pytest.raises(Lost, match=what):
        _run(tmp_path, skip)


def test_negative_control_the_flushers_fdatasync_deleted_from_the_code_is_caught(tmp_path):
    """The control without the shim's help: the commitlog flusher's own fdatasync deleted
    (a copy of rmqha on the broker's PYTHONPATH)."""
    code = mutated_package(tmp_path, "store/flusher.py", "os.fdatasync(seg.fd)", "None")
    with pytest.raises(Lost, match="acknowledged messages"):
        _run(tmp_path, (), {"PYTHONPATH": str(code)})


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def _unsynced(live: dict[str, bytes | None], image: dict[str, bytes | None]) -> list[str]:
    """What of the live tree a power loss right now would lose or change."""
    out = [f"{name}: missing" for name in live if name not in image]
    out += [f"{name}: differs" for name in live if name in image and live[name] != image[name]]
    out += [f"{name}: left over" for name in image if name not in live]
    return out


def test_a_cleanly_stopped_broker_has_synced_every_file_and_name(tmp_path):
    """After a graceful stop nothing may be left in the page cache only: the image equals
    the directory, name for name and byte for byte.  This finds any rename or mkdir
    without its directory fsync and any file written without a sync, wherever it is."""
    with Cluster(tmp_path) as cluster:
        cluster.start_controllers(1)
        broker = cluster.add_broker("broker-a", flush="sync", consume_queue_flush_interval_s=0.2)
        disk = PowerLossDisk(broker.store_dir, tmp_path / "shadow")
        disk.start(broker)
        cluster.wait_role(broker, "master", 60)
        _send(cluster, broker.address, 20)
        _send(cluster, broker.address, 5, "second")
        assert broker.stop(10) == 0, broker.log_tail()
        image = tmp_path / "image"
        disk.build_image(image)
        unsynced = _unsynced(_tree(broker.store_dir), _tree(image))
        assert not unsynced, f"a power loss after a clean stop would lose: {unsynced}"
