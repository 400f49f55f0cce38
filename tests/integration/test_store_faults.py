"""Stores damaged at rest, with real broker processes: refused, or rebuilt when asked.

Issue 12.4: a slave whose first segment file is gone used to start with a max offset past
anything its master has, and reconnect every 100 ms forever.  It now refuses to start,
naming the missing file; with ``rebuild_store_from_master`` it moves the damaged store
aside and is rebuilt by replication, ending byte-identical to its master.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from cluster import Cluster

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.testing.ha import assert_same_log
from rmqha.store import CommitLog



def _send(cluster: Cluster, addr: str, n: int, size: int = 4000) -> None:
    for i in range(n):
        resp = cluster.request(addr, RequestCode.SEND_MESSAGE, {
            "producerGroup": "pg", "topic": "faults", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "",
            "reconsumeTimes": 0}, b"%06d" % i + b"f" * size)
        assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_missing_first_segment_is_refused_then_rebuilt_from_the_master(cluster):
    cluster.start_controllers(1)
    master, slave = cluster.start_group("broker-a", 2, in_sync=True, all_ack_in_sync_state_set=True)
    _send(cluster, master.address, 700)  # about 2.7 MiB: three 1 MiB segments
    cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"] == cluster.broker_status(master)["maxOffset"],
                     what="the slave caught up")
    slave.stop()
    segments = slave.segment_files()
    assert len(segments) >= 3
    first = segments[0]
    first.unlink()

    slave.start()
    assert slave.wait_exit(30) != 0
    assert first.name in slave.log_text() and "missing" in slave.log_text(), slave.log_tail()
    assert not first.exists() and slave.segment_files() == segments[1:]  # nothing touched

    slave.start(rebuild_store_from_master=True)
    cluster.wait_role(slave, "slave", 30)
    aside = [p for p in slave.store_dir.iterdir() if p.name.startswith("aside-")]
    assert len(aside) == 1 and (aside[0] / "commitlog" / segments[1].name).exists()
    assert slave.broker_id() == 2  # the identity stays
    cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"] == cluster.broker_status(master)["maxOffset"],
                     30, what="the rebuilt slave to catch up")
    seg = int(master.config["segment_bytes"])
    slave.stop()
    master.stop()
    a = CommitLog(master.commitlog_dir, segment_bytes=seg, prefault=False)
    b = CommitLog(slave.commitlog_dir, segment_bytes=seg, prefault=False)
    try:
        assert b.min_offset == a.min_offset == 0
        assert_same_log(a, b, "rebuilt slave vs master")
    finally:
        a.close()
        b.close()


def _send_recorded(cluster: Cluster, addr: str, n: int) -> list[int]:
    """Send n messages to queue 0; the commitlog offset of each, by queue offset."""
    offsets = []
    for i in range(n):
        resp = cluster.request(addr, RequestCode.SEND_MESSAGE, {
            "producerGroup": "pg", "topic": "rot", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "",
            "reconsumeTimes": 0}, b"%06d" % i + b"r" * 4000)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert int(resp.ext_fields["queueOffset"]) == i
        offsets.append(int(resp.ext_fields["commitLogOffset"]))
    return offsets


def _flip_body_byte(commitlog_dir, segment_bytes: int, record_offset: int) -> None:
    """Flip one bit inside a record's body (the fixed header of an IPv4 record is 96 bytes)."""
    path = commitlog_dir / f"{record_offset - record_offset % segment_bytes:020d}"
    at = record_offset % segment_bytes + 96 + 10
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x10]))


def _pull(cluster: Cluster, addr: str, queue_offset: int):
    return cluster.request(addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": "rot", "queueId": 0, "queueOffset": queue_offset,
        "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subscription": "*", "subVersion": 0})


def _scrub(store) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "rmqha", "scrub", str(store), "--json"],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def test_bytes_changed_at_rest_are_never_served_and_a_slave_is_repaired(cluster):
    cluster.start_controllers(1)
    master, slave = cluster.start_group("broker-a", 2, in_sync=True, all_ack_in_sync_state_set=True)
    seg = int(master.config["segment_bytes"])
    offsets = _send_recorded(cluster, master.address, 700)
    cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"] == cluster.broker_status(master)["maxOffset"],
                     what="the slave caught up")

    # Rot under the master's feet (its mapping shares the page cache with the file).
    _flip_body_byte(master.commitlog_dir, seg, offsets[500])
    resp = _pull(cluster, master.address, 490)
    assert resp.code == ResponseCode.SUCCESS and int(resp.ext_fields["nextBeginOffset"]) == 500
    resp = _pull(cluster, master.address, 500)
    assert resp.code == ResponseCode.SYSTEM_ERROR and str(offsets[500]) in resp.remark, resp.remark
    assert b"000500" not in resp.body
    assert offsets[500] in cluster.broker_status(master)["corruptRecords"]
    # The slave's copy is intact and served.
    resp = _pull(cluster, slave.address, 500)
    assert resp.code == ResponseCode.SUCCESS and b"000500" in resp.body

    # Rot in the slave's store at rest: scrub finds it, a restart repairs it from the master.
    slave.stop()
    _flip_body_byte(slave.commitlog_dir, seg, offsets[650])
    code, out = _scrub(slave.store_dir)
    assert code == 1 and str(offsets[650]) in out and "BAD_CRC" in out, out
    slave.start()
    cluster.wait_role(slave, "slave", 30)
    cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"] == cluster.broker_status(master)["maxOffset"],
                     30, what="the repaired slave to catch up")
    assert "first record that failed its check" in slave.log_text()
    resp = _pull(cluster, slave.address, 650)
    assert resp.code == ResponseCode.SUCCESS and b"000650" in resp.body
    slave.stop()
    code, out = _scrub(slave.store_dir)
    assert code == 0, out
    code, out = _scrub(master.store_dir)
    assert code == 1 and str(offsets[500]) in out


