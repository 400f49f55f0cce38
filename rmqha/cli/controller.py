"""``rmqha controller --config FILE``: run one controller of a controller group."""
from __future__ import annotations

import argparse
import sys

from rmqha.net import loop as event_loop
from rmqha.config import check_port_free, load_config
from rmqha.controller.config import ControllerConfig
from rmqha.errors import RmqhaError
from rmqha.log import configure_logging


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "controller", help="run one controller (Raft-replicated broker metadata and elections)",
        description="Run one controller. The config is TOML or a RocketMQ key=value file; "
                    "RMQHA_<KEY> environment variables override it.")
    p.add_argument("-c", "--config", help="config file (.toml or key=value)")
    p.add_argument("--self-id", help="controllerDLegerSelfId (overrides the file)")
    p.add_argument("--peers", help="controllerDLegerPeers, id-host:port;... (overrides the file)")
    p.add_argument("--raft-peers", help="raft_peers, id-host:port;... (overrides the file)")
    p.add_argument("--store-path", help="controller_store_path (overrides the file)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="metrics_port / metricsPromExporterPort (0 = off; overrides the file)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], type=str.upper)
    p.add_argument("--log-file", default=None, help="append JSON-line logs to this file instead of stderr")
    p.add_argument("--plain-logs", action="store_true", help="plain text logs instead of JSON lines")
    p.set_defaults(func=run)


def preflight(config: ControllerConfig) -> None:
    """Stop at once, naming the key, if a port the controller will bind is taken."""
    me = config.self_peer()
    rpc_port = int(me.rpc_address.rpartition(":")[2])
    raft_host, _, raft_port = me.raft_address.rpartition(":")
    check_port_free(config.listen_host, rpc_port, "controller_peers (RPC port of this controller)")
    check_port_free(raft_host, int(raft_port), "raft port (raft_peers / raft_port_offset)")
    if config.metrics_port > 0:
        check_port_free(config.metrics_host, config.metrics_port, "metrics_port")


def run(args: argparse.Namespace) -> int:
    configure_logging("controller", level=str(args.log_level), json_lines=not args.plain_logs,
                      path=args.log_file)
    config = load_config(ControllerConfig, args.config, overrides={
        "controller_self_id": args.self_id, "controller_peers": args.peers,
        "raft_peers": args.raft_peers, "controller_store_path": args.store_path,
        "metrics_port": args.metrics_port})
    preflight(config)
    from rmqha.controller.server import serve

    event_loop.run(serve(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rmqha.cli.controller ...``: the same command without the other CLI modules."""
    parser = argparse.ArgumentParser(prog="rmqha")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["controller", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except RmqhaError as exc:
        print(f"rmqha controller: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
