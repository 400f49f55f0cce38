"""``rmqha ha-status --watch``: the HA status refreshed until Ctrl-C or ``--count`` rounds.

Each round asks every target broker GET_BROKER_HA_STATUS again (a group or cluster given
through ``-n`` is looked up again, so brokers that join or leave show up).  A slave that
is not in the SyncStateSet is catching up: it gets a progress line (its acknowledged
offset against the master's max offset, the rate since the previous round, the time
left at that rate).

Where it goes decides how it looks:

- a terminal: one live view redrawn in place by rich (tables, catch-up bars);
- a pipe, a file, a CI log: each round appended as plain lines (the ``ha-status`` blocks
  plus ``#CatchUp`` lines) after a ``#Round`` line with the time, no escape codes;
- ``--json``: one JSON object per round per line (JSON Lines), each the exact object
  ``ha-status --json`` prints for one round.

A broker that stops answering mid-watch is shown as unreachable, and the watch goes on.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rmqha.cli.output import Block, stdout_console, write_blocks
from rmqha.errors import RmqhaError

#: One round's answers: broker address -> its GET_BROKER_HA_STATUS body, or why none.
Answers = dict[str, dict[str, Any] | str]


@dataclass(frozen=True)
class CatchUp:
    """A slave outside the SyncStateSet, as one round saw it."""

    master: str
    slave_id: int
    slave_address: str
    ack_offset: int
    master_max: int
    rate_bytes_s: float | None  # since the previous round; None on the first

    @property
    def behind(self) -> int:
        return max(self.master_max - self.ack_offset, 0)

    @property
    def fraction(self) -> float:
        return 1.0 if self.master_max <= 0 else min(max(self.ack_offset / self.master_max, 0.0), 1.0)

    @property
    def eta_s(self) -> float | None:
        if not self.rate_bytes_s or self.rate_bytes_s <= 0:
            return None
        return self.behind / self.rate_bytes_s

    def describe(self) -> str:
        rate = "-" if self.rate_bytes_s is None else f"{_bytes(self.rate_bytes_s)}/s"
        eta = "-" if self.eta_s is None else f"{self.eta_s:,.1f} s"
        return (f"{self.fraction * 100:5.1f}% {self.ack_offset:,}/{self.master_max:,} bytes, "
                f"{self.behind:,} behind, {rate}, eta {eta}")

    def line(self) -> str:
        return f"#CatchUp\tslave {self.slave_id} ({self.slave_address}) of {self.master}: {self.describe()}"


class CatchUpTracker:
    """Turns successive rounds into catch-up entries with rates."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[tuple[str, int], tuple[int, float]] = {}

    def update(self, answers: Answers) -> list[CatchUp]:
        now = self._clock()
        found: list[CatchUp] = []
        seen: dict[tuple[str, int], tuple[int, float]] = {}
        for addr, data in answers.items():
            if not isinstance(data, dict) or data.get("role") != "master":
                continue
            ha = data.get("ha") if isinstance(data.get("ha"), dict) else {}
            master_max = int(data.get("maxOffset") or 0)
            for s in ha.get("slaves") or []:
                if s.get("in_sync") or s.get("broker_id") is None:
                    continue
                key = (addr, int(s["broker_id"]))
                ack = max(int(s.get("ack_offset") or 0), 0)
                rate = None
                if key in self._last:
                    prev_ack, prev_t = self._last[key]
                    if now > prev_t:
                        rate = max(ack - prev_ack, 0) / (now - prev_t)
                seen[key] = (ack, now)
                found.append(CatchUp(addr, key[1], str(s.get("address") or "?"), ack, master_max, rate))
        self._last = seen
        return found


