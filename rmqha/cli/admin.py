"""Controller admin commands, named like mqadmin's (kebab-case, with camelCase aliases).

``get-controller-metadata``, ``get-sync-state-set``, ``elect-master``,
``clean-broker-metadata``, ``get-controller-config``, ``update-controller-config``.
Each takes ``-a/--controller-address`` (``a;b;c``), prints a human table (mqadmin's
layout) or ``--json``, and exits non-zero on a refusal with the controller's remark or on
an unreachable address (named, with what to check; no traceback).
``get-sync-state-set`` takes broker names (``-b``, repeatable) or ``-c CLUSTER -n NAMESRV``
(the cluster's groups, resolved through the name server as mqadmin does).
The admin token (when the controllers have one) comes from ``--admin-token`` or the
environment variable ``RMQHA_ADMIN_TOKEN``.  Writes (elect, clean, config update) are
signed with the cluster secret, from ``RMQHA_CLUSTER_SECRET`` or the file named by
``--cluster-secret-file`` / ``RMQHA_CLUSTER_SECRET_FILE`` (never a command-line value:
other users can read those).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from rmqha.cli.client_security import add_flags, client_security
from rmqha.cli.lookup import group_names
from rmqha.cli.output import add_json_flag, emit, reports_errors
from rmqha.config import ConfigError, camel_to_snake, resolve_key
from rmqha.controller.client import BlockingControllerClient
from rmqha.controller.config import UPDATE_BLACKLIST, ControllerConfig
from rmqha.errors import ControllerError
from rmqha.security.secret_policy import resolve_secret


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-a", "--controller-address", "--controllerAddress", dest="controller_address",
                   required=True, help="controller addresses, host:port;host:port")
    add_json_flag(p)
    p.add_argument("--timeout", type=float, default=3.0, help="per-request timeout in seconds")
    p.add_argument("--admin-token", default=os.environ.get("RMQHA_ADMIN_TOKEN"),
                   help="the cluster's admin token (default: $RMQHA_ADMIN_TOKEN)")
    add_flags(p, credentials=False)
    p.add_argument("--cluster-secret-file", default=None,
                   help="file holding the cluster secret that signs writes "
                        "(default: $RMQHA_CLUSTER_SECRET, else $RMQHA_CLUSTER_SECRET_FILE)")


def _client(args: argparse.Namespace, *, leader: bool = False) -> BlockingControllerClient:
    """A client; with ``leader`` it first asks GET_METADATA_INFO (as mqadmin does), so an
    unreachable address or a group without a leader fails at once instead of after the
    client's leader-search retries."""
    secret = resolve_secret(None if args.cluster_secret_file else os.environ.get("RMQHA_CLUSTER_SECRET"),
                            args.cluster_secret_file or os.environ.get("RMQHA_CLUSTER_SECRET_FILE"))
    client = BlockingControllerClient(args.controller_address, request_timeout=args.timeout,
                                      admin_token=args.admin_token, security=client_security(args),
                                      cluster_secret=secret)
    if leader:
        try:
            meta = client.get_metadata()
        except BaseException:
            client.close()
            raise
        if not meta.leader_address:
            client.close()
            raise ControllerError(f"controller {meta.address} answers but its group has no leader "
                                  "right now (a majority of controllers must be up); retry shortly")
    return client


def _emit(args: argparse.Namespace, data: Any, lines: list[str]) -> None:
    emit(args, data, lines)


def _command(subparsers: argparse._SubParsersAction, name: str, alias: str, help_text: str,
             func: Any) -> argparse.ArgumentParser:
    """One admin subcommand with the flags every one of them takes."""
    p = subparsers.add_parser(name, aliases=[alias], help=help_text)
    _common(p)
    p.set_defaults(func=func)
    return p


