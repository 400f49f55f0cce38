"""A copy of the rmqha package with one line of its source changed, for a child process.

The power-loss tests' strongest negative control deletes a sync call from the code itself
(not a skip in the shim): the child runs ``python -m rmqha`` with ``PYTHONPATH`` naming the
copy, which Python finds before the editable install; the compiled twins are copied along.
The change must match exactly once, so a refactor that moves the call fails loudly here
instead of letting the control pass on unchanged code.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import rmqha

PACKAGE = Path(rmqha.__file__).parent


def mutated_package(directory: Path, relative: str, old: str, new: str) -> Path:
    """Copy rmqha under ``directory`` with ``old`` replaced by ``new`` in ``relative`` (a
    path inside the package); the directory to put on ``PYTHONPATH``."""
    root = directory / "mutated"
    shutil.copytree(PACKAGE, root / "rmqha", ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.html"))
    target = root / "rmqha" / relative
    text = target.read_text()
    if text.count(old) != 1:
        raise AssertionError(f"{relative} holds {text.count(old)} copies of {old!r}, not one: update the control")
    target.write_text(text.replace(old, new))
    return root
