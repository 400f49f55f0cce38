"""The name server process: registration, routes in the C++ client's shape, expiry, id-0 rules.

A real ``rmqha namesrv`` process on loopback; the test plays the brokers and clients by
sending RocketMQ remoting requests to it.
"""
from __future__ import annotations

import json
import socket
import struct
import urllib.request


from cluster import Cluster, free_port
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.net.client import RemotingClient
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand



def register(cluster: Cluster, ns, *, group: str, addr: str, broker_id: int, epoch: int = 1,
             topics: dict[str, int] | None = None, timeout_ms: int | None = None, ha_addr: str | None = None):
    ext = {
        "brokerName": group, "brokerAddr": addr, "clusterName": "c1",
        "haServerAddr": ha_addr or addr.rsplit(":", 1)[0] + ":" + str(int(addr.rsplit(":", 1)[1]) + 1),
        "brokerId": broker_id,
    }
    if timeout_ms is not None:
        ext["heartbeatTimeoutMillis"] = timeout_ms
    body = {
        "topicConfigSerializeWrapper": {
            "topicConfigTable": {
                t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6, "topicSysFlag": 0}
                for t, n in (topics or {"T": 4}).items()
            },
            "dataVersion": {"timestamp": 0, "counter": 1, "stateVersion": epoch},
        },
        "filterServerList": [],
    }
    return cluster.request(ns.address, RequestCode.REGISTER_BROKER, ext, body)


def test_routes_by_topic_group_and_cluster(cluster):
    metrics_port = free_port()
    ns = cluster.start_namesrv(metrics_port=metrics_port)
    r = register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0, topics={"T": 8, "X": 4})
    assert r.code == ResponseCode.SUCCESS
    assert r.ext_fields["masterAddr"] == "127.0.0.1:30911"
    assert r.ext_fields["haServerAddr"] == "127.0.0.1:30912"
    r = register(cluster, ns, group="g1", addr="127.0.0.1:30921", broker_id=2)
    assert r.ext_fields["masterAddr"] == "127.0.0.1:30911"
    register(cluster, ns, group="g2", addr="127.0.0.1:31911", broker_id=0)

    route = cluster.route("T")
    assert route["queueDatas"] == [
        {"brokerName": "g1", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6, "topicSysFlag": 0},
        {"brokerName": "g2", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0},
    ]
    assert route["brokerDatas"] == [
        {"cluster": "c1", "brokerName": "g1", "brokerAddrs": {"0": "127.0.0.1:30911", "2": "127.0.0.1:30921"}},
        {"cluster": "c1", "brokerName": "g2", "brokerAddrs": {"0": "127.0.0.1:31911"}},
    ]
    assert cluster.route("X")["brokerDatas"][0]["brokerName"] == "g1"
    assert cluster.route("missing") is None

    group = cluster.group_route("g1")
    assert group["brokerAddrs"] == {"0": "127.0.0.1:30911", "2": "127.0.0.1:30921"}
    assert group["haAddrs"] == {"0": "127.0.0.1:30912", "2": "127.0.0.1:30922"}
    assert group["masterEpoch"] == 1

    info = cluster.request(ns.address, RequestCode.GET_BROKER_CLUSTER_INFO).json_body()
    assert info["clusterAddrTable"] == {"c1": ["g1", "g2"]}
    topics = cluster.request(ns.address, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).json_body()
    assert topics == {"topicList": ["T", "X"]}
    # RocketMQ's GetBrokerMemberGroupResponseBody shape, rmqha's extras beside it.
    raw = cluster.request(ns.address, RequestCode.GET_BROKER_MEMBER_GROUP,
                          {"clusterName": "c1", "brokerName": "g2"}).json_body()
    assert raw["brokerMemberGroup"] == {"cluster": "c1", "brokerName": "g2", "brokerAddrs": {"0": "127.0.0.1:31911"}}
    assert raw["masterAddr"] == "127.0.0.1:31911"

    assert cluster.request(ns.address, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "X"}).code == 0
    assert cluster.route("X") is None and cluster.route("T") is not None
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    assert "rmqha_namesrv_brokers 3.0" in text and "rmqha_namesrv_broker_groups 2.0" in text
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0, topics={"T": 8, "X": 4})
    assert cluster.route("X")["queueDatas"][0]["brokerName"] == "g1"


