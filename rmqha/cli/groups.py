"""Consumer (subscription) group commands, named like mqadmin's.

``update-sub-group`` (``updateSubGroup``) creates or replaces a group's settings on the
masters of a cluster (``-c``, resolved through ``-n``) or on one broker (``-b ADDR``), as
mqadmin builds them: RocketMQ's defaults with broadcast and from-min off, then the flags
given (``-o true``: consume orderly, which makes the group's pops FIFO; ``-r N``: deliveries
before the dead-letter queue).  ``delete-sub-group`` (``deleteSubGroup``) removes one.  The
admin token (when brokers have one) comes from ``--admin-token`` or ``RMQHA_ADMIN_TOKEN``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rmqha.cli.client_security import add_flags, client_security
from rmqha.cli.lookup import members
from rmqha.cli.output import add_json_flag, emit, reports_errors, table
from rmqha.errors import ConfigError, RemotingError
from rmqha.net.blocking import BlockingRemotingClient
from rmqha.net.client_security import ServerRole
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.topic_attributes import parse_modification

#: flag dest -> SubscriptionGroupConfig field, for the boolean flags (mqadmin's letters).
_BOOL_FLAGS = {
    "consume_enable": "consume_enable",
    "consume_from_min": "consume_from_min_enable",
    "broadcast": "consume_broadcast_enable",
    "orderly": "consume_message_orderly",
    "notify": "notify_consumer_ids_changed_enable",
}
_INT_FLAGS = {
    "retry_queue_nums": "retry_queue_nums",
    "retry_max_times": "retry_max_times",
    "broker_id": "broker_id",
    "slow_broker": "which_broker_when_consume_slowly",
}


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namesrv-addr", "--namesrvAddr", dest="namesrv",
                   default=os.environ.get("RMQHA_NAMESRV_ADDR"),
                   help="name server addresses for -c, host:port;host:port")
    p.add_argument("-c", "--cluster-name", "--clusterName", dest="cluster",
                   help="every master of this cluster")
    p.add_argument("-b", "--broker-addr", "--brokerAddr", dest="broker_addr",
                   help="one broker, host:port")
    p.add_argument("-g", "--group-name", "--groupName", dest="group", required=True)
    p.add_argument("--admin-token", default=os.environ.get("RMQHA_ADMIN_TOKEN"),
                   help="the cluster's admin token (default: $RMQHA_ADMIN_TOKEN)")
    p.add_argument("--timeout", type=float, default=3.0, help="per-request timeout in seconds")
    add_flags(p)  # an admin account and TLS: a secured broker takes group changes from admins only
    add_json_flag(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("update-sub-group", aliases=["updateSubGroup"],
                              help="create or update a consumer group on broker masters")
    _common(p)
    for flag, long, dest, help_ in (
            ("-s", "--consume-enable", "consume_enable", "consume enable"),
            ("-m", "--consume-from-min-enable", "consume_from_min", "from min offset"),
            ("-d", "--consume-broadcast-enable", "broadcast", "broadcast"),
            ("-o", "--consume-message-orderly", "orderly",
             "consume message orderly (pops of the group are FIFO)"),
            ("-a", "--notify-consumer-ids-changed", "notify", "notify consumerId changed")):
        p.add_argument(flag, long, dest=dest, type=_bool, default=None, help=help_)
    for flag, long, dest, help_ in (
            ("-q", "--retry-queue-nums", "retry_queue_nums", "retry queue nums"),
            ("-r", "--retry-max-times", "retry_max_times",
             "deliveries before the dead-letter queue"),
            ("-i", "--broker-id", "broker_id", "consumer from which broker id"),
            ("-w", "--which-broker-when-consume-slowly", "slow_broker",
             "which broker id when consume slowly")):
        p.add_argument(flag, long, dest=dest, type=int, default=None, help=help_)
    p.add_argument("--attributes", default=None, help="attribute(+a=b,+c=d,-e)")
    p.set_defaults(func=_update_sub_group)
    p = subparsers.add_parser("delete-sub-group", aliases=["deleteSubGroup"],
                              help="delete a consumer group from broker masters")
    _common(p)
    p.set_defaults(func=_delete_sub_group)


def group_config(args: argparse.Namespace) -> SubscriptionGroupConfig:
    """The config mqadmin's updateSubGroup builds from its flags."""
    cfg = SubscriptionGroupConfig(args.group.strip(), consume_broadcast_enable=False,
                                  consume_from_min_enable=False)
    for dest, name in {**_BOOL_FLAGS, **_INT_FLAGS}.items():
        value = getattr(args, dest)
        if value is not None:
            setattr(cfg, name, value)
    if args.attributes:
        cfg.attributes = {k.lstrip("+"): v for k, v in parse_modification(args.attributes).items()
                          if k.startswith("+")}
    if cfg.retry_max_times < 0:
        raise ConfigError(f"-r/--retry-max-times must be >= 0, got {cfg.retry_max_times}")
    return cfg


def _targets(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    """(broker name, address) of the masters to change; None after printing why not."""
    if args.broker_addr:
        return [(args.broker_addr, args.broker_addr)]
    if not args.cluster or not args.namesrv:
        print("name the brokers with -b BROKER_ADDR, or -c CLUSTER with -n NAMESRV",
              file=sys.stderr)
        return None
    return [(m.broker_name, m.address) for m in
            members(args.namesrv, cluster=args.cluster, timeout=args.timeout, security=client_security(args))
            if m.namesrv_id == 0]


def _apply(args: argparse.Namespace, code: int, ext: dict[str, Any], body: Any) -> int:
    targets = _targets(args)
    if targets is None:
        return 2
    if args.admin_token:
        ext["adminToken"] = args.admin_token
    rows: list[tuple[str, str, str, str]] = []
    for name, addr in targets:
        try:
            with BlockingRemotingClient(addr, connect_timeout=args.timeout, security=client_security(args),
                                        expect=ServerRole.broker()) as client:
                resp = client.request(RemotingCommand.request(code, ext, body), args.timeout)
            ok, remark = resp.code == ResponseCode.SUCCESS, resp.remark or ""
        except (RemotingError, TimeoutError) as exc:
            ok, remark = False, str(exc) or type(exc).__name__
        rows.append((name, addr, "OK" if ok else "FAILED", remark))
    data = {"group": args.group, "changes": [
        {"brokerName": n, "address": a, "ok": r == "OK", "remark": m} for n, a, r, m in rows]}
    emit(args, data, table(("#BrokerName", "#BrokerAddr", "#Result", "#Remark"), rows))
    return 0 if rows and all(r[2] == "OK" for r in rows) else 1


@reports_errors("broker")
def _update_sub_group(args: argparse.Namespace) -> int:
    try:
        cfg = group_config(args)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return _apply(args, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, cfg.to_rocketmq())


@reports_errors("broker")
def _delete_sub_group(args: argparse.Namespace) -> int:
    return _apply(args, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                  {"groupName": args.group.strip(), "cleanOffset": "false"}, b"")
