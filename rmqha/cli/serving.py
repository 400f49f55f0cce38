"""How a server command (``rmqha broker``, ``rmqha namesrv``) is declared and run.

Both take a config file plus a few overrides (:func:`add_server_parser`), and serve in
the foreground until SIGTERM or SIGINT, then let the server shut down in order (the
server function returns once its stop event is set) and exit 0
(:func:`serve_until_signalled`).
"""
from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable

from rmqha.net import loop as event_loop


def add_server_parser(subparsers: argparse._SubParsersAction, name: str, help_text: str, title: str, *,
                      store_dir: bool = False) -> argparse.ArgumentParser:
    """The ``rmqha NAME`` subcommand: ``--config`` and the overrides every server has
    (``--store-dir`` too with ``store_dir``); ``title`` opens the description."""
    p = subparsers.add_parser(
        name, help=help_text,
        description=f"{title} The config is TOML or a RocketMQ key=value file "
                    f"(run `rmqha config-keys {name}` for every key); RMQHA_<KEY> environment "
                    "variables override it.")
    p.add_argument("--config", "-c", help="TOML or key=value config file")
    p.add_argument("--listen-port", type=int, default=None, help="override listen_port")
    if store_dir:
        p.add_argument("--store-dir", default=None, help="override store_dir")
    p.add_argument("--metrics-port", type=int, default=None, help="override metrics_port (0 = off)")
    p.add_argument("--log-file", default=None, help="override log_file (JSON lines appended there)")
    return p


def serve_until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run ``serve(stop)`` on a new event loop; SIGTERM/SIGINT set ``stop``. Returns 0."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(stop)

    event_loop.run(main())
    return 0
