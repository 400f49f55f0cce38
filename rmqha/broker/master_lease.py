"""The master lease: how long a master may take and acknowledge writes on the controller's word.

RocketMQ's controller mode has none: a master cut off from the controllers (but not from
its clients) keeps writing after the controller elected another master.  Here a master
may accept and acknowledge writes only while it holds a lease from the controller leader.

- **Renewal.**  Every heartbeat round the broker sends BROKER_HEARTBEAT to every controller
  and the leader answers ``leaseGranted`` with its record of the group's master (id and
  epoch).  An answer that names this broker master at the epoch it holds renews the lease
  from the moment the renewing heartbeat was **sent** (not answered): the broker's view
  of the lease always ends before the controller's view of that heartbeat does.
- **Expiry.**  The lease runs for ``lease_s`` on the broker's monotonic clock.  Past it the
  master is *lease-fenced*: it refuses sends (SERVICE_NOT_AVAILABLE, which clients retry on
  another broker) and sends waiting for their acks fail instead of succeeding.  A renewal
  naming it master of the same epoch lifts the fence; an answer naming another master or
  a newer epoch revokes the lease at once.
- **Timing rule.**  The controller declares a master dead no earlier than the heartbeat
  timeout ``T`` after the last heartbeat it received from it (a new controller leader: no
  earlier than ``T`` after it became leader).  A leader cut off from its quorum may still
  grant renewals for up to the Raft leader-fallback window ``F`` (pysyncobj steps a leader
  down after ``F`` without a majority, checked once a tick) after a new leader could have
  been elected.  With monotonic clocks whose rates differ by at most ``rho``, the lease is
  safe when::

      lease <= T - margin,   margin >= F + tick + 2 * rho * T

  so every lease the old master holds ends before any new master can be elected.
  :func:`min_margin_ms` computes the smallest allowed margin; the broker's config check
  refuses anything shorter.

The one faster path: a controller leader that sees a master's heartbeat connection close
and then finds its client port refusing connections elects at once (a killed process
acknowledges nothing, and a stopping broker fences itself before closing its port).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rmqha.protocol.lease_timing import LEADER_FALLBACK_TIMEOUT_S, RAFT_TICK_S

#: Largest rate difference assumed between two hosts' monotonic clocks (NTP slews at most
#: 500 ppm; twice that).
MAX_CLOCK_RATE_ERROR = 0.001
#: How long a controller leader cut off from its quorum may still answer as leader.
STALE_LEADER_WINDOW_MS = math.ceil((LEADER_FALLBACK_TIMEOUT_S + RAFT_TICK_S) * 1000)


def min_margin_ms(heartbeat_timeout_ms: int) -> int:
    """The smallest safe ``heartbeat timeout - lease`` for this heartbeat timeout."""
    return STALE_LEADER_WINDOW_MS + math.ceil(2 * MAX_CLOCK_RATE_ERROR * heartbeat_timeout_ms)


def lease_ms_for(heartbeat_timeout_ms: int, margin_ms: int, lease_ms: int) -> int:
    """The lease length in force: ``lease_ms``, or ``timeout - margin`` when it is 0."""
    return lease_ms if lease_ms > 0 else heartbeat_timeout_ms - margin_ms


@dataclass(frozen=True)
class LeaseGrant:
    """What a controller's heartbeat answer says (only the leader's answer grants)."""

    granted: bool
    master_id: int | None
    master_epoch: int


class MasterLease:
    """One broker's lease; times are ``clock()`` seconds (``time.monotonic``)."""

    def __init__(self, lease_s: float, *, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if enabled and lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.lease_s = lease_s
        self.enabled = enabled
        self._clock = clock
        #: Send time of the newest renewing heartbeat, and the epoch it was granted for.
        self._sent_at: float | None = None
        self._epoch = -1
        self.renewals = 0
        self.revocations = 0

    def on_answer(self, grant: LeaseGrant, sent_at: float, broker_id: int) -> bool:
        """Take a controller answer to a heartbeat sent at ``sent_at``; True if it renewed."""
        if not grant.granted:
            return False  # a follower's answer (or a leader not ready yet) says nothing
        if grant.master_id != broker_id:
            if self._sent_at is not None and grant.master_epoch >= self._epoch:
                # The leader names another master (or none) at our epoch or later: whatever
                # we held is over, even if its time has not run out.
                self.revoke()
            return False
        if grant.master_epoch < self._epoch:
            return False  # an answer from before an election we already heard of
        if grant.master_epoch == self._epoch and self._sent_at is not None and sent_at <= self._sent_at:
            return False  # answers can overtake each other; keep the newest send time
        self._sent_at = sent_at
        self._epoch = grant.master_epoch
        self.renewals += 1
        return True

    @property
    def granted_epoch(self) -> int:
        """The epoch of the newest renewal (-1 before any)."""
        return self._epoch

    def revoke(self) -> None:
        if self._sent_at is not None:
            self.revocations += 1
        self._sent_at = None

    def holds(self, epoch: int) -> bool:
        """True while the lease covers being master at ``epoch`` (always, when disabled)."""
        if not self.enabled:
            return True
        return (self._sent_at is not None and self._epoch == epoch
                and self._clock() < self._sent_at + self.lease_s)

    def remaining_s(self, epoch: int) -> float:
        """Seconds of lease left at ``epoch`` (0 when none)."""
        if self._sent_at is None or self._epoch != epoch:
            return 0.0
        return max(0.0, self._sent_at + self.lease_s - self._clock())

    def status(self, epoch: int) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "leaseMs": round(self.lease_s * 1000),
            "held": self.holds(epoch),
            "remainingMs": round(self.remaining_s(epoch) * 1000),
            "grantedEpoch": self._epoch,
            "renewals": self.renewals,
            "revocations": self.revocations,
        }
