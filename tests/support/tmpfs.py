"""Small tmpfs mounts for the full-disk tests (root only): a filesystem that fills after a
few records, grown later to show the store carries on without losing anything."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: "320k", "3m") at ``path`` for the block, lazily
    unmounted after it; the test is skipped where mounting needs a root it does not have."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def grow(path: Path, size: str) -> None:
    """Give a mounted tmpfs more room (what an operator freeing disk space does)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, timeout=30)
