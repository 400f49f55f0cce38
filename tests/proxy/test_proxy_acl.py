"""ACL through the proxy: brokers with ``aclEnable``, a proxy checking the gRPC
``authorization`` of RocketMQ 5's clients against the same ``plain_acl.yml`` and signing
its own broker requests as its inner account."""
from __future__ import annotations

import datetime
import hashlib
import hmac
from pathlib import Path
from typing import Any

import grpc
import pytest
from proxy_harness import (
    closing,
    configuration,
    create_topic,
    message,
    producer,
    receive_until,
    simple_consumer,
    start_cluster,
    start_proxy,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

ACL = """\
accounts:
  - accessKey: proxyInner
    secretKey: proxyInnerSecret
    admin: true
  - accessKey: aliceUser
    secretKey: aliceSecret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [acl_topic=PUB|SUB, acl_readonly=SUB]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = Path(tmp_path_factory.mktemp("acl"))
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL)
    cluster = start_cluster(base, replicas=1)
    with cluster:
        for topic in ("acl_topic", "acl_readonly"):
            create_topic(cluster, topic)
        # The ACL goes on once the topics exist (the harness's own queries are unsigned).
        broker = cluster.brokers[0]
        broker.stop()
        broker.start(acl_enable=True, acl_file=str(acl_file))
        cluster.wait_for(lambda: "0" in _route_addrs(cluster, "acl_topic"), what="the master routed")
        proxy = start_proxy(cluster, acl_enable=True, acl_file=str(acl_file),
                            inner_access_key="proxyInner", inner_secret_key="proxyInnerSecret")
        yield cluster, proxy


def _route_addrs(cluster: Any, topic: str) -> dict[str, str]:
    route = cluster.route(topic) or {}
    return {str(k): v for b in route.get("brokerDatas") or [] for k, v in (b.get("brokerAddrs") or {}).items()}


def send_as(proxy: Any, topic: str, ak: str, sk: str) -> Any:
    meta = Signature.metadata(configuration(proxy, ak, sk), "acl-test-client") if ak else [
        ("x-mq-client-id", "acl-test-client")]
    msg = pb.Message(body=b"x")
    msg.topic.name = topic
    msg.system_properties.message_id = "ACL0001"
    msg.system_properties.message_type = pb.MessageType.NORMAL
    with grpc.insecure_channel(proxy.address) as channel:
        return MessagingServiceStub(channel).SendMessage(
            spb.SendMessageRequest(messages=[msg]), metadata=meta, timeout=10)


def test_signed_client_sends_and_receives(secured: Any) -> None:
    cluster, proxy = secured
    creds = {"ak": "aliceUser", "sk": "aliceSecret"}
    p = producer(proxy, ["acl_topic"], **creds)
    c = simple_consumer(proxy, "acl_group", "acl_topic", await_s=1, **creds)
    with closing(p, c):
        p.send(message("acl_topic", b"allowed"))
        got = receive_until(c, lambda g: len(g) >= 1, timeout_s=10)
    assert [m.body for m in got] == [b"allowed"]


@pytest.mark.parametrize(("topic", "ak", "sk", "why"), [
    ("acl_topic", "aliceUser", "wrongSecret", "check signature failed"),
    ("acl_readonly", "aliceUser", "aliceSecret", "has no PUB permission"),
    ("acl_topic", "nobodyUser", "nobodySecret", "no ACL account"),
    ("acl_topic", "", "", "carries no authorization"),
])
def test_refused_clients(secured: Any, topic: str, ak: str, sk: str, why: str) -> None:
    cluster, proxy = secured
    resp = send_as(proxy, topic, ak, sk)
    assert resp.status.code == pb.Code.UNAUTHORIZED and why in resp.status.message


def test_control_the_right_secret_passes(secured: Any) -> None:
    """Negative control of the refusals above: the same request, correctly signed, is stored."""
    cluster, proxy = secured
    assert send_as(proxy, "acl_topic", "aliceUser", "aliceSecret").status.code == pb.Code.OK


def test_proxy_without_inner_account_is_refused_by_brokers(secured: Any) -> None:
    """The proxy's own signature is what the brokers let through: without it they refuse."""
    cluster, proxy = secured
    unsigned = start_proxy(cluster, acl_enable=False)
    resp = send_as(unsigned, "acl_topic", "", "")
    # The broker's own refusal, passed on: not any failure (a dead proxy, a wrong topic).
    assert resp.status.code == pb.Code.INTERNAL_SERVER_ERROR, resp.status
    assert "carries no AccessKey" in resp.status.message, resp.status.message


def _signed_at(ak: str, sk: str, when: datetime.datetime) -> list[tuple[str, str]]:
    """The headers a RocketMQ 5 client signs with, as captured at ``when``."""
    date_time = when.strftime("%Y%m%dT%H%M%SZ")
    sig = hmac.new(sk.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return [("x-mq-client-id", "acl-test-client"), ("x-mq-date-time", date_time),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}")]


def _send_with(proxy: Any, topic: str, meta: list[tuple[str, str]]) -> Any:
    msg = pb.Message(body=b"replayed")
    msg.topic.name = topic
    msg.system_properties.message_id = "ACL0002"
    msg.system_properties.message_type = pb.MessageType.NORMAL
    with grpc.insecure_channel(proxy.address) as channel:
        return MessagingServiceStub(channel).SendMessage(
            spb.SendMessageRequest(messages=[msg]), metadata=meta, timeout=10)


@pytest.mark.parametrize(("skew_s", "why"), [(-600, "behind the proxy's clock"),
                                             (600, "ahead of the proxy's clock")])
def test_a_signature_outside_the_window_is_refused(secured: Any, skew_s: int, why: str) -> None:
    """A correctly signed call captured ten minutes ago (or dated ten minutes ahead) is
    refused, naming the window; the same headers signed now pass (negative control)."""
    cluster, proxy = secured
    now = datetime.datetime.now(datetime.UTC)
    old = _send_with(proxy, "acl_topic", _signed_at("aliceUser", "aliceSecret",
                                                    now + datetime.timedelta(seconds=skew_s)))
    assert old.status.code == pb.Code.UNAUTHORIZED and why in old.status.message, old.status
    assert "at most 300 s" in old.status.message
    fresh = _send_with(proxy, "acl_topic", _signed_at("aliceUser", "aliceSecret", now))
    assert fresh.status.code == pb.Code.OK, fresh.status
