"""How admin commands print and fail: tables or ``--json``, and one-line errors.

Every admin/client command prints a human view by default (mqadmin's ``#Key\tvalue``
blocks or an aligned table) and the same data as JSON with ``--json``.  Tables are rich
tables: on a terminal they fit its width (long cells fold onto more lines, nothing is cut)
with bold headers; in a pipe or a CI log each row is one plain line without escape codes,
however wide, so ``grep``/``awk`` keep working.  Failures never
show a traceback: :func:`reports_errors` turns an unreachable address into a message that
names the address and the flag to check, a refusal into the peer's remark, and returns
exit code 1.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import io
import json
import sys
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from rmqha.errors import ClientError, RemoteCommandError, RemotingError, RmqhaError

#: What to check when a kind of peer does not answer.
_HINTS = {
    "controller": "is a controller running there, and is -a/--controller-address right?",
    "namesrv": "is a name server running there, and is -n/--namesrv-addr right?",
    "broker": "is the broker running there, and is -b (broker address or name) right?",
}


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


#: One piece of a command's human output: a plain line, or a table (or any rich renderable).
Block = str | RenderableType

#: Wide enough that no table row folds when rendered for a pipe.
_UNBOUNDED_WIDTH = 100_000


def stdout_console(file: TextIO | None = None) -> Console:
    """A console on stdout (looked up at call time, so redirections apply).

    rich decides from the stream: a terminal gets colour and its width; anything else
    (a pipe, a file, a CI log) no escape codes at all.  ``NO_COLOR``/``TERM=dumb`` are
    honoured by rich itself.
    """
    return Console(file=file if file is not None else sys.stdout, highlight=False, emoji=False,
                   soft_wrap=False)


def emit(args: argparse.Namespace, data: Any, lines: Sequence[Block]) -> None:
    """Print ``data`` as JSON when ``--json`` was given, else the human ``lines``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        write_blocks(lines)


def write_blocks(blocks: Iterable[Block], console: Console | None = None) -> None:
    """Write plain lines as they are and tables through rich (see the module docstring)."""
    console = console if console is not None else stdout_console()
    live = console.is_terminal and not console.is_dumb_terminal
    for block in blocks:
        if isinstance(block, str):
            # Exactly the bytes print() wrote before: mqadmin's tab-separated blocks stay
            # tab-separated (rich would expand the tabs and read brackets as markup).
            console.file.write(block + "\n")
        elif live:
            console.print(block)
        else:
            for line in plain_lines(block):
                console.file.write(line + "\n")
    console.file.flush()


def plain_lines(renderable: RenderableType) -> list[str]:
    """``renderable`` as lines of plain text: no escape codes, never folded, no trailing blanks."""
    buf = io.StringIO()
    Console(file=buf, width=_UNBOUNDED_WIDTH, color_system=None, force_terminal=False,
            highlight=False, emoji=False).print(renderable)
    return [line.rstrip() for line in buf.getvalue().splitlines()]


@dataclass
class RowsTable:
    """Rows under ``#Header`` names, mqadmin style: left-aligned columns two spaces apart,
    ``None`` shown as ``-``, cells plain text (a ``[`` in a value is not rich markup).

    A rich renderable that picks its layout from the width it is given: the wide table
    when it fits, else one record after another as ``#Header  value`` pairs (as ``psql
    \\x`` does), so a narrow terminal gets readable records instead of columns crushed to
    a few letters.  A cell still too long folds onto the next line; nothing is cut.
    """

    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]

    @classmethod
    def of(cls, headers: Sequence[Any], rows: Sequence[Sequence[Any]]) -> RowsTable:
        return cls(tuple(str(h) for h in headers),
                   [tuple("-" if v is None else str(v) for v in r) for r in rows])

    def natural_width(self) -> int:
        widths = [max([cell_len(h)] + [cell_len(r[i]) for r in self.rows]) for i, h in enumerate(self.headers)]
        return sum(widths) + 2 * (len(widths) - 1)

    def wide(self) -> Table:
        t = _bare_table()
        for h in self.headers:
            t.add_column(Text(h), overflow="fold")
        for r in self.rows:
            t.add_row(*(Text(v) for v in r))
        return t

    def stacked(self) -> Table:
        t = _bare_table(show_header=False)
        t.add_column(style="bold", overflow="fold")
        t.add_column(overflow="fold")
        for i, r in enumerate(self.rows):
            if i:
                t.add_row("", "")
            for h, v in zip(self.headers, r):
                t.add_row(Text(h), Text(v))
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.natural_width() <= options.max_width or not self.rows:
            yield self.wide()
        else:
            yield self.stacked()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, min(self.natural_width(), options.max_width))


def _bare_table(*, show_header: bool = True) -> Table:
    return Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold",
                 show_header=show_header)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Block]:
    """A :class:`RowsTable` as a list of blocks, to extend a command's output lines with."""
    return [RowsTable.of(headers, rows)]


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
