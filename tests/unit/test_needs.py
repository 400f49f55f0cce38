"""tests/support/needs.py: a test that cannot run here is a skip locally and a failure under CI."""
from __future__ import annotations

import os
from pathlib import Path

import needs
import pytest


def test_missing_root_is_a_skip_locally(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="mounting a tmpfs needs root"):
        needs.require_root("mounting a tmpfs")


def test_missing_root_fails_under_ci(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match="must not be skipped"):
        needs.require_root("mounting a tmpfs")


def test_root_is_enough(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    needs.require_root("mounting a tmpfs")  # returns: nothing to skip or fail


def test_a_module_that_imports_is_returned(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert needs.module("json", "the standard library").dumps([1]) == "[1]"


def test_a_missing_module_is_a_skip_locally(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the dev extra: no_such_module_rmqha does not import"):
        needs.module("no_such_module_rmqha", "the dev extra")


def test_a_missing_module_fails_under_ci(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must not be skipped"):
        needs.module("no_such_module_rmqha", "the dev extra", module_level=True)


def test_a_missing_mark_skips_locally_and_fails_under_ci(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert needs.missing_mark("no JVM").name == "skip"
    assert needs.missing_mark(None).args == (False,)  # present: a skipif that never fires
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no JVM; CI provides it"):
        needs.missing_mark("no JVM")


_QUIET_SKIPS = ("importorskip(", "pytest.skip(")


def quiet_skips(text: str) -> list[int]:
    """Lines of a test module that skip without going through needs (so CI would stay green)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if any(s in line for s in _QUIET_SKIPS)]


def test_every_skip_goes_through_needs() -> None:
    tests = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(tests)): quiet_skips(p.read_text("utf-8"))
             for p in tests.rglob("*.py") if p.name not in ("needs.py", "test_needs.py") and p.parent.name != "proxy"}
    assert {k: v for k, v in found.items() if v} == {}, "skip through tests/support/needs.py instead"


def test_negative_control_a_quiet_skip_is_found() -> None:
    assert quiet_skips('import pytest\nyaml = pytest.importorskip("yaml")\n') == [2]
