"""The proxy's replay window on ``x-mq-date-time`` (issue 37, point 3): the rule itself,
at its edges, on a fixed clock (the proxy process is exercised in
tests/proxy/test_proxy_acl.py)."""
from __future__ import annotations

import datetime as dt

import pytest

from rmqha.errors import ProxyError
from rmqha.proxy.auth import REPLAY_WINDOW_S, check_date_time

NOW = dt.datetime(2026, 12, 7, 12, 0, 0, tzinfo=dt.UTC)


def _stamp(offset_s: float) -> str:
    return (NOW + dt.timedelta(seconds=offset_s)).strftime("%Y%m%dT%H%M%SZ")


@pytest.mark.parametrize("offset_s", [0, REPLAY_WINDOW_S, -REPLAY_WINDOW_S, 120, -120])
def test_inside_the_window_passes(offset_s: float) -> None:
    check_date_time(_stamp(offset_s), NOW.timestamp())


@pytest.mark.parametrize(("offset_s", "why"), [
    (REPLAY_WINDOW_S + 1, "301 s ahead of the proxy's clock"),
    (-REPLAY_WINDOW_S - 1, "301 s behind the proxy's clock"),
    (-3 * 365 * 86400, "behind the proxy's clock"),  # the "years old"
])
def test_outside_the_window_is_refused(offset_s: float, why: str) -> None:
    with pytest.raises(ProxyError, match=why):
        check_date_time(_stamp(offset_s), NOW.timestamp())


@pytest.mark.parametrize("value", ["", "2026-12-07T12:00:00Z", "20261207T120000", "garbage"])
def test_missing_or_malformed_is_refused(value: str) -> None:
    with pytest.raises(ProxyError, match="missing or not"):
        check_date_time(value, NOW.timestamp())
