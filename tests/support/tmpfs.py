"""Small tmpfs mounts for the full-disk tests (root only: skipped without it locally, a
failure under CI, see :mod:`needs`): a filesystem that fills after a few records, grown
later to show the store carries on without losing anything."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from needs import require_root


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: "320k", "3m") at ``path`` for the block, lazily
    unmounted after it (root only, see :func:`needs.require_root`)."""
    require_root("mounting a tmpfs")
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
