"""The ``rmqha`` command: one subcommand per process and admin operation.

Each module listed in ``_COMMAND_MODULES`` defines ``register(subparsers)``, adding its
subcommands with ``set_defaults(func=...)``; a command function takes the parsed
``argparse.Namespace`` and returns the process exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from rmqha.errors import RmqhaError

_COMMAND_MODULES: tuple[str, ...] = (
    "rmqha.cli.demo",
    "rmqha.cli.namesrv",
    "rmqha.cli.broker",
    "rmqha.cli.proxy",
    "rmqha.cli.controller",
    "rmqha.cli.admin",
    "rmqha.cli.client",
    "rmqha.cli.groups",
    "rmqha.cli.query_msg",
    "rmqha.cli.config_keys",
    "rmqha.cli.scrub",
    "rmqha.cli.certs",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmqha",
        description="Replicated commit log with automatic master/slave switching.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except RmqhaError as exc:
        print(f"rmqha {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