def _raw_request(addr: str, header: dict, body: bytes = b"") -> tuple[dict, bytes]:
    """Send one frame the way the C++ client builds it, read one raw response frame."""
    host, _, port = addr.rpartition(":")
    h = json.dumps(header).encode()
    frame = struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = s.recv(65536)
            assert chunk, "connection closed before a full response"
            buf += chunk
    total, ori = struct.unpack(">ii", buf[:8])
    assert ori >> 24 == 0, "C++ clients need JSON serialize type 0"
    hlen = ori & 0xFFFFFF
    return json.loads(buf[8:8 + hlen]), buf[8 + hlen:4 + total]


def test_route_answer_is_what_the_cpp_client_parses(cluster):
    ns = cluster.start_namesrv()
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0)
    # C++ 1.2.3: language CPP, version 63, flag 0, AccessKey/OnsChannel/Signature extras.
    header = {"code": 105, "language": "CPP", "version": 63, "opaque": 4242, "flag": 0, "remark": "",
              "extFields": {"topic": "T", "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x"}}
    resp, body = _raw_request(ns.address, header)
    assert resp["code"] == 0 and resp["opaque"] == 4242 and resp["flag"] & 1
    assert isinstance(resp["extFields"], dict)
    assert all(isinstance(v, str) for v in resp["extFields"].values())
    route = json.loads(body)
    q = route["queueDatas"][0]
    assert all(type(q[k]) is int for k in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"))
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:30911"}

    header.update(opaque=4243, extFields={"topic": "nope"})
    resp, body = _raw_request(ns.address, header)
    assert resp["code"] == ResponseCode.TOPIC_NOT_EXIST and resp["opaque"] == 4243 and body == b""


def test_register_answer_ext_fields_are_strings(cluster):
    # A Java broker signs nothing: a name server without a cluster secret (loopback only).
    ns = cluster.start_namesrv(cluster_secret_file="")
    header = {"code": 103, "language": "JAVA", "version": 475, "opaque": 7, "flag": 0,
              "extFields": {"brokerName": "g1", "brokerAddr": "127.0.0.1:1", "clusterName": "c1",
                            "haServerAddr": "127.0.0.1:2", "brokerId": 0, "compressed": "false"}}
    resp, body = _raw_request(ns.address, header, b"")
    assert resp["code"] == 0
    assert resp["extFields"] == {"masterAddr": "127.0.0.1:1", "haServerAddr": "127.0.0.1:2"}
    assert json.loads(body) == {"table": {}}


def test_stale_master_claim_on_id_zero_is_refused(cluster):
    ns = cluster.start_namesrv()
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0, epoch=1)
    register(cluster, ns, group="g1", addr="127.0.0.1:30921", broker_id=2, epoch=1)
    # The slave was elected at epoch 2; the old master has not learned it and renews as id 0.
    assert register(cluster, ns, group="g1", addr="127.0.0.1:30921", broker_id=0, epoch=2).code == 0
    stale = register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0, epoch=1)
    assert stale.code == ResponseCode.SYSTEM_ERROR
    assert "127.0.0.1:30921" in stale.remark and stale.ext_fields["masterAddr"] == "127.0.0.1:30921"
    assert cluster.group_route("g1")["brokerAddrs"] == {"0": "127.0.0.1:30921"}
    assert cluster.group_route("g1")["masterEpoch"] == 2


