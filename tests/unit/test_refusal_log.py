"""RefusalLog, the one rate limit of refusal warnings (remoting, HA and Raft ports): the
first refusal of each kind is logged at once, the same kind again within the period is
only counted, and the next line of that kind says how many were left out."""
from __future__ import annotations

import logging

from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import RefusalLog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_kind_once_then_one_line_per_period_with_the_count(caplog):
    clock = _Clock()
    refusals = RefusalLog(logging.getLogger("test.refusals"), period_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, "test.refusals"):
        assert refusals.warn("tls", "refusing link from %s: %s", "a:1", "bad cert")
        assert refusals.warn("auth", "refusing link from %s: %s", "a:2", "bad secret")
        for port in range(3, 8):
            assert not refusals.warn("tls", "refusing link from %s: %s", f"a:{port}", "bad cert")
        assert refusals.warn(("probe", logging.INFO), "probe from %s", "a:9", level=logging.INFO)
        clock.now += 10.0
        assert refusals.warn("tls", "refusing link from %s: %s", "a:8", "bad cert")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "refusing link from a:1: bad cert"),
        (logging.WARNING, "refusing link from a:2: bad secret"),
        (logging.INFO, "probe from a:9"),
        (logging.WARNING, "refusing link from a:8: bad cert (5 more refused since the last report)"),
    ]
    assert refusals.refused == 9


def test_requests_are_keyed_by_their_code(caplog):
    refusals = RefusalLog(logging.getLogger("test.codes"), clock=_Clock())
    with caplog.at_level(logging.WARNING, "test.codes"):
        for _ in range(3):
            refusals.note(RemotingCommand.request(RequestCode.SEND_MESSAGE), "a:1", "no permission")
        refusals.note(RemotingCommand.request(RequestCode.PULL_MESSAGE), "a:1", "no permission")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "SEND_MESSAGE" in lines[0] and "PULL_MESSAGE" in lines[1], lines
