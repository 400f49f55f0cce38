"""Auto-renew's rules without I/O (:mod:`rmqha.proxy.renewal_logic`): when a delivery is
renewed, for how long, when renewing stops and what then, and the book of deliveries; and
the glue (:mod:`rmqha.proxy.renewal`) over a fake cluster: an ack during a renewal, a
client that went away."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rmqha.errors import ConfigError
from rmqha.protocol.codes import ResponseCode
from rmqha.proxy.clients import ClientRegistry
from rmqha.proxy.config import ProxyConfig, load_proxy_config
from rmqha.proxy.handles import compose_handle
from rmqha.proxy.renewal import Renewal
from rmqha.proxy.renewal_logic import (
    DEFAULT_RETRY_NEXT_MS,
    RENEW_STEPS_MS,
    Delivery,
    DeliveryBook,
    RenewRules,
    Step,
    client_gone,
    next_step,
    renew_failed,
    renewed,
    retry_delay_ms,
)
from rmqha.proxy.status import Code

RULES = RenewRules(ahead_ms=10_000, max_ms=3 * 3600_000, max_retry_times=3)


def delivery(at: int = 0, invisible: int = 60_000, msg: str = "m1", offset: int = 7,
             retry: str = "0") -> Delivery:
    return Delivery(("g", msg, "broker-a", 1, offset, retry), "t", f"h-{msg}", at, at + invisible)


def test_rules_come_from_rocketmq_keys() -> None:
    cfg = ProxyConfig(namesrv_addr="a:1", renew_ahead_time_millis=500, renew_max_time_millis=9000,
                      max_renew_retry_times=5)
    assert RenewRules.from_config(cfg) == RenewRules(500, 9000, 5)
    defaults = RenewRules.from_config(ProxyConfig(namesrv_addr="a:1"))
    assert defaults == RenewRules(10_000, 3 * 3600_000, 3)
    sliced = RenewRules.from_config(ProxyConfig(namesrv_addr="a:1", renew_slice_time_millis=700))
    assert [sliced.renew_ms(n) for n in range(3)] == [700, 700, 700]
    for bad in ({"renew_ahead_time_millis": 0}, {"renew_schedule_period_millis": -1},
                {"channel_expired_timeout": 0}, {"max_renew_retry_times": -1},
                {"renew_slice_time_millis": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ProxyConfig(namesrv_addr="a:1", **bad).validate()  # type: ignore[arg-type]


def test_keys_read_from_rmq_proxy_json_and_toml(tmp_path: Path) -> None:
    keys = {"namesrvAddr": "a:1", "enableProxyAutoRenew": False, "renewAheadTimeMillis": 500,
            "renewMaxTimeMillis": 9000, "renewSliceTimeMillis": 700, "renewSchedulePeriodMillis": 50,
            "maxRenewRetryTimes": 5, "invisibleTimeMillisWhenClear": 300, "channelExpiredTimeout": 4000}
    (tmp_path / "rmq-proxy.json").write_text(json.dumps(keys))
    (tmp_path / "proxy.toml").write_text("\n".join(
        f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}" for k, v in keys.items()))
    for name in ("rmq-proxy.json", "proxy.toml"):
        cfg = load_proxy_config(tmp_path / name)
        assert (cfg.enable_proxy_auto_renew, cfg.renew_ahead_time_millis, cfg.renew_max_time_millis,
                cfg.renew_slice_time_millis, cfg.renew_schedule_period_millis, cfg.max_renew_retry_times,
                cfg.invisible_time_millis_when_clear, cfg.channel_expired_timeout) == (
            False, 500, 9000, 700, 50, 5, 300, 4000)


def test_renewed_only_when_its_end_is_near() -> None:
    d = delivery(at=0, invisible=60_000)
    assert next_step(d, 49_999, RULES) is Step.WAIT
    assert next_step(d, 50_000, RULES) is Step.RENEW
    assert next_step(d, 70_000, RULES) is Step.RENEW  # late (a slow scan): still renewed


def test_renewal_steps_follow_rocketmqs_strategy() -> None:
    assert [RULES.renew_ms(n) for n in range(8)] == [60_000, 180_000, 300_000, 600_000,
                                                     1_800_000, 3_600_000, 3_600_000, 3_600_000]
    assert RULES.renew_ms(-1) == RENEW_STEPS_MS[0]
    d = delivery(at=0, invisible=60_000)
    d.retry_times = 2
    renewed(d, "h2", sent_ms=52_000, invisible_ms=RULES.renew_ms(d.renew_times))
    # The new end counts from when the renewal was sent: never later than the broker's.
    assert (d.handle, d.visible_ms, d.renew_times, d.retry_times) == ("h2", 112_000, 1, 0)
    assert next_step(d, 101_999, RULES) is Step.WAIT and next_step(d, 102_000, RULES) is Step.RENEW


def test_renewing_stops_after_the_max_time_with_a_nack() -> None:
    rules = RenewRules(ahead_ms=1000, max_ms=30_000, max_retry_times=3)
    d = delivery(at=0, invisible=5000)
    assert next_step(d, 4000, rules) is Step.RENEW
    d.visible_ms = 40_000
    assert next_step(d, 35_000, rules) is Step.WAIT  # past max, but its end is not near yet
    assert next_step(d, 39_000, rules) is Step.NACK


def test_failed_renewals_are_retried_then_given_up() -> None:
    d = delivery()
    assert renew_failed(d, Code.PROXY_TIMEOUT, RULES) and renew_failed(d, Code.INTERNAL_SERVER_ERROR, RULES)
    assert not renew_failed(d, Code.PROXY_TIMEOUT, RULES)  # the third in a row
    fresh = delivery()
    # An acked, expired or superseded handle: nothing to retry.
    assert not renew_failed(fresh, Code.INVALID_RECEIPT_HANDLE, RULES)
    assert not renew_failed(delivery(), Code.PROXY_TIMEOUT, RenewRules(1, 1, 0))


def test_nack_delay_is_the_groups_retry_policy() -> None:
    assert retry_delay_ms(None, 0) == 1000 and retry_delay_ms({}, 3) == 30_000
    assert retry_delay_ms(None, 99) == DEFAULT_RETRY_NEXT_MS[-1]
    custom = {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [100, 200]}}
    assert [retry_delay_ms(custom, n) for n in range(3)] == [100, 200, 200]
    exp = {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 1000, "max": 5000, "multiplier": 2}}
    assert [retry_delay_ms(exp, n) for n in range(5)] == [1000, 2000, 4000, 5000, 5000]
    assert retry_delay_ms("not a policy", 1) == 5000


def test_a_client_is_gone_when_unknown_or_silent() -> None:
    assert client_gone(None, 1000, 120_000)
    assert not client_gone(0, 120_000, 120_000)
    assert client_gone(0, 120_001, 120_000)


def test_book_keys_deliveries_per_client_and_message() -> None:
    book = DeliveryBook()
    first, again, other = delivery(msg="m1"), delivery(at=5, msg="m1"), delivery(msg="m2", offset=8)
    book.add("c1", first)
    book.add("c1", again)  # the same message delivered again replaces the first
    book.add("c1", other)
    book.add("c2", delivery(msg="m1"))
    retried = delivery(msg="m1", retry="1")  # its retry copy, at the same queue and offset
    book.add("c2", retried)
    assert book.take("c2", retried.key) is retried
    assert len(book) == 3 and sorted(book.clients()) == ["c1", "c2"]
    assert book.holds("c1") and not book.holds("c9")
    assert book.take("c1", first.key) is again
    assert book.take("c1", first.key) is None and book.take("c9", first.key) is None
    book.discard("c1", first)  # not the delivery under its key: kept
    assert len(book) == 2
    assert [(d, s) for d, s in book.due("c1", 55_000, RULES)] == [(other, Step.RENEW)]
    assert list(book.due("c1", 1000, RULES)) == []
    book.discard("c1", other)
    assert book.clients() == ["c2"]
    assert [d.key for d in book.drop_client("c2")] == [first.key] and len(book) == 0


# --- the glue with a fake cluster: what reaches the broker, in which order ----------------------


class FakeCluster:
    """Answers CHANGE_MESSAGE_INVISIBLETIME with a new handle once ``gate`` is set."""

    rpc_timeout_s = 1.0

    def __init__(self) -> None:
        self.changes: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def to_master(self, topic: str, group: str, make: Any, deadline: Any, **_: Any) -> Any:
        cmd = make()
        await self.gate.wait()
        old, invisible = cmd.ext_fields["extraInfo"], int(cmd.ext_fields["invisibleTime"])
        self.changes.append((old, invisible))
        fresh = broker_handle(pop_time=len(self.changes) * 1000, invisible=invisible)
        return cmd.response(ResponseCode.SUCCESS, None, {"extraInfo": fresh})

    async def group_config(self, group: str, topic: str) -> Any:
        return None


def broker_handle(pop_time: int = 0, invisible: int = 2000) -> str:
    return f"0 {pop_time} {invisible} 0 0 broker-a 1 7 sig"


def received(handle: str, msg_id: str = "m1") -> Any:
    return SimpleNamespace(system_properties=SimpleNamespace(
        receipt_handle=handle, message_id=msg_id, delivery_attempt=1))


def renewal_with(cluster: FakeCluster, **keys: Any) -> tuple[Renewal, ClientRegistry]:
    cfg = ProxyConfig(namesrv_addr="a:1", renew_ahead_time_millis=5000, **keys)
    clients = ClientRegistry()
    clients.update("c1", SimpleNamespace(client_type=3), asyncio.Queue())
    return Renewal(cfg, cluster, clients), clients  # type: ignore[arg-type]


def test_an_ack_during_a_renewal_gets_the_renewed_handle() -> None:
    async def scenario() -> None:
        cluster = FakeCluster()
        renewal, _ = renewal_with(cluster)
        original = compose_handle(broker_handle(), 100)
        renewal.track("c1", "g", "t", [received(original)])
        cluster.gate.clear()
        renewal.scan()  # due at once: 2 s invisible, renewed 5 s ahead
        await asyncio.sleep(0)
        settling = asyncio.ensure_future(renewal.settle("c1", "g", "m1", original))
        await asyncio.sleep(0)
        assert not settling.done()  # waits for the renewal in flight
        cluster.gate.set()
        latest = await settling
        assert cluster.changes == [(broker_handle(), 60_000)]
        assert latest == compose_handle(broker_handle(pop_time=1000, invisible=60_000), 100)
        assert len(renewal.book) == 0 and await renewal.settle("c1", "g", "m1", original) == original

    asyncio.run(scenario())


def test_a_gone_client_has_its_deliveries_handed_back() -> None:
    async def scenario() -> None:
        cluster = FakeCluster()
        renewal, clients = renewal_with(cluster, invisible_time_millis_when_clear=300)
        original = compose_handle(broker_handle(invisible=60_000), 100)
        renewal.track("c1", "g", "t", [received(original)])
        renewal.scan()
        await asyncio.sleep(0)
        assert cluster.changes == []  # not due: its end is a minute away
        clients.remove("c1")
        renewal.scan()
        await renewal.close()
        assert cluster.changes == [(broker_handle(invisible=60_000), 300)] and len(renewal.book) == 0

    asyncio.run(scenario())


def test_a_stopping_proxy_hands_back_what_it_renews() -> None:
    async def scenario() -> None:
        cluster = FakeCluster()
        renewal, _ = renewal_with(cluster, invisible_time_millis_when_clear=300)
        renewal.track("c1", "g", "t", [received(compose_handle(broker_handle(invisible=60_000), 100))])
        await renewal.close()
        assert cluster.changes == [(broker_handle(invisible=60_000), 300)] and len(renewal.book) == 0

    asyncio.run(scenario())
