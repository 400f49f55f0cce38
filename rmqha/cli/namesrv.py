"""``rmqha namesrv --config FILE``: run a name server (optionally hosting a controller)."""
from __future__ import annotations

import argparse

from rmqha.cli.serving import add_server_parser, serve_until_signalled
from rmqha.config import check_port_free
from rmqha.log import configure_logging
from rmqha.namesrv.config import NamesrvConfig, load_namesrv_config
from rmqha.namesrv.server import run_namesrv


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_server_parser(subparsers, "namesrv", "run a name server", "Run a name server.")
    p.set_defaults(func=_run)


def preflight(config: NamesrvConfig) -> None:
    """Stop at once, naming the key, if a port the name server will bind is taken."""
    check_port_free(config.listen_host, config.listen_port, "listen_port (client port)")
    if config.metrics_port > 0:
        check_port_free(config.metrics_host, config.metrics_port, "metrics_port")
    if config.status_port > 0:
        check_port_free(config.status_host, config.status_port, "status_port")


def _run(args: argparse.Namespace) -> int:
    config = load_namesrv_config(args.config, listen_port=args.listen_port,
                                 metrics_port=args.metrics_port, log_file=args.log_file)
    configure_logging("namesrv", level=config.log_level, json_lines=config.log_json, path=config.log_file or None)
    preflight(config)
    return serve_until_signalled(lambda stop: run_namesrv(config, stop))