# --- every kind of damage at rest, at the start, middle and end of a slave's log ---------------

#: Where each kind of damage goes inside a record (RocketMQ's layout: total size at 0, magic
#: at 4, body length at 84, the body from 96 for an IPv4 record), and the value written there.
_DAMAGE = {
    "length": (84, b"\x7f\x00\x00\x00"),  # the body length no longer sums to the record's size
    "magic": (4, b"\xde\xad\xbe\xef"),
    "crc": (96 + 10, None),  # one bit of the body: the CRC check fails
    "tail": (-1, b"\x00"),  # the record's last byte zeroed, as a torn write leaves it
}


def _damage(commitlog_dir, segment_bytes: int, record_offset: int, size: int, kind: str) -> None:
    at, value = _DAMAGE[kind]
    path = commitlog_dir / f"{record_offset - record_offset % segment_bytes:020d}"
    pos = record_offset % segment_bytes + (size + at if at < 0 else at)
    with open(path, "r+b") as fh:
        fh.seek(pos)
        old = fh.read(len(value) if value else 1)
        fh.seek(pos)
        fh.write(value if value is not None else bytes([old[0] ^ 0x10]))


def _repaired_after_damage(cluster: Cluster, kinds: list[str], places: list[str]) -> None:
    """A slave whose store was damaged at rest (each kind at each place in turn) starts,
    cuts its log at the damage, fetches the rest again and serves the damaged message."""
    cluster.start_controllers(1)
    master, slave = cluster.start_group("broker-a", 2, in_sync=True, all_ack_in_sync_state_set=True)
    seg = int(master.config["segment_bytes"])
    n = 700  # about 2.8 MiB: three 1 MiB segments, so damage lies below the newest one too
    offsets = _send_recorded(cluster, master.address, n)
    sizes = [b - a for a, b in zip(offsets, offsets[1:])] + [offsets[1] - offsets[0]]
    # The segments a broker checks when it opens (verify_segments_on_open = 2): from the
    # first record of the second one to the last record of the log.
    checked = next(i for i, o in enumerate(offsets) if o >= seg)
    index = {"start": checked, "middle": (checked + n) // 2 - 40, "end": n - 1}
    # One clean restart first: that open checks the log, and the next open's recovery walks
    # only what came after it, so damage below is found by the CRC pass alone (the path
    # that used to stick).
    cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"]
                     == cluster.broker_status(master)["maxOffset"], 30, what="the slave caught up")
    slave.stop()
    slave.start()
    cluster.wait_role(slave, "slave", 30)
    for kind in kinds:
        for place in places:
            i = index[place]
            cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"]
                             == cluster.broker_status(master)["maxOffset"], 30, what="the slave caught up")
            slave.stop()
            _damage(slave.commitlog_dir, seg, offsets[i], sizes[i], kind)
            slave.start()
            cluster.wait_role(slave, "slave", 30)
            cluster.wait_for(lambda: cluster.broker_status(slave)["maxOffset"]
                             == cluster.broker_status(master)["maxOffset"], 30,
                             what=f"the slave repaired after {kind} damage at its {place}")
            # Cut there, by recovery (a walk of the records) or by the broker (the CRC check).
            assert re.search(r"cut(ting)? the log at (offset )?%d\b" % offsets[i], slave.log_text()), (
                kind, place, slave.log_tail())
            resp = _pull(cluster, slave.address, i)
            assert resp.code == ResponseCode.SUCCESS and b"%06d" % i in resp.body, (kind, place, resp.remark)
    slave.stop()
    master.stop()
    a = CommitLog(master.commitlog_dir, segment_bytes=seg, prefault=False)
    b = CommitLog(slave.commitlog_dir, segment_bytes=seg, prefault=False)
    try:
        assert_same_log(a, b, "repaired slave vs master")
    finally:
        a.close()
        b.close()


def test_a_slave_with_a_damaged_length_in_its_log_cuts_there_and_is_repaired(cluster):
    """Issue 40.3: a corrupt length used to fail every role change with "truncate to N: not
    a record boundary (BAD_LENGTHS)", so the slave never got a role and never repaired."""
    _repaired_after_damage(cluster, ["length"], ["middle"])


@pytest.mark.slow
def test_every_kind_of_damage_at_every_place_is_repaired(cluster):
    _repaired_after_damage(cluster, list(_DAMAGE), ["start", "middle", "end"])
