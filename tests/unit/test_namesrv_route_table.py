"""The name server's route table: ids, id-0 conflicts, expiry, route shapes (pure logic)."""
from __future__ import annotations

import json

from rmqha.namesrv.route_table import BrokerRegistration, RouteTable, TopicConfig


def reg(addr: str, broker_id: int, epoch: int = 1, group: str = "g1", topics: tuple[str, ...] = ("T",),
        cluster: str = "c1") -> BrokerRegistration:
    return BrokerRegistration(
        cluster=cluster, broker_name=group, broker_addr=addr, broker_id=broker_id,
        ha_addr=addr.rsplit(":", 1)[0] + ":" + str(int(addr.rsplit(":", 1)[1]) + 1), master_epoch=epoch,
        topics={t: TopicConfig(t, 4, 4) for t in topics},
    )


def test_master_is_id_zero_and_slaves_keep_their_ids():
    rt = RouteTable()
    assert rt.register(reg("127.0.0.1:1000", 0), 0).accepted
    assert rt.register(reg("127.0.0.1:2000", 2), 0).master_addr == "127.0.0.1:1000"
    data = rt.broker_data("g1")
    assert data == {"cluster": "c1", "brokerName": "g1", "brokerAddrs": {"0": "127.0.0.1:1000", "2": "127.0.0.1:2000"}}
    group = rt.group_route("g1")
    assert group["haAddrs"] == {"0": "127.0.0.1:1001", "2": "127.0.0.1:2001"}
    assert group["masterEpoch"] == 1 and group["masterAddr"] == "127.0.0.1:1000"


def test_two_claims_on_id_zero_higher_master_epoch_wins():
    rt = RouteTable()
    rt.register(reg("127.0.0.1:1000", 0, epoch=1), 0)
    rt.register(reg("127.0.0.1:2000", 2, epoch=1), 0)
    # The slave was elected (epoch 2) while the old master still renews as id 0.
    assert rt.register(reg("127.0.0.1:2000", 0, epoch=2), 10).accepted
    assert rt.broker_data("g1")["brokerAddrs"] == {"0": "127.0.0.1:2000"}
    stale = rt.register(reg("127.0.0.1:1000", 0, epoch=1), 20)
    assert not stale.accepted
    assert stale.master_addr == "127.0.0.1:2000"
    assert "epoch 1 < 2" in stale.reason
    assert rt.broker_data("g1")["brokerAddrs"] == {"0": "127.0.0.1:2000"}
    # Once it learns its role it registers as a slave under its own id.
    assert rt.register(reg("127.0.0.1:1000", 1, epoch=2), 30).accepted
    assert rt.broker_data("g1")["brokerAddrs"] == {"0": "127.0.0.1:2000", "1": "127.0.0.1:1000"}


def test_equal_epoch_id_zero_reclaim_replaces_and_dead_master_never_resurfaces():
    rt = RouteTable(broker_expire_ms=100)
    rt.register(reg("127.0.0.1:1000", 0, epoch=3), 0)
    rt.register(reg("127.0.0.1:2000", 0, epoch=4), 50)
    # The epoch-3 entry was dropped, not shadowed: when the epoch-4 master expires there is no id 0.
    rt.expire(200)
    assert rt.broker_data("g1") is None


def test_restart_on_new_port_replaces_the_old_address_of_the_same_id():
    rt = RouteTable()
    rt.register(reg("127.0.0.1:1000", 0), 0)
    rt.register(reg("127.0.0.1:2000", 2), 0)
    rt.register(reg("127.0.0.1:3000", 2), 5)
    assert rt.broker_data("g1")["brokerAddrs"] == {"0": "127.0.0.1:1000", "2": "127.0.0.1:3000"}


def test_expiry_drops_only_silent_brokers():
    rt = RouteTable(broker_expire_ms=120_000)
    rt.register(reg("127.0.0.1:1000", 0), 0)
    rt.register(reg("127.0.0.1:2000", 1), 0)
    rt.register(reg("127.0.0.1:2000", 1), 100_000)  # renewed
    dropped = rt.expire(120_001)
    assert [r.broker_addr for r in dropped] == ["127.0.0.1:1000"]
    assert rt.broker_data("g1")["brokerAddrs"] == {"1": "127.0.0.1:2000"}
    assert rt.expire(220_001)[0].broker_addr == "127.0.0.1:2000"
    assert rt.group_names() == []


def test_topic_route_shape_for_the_cpp_client():
    rt = RouteTable()
    rt.register(reg("127.0.0.1:1000", 0, group="g1", topics=("T", "X")), 0)
    rt.register(reg("127.0.0.1:1100", 1, group="g1", topics=("T",)), 0)
    rt.register(reg("127.0.0.1:2000", 0, group="g2", topics=("T",), cluster="c1"), 0)
    route = rt.topic_route("T")
    text = json.dumps(route)
    back = json.loads(text)
    assert [q["brokerName"] for q in back["queueDatas"]] == ["g1", "g2"]
    for q in back["queueDatas"]:
        # jsoncpp asInt(): these must be JSON numbers, never strings.
        assert all(isinstance(q[k], int) for k in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"))
    assert back["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:1000", "1": "127.0.0.1:1100"}
    assert back["brokerDatas"][1]["brokerAddrs"] == {"0": "127.0.0.1:2000"}
    assert rt.topic_route("X")["queueDatas"][0]["brokerName"] == "g1"
    assert rt.topic_route("nope") is None


def test_master_topic_config_wins_over_a_slave():
    rt = RouteTable()
    slave = reg("127.0.0.1:1100", 1)
    slave.topics = {"T": TopicConfig("T", 2, 2)}
    rt.register(slave, 0)
    master = reg("127.0.0.1:1000", 0)
    master.topics = {"T": TopicConfig("T", 8, 8)}
    rt.register(master, 0)
    assert rt.topic_route("T")["queueDatas"][0]["readQueueNums"] == 8


def test_cluster_info():
    rt = RouteTable()
    rt.register(reg("127.0.0.1:1000", 0, group="g1"), 0)
    rt.register(reg("127.0.0.1:2000", 0, group="g2"), 0)
    info = rt.cluster_info()
    assert info["clusterAddrTable"] == {"c1": ["g1", "g2"]}
    assert set(info["brokerAddrTable"]) == {"g1", "g2"}
