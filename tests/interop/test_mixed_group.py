"""An rmqha slave in a real RocketMQ 5 broker group (issue 36, part 2: a mixed broker group).

A RocketMQ operator replaces one broker at a time.  Here the group is RocketMQ 5.5.0's: its
name server with the controller embedded and one RocketMQ broker, elected master
(``benches/peers/rocketmq_cluster.py``).  An rmqha broker joins it as a second broker of the
same group: it asks RocketMQ's controller for an id, registers, is told the master and follows
it over RocketMQ's own AutoSwitch HA protocol (``ha_protocol = "rocketmq"``, the dialect rmqha
serves and speaks; unauthenticated, so the broker must be told
``ha_allow_unauthenticated_rocketmq_dialect``, which is what the secure mode allows for a mix).

What must hold, checked from both sides:

* RocketMQ's master adds the rmqha slave to the SyncStateSet (it acknowledged in the dialect,
  caught up, and the master asked RocketMQ's controller to grow the set);
* with ``allAckInSyncStateSet=true`` every later send is acknowledged only once the rmqha
  slave holds it, and it is acknowledged (the slave's acks are what RocketMQ expects);
* the two commitlogs are byte-identical over every offset both hold, and the slave's epoch
  file equals the master's epoch cache.

Not covered yet (issue 36, part 2): the epoch change with the rmqha slave elected, truncation
on rejoin both ways, and a RocketMQ slave under an rmqha master.  A finding this test shows
in passing: RocketMQ's name server refuses the rmqha slave's REGISTER_BROKER ("register
broker failed"), because a broker whose topic table holds exactly one topic may register only
incrementally after a full registration (RouteInfoManager); a RocketMQ broker always has its
system topics.  Replication and acknowledgement do not depend on it.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqha.client import BlockingProducer, Message, SendStatus
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.testing.local_cluster import Cluster
from rmqha.testing.processes import BrokerProc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

from peers.jvm import TEST_HEAPS  # noqa: E402
from peers.rocketmq_cluster import CLUSTER, COMMITLOG_FILE_BYTES, GROUP, RocketmqCluster  # noqa: E402

pytestmark = pytest.mark.timeout(1200)

TOPIC = "mixed-group"
N = 40
DEADLINE_S = 120.0


@pytest.fixture()
def mixed(tmp_path: Path) -> Iterator[tuple[RocketmqCluster, Cluster]]:
    rocketmq = RocketmqCluster(tmp_path / "rocketmq", TEST_HEAPS, brokers=1)
    rmqha = Cluster(tmp_path / "rmqha", insecure=True, cluster_name=CLUSTER)
    try:
        rocketmq.start()
        yield rocketmq, rmqha
    except BaseException:
        print(rocketmq.describe())
        print(rmqha.describe())
        raise
    finally:
        rmqha.stop_all()
        rocketmq.stop()
    assert not rmqha.leftovers()


def _send(namesrv: str, tag: str) -> None:
    """N sends, each acknowledged at its first attempt."""
    with BlockingProducer(namesrv) as producer:
        results = [producer.send(TOPIC, Message(f"{tag}-{i}".encode() * (i + 1), keys=f"{tag}{i}"))
                   for i in range(N)]
    assert all(r.ok and r.attempts == 1 for r in results), [r for r in results if not r.ok or r.attempts > 1]


def _epochs(rocketmq: RocketmqCluster, addr: str) -> dict:  # type: ignore[type-arg]
    resp = rocketmq.request(addr, RequestCode.GET_BROKER_EPOCH_CACHE)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp.json_body()


def _bytes(commitlog: Path, end: int) -> bytes:
    out = bytearray()
    for seg in sorted(p for p in commitlog.iterdir() if p.name.isdigit()):
        base = int(seg.name)
        if base >= end:
            break
        with open(seg, "rb") as fh:
            out += fh.read(min(COMMITLOG_FILE_BYTES, end - base))
    return bytes(out)


def test_an_rmqha_slave_follows_a_rocketmq_master(mixed: tuple[RocketmqCluster, Cluster]) -> None:
    rocketmq, rmqha = mixed
    rocketmq.create_topic(TOPIC, 4)
    _send(rocketmq.namesrv_address, "before")
    master = rocketmq.master()
    assert master is not None
    master_addr = rocketmq.broker_address(master)

    slave: BrokerProc = rmqha.add_broker(
        GROUP, controller_addr=[rocketmq.controller_address], namesrv_addr=[rocketmq.namesrv_address],
        ha_protocol="rocketmq", ha_allow_unauthenticated_rocketmq_dialect=True,
        segment_bytes=COMMITLOG_FILE_BYTES)
    slave.start()
    rmqha.wait_role(slave, "slave", DEADLINE_S)
    state = rmqha.wait_for(lambda: (s := rocketmq.replica_state()) is not None and len(s.sync_state_set) == 2 and s,
                           DEADLINE_S, what="SyncStateSet of two at RocketMQ's controller")
    assert state.master_address == master_addr

    # Every send now needs the rmqha slave's ack (allAckInSyncStateSet): all are acknowledged.
    _send(rocketmq.namesrv_address, "after")
    end = int(_epochs(rocketmq, master_addr)["maxOffset"])
    rmqha.wait_for(lambda: int(rmqha.broker_epochs(slave)["maxOffset"]) >= end, DEADLINE_S,
                   what="the slave at the master's end")

    theirs = _bytes(rocketmq.workdir / master / "store" / "commitlog", end)
    ours = _bytes(slave.commitlog_dir, end)
    assert len(theirs) == len(ours) == end
    first_diff = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), None)
    assert first_diff is None, f"commitlogs differ first at offset {first_diff}"
    master_epochs = [(e["epoch"], e["startOffset"]) for e in _epochs(rocketmq, master_addr)["epochList"]]
    slave_epochs = [(e["epoch"], e["startOffset"]) for e in rmqha.broker_epochs(slave)["epochList"]]
    assert slave_epochs == master_epochs and master_epochs, (slave_epochs, master_epochs)

    # Negative control: the acks above were the rmqha slave's.  Stopped (SIGSTOP: its socket
    # stays open, it just stops acknowledging), a send waits for it: its first attempt is
    # answered FLUSH_SLAVE_TIMEOUT (stored, not confirmed), which the producer returns or
    # retries until RocketMQ's master has dropped the silent slave from the SyncStateSet.
    slave.pause()
    try:
        with BlockingProducer(rocketmq.namesrv_address) as producer:
            late = producer.send(TOPIC, b"while the rmqha slave is stopped")
        assert late.status is SendStatus.FLUSH_SLAVE_TIMEOUT or late.attempts > 1, late
    finally:
        slave.resume()
