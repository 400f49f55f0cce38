"""A Broker object run in the test's own event loop against a real controller process.

Covers what is awkward to provoke from outside: a fenced (stale-epoch) AlterSyncStateSet
answer re-reads replica info and adopts the controller's set; the replication view of a
lone master; the broker's own stale-notice handling through its handler.
"""
from __future__ import annotations

import asyncio
import socket
import subprocess
import urllib.request

import pytest

from cluster import FAST_BROKER, Cluster, free_port, free_port_pair
from needs import require_root
from rmqha.broker import Broker, BrokerConfig
from rmqha.broker.replicas_manager import GroupState, Role
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.config import apply_values
from rmqha.net.client import RemotingClient
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand



@pytest.fixture
def loop():
    thread = EventLoopThread("test-broker")
    try:
        yield thread
    finally:
        thread.stop()


def make_config(cluster: Cluster, tmp_path, group: str = "broker-a", **overrides) -> BrokerConfig:
    cfg = BrokerConfig()
    values = dict(FAST_BROKER, cluster=cluster.cluster_name, broker_name=group, store_dir=str(tmp_path / "store"),
                  listen_port=free_port_pair(), controller_addr=cluster.controller_addresses, log_level="INFO",
                  **cluster.secret_settings("broker"))
    values.update(overrides)
    apply_values(cfg, values, "test")
    cfg.validate()
    return cfg


def test_fenced_alter_sync_state_set_rereads_and_adopts_the_controller_set(cluster, tmp_path, loop):
    cluster.start_controllers(1)
    broker = Broker(make_config(cluster, tmp_path, metrics_port=free_port()))
    try:
        loop.run(broker.start(), 30)
        cluster.wait_for(lambda: broker.role == Role.MASTER, what="the in-process broker to be master")
        assert broker.metrics_port
        text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=5).read().decode()
        assert "rmqha_broker_role 2.0" in text
        assert f"rmqha_broker_master_epoch {float(broker.replicas.master_epoch)}" in text
        rm = broker.replicas
        assert rm is not None
        info = cluster.replica_info("broker-a")
        assert rm.status.sync_state_set_epoch == info.sync_state_set_epoch
        assert broker.ha_master is not None and broker.ha_master.sync_state_set == {1}

        # Pretend this broker missed a SyncStateSet change: its epoch is one behind.
        rm.status.sync_state_set_epoch -= 1
        ids, epoch = loop.run(rm.alter_sync_state_set([1, 7]), 30)
        # Refused: the answer is the set held now (older than the controller's, so the HA
        # master ignores it), and a re-read of replica info catches up in the background.
        assert (sorted(ids), epoch) == ([1], info.sync_state_set_epoch - 1)
        cluster.wait_for(lambda: rm.status.sync_state_set_epoch == info.sync_state_set_epoch,
                         what="the re-read after the fenced answer")
        assert sorted(rm.status.sync_state_set) == [1]
        assert cluster.replica_info("broker-a").sync_state_set == [1]  # nothing altered

        # A lone master confirms everything it has.
        assert broker.replication.sync_state_set_size() == 1
        assert broker.replication.confirm_offset() == broker.commitlog.max_offset
        assert loop.run(broker.replication.wait_for_copies(broker.commitlog.max_offset, 1.0), 5)

        # A notice older than the held epoch changes nothing.
        stale = GroupState(master_id=9, master_address="127.0.0.1:1", master_epoch=rm.master_epoch - 1)
        assert loop.run(rm.change_role(stale, source="notification"), 5) is False
        assert broker.role == Role.MASTER and rm.status.stale_notices_ignored == 1
    finally:
        loop.run(broker.stop(), 30)


def test_broker_without_controller_keeps_trying_and_stops_cleanly(cluster, tmp_path, loop):
    """No controller reachable: the id cannot be negotiated, nothing is served, stop() works."""
    cfg = make_config(cluster, tmp_path, controller_addr=[f"127.0.0.1:{free_port_pair()}"], rpc_timeout_ms=200)
    broker = Broker(cfg)

    async def start_then_stop() -> str:
        task = asyncio.ensure_future(broker.start())
        done, _ = await asyncio.wait({task}, timeout=1.5)
        assert not done, "start() must not finish without a controller"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass  # cancelled by us
        await broker.stop()
        return "stopped"

    assert loop.run(start_then_stop(), 30) == "stopped"
    assert broker.server is None and broker.role == Role.FENCED
    assert not (tmp_path / "store" / ".broker.meta").exists()


