"""mqadmin (rocketmq-tools 5.5.0, ``MQAdminStartup``) against rmqha, plaintext and TLS + ACL.

Every command of issue 35's list runs through the real tool (one JVM per module, see
:mod:`mqadmin_session`) against the shared ``interop_cluster``; each test asserts on what
the tool printed and checks the effect from rmqha's side (routes, topic and group
configs, offsets, the controllers' view).  The commands rmqha refuses
(``updateBrokerConfig``; ``electMaster`` and ``cleanBrokerMetadata``, unsigned control
requests) must print rmqha's reason and change nothing.  The results are tabled in
docs/compatibility.md.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from interop_cluster import CLUSTER_NAME, GROUP, InteropCluster, Mode
from mqadmin_session import MqAdmin

from rmqha.client.blocking_producer import BlockingProducer
from rmqha.client.consumer import BlockingConsumer
from rmqha.client.model import Message
from rmqha.client.transaction import LocalTransactionState
from rmqha.protocol.codes import RequestCode, ResponseCode


@pytest.fixture(scope="module")
def mqadmin(interop_cluster: InteropCluster) -> Iterator[MqAdmin]:
    session = MqAdmin(interop_cluster)
    try:
        yield session
    finally:
        session.close()


def _options(target: InteropCluster) -> dict[str, Any]:
    """rmqha's own clients as the operator (admin account and certificate in tls-acl)."""
    return target.admin_options()


def _broker_request(target: InteropCluster, code: int, ext: dict[str, Any] | None = None) -> Any:
    return target.cluster.request(target.master().address, code, ext or {}, b"", timeout=5.0)


def test_cluster_list_and_broker_status(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    ns, master = interop_cluster.namesrv, interop_cluster.master()
    out = mqadmin.run("clusterList", "-n", ns)
    assert "Exception" not in out.err, out
    rows = [r for r in out.rows() if r[0] == CLUSTER_NAME]
    by_addr = {r[3]: r for r in rows}
    assert set(by_addr) == {b.address for b in interop_cluster.brokers}, out
    assert by_addr[master.address][1:3] == [GROUP, "0"], out      # the master is BID 0
    assert by_addr[master.address][-1] == "true", out              # #ACTIVATED
    assert "rmqha" in by_addr[master.address][4], out              # #Version
    status = mqadmin.run("brokerStatus", "-n", ns, "-b", master.address)
    table = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in status.out.splitlines()) if _}
    assert table["brokerActive"] == "true", status
    assert "putTps" in table and "commitLogDirCapacity" in table, status


@pytest.mark.parametrize("message_type", ["NORMAL", "FIFO", "DELAY", "TRANSACTION"])
def test_update_topic_with_message_type(interop_cluster: InteropCluster, mqadmin: MqAdmin, message_type: str) -> None:
    ns, topic = interop_cluster.namesrv, f"admin-{message_type.lower()}"
    out = mqadmin.run("updateTopic", "-n", ns, "-c", CLUSTER_NAME, "-t", topic, "-r", "4", "-w", "4",
                      "-a", f"+message.type={message_type}")
    assert f"create topic to {interop_cluster.master().address} success" in out.out, out
    # The effect, from rmqha's side: the broker's topic config and the name server's route.
    resp = _broker_request(interop_cluster, RequestCode.GET_TOPIC_CONFIG, {"topic": topic})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    config = resp.json_body()
    assert config["attributes"] == {"+message.type": message_type} or \
        config["attributes"].get("message.type") == message_type, config
    assert (config["readQueueNums"], config["writeQueueNums"]) == (4, 4), config
    interop_cluster.cluster.wait_for(lambda: interop_cluster.cluster.route(topic) is not None, 20,
                                   what=f"a route of {topic}")
    listed = mqadmin.run("topicList", "-n", ns)
    assert topic in listed.out.split(), listed
    route = mqadmin.run("topicRoute", "-n", ns, "-t", topic)
    assert f'"brokerName":"{GROUP}"' in route.out and '"writeQueueNums":4' in route.out, route


