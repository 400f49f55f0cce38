"""Client commands of ``rmqha``: topics (mqadmin's names) and quick produce/consume.

``update-topic`` (alias ``updateTopic``), ``delete-topic`` (``deleteTopic``), ``topic-route``
(``topicRoute``), ``produce`` and ``consume``.  Each takes ``-n/--namesrv-addr`` (``a;b``).
Topic changes go to the masters of the groups named with ``-b`` (comma-separated), of a
cluster with ``-c``, or of every group; the admin token (when brokers have one) comes from
``--admin-token`` or ``RMQHA_ADMIN_TOKEN``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from rmqha.client.admin import TopicAdmin, TopicChange


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namesrv-addr", "--namesrvAddr", dest="namesrv", required=True,
                   help="name server addresses, host:port;host:port")


def _groups(value: str | None) -> list[str] | None:
    return [g.strip() for g in value.split(",") if g.strip()] if value else None


def _print_changes(changes: list[TopicChange]) -> int:
    for c in changes:
        print(f"{c.broker_name:<20} {c.address:<22} {'OK' if c.ok else 'FAILED'} {c.remark}")
    return 0 if changes and all(c.ok for c in changes) else 1


def _update_topic(args: argparse.Namespace) -> int:
    async def run() -> list[TopicChange]:
        async with TopicAdmin(args.namesrv, admin_token=args.admin_token) as admin:
            return await admin.create_topic(args.topic, args.read_queue_nums,
                                            args.write_queue_nums, perm=args.perm,
                                            groups=_groups(args.broker_names),
                                            cluster=args.cluster)
    return _print_changes(asyncio.run(run()))


def _delete_topic(args: argparse.Namespace) -> int:
    async def run() -> list[TopicChange]:
        async with TopicAdmin(args.namesrv, admin_token=args.admin_token) as admin:
            return await admin.delete_topic(args.topic, groups=_groups(args.broker_names),
                                            cluster=args.cluster)
    return _print_changes(asyncio.run(run()))


def _topic_route(args: argparse.Namespace) -> int:
    from rmqha.client.route import ClientSession

    async def run() -> Any:
        session = ClientSession(args.namesrv)
        try:
            route = await session.route(args.topic, refresh=True)
        finally:
            await session.close()
        return route

    route = asyncio.run(run())
    print(json.dumps({
        "queueDatas": [vars(q) for q in route.queue_datas],
        "brokerDatas": [{"brokerName": b.broker_name, "cluster": b.cluster,
                         "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()}}
                        for b in route.broker_datas.values()],
    }, indent=2))
    return 0


def _produce(args: argparse.Namespace) -> int:
    from rmqha.client import BlockingProducer, Message

    lines = args.message or [line.rstrip("\n") for line in sys.stdin]
    with BlockingProducer(args.namesrv) as p:
        for text in lines:
            r = p.send(args.topic, Message(text.encode("utf-8"), tags=args.tags))
            q = r.queue
            print(f"{r.status.value} {r.msg_id} {q.broker_name}/{q.queue_id}@{r.queue_offset}")
    return 0


def _consume(args: argparse.Namespace) -> int:
    from rmqha.client import BlockingConsumer

    seen = 0
    with BlockingConsumer(args.namesrv, args.group, args.topic, tags=args.tags) as c:
        idle = 0.0
        while (args.count <= 0 or seen < args.count) and idle < args.idle_s:
            msgs = c.poll(1.0)
            idle = 0.0 if msgs else idle + 1.0
            for m in msgs:
                seen += 1
                print(f"{m.broker_name}/{m.queue_id}@{m.queue_offset} {m.msg_id} "
                      f"{m.body.decode('utf-8', 'replace')}")
        c.commit()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    token = os.environ.get("RMQHA_ADMIN_TOKEN")
    for name, alias, func, help_ in (
        ("update-topic", "updateTopic", _update_topic, "create or update a topic on broker groups"),
        ("delete-topic", "deleteTopic", _delete_topic, "delete a topic from broker groups"),
    ):
        p = subparsers.add_parser(name, aliases=[alias], help=help_)
        _common(p)
        p.add_argument("-t", "--topic", required=True)
        p.add_argument("-b", "--broker-names", help="broker groups, comma-separated")
        p.add_argument("-c", "--cluster", help="every group of this cluster")
        p.add_argument("--admin-token", default=token)
        if func is _update_topic:
            p.add_argument("-r", "--read-queue-nums", "--readQueueNums", type=int, default=8)
            p.add_argument("-w", "--write-queue-nums", "--writeQueueNums", type=int, default=None)
            p.add_argument("-p", "--perm", type=int, default=6)
        p.set_defaults(func=func)
    p = subparsers.add_parser("topic-route", aliases=["topicRoute"], help="show a topic's route")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(func=_topic_route)
    p = subparsers.add_parser("produce", help="send messages (arguments or stdin lines)")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("--tags")
    p.add_argument("message", nargs="*")
    p.set_defaults(func=_produce)
    p = subparsers.add_parser("consume", help="print a topic's messages as a group member")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-g", "--group", required=True)
    p.add_argument("--tags", default="*")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--idle-s", type=float, default=5.0,
                   help="stop after this long without messages")
    p.set_defaults(func=_consume)
