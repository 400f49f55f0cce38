"""``rmqha namesrv --config FILE``: run a name server (optionally hosting a controller)."""
from __future__ import annotations

import argparse
import asyncio
import signal

from rmqha.config import check_port_free
from rmqha.log import configure_logging
from rmqha.namesrv.config import NamesrvConfig, load_namesrv_config
from rmqha.namesrv.server import run_namesrv


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "namesrv", help="run a name server",
        description="Run a name server. The config is TOML or a RocketMQ key=value file "
                    "(run `rmqha config-keys namesrv` for every key); RMQHA_<KEY> environment "
                    "variables override it.")
    p.add_argument("--config", "-c", help="TOML or key=value config file")
    p.add_argument("--listen-port", type=int, default=None, help="override listen_port")
    p.add_argument("--metrics-port", type=int, default=None, help="override metrics_port (0 = off)")
    p.add_argument("--log-file", default=None, help="override log_file (JSON lines appended there)")
    p.set_defaults(func=_run)


def preflight(config: NamesrvConfig) -> None:
    """Stop at once, naming the key, if a port the name server will bind is taken."""
    check_port_free(config.listen_host, config.listen_port, "listen_port (client port)")
    if config.metrics_port > 0:
        check_port_free(config.metrics_host, config.metrics_port, "metrics_port")


def _run(args: argparse.Namespace) -> int:
    config = load_namesrv_config(args.config, listen_port=args.listen_port,
                                 metrics_port=args.metrics_port, log_file=args.log_file)
    configure_logging("namesrv", level=config.log_level, json_lines=config.log_json, path=config.log_file or None)
    preflight(config)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_namesrv(config, stop)

    asyncio.run(main())
    return 0