def test_delete_topic(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    ns, topic = interop_cluster.namesrv, "admin-doomed"
    mqadmin.run("updateTopic", "-n", ns, "-c", CLUSTER_NAME, "-t", topic)
    interop_cluster.cluster.wait_for(lambda: interop_cluster.cluster.route(topic) is not None, 20,
                                   what=f"a route of {topic}")
    out = mqadmin.run("deleteTopic", "-n", ns, "-c", CLUSTER_NAME, "-t", topic)
    assert f"delete topic [{topic}] from cluster [{CLUSTER_NAME}] success." in out.out, out
    assert f"delete topic [{topic}] from NameServer success." in out.out, out
    resp = _broker_request(interop_cluster, RequestCode.GET_TOPIC_CONFIG, {"topic": topic})
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST, (resp.code, resp.remark)
    interop_cluster.cluster.wait_for(lambda: interop_cluster.cluster.route(topic) is None, 20,
                                   what=f"{topic} gone from the routes")


def test_messages_status_and_queries(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    ns, topic = interop_cluster.namesrv, "admin-messages"
    mqadmin.run("updateTopic", "-n", ns, "-c", CLUSTER_NAME, "-t", topic, "-r", "2", "-w", "2")
    interop_cluster.cluster.wait_for(lambda: interop_cluster.cluster.route(topic) is not None, 20,
                                   what=f"a route of {topic}")
    with BlockingProducer(ns, **_options(interop_cluster)) as producer:
        sent = [producer.send(topic, Message(f"body {i}".encode(), keys="order-42")) for i in range(3)]
    status = mqadmin.run("topicStatus", "-n", ns, "-t", topic)
    rows = [r for r in status.rows() if r[0] == GROUP]
    assert len(rows) == 2, status
    assert sum(int(r[3]) for r in rows) == 3, status                 # #Max Offset summed
    by_key = mqadmin.run("queryMsgByKey", "-n", ns, "-t", topic, "-k", "order-42")
    assert {s.msg_id for s in sent} <= set(by_key.out.split()), by_key
    by_id = mqadmin.run("queryMsgById", "-n", ns, "-t", topic, "-i", sent[0].msg_id)
    assert f"Topic:               {topic}" in by_id.out and "Keys:                [order-42]" in by_id.out, by_id
    assert "Exception" not in by_id.err, by_id


def test_groups_progress_and_connections(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    ns, topic, group = interop_cluster.namesrv, "admin-progress", "admin-group"
    mqadmin.run("updateTopic", "-n", ns, "-c", CLUSTER_NAME, "-t", topic, "-r", "2", "-w", "2")
    interop_cluster.cluster.wait_for(lambda: interop_cluster.cluster.route(topic) is not None, 20,
                                   what=f"a route of {topic}")
    out = mqadmin.run("updateSubGroup", "-n", ns, "-c", CLUSTER_NAME, "-g", group, "-r", "5")
    assert f"create subscription group to {interop_cluster.master().address} success." in out.out, out
    groups = _broker_request(interop_cluster, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).json_body()
    assert groups["subscriptionGroupTable"][group]["retryMaxTimes"] == 5, groups
    opts = _options(interop_cluster)
    with BlockingProducer(ns, group="admin-producers", **opts) as producer:
        producer.set_transaction_check_listener(lambda m: LocalTransactionState.COMMIT_MESSAGE, topics=[topic])
        for i in range(4):
            producer.send(topic, f"m{i}".encode())
        with BlockingConsumer(ns, group=group, topics=topic, **opts) as consumer:
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < 4 and time.monotonic() < deadline:
                got += consumer.poll(timeout=2.0)
            consumer.commit()
            assert len(got) == 4, got
            interop_cluster.cluster.wait_for(
                lambda: (r := mqadmin.run("consumerProgress", "-n", ns, "-g", group))
                and "Consume Diff Total: 0" in r.out and r, 30, what="the group's progress at 0 behind")
            conn = mqadmin.run("consumerConnection", "-n", ns, "-g", group)
            rows = conn.rows()
            assert rows[0] == ["#ClientId", "#ClientAddr", "#Language", "#Version"], conn
            assert rows[1][2:] == ["PYTHON", "V5_1_4"] and rows[1][1].startswith("127.0.0.1:"), conn
            assert [topic, "*"] in rows and ["MessageModel:", "CLUSTERING"] in rows, conn
            producers = mqadmin.run("producerConnection", "-n", ns, "-g", "admin-producers", "-t", topic)
            (row,) = producers.rows()
            assert row[0] == "0001" and row[3:] == ["PYTHON", "V5_1_4"], producers
        # The consumer left: resetOffsetByTime takes RocketMQ's offline path and rewinds.
        reset = mqadmin.run("resetOffsetByTime", "-n", ns, "-g", group, "-t", topic, "-s", "0")
        assert "#resetOffset" in reset.out, reset
        resp = _broker_request(interop_cluster, RequestCode.QUERY_CONSUMER_OFFSET,
                               {"consumerGroup": group, "topic": topic, "queueId": 0})
        assert int(resp.ext_fields["offset"]) == 0, resp.ext_fields
    progress = mqadmin.run("consumerProgress", "-n", ns, "-g", group, "-t", topic)
    assert "Consume Diff Total: 4" in progress.out, progress


def test_broker_config(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    ns, master = interop_cluster.namesrv, interop_cluster.master()
    out = mqadmin.run("getBrokerConfig", "-n", ns, "-b", master.address)
    values = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.out.splitlines()) if _}
    assert values["brokerName"] == GROUP and values["cluster"] == CLUSTER_NAME, out
    refused = mqadmin.run("updateBrokerConfig", "-n", ns, "-b", master.address, "-k", "flushIntervalMs", "-v", "1")
    assert "rmqha brokers take no configuration changes at run time" in refused.text, refused
    again = mqadmin.run("getBrokerConfig", "-n", ns, "-b", master.address)
    assert "flushIntervalMs" in again.out and f"flushIntervalMs{' ' * 34}=  {values['flushIntervalMs']}" in again.out \
        or values["flushIntervalMs"] != "1", again


def test_controller_reads(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    ns, leader = interop_cluster.namesrv, interop_cluster.cluster.controller_leader()
    assert leader is not None
    meta = mqadmin.run("getControllerMetaData", "-a", leader)
    assert f"#ControllerLeaderAddress\t{leader}" in meta.out, meta
    assert meta.out.count("#Peer:") == 3, meta
    sss = mqadmin.run("getSyncStateSet", "-a", leader, "-b", GROUP)
    assert f"#MasterAddr\t{interop_cluster.master().address}" in sss.out, sss
    assert sss.out.count("InSyncReplica:") == len(interop_cluster.brokers), sss
    epochs = mqadmin.run("getBrokerEpoch", "-n", ns, "-b", GROUP)
    assert epochs.out.count("#Epoch: EpochEntry{epoch=") >= 2, epochs
    config = mqadmin.run("getControllerConfig", "-a", leader)
    assert "controllerGroup" in config.out, config


def test_controller_writes_are_refused_unsigned(interop_cluster: InteropCluster, mqadmin: MqAdmin) -> None:
    leader = interop_cluster.cluster.controller_leader()
    assert leader is not None
    before = interop_cluster.cluster.replica_info(GROUP)
    slave = next(b for b in interop_cluster.brokers if b is not interop_cluster.master())
    elect = mqadmin.run("electMaster", "-a", leader, "-c", CLUSTER_NAME, "-bn", GROUP, "-b", str(slave.broker_id()))
    assert "CODE: 16" in elect.err and "unsigned request" in elect.err and "cluster secret" in elect.err, elect
    clean = mqadmin.run("cleanBrokerMetadata", "-a", leader, "-c", CLUSTER_NAME, "-bn", GROUP,
                        "-b", str(slave.broker_id()), "-l")
    assert "CODE: 16" in clean.err and "unsigned request" in clean.err and "cluster secret" in clean.err, clean
    assert interop_cluster.cluster.replica_info(GROUP) == before


def test_control_without_the_account_is_refused(interop_cluster: InteropCluster) -> None:
    """The negative control of the tls-acl runs: mqadmin with an empty tools.yml (no
    account, so unsigned requests over the same certificate) is refused by the brokers'
    ACL and creates nothing; in plaintext mode the same command works (no ACL there)."""
    session = MqAdmin(interop_cluster, with_account=False)
    topic = "admin-unsigned"
    try:
        out = session.run("updateTopic", "-n", interop_cluster.namesrv, "-c", CLUSTER_NAME, "-t", topic)
    finally:
        session.close()
    resp = _broker_request(interop_cluster, RequestCode.GET_TOPIC_CONFIG, {"topic": topic})
    if interop_cluster.mode is Mode.TLS_ACL:
        assert "AccessKey" in out.err and "create topic to" not in out.out, out
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST, (resp.code, resp.remark)
    else:
        assert "create topic to" in out.out, out
        assert resp.code == ResponseCode.SUCCESS, resp.remark
