"""QueryRoute and QueryAssignment answers from a topic's remoting route (``RouteActivity``).

Every queue a client is shown points at the proxy itself (the endpoints the client
connected to, with the proxy's port), as broker id 0 of its broker group: the client
never learns which broker is master, so a failover changes nothing it holds.  The queues
of a group come from its queue data the way RocketMQ's proxy splits them: read-only,
write-only, read-write, then inaccessible ones, each listing the message types the topic
accepts (its ``message.type``; MIXED accepts all four).

An assignment (push consumers) is one queue per readable group, ``id = -1`` (the proxy
pops every queue of the group), or for a FIFO group one assignment per queue.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from rmqha.protocol.route import QueueData, TopicRoute
from rmqha.protocol.topic_attributes import TopicMessageType
from rmqha.protocol.topics import PERM_READ, PERM_WRITE

_ACCEPTS: dict[TopicMessageType, list[int]] = {
    TopicMessageType.NORMAL: [pb.MessageType.NORMAL],
    TopicMessageType.FIFO: [pb.MessageType.FIFO],
    TopicMessageType.DELAY: [pb.MessageType.DELAY],
    TopicMessageType.TRANSACTION: [pb.MessageType.TRANSACTION],
    TopicMessageType.MIXED: [pb.MessageType.NORMAL, pb.MessageType.FIFO,
                             pb.MessageType.DELAY, pb.MessageType.TRANSACTION],
}


def accepted_types(kind: TopicMessageType) -> list[int]:
    return _ACCEPTS.get(kind, [pb.MessageType.MESSAGE_TYPE_UNSPECIFIED])


def permission(perm: int) -> int:
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    if readable and writable:
        return int(pb.Permission.READ_WRITE)
    if readable:
        return int(pb.Permission.READ)
    return int(pb.Permission.WRITE if writable else pb.Permission.NONE)


def proxy_endpoints(requested: Any, port: int, use_requested_port: bool) -> Any:
    """The endpoints a route names: the hosts the client used, the proxy's port."""
    out = pb.Endpoints()
    out.scheme = requested.scheme or pb.AddressScheme.IPv4
    for address in requested.addresses:
        item = out.addresses.add()
        item.host = address.host
        item.port = address.port if use_requested_port else port
    return out


def _queue_split(qd: QueueData) -> list[tuple[int, int]]:
    """(permission, count) runs in RocketMQ's order: read-only, write-only, read-write,
    none."""
    readable, writable = bool(qd.perm & PERM_READ), bool(qd.perm & PERM_WRITE)
    if readable and writable:
        both = min(qd.read_queue_nums, qd.write_queue_nums)
        return [(pb.Permission.READ, qd.read_queue_nums - both),
                (pb.Permission.WRITE, qd.write_queue_nums - both),
                (pb.Permission.READ_WRITE, both)]
    if writable:
        return [(pb.Permission.WRITE, qd.write_queue_nums)]
    if readable:
        return [(pb.Permission.READ, qd.read_queue_nums)]
    return [(pb.Permission.NONE, max(1, qd.read_queue_nums, qd.write_queue_nums))]


def broker_of(name: str, endpoints: Any) -> Any:
    broker = pb.Broker(name=name, id=0)
    broker.endpoints.CopyFrom(endpoints)
    return broker


def _groups(route: TopicRoute) -> Iterable[QueueData]:
    return sorted((qd for qd in route.queue_datas if qd.broker_name in route.broker_datas),
                  key=lambda qd: qd.broker_name)


def route_queues(route: TopicRoute, topic: Any, kind: TopicMessageType, endpoints: Any) -> list[Any]:
    """The ``MessageQueue`` list of a QueryRoute answer."""
    out = []
    for qd in _groups(route):
        broker = broker_of(qd.broker_name, endpoints)
        queue_id = 0
        for perm, count in _queue_split(qd):
            for _ in range(count):
                mq = pb.MessageQueue(id=queue_id, permission=perm)
                mq.topic.CopyFrom(topic)
                mq.broker.CopyFrom(broker)
                mq.accept_message_types.extend(accepted_types(kind))
                out.append(mq)
                queue_id += 1
    return out


def assignments(route: TopicRoute, topic: Any, fifo: bool, endpoints: Any) -> list[Any]:
    """The ``Assignment`` list of a QueryAssignment answer (empty: nothing readable)."""
    out = []
    for qd in _groups(route):
        if not qd.perm & PERM_READ or qd.read_queue_nums <= 0:
            continue
        broker = broker_of(qd.broker_name, endpoints)
        for queue_id in (range(qd.read_queue_nums) if fifo else [-1]):
            mq = pb.MessageQueue(id=queue_id, permission=permission(qd.perm))
            mq.topic.CopyFrom(topic)
            mq.broker.CopyFrom(broker)
            out.append(pb.Assignment(message_queue=mq))
    return out


def writable_queues(route: TopicRoute) -> list[tuple[str, int]]:
    """(group, queue id) a send may go to: writable queues of groups with a master."""
    return [(mq.broker_name, mq.queue_id) for mq in route.publish_queues()]


def readable_groups(route: TopicRoute) -> list[QueueData]:
    return [qd for qd in _groups(route) if qd.perm & PERM_READ and qd.read_queue_nums > 0]
