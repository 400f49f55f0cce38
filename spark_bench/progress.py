"""Progress of the pipeline's long stages (ingest, change points, report) on stderr.

On a terminal a stage shows a live spinner with its elapsed time and leaves no trace when
it ends (its one result line follows); in a pipe or a CI log nothing extra is written, so
logs stay the plain result lines they were.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

_stderr = Console(stderr=True)


@contextmanager
def stage(title: str, console: Console | None = None) -> Iterator[None]:
    """Show ``title`` with a spinner and elapsed time while the block runs (terminals only)."""
    console = console or _stderr
    if not console.is_terminal:
        yield
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task(title, total=None)
        yield
