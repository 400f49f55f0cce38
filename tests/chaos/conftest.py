"""Collects each scenario's report and prints the table at the end of the run.

The table also goes to ``reports/chaos.md`` (``make chaos`` prints it; README's
Reliability section quotes it).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness import TABLE_HEAD, Report

REPORTS: list[Report] = []


@pytest.fixture
def chaos_reports() -> list[Report]:
    return REPORTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORTS:
        return
    table = "\n".join([TABLE_HEAD, *(r.row() for r in REPORTS)])
    terminalreporter.write_sep("=", "chaos scenarios")
    terminalreporter.write_line(table)
    out = Path(__file__).resolve().parents[2] / "reports" / "chaos.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table + "\n", encoding="utf-8")
