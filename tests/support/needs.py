"""What a test needs from the machine it runs on, and what happens when it is missing.

A test that cannot run here (no root to mount a tmpfs, no filesystem that answers FIEMAP)
is skipped on a developer's machine but fails under CI: CI runs as root on a real disk, so
a skip there means the environment broke and the test would silently stop testing.
"""
from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def unavailable(reason: str) -> None:
    """Skip (locally) or fail (under CI) a test whose environment lacks ``reason``."""
    if in_ci():
        pytest.fail(f"{reason}; CI provides it, so this test must not be skipped there")
    pytest.skip(reason)


def require_root(what: str) -> None:
    """``what`` (mounting a tmpfs, making network namespaces) needs root."""
    if os.geteuid() != 0:
        unavailable(f"{what} needs root")
