"""Persistent unique broker ids with real controller, name server and broker processes.

Broker ids: first start gets 1, 2, 3; restarts keep the id; a new port keeps the id and
updates the controller's address; every crash window of the id negotiation (failpoints)
resumes to one unique id; a foreign identity file is refused.
"""
from __future__ import annotations

import pytest

from cluster import BrokerProc, Cluster, port_open
from rmqha.failpoints import FAILPOINT_EXIT_CODE, Failpoint
from rmqha.broker.identity import META_FILE, TEMP_META_FILE



def registered_ids(cluster: Cluster, group: str) -> dict[int, str]:
    """Controller's broker id -> address for a group (GET_SYNC_STATE_DATA)."""
    data = cluster.sync_state_data(group)
    out: dict[int, str] = {}
    for key in ("inSyncReplicas", "notInSyncReplicas"):
        for rep in data.get(key, []):
            out[int(rep["brokerId"])] = rep["brokerAddress"]
    return out


def wait_id(cluster: Cluster, broker: BrokerProc, timeout: float = 20.0) -> int:
    return cluster.wait_for(broker.broker_id, timeout, what=f"{broker.name} to settle its id", process=broker)


def test_ids_are_1_2_3_and_survive_restarts_and_new_ports(cluster):
    cluster.start_controllers(1)
    ns = cluster.start_namesrv()
    brokers = [cluster.start_broker("broker-a") for _ in range(3)]
    ids = [wait_id(cluster, b) for b in brokers]
    assert sorted(ids) == [1, 2, 3]
    # First started, first id: the flow is sequential per broker.
    assert ids[0] == 1
    cluster.wait_for(lambda: registered_ids(cluster, "broker-a") == {b.broker_id(): b.address for b in brokers},
                     what="controller to record all three addresses")

    # Kill everything but the controller and start again: same ids, no new ones.
    for b in brokers:
        b.kill()
    for b in brokers:
        b.start()
    for b in brokers:
        cluster.wait_broker_up(b)
    assert [b.broker_id() for b in brokers] == ids
    cluster.wait_for(lambda: set(registered_ids(cluster, "broker-a")) == {1, 2, 3},
                     what="the same three ids registered")

    # A restart on a new port keeps the id; the controller and the name server follow the address.
    moved = brokers[1]
    old_addr = moved.address
    moved.restart_on_new_port()
    assert moved.address != old_addr
    cluster.wait_broker_up(moved)
    assert moved.broker_id() == ids[1]
    cluster.wait_for(lambda: registered_ids(cluster, "broker-a").get(ids[1]) == moved.address,
                     what="controller to record the new address")
    assert set(registered_ids(cluster, "broker-a")) == {1, 2, 3}

    def ns_has_new_address() -> bool:
        addrs = cluster.group_route("broker-a", ns)["brokerAddrs"]
        return moved.address in addrs.values() and old_addr not in addrs.values()

    cluster.wait_for(ns_has_new_address, what="name server to list the new address only")


# Each crash window of the negotiation, with what the restart must find on disk.
WINDOWS = [
    (Failpoint.AFTER_GET_NEXT_BROKER_ID, set()),
    (Failpoint.DURING_TEMP_META_WRITE, {TEMP_META_FILE + ".tmp"}),
    (Failpoint.AFTER_TEMP_META_WRITTEN, {TEMP_META_FILE}),
    (Failpoint.AFTER_APPLY_BROKER_ID, {TEMP_META_FILE}),
    (Failpoint.AFTER_META_WRITTEN, {META_FILE, TEMP_META_FILE}),
    (Failpoint.AFTER_TEMP_META_REMOVED, {META_FILE}),
    (Failpoint.AFTER_REGISTER_BROKER, {META_FILE}),
    (Failpoint.AFTER_MASTER_EPOCH_APPENDED, {META_FILE}),
]