def watch(args: argparse.Namespace, ask: Callable[[], Answers],
          lines_of: Callable[[str, dict[str, Any]], list[Block]],
          json_of: Callable[[Answers], Any]) -> int:
    """Run rounds until ``--count`` or Ctrl-C; 0 when stopped either way."""
    console = stdout_console()
    live_view = console.is_terminal and not console.is_dumb_terminal and not args.json
    tracker = CatchUpTracker()
    rounds = 0
    try:
        live = Live(console=console, auto_refresh=False, transient=False) if live_view else None
        if live is not None:
            live.start()
        try:
            while True:
                answers = ask()
                catch_ups = tracker.update(answers)
                rounds += 1
                stamp = time.strftime("%H:%M:%S")
                if args.json:
                    print(json.dumps(json_of(answers), sort_keys=True, default=str), flush=True)
                elif live is not None:
                    live.update(render_round(answers, catch_ups, lines_of, stamp, rounds), refresh=True)
                else:
                    write_blocks(plain_round(answers, catch_ups, lines_of, stamp, rounds), console)
                if 0 < args.count <= rounds:
                    return 0
                time.sleep(args.interval)
        finally:
            if live is not None:
                live.stop()
    except KeyboardInterrupt:
        return 0


def _answer_blocks(addr: str, data: dict[str, Any] | str,
                   lines_of: Callable[[str, dict[str, Any]], list[Block]]) -> list[Block]:
    if isinstance(data, dict):
        return lines_of(addr, data)
    return [f"#BrokerAddr\t{addr}", f"#Error\t{data}"]


def plain_round(answers: Answers, catch_ups: list[CatchUp],
                lines_of: Callable[[str, dict[str, Any]], list[Block]], stamp: str, n: int) -> list[Block]:
    blocks: list[Block] = [f"#Round\t{n} at {stamp}"]
    for addr, data in answers.items():
        blocks += _answer_blocks(addr, data, lines_of)
        blocks += [c.line() for c in catch_ups if c.master == addr]
        blocks.append("")
    return blocks


def render_round(answers: Answers, catch_ups: list[CatchUp],
                 lines_of: Callable[[str, dict[str, Any]], list[Block]], stamp: str, n: int) -> RenderableType:
    parts: list[RenderableType] = [Text(f"ha-status {stamp}, round {n} (Ctrl-C stops)", style="bold")]
    for addr, data in answers.items():
        parts.append(Text(""))
        for block in _answer_blocks(addr, data, lines_of):
            parts.append(Text(block, tab_size=4) if isinstance(block, str) else block)
        parts += [catch_up_view(c) for c in catch_ups if c.master == addr]
    return Group(*parts)


def catch_up_view(c: CatchUp) -> RenderableType:
    """One catch-up as three short lines (name, bar, figures): fits a narrow terminal."""
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(c.master_max, 1), completed=min(c.ack_offset, max(c.master_max, 1)),
                            width=24), Text(f"{c.fraction * 100:.1f}%"))
    rate = "-" if c.rate_bytes_s is None else f"{_bytes(c.rate_bytes_s)}/s"
    eta = "-" if c.eta_s is None else f"{c.eta_s:,.1f} s"
    return Group(Text(f"#CatchUp slave {c.slave_id} ({c.slave_address})", style="bold"), bar,
                 Text(f"{c.ack_offset:,}/{c.master_max:,} bytes, {c.behind:,} behind, {rate}, eta {eta}"))


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def ask_each(targets: Callable[[], list[str]], query: Callable[[str], dict[str, Any]]) -> Callable[[], Answers]:
    """A round: look the targets up, ask each; an error is kept as the answer's text."""

    def round_() -> Answers:
        try:
            addrs = targets()
        except (RmqhaError, OSError, asyncio.TimeoutError) as exc:
            return {"(lookup)": f"{type(exc).__name__}: {exc}"}
        out: Answers = {}
        for addr in addrs:
            try:
                out[addr] = query(addr)
            except (RmqhaError, OSError, asyncio.TimeoutError) as exc:
                out[addr] = f"unreachable: {exc or type(exc).__name__}"
        return out

    return round_

