"""Repeated master kills: every failover moves the role on with epoch + 1.

Three brokers; the master is SIGKILLed and restarted five times, with writes in between.
Every new master's epoch map ends with its new epoch starting at its max offset, epochs
never repeat, the name server lists exactly one id 0 (the controller's master), and the
restarted old masters come back as slaves under their own ids.
"""
from __future__ import annotations


from rmqha.protocol.codes import RequestCode, ResponseCode



def send(cluster, b):
    ext = {"producerGroup": "pg", "topic": "T", "queueId": 0, "sysFlag": 0, "bornTimestamp": "1", "flag": 0,
           "properties": "", "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}
    return cluster.request(b.address, RequestCode.SEND_MESSAGE, ext, b"x" * 100)


def test_five_failovers_move_the_role_with_increasing_epochs(cluster):
    cluster.start_controllers(1)
    ns = cluster.start_namesrv()
    brokers = [cluster.start_broker("broker-a") for _ in range(3)]
    cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [1, 2, 3], timeout=30,
                     what="SyncStateSet {1, 2, 3}")
    seen_epochs: list[int] = []
    for round_no in range(5):
        master = cluster.wait_for(lambda: cluster.master_of("broker-a"), what="a master")
        cluster.wait_for(lambda: cluster.broker_role(master) == "master", what="the master to take its role")
        epoch = cluster.replica_info("broker-a").master_epoch
        assert not seen_epochs or epoch > seen_epochs[-1]
        seen_epochs.append(epoch)
        for _ in range(3):
            assert send(cluster, master).code == ResponseCode.SUCCESS
        written = cluster.broker_status(master)["maxOffset"]
        others = [b for b in brokers if b is not master]
        cluster.wait_for(lambda: all(cluster.broker_status(b)["maxOffset"] == written for b in others), timeout=30,
                         what=f"round {round_no}: slaves caught up")
        cluster.wait_for(lambda: cluster.replica_info("broker-a").sync_state_set == [1, 2, 3], timeout=30,
                         what=f"round {round_no}: everyone in sync")
        master.kill()
        new = cluster.wait_for(lambda: (m := cluster.master_of("broker-a")) is not None and m is not master and m,
                               what=f"round {round_no}: a new master")
        cluster.wait_for(lambda: cluster.broker_role(new) == "master", what=f"round {round_no}: role taken")
        new_epoch = cluster.replica_info("broker-a").master_epoch
        assert new_epoch == epoch + 1, f"round {round_no}: epoch {epoch} -> {new_epoch}\n{cluster.describe()}"
        entries = cluster.broker_epochs(new)["epochList"]
        assert (entries[-1]["epoch"], entries[-1]["startOffset"]) == (new_epoch, written)
        assert [e["epoch"] for e in entries] == sorted({e["epoch"] for e in entries})
        cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"].get("0") == new.address,
                         what=f"round {round_no}: name server id 0")
        master.start()
        cluster.wait_for(lambda: cluster.broker_role(master) == "slave", timeout=30,
                         what=f"round {round_no}: old master back as slave")
        zeros = [k for k in cluster.group_route("broker-a", ns)["brokerAddrs"] if k == "0"]
        assert zeros == ["0"]
    assert len(set(seen_epochs)) == 5
