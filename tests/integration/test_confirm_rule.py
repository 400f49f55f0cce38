"""Nothing past the confirm offset is ever indexed or served, and no ack has too few copies.

Issue 12.1: a master that learns of a newer epoch while it holds unconfirmed records and a
consumer long-polls on it must not hand that consumer the records (its own HA slave cuts
them a moment later).  Between stopping its HA master and starting its HA slave, and while
fenced at start-up, a broker knows no confirm offset but the last one it learned; the log's
max offset is never a stand-in for it.

With ``min_in_sync_replicas = 2`` a send that waited while the SyncStateSet shrank to the
master alone is not acknowledged: the wait for its replicas fails (the broker then answers
FLUSH_SLAVE_TIMEOUT, "stored, not confirmed"), never SEND_OK.

Real processes and sockets: a controller process, a slave broker process, the master a
:class:`Broker` in the test's own loop so the test can hold it at the exact step; the
replication link runs through a TCP proxy the test cuts.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from cluster import FAST_BROKER, Cluster, free_port_pair
from rmqha.broker import Broker, BrokerConfig
from rmqha.broker.confirm_checkpoint import ConfirmCheckpoint
from rmqha.broker.replicas_manager import Role
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.config import apply_values
from rmqha.testing.ha import fill, ha_master, ha_slave, fast_config, master_running, replica_stores, \
    slave_running, wait_until_async
from rmqha.net.client import RemotingClient
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand
from tcp_proxy import TcpProxy

TOPIC = "confirm-rule"
PULL_SUSPEND = 0x2  # RocketMQ PullSysFlag: hold the pull (long polling)



@pytest.fixture
def loop():
    thread = EventLoopThread("test-confirm-rule")
    try:
        yield thread
    finally:
        thread.stop()


def _master_config(cluster: Cluster, tmp_path, ha_proxy_port: int) -> BrokerConfig:
    cfg = BrokerConfig()
    values = dict(FAST_BROKER, cluster=cluster.cluster_name, broker_name="broker-a",
                  store_dir=str(tmp_path / "master-store"), listen_port=free_port_pair(),
                  controller_addr=cluster.controller_addresses, log_level="INFO",
                  all_ack_in_sync_state_set=True, slave_timeout_ms=20_000,
                  ha_advertised_address=f"127.0.0.1:{ha_proxy_port}", **cluster.secret_settings("broker"))
    apply_values(cfg, values, "test")
    cfg.validate()
    return cfg


def _send(body: bytes) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": 1,
        "queueId": 0, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
        "properties": "", "reconsumeTimes": 0}, body)


def _pull(queue_offset: int, hold_ms: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": TOPIC, "queueId": 0, "queueOffset": queue_offset,
        "maxMsgNums": 32, "sysFlag": PULL_SUSPEND, "commitOffset": 0,
        "suspendTimeoutMillis": hold_ms, "subscription": "*", "subVersion": 0})


def test_stepping_down_master_never_serves_its_unconfirmed_tail(cluster, tmp_path, loop):
    cluster.start_controllers(1)
    # The replication link runs through a proxy in front of the master's HA port.
    listen = free_port_pair()
    proxy = TcpProxy("127.0.0.1", listen + 1)
    proxy.start()
    cfg = _master_config(cluster, tmp_path, proxy.port)
    apply_values(cfg, {"listen_port": listen}, "test")
    master = Broker(cfg)
    client = RemotingClient(master.config.broker_address, connect_timeout=2.0)
    try:
        loop.run(master.start(), 30)
        cluster.wait_for(lambda: master.role == Role.MASTER, what="the in-process broker to be master")
        slave = cluster.start_broker("broker-a", all_ack_in_sync_state_set=True)
        cluster.wait_role(slave, "slave")
        cluster.wait_for(lambda: (i := cluster.replica_info("broker-a")) is not None
                         and i.sync_state_set == [1, 2], 30.0, what="SyncStateSet {1, 2}")

        # Acknowledged with both copies: served to consumers.
        resp = loop.run(client.request(_send(b"acked-0"), 10.0), 15)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        resp = loop.run(client.request(_pull(0, 0), 5.0), 10)
        assert resp.code == ResponseCode.SUCCESS and b"acked-0" in resp.body
        confirmed = master.replication.confirm_offset()

        # The slave stops hearing the master: new sends are stored but wait for its ack.
        proxy.cut("blackhole")

        async def send_unacked() -> list[RemotingCommand]:
            return list(await asyncio.gather(*(client.request(_send(b"unacked-%d" % i), 30.0)
                                               for i in range(4))))

        sends = asyncio.run_coroutine_threadsafe(send_unacked(), loop.loop)
        cluster.wait_for(lambda: master.commitlog.max_offset > confirmed, 10.0,
                         what="the unacknowledged sends stored on the master")
        # A consumer long-polls at the end of what it has read.
        held = asyncio.run_coroutine_threadsafe(client.request(_pull(1, 5000), 15.0), loop.loop)

        # The master learns of a newer epoch and steps down.
        epoch = master.replicas.master_epoch
        loop.run(master.become_slave(2, slave.address, epoch + 1), 30)

        answers = sends.result(30)
        assert all(a.code != ResponseCode.SUCCESS for a in answers), [a.code for a in answers]
        pulled = held.result(30)
        assert b"unacked" not in pulled.body, "a consumer was served records no replica confirmed"
        assert pulled.code == ResponseCode.PULL_NOT_FOUND, (pulled.code, pulled.remark)
        # Neither side running counts as "the last confirm learned", never the log's end.
        assert master.replication.confirm_offset() <= confirmed < master.commitlog.max_offset
    finally:
        loop.run(client.close(), 10)
        loop.run(master.stop(), 30)
        proxy.stop()

    # A restart (fenced until its role is known) serves up to the persisted confirm only.
    assert ConfirmCheckpoint(tmp_path / "master-store").offset == confirmed


def test_shrunk_set_does_not_satisfy_min_in_sync_replicas(tmp_path) -> None:
    """Sends waiting on {1, 2} when the set shrinks to {1} are not acknowledged with one copy."""
    cfg = fast_config(ha_housekeeping_interval_ms=600, ha_max_time_slave_not_catchup_ms=500,
                      check_sync_state_set_period_ms=50, all_ack_in_sync_state_set=True,
                      min_in_sync_replicas=2)
    with replica_stores(tmp_path, 4 << 20, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)

        async def run() -> None:
            m = ha_master(mcl, mem, cfg, sync_state_set=[1, 2], sync_state_set_epoch=1,
                          alter_sync_state_set=_always_accept)
            async with master_running(m) as port:
                proxy = TcpProxy("127.0.0.1", port)
                proxy.start()
                try:
                    async with slave_running(ha_slave(scl, sem, proxy.port, cfg)):
                        end = fill(mcl, 50_000, seed=1)
                        assert await m.sync.wait_for_copies(end, 10.0)
                        assert m.sync.copies_of(end) == 2
                        proxy.cut("blackhole")
                        end2 = fill(mcl, 50_000, seed=2)
                        waiting = asyncio.ensure_future(m.sync.wait_for_copies(end2, 5.0))
                        await wait_until_async(lambda: m.sync_state_set == {1}, 10, "shrink to {1}")
                        # All of the (now one-member) set holds it, but one copy is not two.
                        assert await waiting is False
                        assert m.sync.copies_of(end2) == 1
                        # in_sync_replicas below the floor is raised to it as well.
                        m.config.all_ack_in_sync_state_set = False
                        assert await m.sync.wait_for_copies(end2, 0.2) is False
                finally:
                    proxy.stop()

        asyncio.run(run())


_set_epoch = [1]


async def _always_accept(ids: list[int]) -> tuple[list[int], int]:
    """A controller that applies every proposed set."""
    _set_epoch[0] += 1
    return list(ids), _set_epoch[0]
