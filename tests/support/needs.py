"""What a test needs from the machine it runs on, and what happens when it is missing.

A test that cannot run here (no root to mount a tmpfs, no filesystem that answers FIEMAP)
is skipped on a developer's machine but fails under CI: CI runs as root on a real disk, so
a skip there means the environment broke and the test would silently stop testing.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def unavailable(reason: str, *, module_level: bool = False) -> None:
    """Skip (locally) or fail (under CI) a test whose environment lacks ``reason``.

    ``module_level`` is for a call at a test module's top: the whole module is skipped, or,
    under CI, fails to collect (an error the run counts, never a quiet skip)."""
    if in_ci():
        pytest.fail(f"{reason}; CI provides it, so this test must not be skipped there", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def module(name: str, why: str, *, module_level: bool = False) -> ModuleType:
    """Import ``name`` for a test; when it does not import, skip locally and fail under CI.

    The project's own files install every module a test imports this way (the dev and spark
    extras), so under CI a missing one means the set-up broke, not that the test may rest."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{why}: {name} does not import ({exc})", module_level=module_level)
        raise  # unreachable: unavailable() always raises; keeps the return type honest


def missing_mark(reason: str | None) -> pytest.MarkDecorator:
    """A mark for tests that need what ``reason`` says is missing (None: nothing is).

    Locally it skips them; under CI the module asking for the mark fails to collect, as
    :func:`unavailable` does at a module's top."""
    if reason is None:
        return pytest.mark.skipif(False, reason="present")
    if in_ci():
        pytest.fail(f"{reason}; CI provides it, so these tests must not be skipped there", pytrace=False)
    return pytest.mark.skip(reason=reason)


def require_root(what: str) -> None:
    """``what`` (mounting a tmpfs, making network namespaces) needs root."""
    if os.geteuid() != 0:
        unavailable(f"{what} needs root")


def compiled_lane() -> pytest.MarkDecorator:
    """A mark for tests of the HA slave's compiled lane: skipped with the twins under
    ``RMQHA_NO_EXTENSIONS=1`` (the lane is off by design there); otherwise, when it is not
    built (no OpenSSL headers), skipped locally and a collection failure under CI."""
    from rmqha import _core
    from rmqha.ha.slave_lane import lane_available

    if _core.NO_EXTENSIONS:
        return pytest.mark.skip(reason="RMQHA_NO_EXTENSIONS=1: the compiled lane is off with the twins")
    return missing_mark(None if lane_available() else "the compiled slave lane is not built (libssl-dev)")
