"""Client and name-server commands of ``rmqha`` (mqadmin's names, kebab-case with camelCase aliases).

``cluster-list`` (``clusterList``), ``topic-list`` (``topicList``), ``topic-route``
(``topicRoute``), ``update-topic`` (``updateTopic``), ``delete-topic`` (``deleteTopic``),
``send`` (alias ``produce``) and ``consume``.  ``update-topic -a +message.type=FIFO`` sets
RocketMQ 5 topic attributes.  Each takes ``-n/--namesrv-addr``
(``a;b``), prints a table by default and JSON with ``--json``.  Topic changes go to the
masters of the groups named with ``-b`` (comma-separated), of a cluster with ``-c``, or of
every group; the admin token (when brokers have one) comes from ``--admin-token`` or
``RMQHA_ADMIN_TOKEN``.  Every command takes the credential and TLS flags of
:mod:`rmqha.cli.client_security` (``--access-key``/``--secret-key``, ``--tls``,
``--tls-ca``, ``--tls-cert``/``--tls-key``).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rmqha.net import loop as event_loop
from rmqha.cli.client_security import add_flags, client_options, client_security
from rmqha.cli.lookup import cluster_info, split_addresses
from rmqha.cli.output import add_json_flag, emit, reports_errors, table, write_blocks
from rmqha.client.admin import TopicAdmin, TopicChange
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import RemotingError
from rmqha.net.blocking import BlockingRemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.protocol.command import RemotingCommand


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namesrv-addr", "--namesrvAddr", dest="namesrv",
                   default=os.environ.get("RMQHA_NAMESRV_ADDR"), required="RMQHA_NAMESRV_ADDR" not in os.environ,
                   help="name server addresses, host:port;host:port (default: $RMQHA_NAMESRV_ADDR)")
    add_json_flag(p)
    p.add_argument("--timeout", type=float, default=3.0, help="per-request timeout in seconds")
    add_flags(p)


def _groups(value: str | None) -> list[str] | None:
    return [g.strip() for g in value.split(",") if g.strip()] if value else None


def _changes(args: argparse.Namespace, changes: list[TopicChange], extra: dict[str, Any] | None = None) -> int:
    data = {"topic": args.topic, "changes": [vars(c) for c in changes], **(extra or {})}
    rows = [(c.broker_name, c.address, "OK" if c.ok else "FAILED", c.remark) for c in changes]
    emit(args, data, table(("#BrokerName", "#MasterAddr", "#Result", "#Remark"), rows))
    return 0 if changes and all(c.ok for c in changes) else 1


@reports_errors("namesrv")
def _update_topic(args: argparse.Namespace) -> int:
    async def run() -> list[TopicChange]:
        async with TopicAdmin(args.namesrv, admin_token=args.admin_token, timeout_s=args.timeout,
                              **client_options(args)) as admin:
            if args.attributes:
                return await _update_topic_attributes(admin, args)
            return await admin.create_topic(args.topic, args.read_queue_nums,
                                            args.write_queue_nums, perm=args.perm,
                                            groups=_groups(args.broker_names),
                                            cluster=args.cluster)
    return _changes(args, event_loop.run(run()))


async def _update_topic_attributes(admin: TopicAdmin, args: argparse.Namespace) -> list[TopicChange]:
    """update-topic with ``-a`` (RocketMQ 5's topic attributes, ``+message.type=FIFO``):
    the same request with the ``attributes`` header field, to every chosen master."""
    write_n = args.read_queue_nums if args.write_queue_nums is None else args.write_queue_nums
    ext: dict[str, Any] = {
        "topic": args.topic, "defaultTopic": "TBW102", "readQueueNums": args.read_queue_nums,
        "writeQueueNums": write_n, "perm": args.perm, "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0, "order": "false", "attributes": args.attributes}
    if args.admin_token:
        ext["adminToken"] = args.admin_token
    out = []
    for name, addr in (await admin.masters(_groups(args.broker_names), args.cluster)).items():
        cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        try:
            resp = await admin.session.request(addr, cmd, args.timeout)
        except RemotingError as exc:
            out.append(TopicChange(name, addr, False, str(exc)))
            continue
        out.append(TopicChange(name, addr, resp.code == ResponseCode.SUCCESS, resp.remark or ""))
    return out


@reports_errors("namesrv")
def _delete_topic(args: argparse.Namespace) -> int:
    async def run() -> list[TopicChange]:
        async with TopicAdmin(args.namesrv, admin_token=args.admin_token, timeout_s=args.timeout,
                              **client_options(args)) as admin:
            return await admin.delete_topic(args.topic, groups=_groups(args.broker_names),
                                            cluster=args.cluster)
    changes = event_loop.run(run())
    # Like mqadmin deleteTopic: drop the topic from the name servers' routes as well.
    ext: dict[str, Any] = {"topic": args.topic}
    if args.admin_token:
        ext["adminToken"] = args.admin_token
    namesrv: dict[str, str] = {}
    for addr in split_addresses(args.namesrv):
        try:
            with BlockingRemotingClient(addr, connect_timeout=args.timeout, security=client_security(args),
                                        expect=ServerRole.namesrv()) as client:
                resp = client.request(RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext),
                                      args.timeout)
            namesrv[addr] = "OK" if resp.code == ResponseCode.SUCCESS else f"FAILED {resp.remark}"
        except (RemotingError, TimeoutError) as exc:
            namesrv[addr] = f"FAILED {exc}"
    code = _changes(args, changes, {"namesrv": namesrv})
    if not args.json:
        for addr, result in namesrv.items():
            print(f"namesrv {addr}: {result}")
    return code if all(v == "OK" for v in namesrv.values()) else 1


def _ns_request(args: argparse.Namespace, code: int) -> Any:
    errors = []
    for addr in split_addresses(args.namesrv):
        try:
            with BlockingRemotingClient(addr, connect_timeout=args.timeout, security=client_security(args),
                                        expect=ServerRole.namesrv()) as client:
                resp = client.request(RemotingCommand.request(code), args.timeout)
        except (RemotingError, TimeoutError) as exc:
            errors.append(f"{addr}: {exc or type(exc).__name__}")
            continue
        resp.check_success(code)
        return resp.json_body() or {}
    raise RemotingError("no name server answered (" + "; ".join(errors or ["no address given"]) + ")")


@reports_errors("namesrv")
def _topic_list(args: argparse.Namespace) -> int:
    topics = sorted(_ns_request(args, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).get("topicList") or [])
    emit(args, {"topicList": topics}, topics)
    return 0


def _broker_status(addr: str, timeout: float, security: ClientSecurity | None) -> dict[str, Any] | None:
    try:
        with BlockingRemotingClient(addr, connect_timeout=timeout, security=security,
                                    expect=ServerRole.broker()) as client:
            resp = client.request(RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), timeout)
    except (RemotingError, TimeoutError):
        return None
    return resp.json_body() if resp.code == ResponseCode.SUCCESS else None


@reports_errors("namesrv")
def _cluster_list(args: argparse.Namespace) -> int:
    security = client_security(args)
    info = cluster_info(args.namesrv, args.timeout, security)
    brokers = info.get("brokerAddrTable") or {}
    clusters = info.get("clusterAddrTable") or {}
    out: list[dict[str, Any]] = []
    for cluster in sorted(clusters):
        if args.cluster_name and cluster != args.cluster_name:
            continue
        for name in sorted(clusters[cluster]):
            addrs = (brokers.get(name) or {}).get("brokerAddrs") or {}
            for bid, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
                st = _broker_status(str(addr), min(args.timeout, 1.0), security) or {}
                out.append({"cluster": cluster, "brokerName": name, "brokerId": int(bid), "address": addr,
                            "role": st.get("role"), "controllerBrokerId": st.get("controllerBrokerId"),
                            "masterEpoch": st.get("masterEpoch"), "maxOffset": st.get("maxOffset"),
                            "confirmOffset": st.get("confirmOffset")})
    rows = [(r["cluster"], r["brokerName"], r["brokerId"], r["address"], r["role"], r["controllerBrokerId"],
             r["masterEpoch"], r["maxOffset"], r["confirmOffset"]) for r in out]
    emit(args, {"brokers": out}, table(("#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Role", "#ControllerId",
                                        "#MasterEpoch", "#MaxOffset", "#ConfirmOffset"), rows))
    return 0


@reports_errors("namesrv")
def _topic_route(args: argparse.Namespace) -> int:
    from rmqha.client.route import ClientSession

    async def run() -> Any:
        session = ClientSession(args.namesrv, security=client_security(args))
        try:
            route = await session.route(args.topic, refresh=True)
        finally:
            await session.close()
        return route

    route = event_loop.run(run())
    data = {
        "queueDatas": [vars(q) for q in route.queue_datas],
        "brokerDatas": [{"brokerName": b.broker_name, "cluster": b.cluster,
                         "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()}}
                        for b in route.broker_datas.values()],
    }
    lines = table(("#BrokerName", "#ReadQueueNums", "#WriteQueueNums", "#Perm"),
                  [(q.get("broker_name", q.get("brokerName")), q.get("read_queue_nums", q.get("readQueueNums")),
                    q.get("write_queue_nums", q.get("writeQueueNums")), q.get("perm"))
                   for q in data["queueDatas"]])
    for b in data["brokerDatas"]:
        lines.append(f"#Broker {b['brokerName']} ({b['cluster']}): "
                     + ", ".join(f"{k}={v}" for k, v in sorted(b["brokerAddrs"].items())))
    emit(args, data, lines)
    return 0


@reports_errors("namesrv")
def _send(args: argparse.Namespace) -> int:
    from rmqha.client import BlockingProducer, Message

    lines = args.message or [line.rstrip("\n") for line in sys.stdin]
    results = []
    with BlockingProducer(args.namesrv, send_timeout_s=args.timeout,
                          retry_deadline_s=args.retry_deadline_s, **client_options(args)) as p:
        for text in lines:
            r = p.send(args.topic, Message(text.encode("utf-8"), tags=args.tags, keys=args.keys))
            results.append({"status": r.status.value, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
                            "brokerName": r.queue.broker_name, "queueId": r.queue.queue_id,
                            "queueOffset": r.queue_offset, "attempts": r.attempts})
    rows = [(r["status"], r["msgId"], r["brokerName"], r["queueId"], r["queueOffset"]) for r in results]
    emit(args, results, table(("#Status", "#MsgId", "#BrokerName", "#QueueId", "#QueueOffset"), rows))
    return 0 if all(r["status"] == "SEND_OK" for r in results) else 1


@reports_errors("namesrv")
def _consume(args: argparse.Namespace) -> int:
    import json

    from rmqha.client import BlockingConsumer

    seen = 0
    if not args.json:
        write_blocks(table(("#BrokerName", "#QueueId", "#QueueOffset", "#MsgId", "#Body"), []))
    with BlockingConsumer(args.namesrv, args.group, args.topic, tags=args.tags,
                          **client_options(args)) as c:
        idle = 0.0
        while (args.count <= 0 or seen < args.count) and idle < args.idle_s:
            msgs = c.poll(1.0)
            idle = 0.0 if msgs else idle + 1.0
            for m in msgs:
                seen += 1
                body = m.body.decode("utf-8", "replace")
                if args.json:  # one JSON object per line: consume is a stream
                    print(json.dumps({"brokerName": m.broker_name, "queueId": m.queue_id,
                                      "queueOffset": m.queue_offset, "msgId": m.msg_id, "tags": m.tags,
                                      "keys": m.keys, "body": body}), flush=True)
                else:
                    print(f"{m.broker_name}  {m.queue_id}  {m.queue_offset}  {m.msg_id}  {body}", flush=True)
                if 0 < args.count <= seen:
                    break
        c.commit()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    token = os.environ.get("RMQHA_ADMIN_TOKEN")
    p = subparsers.add_parser("cluster-list", aliases=["clusterList"],
                              help="every broker of every cluster: role, epoch, offsets")
    _common(p)
    p.add_argument("-c", "--cluster-name", "--clusterName", dest="cluster_name", default=None)
    p.set_defaults(func=_cluster_list)
    p = subparsers.add_parser("topic-list", aliases=["topicList"], help="every topic the name servers route")
    _common(p)
    p.set_defaults(func=_topic_list)
    for name, alias, func, help_ in (
        ("update-topic", "updateTopic", _update_topic, "create or update a topic on broker groups"),
        ("delete-topic", "deleteTopic", _delete_topic, "delete a topic from broker groups and name servers"),
    ):
        p = subparsers.add_parser(name, aliases=[alias], help=help_)
        _common(p)
        p.add_argument("-t", "--topic", required=True)
        p.add_argument("-b", "--broker-names", "--brokerName", dest="broker_names",
                       help="broker groups, comma-separated")
        p.add_argument("-c", "--cluster", "--clusterName", dest="cluster", help="every group of this cluster")
        p.add_argument("--admin-token", default=token, help="the cluster's admin token (default: $RMQHA_ADMIN_TOKEN)")
        if func is _update_topic:
            p.add_argument("-r", "--read-queue-nums", "--readQueueNums", type=int, default=8)
            p.add_argument("-w", "--write-queue-nums", "--writeQueueNums", type=int, default=None)
            p.add_argument("-p", "--perm", type=int, default=6)
            p.add_argument("-a", "--attributes", default=None,
                           help="RocketMQ 5 topic attributes, +key=value,-key "
                                "(e.g. +message.type=FIFO|DELAY|TRANSACTION|NORMAL)")
        p.set_defaults(func=func)
    p = subparsers.add_parser("topic-route", aliases=["topicRoute"], help="show a topic's route")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(func=_topic_route)
    p = subparsers.add_parser("send", aliases=["produce", "sendMessage"],
                              help="send messages (arguments, or one per stdin line)")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("--tags")
    p.add_argument("-k", "--keys")
    p.add_argument("--retry-deadline-s", type=float, default=10.0,
                   help="give up on a message after retrying this long")
    p.add_argument("message", nargs="*")
    p.set_defaults(func=_send)
    p = subparsers.add_parser("consume", aliases=["consumeMessage"],
                              help="print a topic's messages as a consumer group member")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-g", "--group", "--consumerGroup", dest="group", required=True)
    p.add_argument("--tags", default="*")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--idle-s", type=float, default=5.0,
                   help="stop after this long without messages")
    p.set_defaults(func=_consume)
