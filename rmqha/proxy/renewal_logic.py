"""The rules of auto-renew, without I/O (RocketMQ's ``DefaultReceiptHandleManager``,
``MessageReceiptHandle`` and ``RenewStrategyPolicy``).

A client that receives with ``auto_renew`` (the push consumers) leaves the invisible time
of its messages to the proxy: every message it got is a :class:`Delivery`, kept per client
in a :class:`DeliveryBook` under its :data:`DeliveryKey` (group, message id, broker
group, queue, offset, as RocketMQ's ``ReceiptHandleGroup`` keys it, and whether the queue
is the pop retry topic's: a retried copy is another delivery than the original).  Each scan asks
:func:`next_step` what to do with a delivery:

- nothing while its invisible time ends more than ``renewAheadTimeMillis`` from now;
- renew it (CHANGE_MESSAGE_INVISIBLETIME) by the next step of :data:`RENEW_STEPS_MS`
  (1, 3, 5, 10, 30 minutes, then an hour each time; or ``renewSliceTimeMillis`` each time,
  as RocketMQ 5.0 did) while ``renewMaxTimeMillis`` has not
  passed since the delivery; the broker's new handle replaces the one the client holds,
  so the client's later ack or change with its original handle is sent with the latest;
- once ``renewMaxTimeMillis`` has passed, hand it back (a nack): its invisible time set
  to the group's retry delay for its attempt (:func:`retry_delay_ms`);
- give it up after ``maxRenewRetryTimes`` failed renewals in a row (:func:`renew_failed`;
  a renewal the broker refuses as an invalid handle is not retried: the message is no
  longer this delivery's); it becomes visible when its invisible time ends.

A client that went away (:func:`client_gone`) has its deliveries cleared: each becomes
visible after ``invisibleTimeMillisWhenClear``.  Times are the proxy's monotonic
milliseconds: a delivery's end is taken from when the proxy got the broker's answer, so
the brokers' clocks do not matter.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rmqha.proxy.status import Code

#: RocketMQ's ``RenewStrategyPolicy``: the invisible time of the n-th renewal (the last
#: one repeats).
RENEW_STEPS_MS = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)

#: RocketMQ's ``CustomizedRetryPolicy`` default: the delay levels from 1s, in ms.
DEFAULT_RETRY_NEXT_MS = (1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000,
                         360000, 420000, 480000, 540000, 600000, 1200000, 1800000, 3600000,
                         7200000)

#: (consumer group, message id, broker group, queue id, queue offset, retry field).
DeliveryKey = tuple[str, str, str, int, int, str]


class Step(Enum):
    """What a scan does with one delivery."""

    WAIT = "wait"
    RENEW = "renew"
    NACK = "nack"


@dataclass(frozen=True)
class RenewRules:
    """The proxy's renew keys, in ms."""

    ahead_ms: int
    max_ms: int
    max_retry_times: int
    steps_ms: tuple[int, ...] = RENEW_STEPS_MS

    @classmethod
    def from_config(cls, cfg: Any) -> RenewRules:
        steps = (cfg.renew_slice_time_millis,) if cfg.renew_slice_time_millis > 0 else RENEW_STEPS_MS
        return cls(cfg.renew_ahead_time_millis, cfg.renew_max_time_millis,
                   cfg.max_renew_retry_times, steps)

    def renew_ms(self, renew_times: int) -> int:
        """The invisible time of a delivery's next renewal, after ``renew_times``."""
        return self.steps_ms[min(max(renew_times, 0), len(self.steps_ms) - 1)]


@dataclass
class Delivery:
    """One message a client received with ``auto_renew``."""

    key: DeliveryKey
    topic: str
    #: The latest receipt handle (the proxy's form): what an ack is sent with.
    handle: str
    #: When the client got it, and when its invisible time ends at the latest.
    delivered_ms: int
    visible_ms: int
    reconsume_times: int = 0
    renew_times: int = 0
    retry_times: int = 0

    @property
    def group(self) -> str:
        return self.key[0]


def next_step(d: Delivery, now_ms: int, rules: RenewRules) -> Step:
    if d.visible_ms - now_ms > rules.ahead_ms:
        return Step.WAIT
    if now_ms - d.delivered_ms < rules.max_ms:
        return Step.RENEW
    return Step.NACK


def renewed(d: Delivery, handle: str, sent_ms: int, invisible_ms: int) -> None:
    """A renewal sent at ``sent_ms`` succeeded with ``handle``."""
    d.handle = handle
    d.visible_ms = sent_ms + invisible_ms
    d.renew_times += 1
    d.retry_times = 0


def renew_failed(d: Delivery, code: int, rules: RenewRules) -> bool:
    """A renewal was refused with status ``code``: whether to try again next scan."""
    if code == Code.INVALID_RECEIPT_HANDLE:
        return False  # acked, expired or superseded: nothing left to renew
    d.retry_times += 1
    return d.retry_times < rules.max_retry_times


def retry_delay_ms(policy: object, reconsume_times: int) -> int:
    """The delay before the next attempt of a message consumed ``reconsume_times`` times
    before, by a group's ``groupRetryPolicy`` (RocketMQ's default: the delay levels)."""
    policy = policy if isinstance(policy, Mapping) else {}
    times = max(reconsume_times, 0)
    if str(policy.get("type", "CUSTOMIZED")).upper() == "EXPONENTIAL":
        exp = policy.get("exponentialRetryPolicy") or {}
        initial, top = int(exp.get("initial", 5000)), int(exp.get("max", 7200000))
        return int(min(initial * float(exp.get("multiplier", 2)) ** min(times, 64), top))
    steps = (policy.get("customizedRetryPolicy") or {}).get("next") or DEFAULT_RETRY_NEXT_MS
    return int(steps[min(times, len(steps) - 1)])


def client_gone(seen_ms: int | None, now_ms: int, expired_ms: int) -> bool:
    """A client is gone when the proxy no longer knows it (it terminated, or its
    Telemetry stream closed) or sent nothing for ``expired_ms``."""
    return seen_ms is None or now_ms - seen_ms > expired_ms


class DeliveryBook:
    """The deliveries of each client, by key."""

    def __init__(self) -> None:
        self._clients: dict[str, dict[DeliveryKey, Delivery]] = {}

    def add(self, client_id: str, d: Delivery) -> None:
        """Keep ``d`` (a later delivery of the same message replaces an earlier one)."""
        self._clients.setdefault(client_id, {})[d.key] = d

    def take(self, client_id: str, key: DeliveryKey) -> Delivery | None:
        """Stop renewing the delivery under ``key``; it, if the client had it."""
        held = self._clients.get(client_id)
        if held is None:
            return None
        d = held.pop(key, None)
        if not held:
            del self._clients[client_id]
        return d

    def discard(self, client_id: str, d: Delivery) -> None:
        """Forget ``d`` if it is still the delivery under its key."""
        held = self._clients.get(client_id, {})
        if held.get(d.key) is d:
            self.take(client_id, d.key)

    def drop_client(self, client_id: str) -> list[Delivery]:
        return list(self._clients.pop(client_id, {}).values())

    def holds(self, client_id: str) -> bool:
        return client_id in self._clients

    def clients(self) -> list[str]:
        return list(self._clients)

    def due(self, client_id: str, now_ms: int, rules: RenewRules) -> Iterator[tuple[Delivery, Step]]:
        """The client's deliveries a scan acts on now, with what to do."""
        for d in list(self._clients.get(client_id, {}).values()):
            step = next_step(d, now_ms, rules)
            if step is not Step.WAIT:
                yield d, step

    def __len__(self) -> int:
        return sum(len(held) for held in self._clients.values())
