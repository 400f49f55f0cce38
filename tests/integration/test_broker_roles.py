"""Broker roles with real processes: fencing, master election, failover, stale notices, name server.

The broker side of RocketMQ's ReplicasManager: a slave becomes master with epoch + 1 when
the master is killed and its epoch map records it; the name server lists the new master as
id 0; a notice older than the held epoch changes nothing; a broker whose role is not
confirmed (fenced) or that is a slave refuses writes with SERVICE_NOT_AVAILABLE, and so
does a master whose lease from the controller ran out, until it is renewed.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any


from cluster import BrokerProc, Cluster
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.security.channel_auth import key_from_text
from rmqha.security.identity import Identity, Role

OPEN_END = (1 << 63) - 1



def role(cluster: Cluster, b: BrokerProc) -> str | None:
    return cluster.broker_role(b)


def send(cluster: Cluster, b: BrokerProc):
    """A SEND_MESSAGE as the C++ client sends it (V1 header)."""
    ext = {"producerGroup": "pg", "topic": "T", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
           "queueId": 0, "sysFlag": 0, "bornTimestamp": "1", "flag": 0, "properties": "",
           "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}
    return cluster.request(b.address, RequestCode.SEND_MESSAGE, ext, b"hello")


def notify(cluster: Cluster, b: BrokerProc, ext: dict[str, Any], body: Any) -> RemotingCommand:
    """A role notice as a controller sends one: signed, over a channel it dialled as a
    controller (a broker holding the secret takes notices no other way)."""
    assert cluster.cluster_secret is not None
    key = key_from_text(cluster.cluster_secret, Identity.controller("test"), (Role.BROKER,))
    cmd = cluster.auth.sign(RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body))

    async def ask() -> RemotingCommand:
        client = RemotingClient(b.address, connect_timeout=2.0, security=ClientSecurity().with_channel(key))
        try:
            return await client.request(cmd, 3.0)
        finally:
            await client.close()
    return asyncio.run(ask())


def start_group(cluster: Cluster, n: int, group: str = "broker-a") -> list[BrokerProc]:
    return cluster.start_group(group, n)


def test_master_kill_elects_a_slave_with_the_next_epoch(cluster):
    cluster.start_controllers(1)
    ns = cluster.start_namesrv()
    a, b, c = start_group(cluster, 3)
    info = cluster.replica_info("broker-a")
    assert info.master_id == 1 and info.master_address == a.address
    first_epoch = info.master_epoch
    assert cluster.broker_epochs(a)["epochList"][-1]["epoch"] == first_epoch
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"]
                     == {"0": a.address, "2": b.address, "3": c.address},
                     what="name server: master as id 0, slaves under their ids")
    # Slaves are only electable once they are in the SyncStateSet (HA caught up).
    cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [1, 2, 3], timeout=30,
                     what="SyncStateSet {1, 2, 3}")
    for _ in range(5):
        assert send(cluster, a).code == ResponseCode.SUCCESS
    written = cluster.broker_status(a)["maxOffset"]
    assert written > 0
    cluster.wait_for(lambda: all(cluster.broker_status(x)["maxOffset"] == written for x in (b, c)),
                     what="slaves to hold everything the master wrote")

    a.kill()
    new_master = cluster.wait_for(lambda: cluster.master_of("broker-a"), what="a new master")
    assert new_master in (b, c)
    other = c if new_master is b else b
    info = cluster.replica_info("broker-a")
    assert info.master_epoch == first_epoch + 1
    cluster.wait_for(lambda: role(cluster, new_master) == "master", what="the new master to take the role")
    epochs = cluster.broker_epochs(new_master)
    assert epochs["brokerId"] == 0
    # The old term's entry ends where the new master's term starts: at everything replicated.
    assert [(e["epoch"], e["startOffset"]) for e in epochs["epochList"]] == [(first_epoch, 0), (first_epoch + 1, written)]
    assert epochs["epochList"][0]["endOffset"] == written
    assert epochs["epochList"][-1]["endOffset"] == OPEN_END
    status = cluster.broker_status(new_master)
    assert status["masterEpoch"] == first_epoch + 1 and status["lastEpoch"] == first_epoch + 1
    cluster.wait_for(lambda: cluster.broker_status(other)["masterAddress"] == new_master.address,
                     what="the other slave to follow the new master")
    assert role(cluster, other) == "slave"
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"].get("0") == new_master.address,
                     what="name server to list the new master as id 0")
    routes = cluster.group_route("broker-a", ns)
    assert a.address not in routes["brokerAddrs"].values()
    assert routes["masterEpoch"] == first_epoch + 1

    # The old master comes back as a slave of the new one, under its own id.
    a.start()
    cluster.wait_for(lambda: role(cluster, a) == "slave", what="the old master to rejoin as slave")
    assert cluster.broker_status(a)["masterAddress"] == new_master.address
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"].get("1") == a.address,
                     what="name server to list the old master as id 1")


def test_stale_role_notification_is_ignored(cluster):
    cluster.start_controllers(1)
    a, b = start_group(cluster, 2)
    epoch = cluster.replica_info("broker-a").master_epoch
    before = cluster.broker_status(b)
    # An old notice (epoch - 1) naming the slave itself as master, and one at the held epoch
    # naming another master: neither may change anything.
    for notice_epoch, master_id, master_addr in ((epoch - 1, 2, b.address), (epoch, 2, b.address)):
        resp = notify(cluster, b, {"masterAddress": master_addr, "masterEpoch": notice_epoch,
                                   "syncStateSetEpoch": 99, "masterBrokerId": master_id},
                      {"syncStateSet": [2], "syncStateSetEpoch": 99})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    after = cluster.broker_status(b)
    assert after["role"] == "slave" and after["masterAddress"] == a.address
    assert after["masterEpoch"] == before["masterEpoch"] == epoch
    assert after["staleNoticesIgnored"] == before["staleNoticesIgnored"] + 2
    assert b.log_contains("ignoring stale notification")
    # The master ignores an old notice naming the slave as master too.
    resp = notify(cluster, a, {"masterAddress": b.address, "masterEpoch": epoch - 1, "masterBrokerId": 2}, b"")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert role(cluster, a) == "master"
    assert cluster.broker_epochs(a)["epochList"][-1]["epoch"] == epoch


def rmqha_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "rmqha", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_slave_refuses_writes_naming_the_master_and_the_cli_shows_both(cluster):
    cluster.start_controllers(1)
    a, b = start_group(cluster, 2)
    resp = send(cluster, b)
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert a.address in resp.remark
    # The refusal names the master in an ext field too (clients re-route without the name server).
    assert resp.ext_fields == {"masterAddress": a.address}
    assert send(cluster, a).code == ResponseCode.SUCCESS
    epoch = cluster.replica_info("broker-a").master_epoch

    out = rmqha_cli("get-broker-epoch", "-b", a.address)
    max_offset = cluster.broker_status(a)["maxOffset"]
    assert "#brokerId\t0" in out
    assert f"#Epoch: EpochEntry{{epoch={epoch}, startOffset=0, endOffset={max_offset}}}" in out
    out = rmqha_cli("ha-status", "-b", b.address)
    assert "#Role\tslave" in out and f"#MasterAddr\t{a.address}" in out
    status = json.loads(rmqha_cli("haStatus", "-b", a.address, "--json"))
    assert status["role"] == "master" and status["controllerBrokerId"] == 1
    assert "ha" in status


def test_sigterm_stops_cleanly_and_unregisters(cluster):
    cluster.start_controllers(1)
    ns = cluster.start_namesrv()
    a, b = start_group(cluster, 2)
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"] == {"0": a.address, "2": b.address},
                     what="both registered")
    assert b.stop() == 0
    assert cluster.group_route("broker-a", ns)["brokerAddrs"] == {"0": a.address}
    assert cluster.broker_epochs(a)["brokerId"] == 0


def test_fenced_until_a_role_is_confirmed(cluster):
    """A broker whose group has no electable master stays fenced: no writes, no name-server entry."""
    cluster.start_controllers(1)
    ns = cluster.start_namesrv()
    a = cluster.start_broker("broker-a")
    cluster.wait_for(lambda: role(cluster, a) == "master", what="a to be master")
    a.kill()
    cluster.wait_for(lambda: cluster.replica_info("broker-a").master_id is None, what="the controller to see a dead")
    b = cluster.start_broker("broker-a")  # id 2, not in the SyncStateSet {1}: not electable
    cluster.wait_for(lambda: b.broker_id() == 2, what="b to get id 2")
    assert role(cluster, b) == "fenced"
    resp = send(cluster, b)
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and "fenced" in resp.remark
    assert cluster.group_route("broker-a", ns)["brokerAddrs"] == {}

    a.start()  # the only SyncStateSet member comes back: elected, b follows it
    cluster.wait_for(lambda: role(cluster, a) == "master", what="a to be master again")
    cluster.wait_for(lambda: role(cluster, b) == "slave", what="b to leave the fenced state")
    assert cluster.replica_info("broker-a").master_epoch >= 2
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"] == {"0": a.address, "2": b.address},
                     what="both brokers in the name server")


def test_restart_on_a_new_port_keeps_the_id_and_the_sync_state_set_place(cluster):
    cluster.start_controllers(1)
    a, b = start_group(cluster, 2)
    cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [1, 2], timeout=30,
                     what="SyncStateSet {1, 2}")
    old = b.address
    b.restart_on_new_port()
    cluster.wait_broker_up(b)
    assert b.broker_id() == 2 and b.address != old
    cluster.wait_for(lambda: role(cluster, b) == "slave", what="b back as slave")
    cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [1, 2], timeout=30,
                     what="b in the SyncStateSet under its id")
    members = {r["brokerId"]: r["brokerAddress"] for r in cluster.sync_state_data("broker-a")["inSyncReplicas"]}
    assert members == {1: a.address, 2: b.address}


def test_master_reelected_after_a_pause_appends_a_new_epoch_and_keeps_serving(cluster):
    """A lone master frozen past its heartbeat timeout loses the role on the controller
    (no live candidate: master none, epoch + 1); once it runs again it asks for an election,
    wins at epoch + 2 while still master, and records that epoch at its current max offset."""
    cluster.start_controllers(1)
    ns = cluster.start_namesrv()
    a = cluster.start_broker("broker-a")
    cluster.wait_for(lambda: role(cluster, a) == "master", what="a to be master")
    for _ in range(3):
        assert send(cluster, a).code == ResponseCode.SUCCESS
    written = cluster.broker_status(a)["maxOffset"]
    epoch = cluster.replica_info("broker-a").master_epoch
    a.pause()
    try:
        cluster.wait_for(lambda: cluster.replica_info("broker-a").master_id is None, timeout=15,
                         what="the controller to drop the frozen master")
    finally:
        a.resume()
    cluster.wait_for(lambda: cluster.replica_info("broker-a").master_id == 1, what="a re-elected")
    new_epoch = cluster.replica_info("broker-a").master_epoch
    assert new_epoch == epoch + 2
    cluster.wait_for(lambda: cluster.broker_status(a)["masterEpoch"] == new_epoch, what="a to take the new epoch")
    assert role(cluster, a) == "master"
    pairs = [(e["epoch"], e["startOffset"]) for e in cluster.broker_epochs(a)["epochList"]]
    assert pairs == [(epoch, 0), (new_epoch, written)]
    assert a.log_contains("re-elected master of broker-a")
    # Serving again; on a starved machine a heartbeat answer can come after the test
    # timers' 1.4 s lease, and a send meets the lapse (SERVICE_NOT_AVAILABLE, retried).
    cluster.wait_for(lambda: send(cluster, a).code == ResponseCode.SUCCESS, timeout=20,
                     what="a send to the re-elected master to be acked")
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["masterEpoch"] == new_epoch,
                     what="name server to see the new epoch")


def test_controller_leader_change_keeps_roles_and_still_fails_over(cluster):
    """Brokers heartbeat every controller (RocketMQ #5712): a new controller leader already
    knows who is alive, keeps the master, and elects a slave when the master dies."""
    cluster.start_controllers(3)
    a, b = start_group(cluster, 2)
    cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [1, 2], timeout=30,
                     what="SyncStateSet {1, 2}")
    epoch = cluster.replica_info("broker-a").master_epoch
    leader = cluster.controller_leader()
    leader_proc = next(c for c in cluster.controllers if c.address == leader)
    leader_proc.kill()
    cluster.wait_for(lambda: cluster.controller_leader() not in (None, leader), what="a new controller leader")
    # Past the new leader's heartbeat grace period the master must still be the master.
    cluster.wait_for(lambda: cluster.controller_request(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=["broker-a"])
                     .code == ResponseCode.SUCCESS, what="the new leader to answer")
    # Through and past the new leader's heartbeat grace period (0.8 s) nothing changes.
    def same_master() -> bool:
        info = cluster.replica_info("broker-a")
        # No answer (the asked controller was not the leader at that moment) says nothing
        # about the roles; an answer must show the same master at the same epoch.
        return info is None or (info.master_id, info.master_epoch) == (1, epoch)

    cluster.holds(same_master, 2.0, what="master 1 at the same epoch under the new leader")
    alive = {r["brokerId"]: r["alive"] for r in cluster.sync_state_data("broker-a")["inSyncReplicas"]}
    assert alive == {1: True, 2: True}
    a.kill()
    cluster.wait_for(lambda: cluster.master_of("broker-a") is b, what="b elected by the new leader")
    assert cluster.replica_info("broker-a").master_epoch == epoch + 1
    cluster.wait_for(lambda: role(cluster, b) == "master", what="b to take the role")


def test_master_cut_off_from_the_controller_fences_itself_and_unfences_at_the_same_epoch(cluster):
    """Issue 13.1: the master's heartbeats dropped (a blackholing proxy in front of the
    controller) for longer than its lease but shorter than the heartbeat timeout: it refuses
    writes (MASTER_LEASE_EXPIRED, a code clients retry elsewhere on) and says so in
    ha-status; once its heartbeats pass again it is renewed and writes at the same epoch."""
    from tcp_proxy import TcpProxy

    # The controller applies at most its own broker_heartbeat_timeout to the broker's ask.
    cluster.start_controllers(1, broker_heartbeat_timeout=6000)
    host, _, port = cluster.controller_addresses[0].rpartition(":")
    proxy = TcpProxy(host, int(port))
    proxy.start()
    try:
        # A 1 s lease against a 6 s heartbeat timeout: 5 s in which no election can happen.
        (a,) = cluster.start_group("broker-a", 1, controller_addr=[f"127.0.0.1:{proxy.port}"],
                                   controller_heartbeat_timeout_ms=6000, master_lease_ms=1000)
        cluster.wait_for(lambda: cluster.broker_status(a)["acceptingWrites"], what="the master's first lease")
        epoch = cluster.broker_status(a)["masterEpoch"]
        assert send(cluster, a).code == ResponseCode.SUCCESS

        proxy.cut("blackhole")
        cluster.wait_for(lambda: cluster.broker_status(a)["leaseFenced"], what="the lease to run out")
        resp = send(cluster, a)
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert resp.ext_fields.get("putStatus") == "MASTER_LEASE_EXPIRED", resp.remark
        st = cluster.broker_status(a)
        assert st["role"] == "master" and not st["acceptingWrites"]
        assert st["masterLease"]["expiries"] >= 1 and st["masterLease"]["remainingMs"] == 0

        proxy.restore()
        cluster.wait_for(lambda: cluster.broker_status(a)["acceptingWrites"], what="the lease renewed")
        st = cluster.broker_status(a)
        assert (st["role"], st["masterEpoch"]) == ("master", epoch)  # no election happened
        assert send(cluster, a).code == ResponseCode.SUCCESS
        assert cluster.replica_info("broker-a").master_epoch == epoch
    finally:
        proxy.stop()