def test_every_failpoint_window_resumes_to_one_unique_id(cluster):
    """One group per window, crashed at once in parallel; each resumes to id 1 and the next
    broker of the group gets 2 (no id used twice, none skipped)."""
    cluster.start_controllers(1)
    crashed: list[tuple[Failpoint, set[str], BrokerProc]] = []
    for point, files in WINDOWS:
        group = "fp-" + point.value.replace("_", "-")
        b = cluster.start_broker(group, wait=False, env={"RMQHA_FAILPOINTS": point.value})
        crashed.append((point, files, b))
    for point, files, b in crashed:
        rc = b.wait_exit(30)
        assert rc == FAILPOINT_EXIT_CODE, f"{b.name} exited {rc}, not by failpoint {point.value}\n{b.log_tail()}"
        assert f"failpoint {point.value} hit" in b.log_text()
        meta_files = {p.name for p in b.store_dir.iterdir() if p.name.startswith(".broker.meta")}
        assert meta_files == files, f"{point.value}: {meta_files} on disk, expected {files}"

    for _, _, b in crashed:
        b.start()
    for point, _, b in crashed:
        assert wait_id(cluster, b) == 1, f"{point.value}: resumed to id {b.broker_id()}"
        cluster.wait_broker_up(b)
        assert not (b.store_dir / TEMP_META_FILE).exists(), f"{point.value}: temp file left after resume"
        assert not (b.store_dir / (TEMP_META_FILE + ".tmp")).exists()

    seconds = [cluster.start_broker(b.group, wait=False) for _, _, b in crashed]
    for (point, _, b), second in zip(crashed, seconds):
        assert wait_id(cluster, second) == 2, f"{point.value}: next broker got {second.broker_id()}"
    for _, _, b in crashed:
        assert set(registered_ids(cluster, b.group)) == {1, 2}


def test_refused_apply_starts_over_with_the_next_id(cluster):
    """A crashes holding a temp file for id 1; B takes id 1; A's retry is refused, A gets 2."""
    cluster.start_controllers(1)
    a = cluster.start_broker("broker-a", wait=False, env={"RMQHA_FAILPOINTS": Failpoint.AFTER_TEMP_META_WRITTEN.value})
    assert a.wait_exit(30) == FAILPOINT_EXIT_CODE
    assert (a.store_dir / TEMP_META_FILE).read_text().split("#")[2] == "1"
    b = cluster.start_broker("broker-a")
    assert wait_id(cluster, b) == 1
    a.start()
    assert wait_id(cluster, a) == 2
    assert "refused broker id 1" in a.log_text()
    assert registered_ids(cluster, "broker-a").keys() == {1, 2}


def test_foreign_identity_is_refused_and_never_registered(cluster):
    cluster.start_controllers(1)
    b = cluster.add_broker("broker-a")
    b.store_dir.mkdir(parents=True)
    (b.store_dir / META_FILE).write_text("OtherCluster#broker-z#7")
    b.start()
    rc = b.wait_exit(30)
    assert rc != 0
    text = b.log_text()
    for value in ("'OtherCluster'", "'broker-z'", repr(cluster.cluster_name), "'broker-a'"):
        assert value in text, f"{value} not named in the error"
    assert not port_open(b.address)
    assert cluster.replica_info("broker-a") is None
    assert cluster.replica_info("broker-z") is None


@pytest.mark.parametrize("victim", ["master", "slave"])
def test_an_id_held_by_a_live_broker_cannot_be_taken(cluster, victim):
    """A copied ``.broker.meta`` (or a whole copied store) naming a live broker's id: the
    controller refuses the newcomer, naming both addresses; the id keeps its address, the
    group keeps one master and its replication links."""
    cluster.start_controllers(1)
    master, slave = cluster.start_group("broker-a", 2, in_sync=True)
    held = master if victim == "master" else slave
    held_id = held.broker_id()
    before = registered_ids(cluster, "broker-a")
    sessions = cluster.broker_status(slave).get("ha", {}).get("sessions")

    impostor = cluster.add_broker("broker-a")
    impostor.store_dir.mkdir(parents=True, exist_ok=True)
    (impostor.store_dir / META_FILE).write_text((held.store_dir / META_FILE).read_text())
    impostor.start()
    code = impostor.wait_exit(30)
    assert code != 0
    text = impostor.log_text()
    assert held.address in text and impostor.address in text, impostor.log_tail()
    assert f"broker id {held_id}" in text

    # Nothing moved: same addresses, same master, the slave's link was never replaced.
    assert registered_ids(cluster, "broker-a") == before
    info = cluster.replica_info("broker-a")
    assert info.master_id == master.broker_id() and info.master_address == master.address
    assert cluster.broker_role(master) == "master" and cluster.broker_role(slave) == "slave"
    assert cluster.broker_status(slave).get("ha", {}).get("sessions") == sessions
    assert sorted(info.sync_state_set) == sorted([master.broker_id(), slave.broker_id()])

    # Once the holder is gone (its connection closed), the same store may take the id at a
    # new address: a rescheduled broker is not an impostor.
    if victim == "slave":
        held.kill()
        impostor.start()
        cluster.wait_role(impostor, "slave", 30)
        assert impostor.broker_id() == held_id
        cluster.wait_for(lambda: registered_ids(cluster, "broker-a").get(held_id) == impostor.address,
                         what="the id re-pointed to the new address")
