"""``rmqha config-keys``: every configuration key of a process with its default.

docs/configuration.md's tables are this command's ``--markdown`` output, and a test checks
that the page is that output and that every key has a meaning, so the page cannot drift
from the code: a key's meaning is the ``#:`` comment above its field.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rmqha.config import describe_keys


def _config_classes() -> dict[str, type]:
    from rmqha.broker.config import BrokerConfig
    from rmqha.controller.config import ControllerConfig
    from rmqha.namesrv.config import NamesrvConfig

    return {"controller": ControllerConfig, "namesrv": NamesrvConfig, "broker": BrokerConfig}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "config-keys", aliases=["configKeys"],
        help="list every configuration key of a process with its default",
    )
    p.add_argument("process", nargs="?", choices=("controller", "namesrv", "broker"),
                   help="one process kind (default: all)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable output")
    fmt.add_argument("--markdown", action="store_true", help="the tables of docs/configuration.md")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    classes = _config_classes()
    kinds = [args.process] if args.process else list(classes)
    if args.json:
        print(json.dumps({k: [vars(d) for d in describe_keys(classes[k])] for k in kinds}, indent=2))
        return 0
    if args.markdown:
        print(markdown_tables(kinds), end="")
        return 0
    for kind in kinds:
        docs = describe_keys(classes[kind])
        print(f"== {kind} ==")
        width = max(len(d.key) for d in docs)
        for d in docs:
            print(f"  {d.key:<{width}}  = {d.default!r:<24} {d.doc}")
    return 0


def markdown_tables(kinds: list[str] | None = None) -> str:
    """One table per process kind, as docs/configuration.md holds them."""
    classes = _config_classes()
    out = []
    for kind in kinds or list(classes):
        out += [f"## {kind}", "", "| key | also read as | default | meaning |", "|---|---|---|---|"]
        for d in describe_keys(classes[kind]):
            aliases = ", ".join(f"`{a}`" for a in d.aliases)
            out.append(f"| `{d.key}` | {aliases} | `{_portable(d.default)}` | {d.doc} |")
        out.append("")
    return "\n".join(out) + "\n"


def _portable(default: str) -> str:
    """A default under the home directory as ``~/...``: the page is the same for every user."""
    home = str(Path.home())
    return "~" + default[len(home):] if default == home or default.startswith(home + "/") else default
