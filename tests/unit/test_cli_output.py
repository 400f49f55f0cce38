"""How the CLI's tables come out: plain rows in a pipe, records on a narrow terminal.

- in a pipe (any non-terminal stream) a table is one line per row, however wide, with no
  escape codes and no trailing blanks, so ``grep``/``awk`` keep working;
- on a terminal 40 columns wide the same table fits: each line at most 40 cells, every
  value still there (records stacked as ``#Header value`` pairs), styled headers;
- plain ``#Key\\tvalue`` lines pass through byte for byte (tabs kept, brackets not markup).
"""
from __future__ import annotations

import io
import re

from rich.console import Console

from rmqha.cli.output import RowsTable, table, write_blocks

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HEADERS = ("#SlaveId", "#SlaveAddr", "#SlaveAckOffset", "#Diff(bytes)", "#Lag(ms)", "#Status",
           "#State", "#TransferFromWhere")
ROWS = [(2, "127.0.0.1:40123", 123_456_789, 0, None, "OK", "transfer", "[bold]x"),
        (3, "127.0.0.1:40125", 99, 123_456_690, 1500, "Fall Behind", "handshake", 0)]


def _render(console_kw: dict) -> str:
    buf = io.StringIO()
    write_blocks(["#Role\tmaster", *table(HEADERS, ROWS), "#SyncStateSet\t[1, 2]"],
                 Console(file=buf, **console_kw))
    return buf.getvalue()


def test_pipe_gets_one_plain_line_per_row() -> None:
    out = _render({"width": 40})  # not a terminal: the width must not fold rows
    assert ANSI.search(out) is None and "\x1b" not in out
    lines = out.splitlines()
    assert lines[0] == "#Role\tmaster" and lines[-1] == "#SyncStateSet\t[1, 2]"
    assert lines[1].split() == [h for h in HEADERS]
    assert lines[2].split() == ["2", "127.0.0.1:40123", "123456789", "0", "-", "OK", "transfer", "[bold]x"]
    assert lines[3].split() == ["3", "127.0.0.1:40125", "99", "123456690", "1500", "Fall", "Behind",
                                "handshake", "0"]
    assert len(lines) == 5
    assert all(line == line.rstrip() for line in lines)
    # Columns line up: every row's second column starts where its header does.
    col = lines[1].index("#SlaveAddr")
    assert lines[2][col:].startswith("127.0.0.1:40123") and lines[3][col:].startswith("127.0.0.1:40125")


def test_narrow_terminal_fits_every_line_and_keeps_every_value() -> None:
    out = _render({"width": 40, "force_terminal": True, "color_system": "standard"})
    assert "\x1b[1m" in out  # a terminal gets bold headers
    plain = ANSI.sub("", out)
    lines = plain.splitlines()
    assert max(len(line) for line in lines) <= 40, "\n".join(lines)
    assert lines[0] == "#Role\tmaster"
    pairs = [line.split(None, 1) for line in lines[1:-1] if line.strip()]
    # Two records of eight #Header value pairs each, in order.
    assert [p[0] for p in pairs] == list(HEADERS) * 2
    assert pairs[1][1].strip() == "127.0.0.1:40123" and pairs[7][1].strip() == "[bold]x"
    assert pairs[11][1].strip() == "123456690" and pairs[13][1].strip() == "Fall Behind"


def test_wide_terminal_gets_the_table_as_columns() -> None:
    out = ANSI.sub("", _render({"width": 200, "force_terminal": True}))
    lines = out.splitlines()
    assert lines[1].split() == list(HEADERS) and len(lines) == 5


def test_a_cell_longer_than_the_terminal_folds_without_losing_characters() -> None:
    long = "x" * 95
    buf = io.StringIO()
    write_blocks(table(("#File", "#Problem"), [("00000000000000000000", long)]),
                 Console(file=buf, width=40, force_terminal=True))
    text = ANSI.sub("", buf.getvalue())
    assert max(len(line) for line in text.splitlines()) <= 40
    assert text.count("x") == 95 and "…" not in text


def test_empty_table_is_its_header() -> None:
    buf = io.StringIO()
    write_blocks(table(("#BrokerName", "#QueueId"), []), Console(file=buf, width=10))
    assert buf.getvalue() == "#BrokerName  #QueueId\n"
    assert RowsTable.of(("#A",), []).natural_width() == 2
