"""``rmqha config-keys``: every configuration key of a process with its default.

The README's configuration tables are this command's ``--markdown`` output, and a test
checks that README lists every key, so the documentation cannot drift from the code.
"""
from __future__ import annotations

import argparse
import json

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
    fmt.add_argument("--markdown", action="store_true", help="README tables")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    classes = _config_classes()
    kinds = [args.process] if args.process else list(classes)
    if args.json:
        print(json.dumps({k: [vars(d) for d in describe_keys(classes[k])] for k in kinds}, indent=2))
        return 0
    for kind in kinds:
        docs = describe_keys(classes[kind])
        if args.markdown:
            print(f"#### {kind}\n")
            print("| key | also read as | default | meaning |")
            print("|---|---|---|---|")
            for d in docs:
                aliases = ", ".join(f"`{a}`" for a in d.aliases)
                print(f"| `{d.key}` | {aliases} | `{d.default}` | {d.doc} |")
            print()
        else:
            print(f"== {kind} ==")
            width = max(len(d.key) for d in docs)
            for d in docs:
                print(f"  {d.key:<{width}}  = {d.default!r:<24} {d.doc}")
    return 0
