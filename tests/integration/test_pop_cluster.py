"""Pop consumption across a master SIGKILL, with real processes (a controller, a name server
and a broker group of three, every write acknowledged by the whole SyncStateSet).

A consumer pops half the messages, acks some (each ack answered once replicated) and
keeps others in flight; the master is SIGKILLed.  On the new master: the kept handles of
the old master still ack (the receipt key is replicated state), nothing acked is delivered
again, every message that was in flight and not acked is delivered again (through the
retry topic, with its retry count), and every message is delivered.  The consumer group and
the topic attributes set with the CLI hold on the new master too.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
from cluster import Cluster

from rmqha.cli import main as rmqha_cli
from rmqha.client import BlockingProducer, Message
from rmqha.errors import RemotingError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import ReceivedMessage, decode_records
from rmqha.protocol.pop import pop_retry_topic

TOPIC, GROUP = "PopHA", "pop-ha"
SETTINGS = {"all_ack_in_sync_state_set": True, "slave_timeout_ms": 3000,
            "pop_revive_interval_ms": 100, "timer_precision_ms": 50,
            "message_delay_level": " ".join(["100ms"] * 8)}
INVISIBLE_MS = 3000


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path) as c:
        yield c


def pop(cluster: Cluster, addr: str, poll: int = 0) -> tuple[int, list[ReceivedMessage]]:
    resp = cluster.request(addr, RequestCode.POP_MESSAGE, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": -1, "maxMsgNums": 16,
        "invisibleTime": INVISIBLE_MS, "pollTime": poll, "bornTime": int(time.time() * 1000),
        "initMode": 0}, timeout=poll / 1000 + 3)
    return resp.code, decode_records(resp.body) if resp.code == ResponseCode.SUCCESS else []


def ack(cluster: Cluster, addr: str, m: ReceivedMessage) -> Any:
    handle = m.properties["POP_CK"]
    f = handle.split(" ")
    topic = pop_retry_topic(GROUP, m.topic) if f[4] == "1" else m.topic
    return cluster.request(addr, RequestCode.ACK_MESSAGE, {
        "consumerGroup": GROUP, "topic": topic, "queueId": int(f[6]), "offset": int(f[7]),
        "extraInfo": handle}, timeout=6)


def test_pop_survives_master_sigkill(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, *_ = cluster.start_group("broker-a", 3, in_sync=True, **SETTINGS)
    ns = ";".join(cluster.namesrv_addresses)
    assert rmqha_cli(["update-topic", "-n", ns, "-t", TOPIC, "-r", "2",
                      "-a", "+message.type=NORMAL"]) == 0
    assert rmqha_cli(["update-sub-group", "-n", ns, "-c", cluster.cluster_name, "-g", GROUP,
                      "-r", "5"]) == 0
    cluster.wait_for(lambda: cluster.route(TOPIC), what=f"a route for {TOPIC}")
    with BlockingProducer(cluster.namesrv_addresses) as p:
        sent = {p.send(TOPIC, Message(b"m%d" % i)).msg_id for i in range(60)}

    acked: set[str] = set()
    kept: list[ReceivedMessage] = []
    while len(acked) + len(kept) < 30:
        _, msgs = pop(cluster, master.address, poll=1000)
        assert msgs, "the master has messages to pop"
        for i, m in enumerate(msgs):
            if i % 3 == 2:
                kept.append(m)  # in flight when the master dies
                continue
            resp = ack(cluster, master.address, m)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            acked.add(m.msg_id)
    master.kill()
    new = cluster.wait_for(lambda: cluster.master_of("broker-a"), timeout=30,
                           what="a new master")
    assert new is not master

    # The old master's handles ack on the new one (answered once the new master has
    # folded the inherited state; until then it says SYSTEM_BUSY).
    def ack_on_new(m: ReceivedMessage) -> bool:
        try:
            resp = ack(cluster, new.address, m)
        except (RemotingError, TimeoutError):
            return False
        assert resp.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY,
                             ResponseCode.SERVICE_NOT_AVAILABLE), (resp.code, resp.remark)
        return resp.code == ResponseCode.SUCCESS

    late_acked = kept[: len(kept) // 2]
    for m in late_acked:
        cluster.wait_for(lambda m=m: ack_on_new(m), timeout=20, what="an old handle's ack")
    acked |= {m.msg_id for m in late_acked}
    unacked = {m.msg_id for m in kept[len(kept) // 2:]}

    delivered: dict[str, list[int]] = {}
    epochs_after: list[int] = []
    deadline = time.monotonic() + 40
    while not (sent - acked) <= set(delivered) and time.monotonic() < deadline:
        try:
            _, msgs = pop(cluster, new.address, poll=1000)
        except (RemotingError, TimeoutError):
            continue
        for m in msgs:
            delivered.setdefault(m.msg_id, []).append(m.reconsume_times)
            epochs_after.append(int(m.properties["POP_CK"].split(" ")[8]))
            assert ack(cluster, new.address, m).code == ResponseCode.SUCCESS
    again = set(delivered) & acked
    assert not again, f"{len(again)} acked message(s) delivered again after the failover"
    missing = sent - acked - set(delivered)
    assert not missing, f"{len(missing)} message(s) never delivered (unacked ones: " \
                        f"{len(missing & unacked)})"
    # The ones in flight at the kill came back through the retry topic, counted.
    assert unacked <= set(delivered)
    assert all(delivered[mid][0] >= 1 for mid in unacked)
    # Handles name the master epoch that issued them.
    assert min(epochs_after) > max(int(m.properties["POP_CK"].split(" ")[8]) for m in kept) > 0
    # Settings made with the CLI were replicated like topics.
    groups = cluster.request(new.address, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert groups.json_body()["subscriptionGroupTable"][GROUP]["retryMaxTimes"] == 5
    topics = cluster.request(new.address, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert topics.json_body()["topicConfigTable"][TOPIC]["attributes"] == {
        "message.type": "NORMAL"}
    print(f"acked before the kill {len(acked) - len(late_acked)}, with old handles after "
          f"{len(late_acked)}, redelivered {len(unacked)}, delivered after {len(delivered)}")
