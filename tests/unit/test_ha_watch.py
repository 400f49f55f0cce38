"""``ha-status --watch``'s catch-up progress and its two renderings, from synthetic rounds.

(The watch against a live cluster, through a pipe and as JSON Lines, is in
tests/integration/test_cli_commands.py.)

- a slave outside the SyncStateSet gets a catch-up entry: acknowledged offset against the
  master's max offset, the rate between two rounds, the time left at that rate; in-sync
  slaves and slaves' own answers get none;
- a pipe gets each round as plain lines (``#Round``, the ha-status block, ``#CatchUp``);
- a terminal 40 columns wide gets a live view that fits, bars included;
- an unreachable broker is a line in the round, not the end of the watch;
- a slave whose disk is full says so in its block (``#DiskFull``), and only then.
"""
from __future__ import annotations

import io
import re

from rich.console import Console

from rmqha.cli.broker import _ha_lines
from rmqha.cli.ha_watch import CatchUpTracker, ask_each, plain_round, render_round
from rmqha.cli.output import write_blocks
from rmqha.errors import RemotingError

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MASTER, SLAVE2, SLAVE3 = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"


def _master(max_offset: int, ack3: int) -> dict:
    return {
        "role": "master", "brokerName": "broker-a", "masterEpoch": 2, "maxOffset": max_offset,
        "confirmOffset": max_offset, "syncStateSet": [1, 2], "syncStateSetEpoch": 3,
        "ha": {"slave_num": 2, "in_sync_slave_num": 1, "slaves": [
            {"broker_id": 2, "address": SLAVE2, "ack_offset": max_offset, "lag_bytes": 0, "lag_ms": 0,
             "in_sync": True, "state": "TRANSFER", "transfer_from": 0},
            {"broker_id": 3, "address": SLAVE3, "ack_offset": ack3, "lag_bytes": max_offset - ack3,
             "lag_ms": 900, "in_sync": False, "state": "TRANSFER", "transfer_from": 0},
        ]},
    }


def _rounds() -> tuple[list, list]:
    times = iter([100.0, 102.0])
    tracker = CatchUpTracker(clock=lambda: next(times))
    first = tracker.update({MASTER: _master(8_000_000, 1_000_000)})
    second = tracker.update({MASTER: _master(8_000_000, 5_000_000), SLAVE3: {"role": "slave", "ha": {}}})
    return first, second


def test_catch_up_has_fraction_rate_and_eta() -> None:
    first, second = _rounds()
    assert [(c.slave_id, c.ack_offset, c.rate_bytes_s) for c in first] == [(3, 1_000_000, None)]
    (c,) = second
    assert (c.master, c.slave_id, c.slave_address) == (MASTER, 3, SLAVE3)
    assert c.behind == 3_000_000 and c.fraction == 0.625
    assert c.rate_bytes_s == 2_000_000.0 and c.eta_s == 1.5
    assert c.line() == (f"#CatchUp\tslave 3 ({SLAVE3}) of {MASTER}:  62.5% 5,000,000/8,000,000 bytes, "
                        "3,000,000 behind, 1.9 MiB/s, eta 1.5 s")


def test_pipe_round_is_plain_lines() -> None:
    _, second = _rounds()
    buf = io.StringIO()
    write_blocks(plain_round({MASTER: _master(8_000_000, 5_000_000), SLAVE2: "unreachable: refused"},
                             second, _ha_lines, "12:00:00", 2), Console(file=buf, width=40))
    out = buf.getvalue()
    assert "\x1b" not in out
    lines = out.splitlines()
    assert lines[0] == "#Round\t2 at 12:00:00"
    assert f"#BrokerAddr\t{MASTER}" in lines and "#SyncStateSet\t[1, 2] (epoch 3)" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("#SlaveId"))
    assert lines[header + 2].split()[:6] == ["3", SLAVE3, "5000000", "3000000", "900", "Fall"]
    assert any(line.startswith("#CatchUp\tslave 3") and "62.5%" in line for line in lines)
    assert lines[-3:] == [f"#BrokerAddr\t{SLAVE2}", "#Error\tunreachable: refused", ""]


def test_terminal_round_fits_a_narrow_terminal_with_bars() -> None:
    _, second = _rounds()
    buf = io.StringIO()
    console = Console(file=buf, width=40, force_terminal=True, color_system="truecolor")
    console.print(render_round({MASTER: _master(8_000_000, 5_000_000)}, second, _ha_lines, "12:00:00", 2))
    out = buf.getvalue()
    plain = ANSI.sub("", out)
    assert max(len(line) for line in plain.splitlines()) <= 40, plain
    lines = [line.rstrip() for line in plain.splitlines()]
    assert lines[0] == "ha-status 12:00:00, round 2 (Ctrl-C"
    # The catch-up: who, a bar with the percentage, the figures (wrapped, nothing cut).
    i = lines.index(f"#CatchUp slave 3 ({SLAVE3})")
    assert "━" in lines[i + 1] and lines[i + 1].rstrip().endswith(" 62.5%")
    assert " ".join(lines[i + 2:]).split() == "5,000,000/8,000,000 bytes, 3,000,000 behind, 1.9 MiB/s, eta 1.5 s".split()
    # The slaves' table, stacked as records at this width.
    assert [line.split()[1] for line in lines if line.startswith("#SlaveAddr")] == [SLAVE2, SLAVE3]


def test_a_round_keeps_going_past_an_unreachable_broker() -> None:
    def query(addr: str) -> dict:
        if addr == SLAVE2:
            raise RemotingError(f"cannot connect to {addr}: refused")
        return {"role": "slave"}

    answers = ask_each(lambda: [SLAVE2, SLAVE3], query)()
    assert answers == {SLAVE2: f"unreachable: cannot connect to {SLAVE2}: refused", SLAVE3: {"role": "slave"}}

    def no_namesrv() -> list[str]:
        raise RemotingError("no name server answered")

    assert ask_each(no_namesrv, query)() == {"(lookup)": "RemotingError: no name server answered"}


def test_a_slave_with_a_full_disk_says_so_and_only_then() -> None:
    ha = {"state": "READY", "last_read_ms_ago": 5, "last_write_ms_ago": 5, "disk_full": True,
          "disk_full_ms": 12_000, "disk_full_refusals": 7,
          "last_error": "DiskFullError: no disk space (No space left on device)"}
    slave = {"role": "slave", "brokerName": "broker-a", "masterAddress": MASTER, "ha": ha}
    lines = [line for line in _ha_lines(SLAVE2, slave) if isinstance(line, str)]
    assert ("#DiskFull\tfor 12000 ms, 7 sessions refused: DiskFullError: no disk space "
            "(No space left on device)") in lines
    ha.update(disk_full=False, disk_full_ms=None, disk_full_refusals=0)
    assert not any(line.startswith("#DiskFull") for line in _ha_lines(SLAVE2, slave) if isinstance(line, str))
