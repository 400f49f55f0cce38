"""The interop drivers build and run: the pinned RocketMQ client is the one on their class path."""
from __future__ import annotations

from interop_support import run_driver


def test_driver_reports_pinned_client_version() -> None:
    out = run_driver("io.rmqha.interop.Version", timeout=60)
    assert out.stdout.strip() == "V5_5_0", out
