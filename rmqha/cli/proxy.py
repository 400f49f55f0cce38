"""``rmqha proxy --config FILE``: run the gRPC access point for RocketMQ 5's clients.

The config is RocketMQ's ``rmq-proxy.json`` (or TOML / key=value with the same keys;
``docs/proxy.md`` lists them).  The proxy needs the ``proxy`` extra (grpcio and the
generated ``apache.rocketmq.v2`` modules of ``rocketmq-python-client``); it is imported
only when the command runs, so the rest of ``rmqha`` works without it.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from rmqha.config import check_port_free
from rmqha.errors import ConfigError
from rmqha.log import configure_logging

MISSING_EXTRA = ("rmqha proxy needs the proxy extra (grpcio and rocketmq-python-client): "
                 "pip install 'rmqha[proxy]'")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "proxy", help="run the gRPC proxy for RocketMQ 5 clients",
        description="Run the gRPC access point RocketMQ 5's clients (rocketmq-clients) talk to. "
                    "The config is RocketMQ's rmq-proxy.json, or TOML / key=value with the same "
                    "keys; RMQHA_<KEY> environment variables override it.")
    p.add_argument("--config", "-c", help="rmq-proxy.json, TOML or key=value config file")
    p.add_argument("--grpc-server-port", type=int, default=None, help="override grpcServerPort")
    p.add_argument("--namesrv-addr", "-n", default=None, help="override namesrvAddr (a;b)")
    p.add_argument("--log-file", default=None, help="override log_file (JSON lines appended there)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rmqha.proxy.config import load_proxy_config

    config = load_proxy_config(args.config, grpc_server_port=args.grpc_server_port,
                               namesrv_addr=args.namesrv_addr, log_file=args.log_file)
    try:
        from rmqha.proxy.server import run_proxy
    except ImportError as exc:
        raise ConfigError(f"{MISSING_EXTRA} ({exc})") from None
    configure_logging("proxy", level=config.log_level, json_lines=config.log_json,
                      path=config.log_file or None)
    # grpc's cython layer logs every loop lookup at DEBUG.
    logging.getLogger("grpc").setLevel(max(logging.INFO, logging.getLogger().level))
    check_port_free(config.grpc_server_host, config.grpc_server_port, "grpcServerPort")
    asyncio.run(_serve(config, run_proxy))
    return 0


async def _serve(config: object, run: object) -> None:
    """Run the proxy until SIGTERM or SIGINT (grpc.aio wants asyncio's own loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run(config, stop)  # type: ignore[operator]
