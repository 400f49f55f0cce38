"""How admin commands print and fail: tables or ``--json``, and one-line errors.

Every admin/client command prints a human view by default (mqadmin's ``#Key\tvalue``
blocks or an aligned table) and the same data as JSON with ``--json``.  Failures never
show a traceback: :func:`reports_errors` turns an unreachable address into a message that
names the address and the flag to check, a refusal into the peer's remark, and returns
exit code 1.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rmqha.errors import ClientError, RemoteCommandError, RemotingError, RmqhaError

#: What to check when a kind of peer does not answer.
_HINTS = {
    "controller": "is a controller running there, and is -a/--controller-address right?",
    "namesrv": "is a name server running there, and is -n/--namesrv-addr right?",
    "broker": "is the broker running there, and is -b (broker address or name) right?",
}


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def emit(args: argparse.Namespace, data: Any, lines: Sequence[str]) -> None:
    """Print ``data`` as JSON when ``--json`` was given, else the human ``lines``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(lines))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Left-aligned columns, mqadmin style (``#Header`` names, two spaces apart)."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def fail(args: argparse.Namespace, message: str) -> int:
    print(f"rmqha {getattr(args, 'command', '')}: error: {message}", file=sys.stderr)
    return 1


def reports_errors(kind: str) -> Callable[[Callable[[argparse.Namespace], int]],
                                          Callable[[argparse.Namespace], int]]:
    """Decorate a command: unreachable peers and refusals become one line on stderr, exit 1.

    ``kind`` ("controller", "namesrv", "broker") picks the hint printed after a
    connection failure.
    """

    def wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(fn)
        def run(args: argparse.Namespace) -> int:
            try:
                return int(fn(args) or 0)
            except (RemotingError, TimeoutError, asyncio.TimeoutError, ConnectionError) as exc:
                return fail(args, f"{exc or type(exc).__name__}; {_HINTS[kind]}")
            except RemoteCommandError as exc:
                return fail(args, f"refused: {exc}")
            except ClientError as exc:
                text = str(exc)
                if "no name server answered" in text or "cannot connect" in text:
                    text = f"{text}; {_HINTS['namesrv']}"
                return fail(args, text)
            except RmqhaError as exc:
                text = str(exc)
                if "no controller answered" in text or "cannot connect" in text:
                    text = f"{text}; {_HINTS[kind]}"
                return fail(args, text)
        return run
    return wrap
