"""``rmqha broker --config FILE`` runs one broker; two read-only broker admin queries.

- ``rmqha get-broker-epoch`` (alias ``getBrokerEpoch``): each replica's epoch map
  (GET_BROKER_EPOCH_CACHE), printed like RocketMQ's ``mqadmin getBrokerEpoch``.
- ``rmqha ha-status`` (alias ``haStatus``): a master's slaves (ack offset, lag in bytes
  and ms, in sync or not) or a slave's link to its master (GET_BROKER_HA_STATUS), laid
  out like ``mqadmin haStatus``; ``--watch`` refreshes it (with the catch-up progress of
  slaves outside the SyncStateSet) until Ctrl-C or ``--count`` rounds
  (:mod:`rmqha.cli.ha_watch`).

Both take ``-b`` as a broker address (``host:port``) or, with ``-n``, a broker group
name (every live member is asked), or ``-c CLUSTER -n NAMESRV`` for every group of a
cluster; ``--json`` prints the raw answers keyed by broker address.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rmqha.broker.broker import run_broker
from rmqha.broker.config import BrokerConfig, load_broker_config
from rmqha.cli.client_security import add_flags, client_security
from rmqha.cli.ha_watch import ask_each, watch
from rmqha.cli.lookup import is_address, members
from rmqha.cli.output import Block, add_json_flag, emit, reports_errors, table
from rmqha.protocol.codes import RequestCode
from rmqha.cli.serving import add_server_parser, serve_until_signalled
from rmqha.config import check_port_free
from rmqha import log as rmqha_log
from rmqha.log import configure_logging
from rmqha.net.blocking import BlockingRemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.protocol.command import RemotingCommand


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_server_parser(subparsers, "broker", "run a broker", "Run one broker.", store_dir=True)
    p.set_defaults(func=_run)

    for name, alias, fn, help_text in (
        ("get-broker-epoch", "getBrokerEpoch", _get_broker_epoch, "print each replica's epoch map"),
        ("ha-status", "haStatus", _ha_status,
         "print a master's slaves (ack offset, lag bytes/ms, in sync) or a slave's link"),
    ):
        q = subparsers.add_parser(name, aliases=[alias], help=help_text)
        q.add_argument("-b", "--broker", "--broker-addr", "--brokerAddr", "--brokerName", dest="broker",
                       help="broker address host:port, or a broker group name (needs -n)")
        q.add_argument("-c", "--cluster-name", "--clusterName", dest="cluster_name", default=None,
                       help="every broker of this cluster (needs -n)")
        q.add_argument("-n", "--namesrv-addr", "--namesrvAddr", dest="namesrv", default=None,
                       help="name server addresses, host:port;host:port")
        add_json_flag(q)
        q.add_argument("--timeout", type=float, default=3.0, help="per-request timeout in seconds")
        add_flags(q)
        if fn is _ha_status:
            q.add_argument("--watch", action="store_true",
                           help="refresh until Ctrl-C (live on a terminal, appended rounds in a pipe, "
                                "JSON Lines with --json), with slaves' catch-up progress")
            q.add_argument("--interval", type=float, default=1.0, help="seconds between --watch rounds")
            q.add_argument("--count", type=int, default=0, help="stop --watch after this many rounds")
        q.set_defaults(func=fn)


def preflight(config: BrokerConfig) -> None:
    """Stop at once, naming the key, if a port the broker will bind is taken.

    The client port is bound only after the id is settled with the controller and the HA
    port only on becoming master: checking them first turns a late failure (or a broker
    that runs without replication) into an immediate ConfigError.
    """
    check_port_free(config.listen_host, config.listen_port, "listen_port (client port)")
    if config.ha_port:
        check_port_free(config.listen_host, config.ha_port, "ha_listen_port (HA port)")
    if config.metrics_port > 0:
        check_port_free(config.metrics_host, config.metrics_port, "metrics_port")


def _run(args: argparse.Namespace) -> int:
    config = load_broker_config(args.config, listen_port=args.listen_port, store_dir=args.store_dir,
                                metrics_port=args.metrics_port, log_file=args.log_file)
    configure_logging("broker", level=config.log_level, json_lines=config.log_json, path=config.log_file or None)
    # From the first line on: the group, id -1 and epoch 0 until the broker learns them.
    rmqha_log.context.group = config.broker_name
    rmqha_log.context.broker_id = -1
    rmqha_log.context.epoch = 0
    preflight(config)
    return serve_until_signalled(lambda stop: run_broker(config, stop))


def _query(addr: str, code: int, timeout: float, security: ClientSecurity | None = None) -> Any:
    with BlockingRemotingClient(addr, connect_timeout=timeout, security=security,
                                expect=ServerRole.broker()) as client:
        resp = client.request(RemotingCommand.request(code), timeout)
    resp.check_success(code)
    return resp.json_body()


def _targets(args: argparse.Namespace) -> list[str] | None:
    """The broker addresses to ask; None (after printing why) if the flags do not say."""
    if args.broker and is_address(args.broker):
        return [args.broker]
    if not (args.broker or args.cluster_name):
        print(f"rmqha {args.command}: give -b BROKER_ADDR, -b BROKER_NAME -n NAMESRV or "
              "-c CLUSTER -n NAMESRV", file=sys.stderr)
        return None
    if not args.namesrv:
        print(f"rmqha {args.command}: a broker name or cluster needs -n/--namesrv-addr", file=sys.stderr)
        return None
    found = members(args.namesrv, cluster=args.cluster_name,
                    broker_names=[args.broker] if args.broker else None, timeout=args.timeout,
                    security=client_security(args))
    return [m.address for m in found]


def _ask_each(args: argparse.Namespace, code: int, render: Callable[[str, dict[str, Any]], list[Block]]) -> int:
    """Ask every target broker ``code``; print the ``render``ed blocks (blank-line apart) or JSON.

    JSON is the one answer when ``-b`` named an address, else the answers keyed by address.
    """
    targets = _targets(args)
    if targets is None:
        return 2
    security = client_security(args)
    answers = {addr: _query(addr, code, args.timeout, security) for addr in targets}
    lines: list[Block] = []
    for addr, data in answers.items():
        if lines:
            lines.append("")
        lines += render(addr, data)
    emit(args, answers[targets[0]] if args.broker and is_address(args.broker) else answers, lines)
    return 0


def _epoch_lines(addr: str, data: dict[str, Any]) -> list[Block]:
    lines: list[Block] = [f"#clusterName\t{data['clusterName']}", f"#brokerName\t{data['brokerName']}",
             f"#brokerAddr\t{addr}", f"#brokerId\t{data['brokerId']}"]
    entries = data.get("epochList", [])
    for i, e in enumerate(entries):
        # RocketMQ's tool shows the open end of the last epoch as the broker's max offset.
        end = data["maxOffset"] if i == len(entries) - 1 else e["endOffset"]
        lines.append(f"#Epoch: EpochEntry{{epoch={e['epoch']}, startOffset={e['startOffset']}, endOffset={end}}}")
    return lines


@reports_errors("broker")
def _get_broker_epoch(args: argparse.Namespace) -> int:
    return _ask_each(args, RequestCode.GET_BROKER_EPOCH_CACHE, _epoch_lines)


def _ha_lines(addr: str, data: dict[str, Any]) -> list[Block]:
    ha = data.get("ha") if isinstance(data.get("ha"), dict) else {}
    lines: list[Block] = [f"#BrokerAddr\t{addr}", f"#BrokerName\t{data.get('brokerName')}",
             f"#Role\t{data.get('role')}", f"#MasterEpoch\t{data.get('masterEpoch')}"]
    disk = data.get("storeDisk")
    if isinstance(disk, dict):  # sparse segments: blocks on disk, then the files' sizes
        lines += [f"#StoreDiskAllocated(bytes)\t{disk.get('allocatedBytes')}",
                  f"#StoreDiskLogical(bytes)\t{disk.get('logicalBytes')}"]
    if data.get("role") == "master":
        slaves = ha.get("slaves") or []
        lines += [f"#MasterAddr\t{addr}", f"#MasterCommitLogMaxOffset\t{data.get('maxOffset')}",
                  f"#ConfirmOffset\t{data.get('confirmOffset')}",
                  f"#SyncStateSet\t{data.get('syncStateSet')} (epoch {data.get('syncStateSetEpoch')})",
                  f"#SlaveNum\t{ha.get('slave_num', len(slaves))}",
                  f"#InSyncSlaveNum\t{ha.get('in_sync_slave_num', 0)}"]
        lease = data.get("masterLease") if isinstance(data.get("masterLease"), dict) else {}
        if lease:
            state = ("off" if not lease.get("enabled") else
                     f"held ({lease.get('remainingMs')} ms left)" if lease.get("held") else
                     "EXPIRED: refusing writes")
            lines.append(f"#MasterLease\t{state}")
        rows = [(s.get("broker_id"), s.get("address"), s.get("ack_offset"), s.get("lag_bytes"),
                 s.get("lag_ms"), "OK" if s.get("in_sync") else "Fall Behind", s.get("state"),
                 s.get("transfer_from")) for s in slaves]
        lines += table(("#SlaveId", "#SlaveAddr", "#SlaveAckOffset", "#Diff(bytes)", "#Lag(ms)",
                        "#Status", "#State", "#TransferFromWhere"), rows)
    else:
        lines += [f"#MasterAddr\t{data.get('masterAddress')}",
                  f"#CommitLogMaxOffset\t{data.get('maxOffset')}",
                  f"#ConfirmOffset\t{data.get('confirmOffset')}",
                  f"#LinkState\t{ha.get('state')}",
                  f"#LastReadMsAgo\t{ha.get('last_read_ms_ago')}",
                  f"#LastWriteMsAgo\t{ha.get('last_write_ms_ago')}"]
        if ha.get("disk_full"):
            lines.append(f"#DiskFull\tfor {ha.get('disk_full_ms')} ms, {ha.get('disk_full_refusals')} "
                         f"sessions refused: {ha.get('last_error')}")
    return lines


@reports_errors("broker")
def _ha_status(args: argparse.Namespace) -> int:
    if not args.watch:
        if args.count:
            print("rmqha ha-status: --count counts --watch rounds; add --watch", file=sys.stderr)
            return 2
        return _ask_each(args, RequestCode.GET_BROKER_HA_STATUS, _ha_lines)
    if args.interval <= 0 or args.count < 0:
        print("rmqha ha-status: --interval must be positive and --count not negative", file=sys.stderr)
        return 2
    first = _targets(args)  # checks the flags (and the name server) once, before any round
    if first is None:
        return 2
    single = bool(args.broker and is_address(args.broker))

    def targets() -> list[str]:
        return first if single else (_targets(args) or [])

    security = client_security(args)
    ask = ask_each(targets, lambda addr: _query(addr, RequestCode.GET_BROKER_HA_STATUS, args.timeout, security))
    return watch(args, ask, _ha_lines, lambda answers: answers.get(first[0]) if single else answers)
