"""The master's view of the SyncStateSet: applied set, the proposal in flight, caught-up times.

The controller owns the SyncStateSet; the master only proposes changes (expand a slave that
caught up, shrink a member that fell behind) and applies what the controller answers.  While
a proposal is in flight the master counts the *union* of the applied and the proposed set
for acks and the confirm offset (RocketMQ #5663: otherwise a set {A,B} the controller
applied, whose answer A never got, would let A confirm data B does not have), and
``in_sync_replicas`` is the larger of the two sizes.

Caught-up times are kept per member id (not per connection), so a member whose link dropped
keeps ageing toward the shrink timeout, and the table is pruned when an id leaves the set
and has no link (RocketMQ never cleaned its table).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable


class SyncStateSet:
    """Applied set + epoch, an optional in-flight proposal, and member caught-up times."""

    __slots__ = ("self_id", "_local", "_epoch", "_proposed", "_caught_up_ms")

    def __init__(self, self_id: int, ids: Iterable[int] = (), epoch: int = 0, now_ms: int = 0):
        self.self_id = int(self_id)
        self._local: frozenset[int] = frozenset(int(i) for i in ids) | {self.self_id}
        self._epoch = int(epoch)
        self._proposed: frozenset[int] | None = None
        self._caught_up_ms: dict[int, int] = {}
        for member in self._local:
            if member != self.self_id:
                # A member we never heard from gets the full grace period before shrink.
                self._caught_up_ms[member] = now_ms

    # --- queries ---------------------------------------------------------------------------

    @property
    def local(self) -> frozenset[int]:
        """The set the controller applied last."""
        return self._local

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def proposed(self) -> frozenset[int] | None:
        """The set proposed to the controller and not answered yet (None when idle)."""
        return self._proposed

    @property
    def in_flight(self) -> bool:
        return self._proposed is not None

    def members(self) -> frozenset[int]:
        """Ids whose acks count: applied set, united with the proposal while in flight."""
        if self._proposed is None:
            return self._local
        return self._local | self._proposed

    def replica_count(self) -> int:
        """Replicas in sync for ``min_in_sync_replicas``: max of both sizes while in flight."""
        if self._proposed is None:
            return len(self._local)
        return max(len(self._local), len(self._proposed))

    def caught_up_ms(self, member: int) -> int | None:
        return self._caught_up_ms.get(member)

    # --- changes ---------------------------------------------------------------------------

    def apply(self, ids: Iterable[int], epoch: int, now_ms: int) -> bool:
        """Adopt the controller's set; an older epoch is ignored (returns False)."""
        epoch = int(epoch)
        if epoch < self._epoch:
            return False
        new = frozenset(int(i) for i in ids) | {self.self_id}
        for member in new - self._local:
            self._caught_up_ms.setdefault(member, now_ms)
        self._local = new
        self._epoch = epoch
        self._proposed = None
        return True

    def begin_proposal(self, ids: Iterable[int]) -> frozenset[int]:
        self._proposed = frozenset(int(i) for i in ids) | {self.self_id}
        return self._proposed

    def abort_proposal(self) -> None:
        """The controller refused or could not be reached: count the applied set only."""
        self._proposed = None

    def mark_caught_up(self, member: int, at_ms: int) -> None:
        """Record that ``member`` had everything the master had at ``at_ms`` (never goes back)."""
        prev = self._caught_up_ms.get(member)
        if prev is None or at_ms > prev:
            self._caught_up_ms[member] = at_ms

    def prune(self, connected: Iterable[int]) -> None:
        """Forget caught-up times of ids that are neither members nor connected."""
        keep = set(self.members()) | set(connected)
        for member in list(self._caught_up_ms):
            if member not in keep:
                del self._caught_up_ms[member]

    def lagging_members(
        self, now_ms: int, max_lag_ms: int, should_shrink: Callable[[int, int, int], bool]
    ) -> set[int]:
        """Applied members (never the master, #7219) that ``should_shrink(now, caught_up, max_lag)``."""
        out: set[int] = set()
        for member in self._local:
            if member == self.self_id:
                continue
            last = self._caught_up_ms.get(member)
            if last is None:
                self._caught_up_ms[member] = now_ms
                continue
            if should_shrink(now_ms, last, max_lag_ms):
                out.add(member)
        return out