def _group_flags(p: argparse.ArgumentParser) -> None:
    """``-c`` (cluster, informational) and ``-bn`` (the broker group acted on)."""
    p.add_argument("-c", "--cluster-name", "--clusterName", dest="cluster_name", default="")
    p.add_argument("-bn", "--broker-name", "--brokerName", dest="broker_name", required=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    _command(subparsers, "get-controller-metadata", "getControllerMetaData",
             "controller group, leader and peers", get_controller_metadata)

    p = _command(subparsers, "get-sync-state-set", "getSyncStateSet",
                 "master, epochs and SyncStateSet of broker groups", get_sync_state_set)
    p.add_argument("-b", "--broker-name", "--brokerName", dest="broker_name", action="append",
                   default=[], help="broker name (repeat for several)")
    p.add_argument("-c", "--cluster-name", "--clusterName", dest="cluster_name", default=None,
                   help="every broker group of this cluster (resolved through -n)")
    p.add_argument("-n", "--namesrv-addr", "--namesrvAddr", dest="namesrv", default=None,
                   help="name server addresses for -c, host:port;host:port")

    p = _command(subparsers, "elect-master", "electMaster",
                 "make a given broker the master of its group", elect_master)
    _group_flags(p)
    p.add_argument("-b", "--broker-id", "--brokerId", dest="broker_id", type=int, required=True)

    p = _command(subparsers, "clean-broker-metadata", "cleanBrokerMetadata",
                 "remove broker ids (or a whole group) from the controller", clean_broker_metadata)
    _group_flags(p)
    p.add_argument("-b", "--broker-ids", "--brokerControllerIdsToClean", dest="broker_ids",
                   default="", help="ids to clean, 1;2;3 (default: the whole group)")
    p.add_argument("-l", "--clean-living-broker", "--cleanLivingBroker", dest="clean_living",
                   action="store_true", help="also clean brokers that are alive")

    _command(subparsers, "get-controller-config", "getControllerConfig",
             "the configuration of each controller", get_controller_config)

    p = _command(subparsers, "update-controller-config", "updateControllerConfig",
                 "change a runtime setting on each controller", update_controller_config)
    p.add_argument("-k", "--key", required=True)
    p.add_argument("-v", "--value", required=True)


@reports_errors("controller")
def get_controller_metadata(args: argparse.Namespace) -> int:
    with _client(args) as client:
        meta = client.get_metadata()
    lines = [f"#ControllerGroup\t{meta.group}", f"#ControllerLeaderId\t{meta.leader_id}",
             f"#ControllerLeaderAddress\t{meta.leader_address}"]
    lines += [f"#Peer:\t{pid}:{addr}" for pid, addr in meta.peers]
    _emit(args, dataclasses.asdict(meta), lines)
    return 0


@reports_errors("controller")
def get_sync_state_set(args: argparse.Namespace) -> int:
    names = list(args.broker_name)
    if args.cluster_name:
        if not args.namesrv:
            print("-c/--cluster-name needs -n/--namesrv-addr to find the cluster's broker groups",
                  file=sys.stderr)
            return 2
        names += [n for n in group_names(args.namesrv, args.cluster_name, args.timeout,
                                         client_security(args)) if n not in names]
    if not names:
        print("name broker groups with -b BROKER_NAME or a cluster with -c CLUSTER -n NAMESRV",
              file=sys.stderr)
        return 2
    args.broker_name = names
    with _client(args, leader=True) as client:
        table = client.get_sync_state_data(args.broker_name)
    lines: list[str] = []
    for name, st in table.items():
        lines += ["", f"#brokerName\t{name}", f"#MasterBrokerId\t{st.master_broker_id}",
                  f"#MasterAddr\t{st.master_address}", f"#MasterEpoch\t{st.master_epoch}",
                  f"#SyncStateSetEpoch\t{st.sync_state_set_epoch}",
                  f"#SyncStateSetNums\t{len(st.in_sync_replicas)}"]
        for kind, reps in (("InSyncReplica", st.in_sync_replicas),
                           ("NotInSyncReplica", st.not_in_sync_replicas)):
            for r in reps:
                lines.append(f"{kind}:\tReplicaIdentity{{brokerName='{r.broker_name}', "
                             f"brokerId={r.broker_id}, brokerAddress='{r.broker_address}', "
                             f"alive={str(r.alive).lower()}}}")
    missing = [n for n in args.broker_name if n not in table]
    for n in missing:
        lines.append(f"broker set {n} is not known to the controller")
    _emit(args, {n: dataclasses.asdict(s) for n, s in table.items()}, lines)
    return 1 if missing and not table else 0


@reports_errors("controller")
def elect_master(args: argparse.Namespace) -> int:
    with _client(args, leader=True) as client:
        res = client.elect_master(args.cluster_name, args.broker_name, args.broker_id, designate=True)
    lines = [f"#ClusterName\t{args.cluster_name}", f"#BrokerName\t{args.broker_name}",
             f"#BrokerMasterAddr\t{res.master_address}", f"#MasterEpoch\t{res.master_epoch}",
             f"#SyncStateSetEpoch\t{res.sync_state_set_epoch}"]
    lines += [f"\t#Broker\t{bid}\t{addr}" for bid, addr in sorted(res.broker_addrs.items())]
    if res.code != 0:
        lines.append(f"(master {res.master_broker_id} is alive and stays master)")
    _emit(args, dataclasses.asdict(res), lines)
    return 0


@reports_errors("controller")
def clean_broker_metadata(args: argparse.Namespace) -> int:
    if not args.clean_living and not args.cluster_name:
        print("cleanLivingBroker option is false, clusterName option can not be empty.",
              file=sys.stderr)
        return 2
    ids = [int(x) for x in args.broker_ids.split(";") if x.strip()] if args.broker_ids else None
    with _client(args, leader=True) as client:
        client.clean_broker_data(args.broker_name, ids, cluster=args.cluster_name,
                                 clean_living_broker=args.clean_living)
    _emit(args, {"brokerName": args.broker_name, "cleaned": ids or "all"},
          [f"clear broker {args.broker_name} metadata from controller success! "])
    return 0


@reports_errors("controller")
def get_controller_config(args: argparse.Namespace) -> int:
    out: dict[str, dict[str, str]] = {}
    lines: list[str] = []
    with _client(args) as client:
        for addr in client.addresses:
            cfg = client.get_controller_config(addr)
            out[addr] = cfg
            lines.append(f"============{addr}============")
            lines += [f"{k:<50s}=  {v}" for k, v in cfg.items()]
    _emit(args, out, lines)
    return 0


@reports_errors("controller")
def update_controller_config(args: argparse.Namespace) -> int:
    try:
        name = resolve_key(ControllerConfig, args.key, "the command line")
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if name in UPDATE_BLACKLIST or camel_to_snake(args.key) in UPDATE_BLACKLIST:
        print(f"refusing to update {args.key}: it redirects storage, membership or security "
              "and can only be changed in the config file", file=sys.stderr)
        return 2
    with _client(args) as client:
        client.update_controller_config({args.key: args.value})
        addrs = client.addresses
    _emit(args, {"updated": {args.key: args.value}, "controllers": addrs},
          [f"update controller config success!{addrs}", f"{args.key} : {args.value}"])
    return 0