def test_silent_broker_expires_and_renewal_keeps_it(cluster):
    ns = cluster.start_namesrv()
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0, timeout_ms=600)
    register(cluster, ns, group="g1", addr="127.0.0.1:30921", broker_id=1, timeout_ms=60_000)
    cluster.wait_for(lambda: cluster.group_route("g1")["brokerAddrs"] == {"1": "127.0.0.1:30921"},
                     timeout=10, what="the silent master to expire")
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0, timeout_ms=60_000)
    assert cluster.group_route("g1")["brokerAddrs"] == {"0": "127.0.0.1:30911", "1": "127.0.0.1:30921"}


def test_broker_dropped_when_its_connection_closes(cluster):
    ns = cluster.start_namesrv()
    loop = EventLoopThread("test-ns")
    try:
        # As a holder of the secret: an authenticated channel, as a broker registers.
        client = RemotingClient(ns.address, security=cluster.control_security(ns.address))
        ext = {"brokerName": "g1", "brokerAddr": "127.0.0.1:30911", "clusterName": "c1", "brokerId": 0,
               "haServerAddr": "127.0.0.1:30912"}
        cmd = cluster.auth.sign(RemotingCommand.request(RequestCode.REGISTER_BROKER, ext))
        resp = loop.run(client.request(cmd, 3))
        assert resp.code == 0
        assert cluster.group_route("g1")["brokerAddrs"] == {"0": "127.0.0.1:30911"}
        loop.run(client.close())
    finally:
        loop.stop()
    cluster.wait_for(lambda: cluster.group_route("g1")["brokerAddrs"] == {}, timeout=5,
                     what="the broker to be dropped on disconnect")


def test_unknown_code_is_not_supported_and_connection_stays(cluster):
    ns = cluster.start_namesrv()
    resp = cluster.request(ns.address, 777)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0)
    assert cluster.route("T") is not None


def test_bad_registration_is_refused_with_a_reason(cluster):
    ns = cluster.start_namesrv()
    resp = cluster.request(ns.address, RequestCode.REGISTER_BROKER, {"brokerName": "g1"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "brokerAddr" in resp.remark
    resp = cluster.request(ns.address, RequestCode.REGISTER_BROKER,
                           {"brokerName": "g1", "brokerAddr": "a:1", "clusterName": "c", "brokerId": "x"})
    assert resp.code == ResponseCode.SYSTEM_ERROR
    resp = cluster.request(ns.address, RequestCode.REGISTER_BROKER,
                           {"brokerName": "g1", "brokerAddr": "a:1", "clusterName": "c", "brokerId": 0},
                           b"{not json")
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert cluster.route("T") is None


def test_name_server_hosting_a_controller_runs_a_broker_group(cluster):
    ns = cluster.start_namesrv_with_controller()
    assert cluster.controller_addresses and not cluster.controllers
    a = cluster.start_broker("broker-a")
    b = cluster.start_broker("broker-a")
    cluster.wait_for(lambda: cluster.broker_role(a) == "master" and cluster.broker_role(b) == "slave",
                     what="master and slave through the embedded controller")
    info = cluster.replica_info("broker-a")
    assert (info.master_id, info.master_address) == (1, a.address)
    cluster.wait_for(lambda: cluster.group_route("broker-a", ns)["brokerAddrs"] == {"0": a.address, "2": b.address},
                     what="both brokers registered in the same process")


def test_topic_deletion_needs_the_admin_token_when_set(cluster):
    ns = cluster.start_namesrv(admin_token="s3cret")
    register(cluster, ns, group="g1", addr="127.0.0.1:30911", broker_id=0)
    for ext in ({"topic": "T"}, {"topic": "T", "adminToken": "wrong"}):
        resp = cluster.request(ns.address, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext)
        assert resp.code == ResponseCode.NO_PERMISSION
    assert cluster.route("T") is not None
    resp = cluster.request(ns.address, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T", "adminToken": "s3cret"})
    assert resp.code == ResponseCode.SUCCESS
    assert cluster.route("T") is None
