"""Lookups with real processes: every replica indexes what it replicated, so a query by
key is answered by a slave, and by the new master after the old one was SIGKILLed."""
from __future__ import annotations



from cluster import Cluster
from rmqha.client import BlockingMessageQuery, BlockingProducer, Message
from rmqha.errors import ClientError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import decode_records
from test_messaging_cluster import ALL_ACK, create_topic, start_group, wait_route



def _by_key(cluster: Cluster, address: str, key: str, unique: bool = False) -> set[str]:
    ext = {"topic": "LK", "key": key, "maxNum": 32, "beginTimestamp": 0,
           "endTimestamp": 2**63 - 1}
    if unique:
        ext["_UNIQUE_KEY_QUERY"] = "true"
    resp = cluster.request(address, RequestCode.QUERY_MESSAGE, ext)
    if resp.code != ResponseCode.SUCCESS:
        return set()
    return {m.msg_id for m in decode_records(resp.body)}


def test_lookup_on_slave_and_after_master_sigkill(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, slave = start_group(cluster, 2, **ALL_ACK)
    create_topic(cluster, master, "LK", 2)
    wait_route(cluster, "LK")
    with BlockingProducer(cluster.namesrv_addresses) as p:
        sent = [p.send("LK", Message(b"v%d" % i, keys=f"acct-{i % 4} ord-{i}")) for i in range(40)]
    assert all(r.ok for r in sent)
    want = {r.msg_id for r in sent[1::4]}
    cluster.wait_for(lambda: _by_key(cluster, slave.address, "acct-1") == want,
                     what="the slave answering a key query")
    assert _by_key(cluster, slave.address, sent[7].msg_id, unique=True) == {sent[7].msg_id}
    master.kill()  # SIGKILL
    new_master = cluster.wait_for(lambda: cluster.master_of("broker-a"), timeout=30,
                                  what="a new master")
    assert new_master is not master
    assert _by_key(cluster, new_master.address, "acct-1") == want
    assert _by_key(cluster, new_master.address, "ord-22") == {sent[22].msg_id}

    # rmqha's blocking client finds them through the name server's (updated) route.
    def client_lookup() -> bool:
        try:
            with BlockingMessageQuery(cluster.namesrv_addresses) as q:
                return {m.msg_id for m in q.by_key("LK", "acct-1")} == want
        except ClientError:
            return False
    cluster.wait_for(client_lookup, timeout=30, what="the client's lookup after the failover")