def test_failed_role_switch_is_rolled_back_and_retried(cluster, tmp_path, loop):
    """The HA port is taken: becoming master fails half-way, the broker stays fenced and gives
    the epoch back (or no later poll would retry), and takes the role once the port is free."""
    cluster.start_controllers(1)
    cfg = make_config(cluster, tmp_path)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", cfg.ha_port))
    blocker.listen(1)
    broker = Broker(cfg)
    try:
        loop.run(broker.start(), 30)
        cluster.wait_for(lambda: (info := cluster.replica_info("broker-a")) is not None and info.master_id == 1,
                         what="the controller to elect the broker")
        cluster.holds(lambda: broker.role == Role.FENCED and broker.ha_master is None, 1.0,
                      what="fenced while the HA port is busy")
        blocker.close()
        cluster.wait_for(lambda: broker.role == Role.MASTER, what="the retried switch to succeed")
        assert broker.replicas.master_epoch == cluster.replica_info("broker-a").master_epoch
        assert broker.ha_master is not None
    finally:
        blocker.close()
        loop.run(broker.stop(), 30)


def test_an_idle_broker_with_1_gib_segments_holds_little_disk(cluster, tmp_path, loop):
    """Segments are sparse: an idle master (RocketMQ's 1 GiB segments) holds a window of
    blocks, not its segments, and says so in ha-status and its metrics."""
    cluster.start_controllers(1)
    broker = Broker(make_config(cluster, tmp_path, segment_bytes=1 << 30, metrics_port=free_port()))
    try:
        loop.run(broker.start(), 30)
        cluster.wait_for(lambda: broker.role == Role.MASTER, what="the in-process broker to be master")
        assert broker.commitlog.wait_prefaulted(60)
        disk = broker.ha_status()["storeDisk"]
        assert disk["logicalBytes"] >= 1 << 30       # the active segment's full size ...
        assert disk["allocatedBytes"] < 100 << 20    # ... sparse: only the window is on disk
        text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=5).read().decode()
        series = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                  if line.startswith("rmqha_broker_store_")}
        assert series["rmqha_broker_store_logical_bytes"] >= 1 << 30
        assert 0 < series["rmqha_broker_store_allocated_bytes"] < 100 << 20
    finally:
        loop.run(broker.stop(), 30)


def test_a_full_disk_refuses_sends_cleanly_and_loses_nothing(cluster, tmp_path, loop):
    """The master's store is a 3 MiB tmpfs: once it is full a send is refused with
    SERVICE_NOT_AVAILABLE (RocketMQ's answer to a full disk, which clients retry), every
    acknowledged message stays readable, and sends succeed again once there is room."""
    require_root("mounting a tmpfs")  # skipped without root locally, a failure under CI
    cluster.start_controllers(1)
    store = tmp_path / "store"
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(store)], check=True, timeout=30)
    broker = Broker(make_config(cluster, tmp_path))
    try:
        loop.run(broker.start(), 30)
        cluster.wait_for(lambda: broker.role == Role.MASTER, what="the in-process broker to be master")

        async def send(client: RemotingClient, body: bytes) -> RemotingCommand:
            return await client.request(RemotingCommand.request(RequestCode.SEND_MESSAGE, {
                "producerGroup": "p", "topic": "TBW102", "queueId": 0, "sysFlag": 0,
                "bornTimestamp": "0", "flag": 0, "properties": "", "reconsumeTimes": "0",
                "unitMode": "0", "batch": "0"}, body))

        async def fill() -> tuple[dict[int, bytes], RemotingCommand]:
            acked: dict[int, bytes] = {}
            async with RemotingClient(f"127.0.0.1:{broker.config.listen_port}") as c:
                for i in range(400):  # 400 x 32 KiB: far more than the filesystem holds
                    body = bytes([i % 251]) * (32 << 10)
                    resp = await send(c, body)
                    if resp.code != ResponseCode.SUCCESS:
                        return acked, resp
                    acked[int(resp.ext_fields["commitLogOffset"])] = body
            raise AssertionError("the 3 MiB store never filled up")

        acked, refused = loop.run(fill(), 60)
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused.remark
        assert "No space left on device" in (refused.remark or "")
        assert len(acked) > 10
        assert all(broker.commitlog.read_message(off).body == body for off, body in acked.items())
        assert broker.role == Role.MASTER

        subprocess.run(["mount", "-o", "remount,size=16m", str(store)], check=True, timeout=30)

        async def once_more() -> RemotingCommand:
            async with RemotingClient(f"127.0.0.1:{broker.config.listen_port}") as c:
                return await send(c, b"after the disk grew")

        resp = loop.run(once_more(), 30)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert broker.commitlog.read_message(int(resp.ext_fields["commitLogOffset"])).body == b"after the disk grew"
    finally:
        loop.run(broker.stop(), 30)
        subprocess.run(["umount", "-l", str(store)], check=False, timeout=30)
