"""Message lookup commands (mqadmin's names as aliases).

``query-msg-by-key`` (``queryMsgByKey``): messages of a topic carrying a key (``KEYS``),
from every broker group of the topic.  ``query-msg-by-id`` (``queryMsgById``,
``queryMsgByUniqueKey``): messages by id, each id read as a unique id (the client
``msgId``) in ``-t TOPIC`` or as an offset message id (store host + commitlog offset).
Both take ``-n/--namesrv-addr``, print a table by default and JSON with ``--json``, and
exit 1 when nothing was found.
"""
from __future__ import annotations

import argparse
import datetime
import os
from typing import Any

from rmqha.net import loop as event_loop
from rmqha.cli.client_security import add_flags, client_options
from rmqha.cli.output import add_json_flag, emit, reports_errors, table
from rmqha.client.message_query import MAX_RESULTS, MessageQuery
from rmqha.protocol.message import ReceivedMessage

_FOREVER_MS = 2**63 - 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namesrv-addr", "--namesrvAddr", dest="namesrv",
                   default=os.environ.get("RMQHA_NAMESRV_ADDR"),
                   required="RMQHA_NAMESRV_ADDR" not in os.environ,
                   help="name server addresses, host:port;host:port (default: $RMQHA_NAMESRV_ADDR)")
    add_json_flag(p)
    p.add_argument("--timeout", type=float, default=3.0, help="per-request timeout in seconds")
    add_flags(p)


def _time(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def _as_json(m: ReceivedMessage) -> dict[str, Any]:
    return {"topic": m.topic, "msgId": m.msg_id, "brokerName": m.broker_name,
            "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commit_offset,
            "storeHost": m.store_host, "storeTimestamp": m.store_timestamp, "tags": m.tags,
            "keys": m.keys, "properties": m.properties, "reconsumeTimes": m.reconsume_times,
            "body": m.body.decode("utf-8", "replace")}


def _rows(msgs: list[ReceivedMessage]) -> list[str]:
    return table(("#MsgId", "#StoreHost", "#QueueId", "#QueueOffset", "#StoreTime", "#Keys"),
                 [(m.msg_id, m.store_host, m.queue_id, m.queue_offset, _time(m.store_timestamp),
                   m.keys) for m in msgs])


@reports_errors("namesrv")
def _by_key(args: argparse.Namespace) -> int:
    async def run() -> list[ReceivedMessage]:
        async with MessageQuery(args.namesrv, timeout_s=args.timeout, **client_options(args)) as q:
            return await q.by_key(args.topic, args.key, max_num=args.max_num,
                                  begin_ms=args.begin, end_ms=args.end)
    msgs = event_loop.run(run())
    emit(args, [_as_json(m) for m in msgs],
         _rows(msgs) if msgs else [f"no message of topic {args.topic} with key {args.key}"])
    return 0 if msgs else 1


@reports_errors("namesrv")
def _by_id(args: argparse.Namespace) -> int:
    ids = [i.strip() for i in args.msg_id.split(",") if i.strip()]

    async def run() -> dict[str, list[ReceivedMessage]]:
        async with MessageQuery(args.namesrv, timeout_s=args.timeout, **client_options(args)) as q:
            return {i: await q.by_id(i, args.topic) for i in ids}
    found = event_loop.run(run())
    lines: list[str] = []
    for msg_id, msgs in found.items():
        if not msgs:
            lines.append(f"no message with id {msg_id}"
                         + ("" if args.topic else " (a unique id needs -t TOPIC)"))
        for m in msgs:
            lines += [f"Topic:               {m.topic}", f"Tags:                [{m.tags or ''}]",
                      f"Keys:                [{m.keys or ''}]", f"Queue ID:            {m.queue_id}",
                      f"Queue Offset:        {m.queue_offset}",
                      f"CommitLog Offset:    {m.commit_offset}",
                      f"Reconsume Times:     {m.reconsume_times}",
                      f"Born Timestamp:      {_time(m.born_timestamp)}",
                      f"Store Timestamp:     {_time(m.store_timestamp)}",
                      f"Store Host:          {m.store_host}", f"Msg ID:              {m.msg_id}",
                      f"Properties:          {m.properties}",
                      f"Message Body:        {m.body.decode('utf-8', 'replace')}", ""]
    emit(args, {i: [_as_json(m) for m in ms] for i, ms in found.items()}, lines)
    return 0 if all(found.values()) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("query-msg-by-key", aliases=["queryMsgByKey"],
                              help="messages of a topic carrying a key")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--key", "--msgKey", dest="key", required=True)
    p.add_argument("-m", "--max-num", "--maxNum", dest="max_num", type=int, default=MAX_RESULTS)
    p.add_argument("-b", "--begin-timestamp", "--beginTimestamp", dest="begin", type=int, default=0,
                   help="stored at or after (ms since the epoch)")
    p.add_argument("-e", "--end-timestamp", "--endTimestamp", dest="end", type=int,
                   default=_FOREVER_MS, help="stored at or before (ms since the epoch)")
    p.set_defaults(func=_by_key)
    p = subparsers.add_parser("query-msg-by-id", aliases=["queryMsgById", "queryMsgByUniqueKey"],
                              help="messages by unique id (with -t) or offset message id")
    _common(p)
    p.add_argument("-i", "--msg-id", "--msgId", dest="msg_id", required=True,
                   help="message ids, comma-separated")
    p.add_argument("-t", "--topic", default=None, help="the topic (needed for unique ids)")
    p.set_defaults(func=_by_id)
