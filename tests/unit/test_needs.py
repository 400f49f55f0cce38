"""tests/support/needs.py: a test that cannot run here is a skip locally and a failure under CI."""
from __future__ import annotations

import os

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
