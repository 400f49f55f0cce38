"""The replay windows (issue 37, point 3), the rules themselves at their edges on a fixed
clock: the proxy's on ``x-mq-date-time`` (the proxy process is exercised in
tests/proxy/test_proxy_acl.py) and the brokers' on ACL 1.0 signatures
(:mod:`rmqha.security.replay`; the broker processes in tests/security/test_broker_replay.py)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from rmqha._core import load
from rmqha.errors import AclAuthenticationError, ProxyError
from rmqha.net.client_security import Credentials
from rmqha.protocol.command import SERIALIZE_ROCKETMQ, VERSION, RemotingCommand, decode_frame, encode
from rmqha.proxy.auth import REPLAY_WINDOW_S, check_date_time
from rmqha.security.acl import AclValidator
from rmqha.security.acl_lane import SendLane
from rmqha.security.replay import NONCE_FIELD, TIME_FIELD, ReplayWindow, stamp, time_in_frame

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


# --- the brokers' window on ACL 1.0 signatures (rmqha.security.replay) -----------------

BROKER_NOW_MS = 1_800_000_000_000


def _window(**kw: Any) -> ReplayWindow:
    return ReplayWindow(clock=lambda: BROKER_NOW_MS / 1000, **kw)


@pytest.mark.parametrize("offset_ms", [0, 300_000, -300_000, 1])
def test_a_signature_inside_the_window_is_taken_once(offset_ms: int) -> None:
    window = _window()
    window.check(str(BROKER_NOW_MS + offset_ms), b"sig-1", 10, "ak")
    with pytest.raises(AclAuthenticationError, match="is a replay"):
        window.check(str(BROKER_NOW_MS + offset_ms), b"sig-1", 10, "ak")
    window.check(str(BROKER_NOW_MS + offset_ms), b"sig-2", 10, "ak")  # another nonce: another signature


@pytest.mark.parametrize(("offset_ms", "why"), [(300_001, "300 s ahead"), (-300_001, "300 s behind")])
def test_a_signature_outside_the_window_is_refused_and_not_kept(offset_ms: int, why: str) -> None:
    window = _window()
    with pytest.raises(AclAuthenticationError, match=why):
        window.check(str(BROKER_NOW_MS + offset_ms), b"sig", 10, "ak")
    assert len(window) == 0


@pytest.mark.parametrize("text", ["", "-5", "1.5e12", "12345678901234567", "١٢٣"])
def test_a_time_that_is_no_time_is_refused(text: str) -> None:
    with pytest.raises(AclAuthenticationError, match="is not a time"):
        _window().check(text, b"sig", 10, "ak")


def test_no_time_is_taken_unless_one_is_required() -> None:
    _window().check(None, b"sig", 10, "ak")
    _window().check(None, b"sig", 10, "ak")
    with pytest.raises(AclAuthenticationError, match="carries no signed RmqhaTime"):
        _window(require_time=True).check(None, b"sig", 10, "ak")


def test_a_full_cache_shrinks_the_window_instead_of_forgetting_a_replay() -> None:
    window = _window(max_entries=3)
    for i, back_ms in enumerate([50_000, 40_000, 30_000, 20_000]):  # the oldest is forgotten
        window.check(str(BROKER_NOW_MS - back_ms), b"sig-%d" % i, 10, "ak")
    assert len(window) == 3
    # The forgotten one replayed: refused by the floor, not taken again.
    with pytest.raises(AclAuthenticationError, match="older than the replay cache reaches"):
        window.check(str(BROKER_NOW_MS - 50_000), b"sig-0", 10, "ak")
    with pytest.raises(AclAuthenticationError, match="older than the replay cache reaches"):
        window.check(str(BROKER_NOW_MS - 60_000), b"new", 10, "ak")
    window.check(str(BROKER_NOW_MS - 10_000), b"new", 10, "ak")  # newer than the floor: fine


def test_expired_signatures_are_forgotten() -> None:
    now = [BROKER_NOW_MS / 1000]
    window = ReplayWindow(clock=lambda: now[0])
    window.check(str(BROKER_NOW_MS), b"sig", 10, "ak")
    now[0] += 301
    window.check(str(BROKER_NOW_MS + 301_000), b"other", 10, "ak")
    assert len(window) == 1


def test_the_time_is_read_from_a_json_frame_and_not_from_a_binary_one() -> None:
    cmd = RemotingCommand.request(10, {"topic": "T", TIME_FIELD: "1800000000000", NONCE_FIELD: "ab"}, b"x")
    head = encode(cmd)[4:-1]
    assert time_in_frame(head) == (True, "1800000000000")
    assert time_in_frame(encode(RemotingCommand.request(10, {"topic": "T"}))[4:]) == (True, None)
    cmd.serialize_type = SERIALIZE_ROCKETMQ
    assert time_in_frame(encode(cmd)[4:]) == (False, None)
    # The name inside another field's value (JSON escapes its quotes): not read as the field.
    odd = RemotingCommand.request(10, {"topic": 'T"RmqhaTime":"1'}, b"x")
    assert time_in_frame(encode(odd)[4:]) == (False, None)


def test_the_send_lane_takes_a_stamped_send_once(tmp_path: Path) -> None:
    """The fast lane (frames signed in place) runs the same window as the full check."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: app-access\n    secretKey: app-secret-1\n"
                   "    topicPerms: [T=PUB]\n")
    window = ReplayWindow()
    lane = SendLane(AclValidator(acl, replay=window))
    creds = Credentials("app-access", "app-secret-1")
    frame = load("send_codec").encode_send(310, 7, VERSION, "pg", "T", 0, 1, 0, "", False, 0, b"body")
    signed = creds.sign_send_frame(frame, decode_frame(frame[4:]).ext_fields, b"body")
    assert signed is not None
    send = load("send_frames").parse_send(signed[4:], (), True)
    state: dict[str, Any] = {}

    def admits() -> bool:
        return lane.admits(send[12], send[3], send[13], send[14], send[10], state, "127.0.0.1", send[11])

    assert admits() and len(window) == 1
    assert not admits()  # the replay goes to the full check, which refuses it by name
    stale = Credentials("app-access", "app-secret-1", stamper=lambda: stamp(1))
    old = load("send_frames").parse_send(stale.sign_send_frame(frame, decode_frame(frame[4:]).ext_fields,
                                                               b"body")[4:], (), True)
    assert not lane.admits(old[12], old[3], old[13], old[14], old[10], state, "127.0.0.1", old[11])
