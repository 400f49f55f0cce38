"""The pipeline's stage progress: live on a terminal, silent in a pipe (no pyspark needed)."""
from __future__ import annotations

import io

from rich.console import Console

from spark_bench.progress import stage


def test_a_pipe_gets_nothing_extra() -> None:
    out = io.StringIO()
    with stage("ingest: parsing new benchmark files", Console(file=out, force_terminal=False)):
        pass
    assert out.getvalue() == ""


def test_a_terminal_sees_the_stage_while_it_runs() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with stage("trends: series, baselines and change points", console):
        pass  # the live display draws once on entry and is cleared on exit
    text = out.getvalue()
    assert "trends: series, baselines and change points" in text
    assert "\x1b[" in text  # drawn live (cursor control), then cleared: transient
