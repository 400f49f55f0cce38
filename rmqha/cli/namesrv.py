"""``rmqha namesrv --config FILE``: run a name server (optionally hosting a controller)."""
from __future__ import annotations

import argparse
import asyncio
import signal

from rmqha.log import configure_logging
from rmqha.namesrv.config import load_namesrv_config
from rmqha.namesrv.server import run_namesrv


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("namesrv", help="run a name server")
    p.add_argument("--config", "-c", help="TOML or key=value config file")
    p.add_argument("--listen-port", type=int, default=None, help="override listen_port")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_namesrv_config(args.config, listen_port=args.listen_port)
    configure_logging("namesrv", level=config.log_level, json_lines=config.log_json, path=config.log_file or None)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_namesrv(config, stop)

    asyncio.run(main())
    return 0
