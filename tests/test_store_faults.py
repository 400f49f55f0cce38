"""Stores damaged at rest, with real broker processes: refused, or rebuilt when asked.

Issue 12.4: a slave whose first segment file is gone used to start with a max offset past
anything its master has, and reconnect every 100 ms forever.  It now refuses to start,
naming the missing file; with ``rebuild_store_from_master`` it moves the damaged store
aside and is rebuilt by replication, ending byte-identical to its master.
"""
from __future__ import annotations

import time

import pytest

from cluster import Cluster
from rmqha.codes import RequestCode, ResponseCode
from rmqha.ha.testing import assert_same_log
from rmqha.store import CommitLog


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path) as c:
        yield c


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
