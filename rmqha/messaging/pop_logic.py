"""The rules of pop consumption, without I/O (the glue is in pop_path, pop_acks, pop_revive).

- where a group with no progress on a queue starts (:func:`initial_cursor`, RocketMQ's
  ``ConsumeInitMode``; the pop retry topic always from its start);
- which messages one pop takes from a queue (:func:`select`: tag filter, count and byte
  budget; skipped messages move the cursor too);
- FIFO: a queue of a consume-orderly group is blocked while any message it delivered is
  unacked and still invisible; once they are all visible again the unacked ones are
  delivered again, in order, before anything new (:func:`fifo_gate`), so per message group
  (one queue) order holds whichever consumer pops;
- checking a request's receipt handle against what is in flight (:func:`check_request`,
  :func:`check_in_flight`): expired, acked, superseded;
- what becomes of an expired message (:func:`revive_plan`): the group's pop retry topic
  after RocketMQ's backoff (delay level 3 + retry count, as CONSUMER_SEND_MSG_BACK), the
  dead-letter queue once its retry count reached the group's ``retryMaxTimes``; a FIFO
  message stays in its queue and is delivered again there.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from rmqha.errors import ReceiptError
from rmqha.messaging.pop_state import InFlight, PopQueue, PopState
from rmqha.messaging.receipt import ReceiptHandle, Refusal, refuse
from rmqha.protocol.pop import ConsumeInitMode, real_topic

#: RocketMQ's retry backoff: a retry waits delay level 3 + its retry count (10s, 30s, 1m...).
FIRST_RETRY_LEVEL = 3


def initial_cursor(mode: int, lo: int, hi: int, *, committed: int | None, retry_topic: bool,
                   young: bool) -> int:
    """Where a group with no pop progress on a queue starts: its committed (pull) offset
    if it has one; the queue's start for MIN and for retry topics; for MAX the last
    message (RocketMQ pops the newest one), or the start of a young queue whose first
    message is still in memory (``initPopOffsetByCheckMsgInMem``)."""
    if committed is not None:
        return min(max(committed, lo), hi)
    if retry_topic or mode == ConsumeInitMode.MIN:
        return lo
    if young:
        return lo
    return max(lo, hi - 1)


@dataclass
class Selection:
    """What one pop takes from a queue: offsets to deliver, and the cursor after them."""

    offsets: list[int]
    next_cursor: int


def select(start: int, tags: Sequence[int], sizes: Sequence[int], hashes: set[int] | None,
           max_msgs: int, max_bytes: int) -> Selection:
    """Take index entries from queue offset ``start`` (``tags``/``sizes`` are its slice):
    matching ones up to ``max_msgs`` and ``max_bytes`` (at least one), skipping ones the
    tag filter (``hashes``; None = all) leaves out."""
    taken: list[int] = []
    total = 0
    for i in range(len(sizes)):
        if len(taken) >= max_msgs:
            return Selection(taken, start + i)
        if hashes is not None and tags[i] not in hashes:
            continue
        if taken and total + sizes[i] > max_bytes:
            return Selection(taken, start + i)
        taken.append(start + i)
        total += sizes[i]
    return Selection(taken, start + len(sizes))


class FifoGate(Enum):
    """What a FIFO pop may do with a queue now."""

    #: Nothing in flight: deliver from the cursor.
    FREE = "FREE"
    #: Something in flight is still invisible: nothing from this queue.
    BLOCKED = "BLOCKED"
    #: Everything in flight is visible again: deliver those (in order) first.
    REDELIVER = "REDELIVER"
    #: The first of them reached retryMaxTimes: blocked until it went to the DLQ.
    DEAD_LETTER_PENDING = "DEAD_LETTER_PENDING"


def fifo_gate(pq: PopQueue | None, now_ms: int, retry_max: int) -> tuple[FifoGate, list[int]]:
    """The gate of a FIFO queue and, for REDELIVER, the offsets to deliver again."""
    if pq is None or not pq.inflight:
        return FifoGate.FREE, []
    if any(e.deadline > now_ms for e in pq.inflight.values()):
        return FifoGate.BLOCKED, []
    offsets = sorted(pq.inflight)
    if pq.inflight[offsets[0]].retry_count >= retry_max:
        return FifoGate.DEAD_LETTER_PENDING, []
    # Only up to the first one at the limit: the ones after it wait for its DLQ move.
    ready = []
    for off in offsets:
        if pq.inflight[off].retry_count >= retry_max:
            break
        ready.append(off)
    return FifoGate.REDELIVER, ready


def fifo_unblocks_at(pq: PopQueue | None) -> int | None:
    """When a blocked FIFO queue's last invisible message becomes visible (None: not
    blocked by anything)."""
    if pq is None or not pq.inflight:
        return None
    return max(e.deadline for e in pq.inflight.values())


def next_pop_time(now_ms: int, previous: int) -> int:
    """A pop time for a new delivery of a message: now, but always after the previous one,
    so the new handle differs from the old even within one millisecond."""
    return max(now_ms, previous + 1)


def check_request(handle: ReceiptHandle, group: str, topic: str, queue_id: int,
                  offset: int) -> None:
    """The request names the message its handle names (ReceiptError MISMATCH otherwise).
    A client may name the original topic or the retry topic for a retried message."""
    named = real_topic(topic, group, handle.retry)
    if (named, queue_id, offset) != (handle.topic, handle.queue_id, handle.offset):
        raise refuse(Refusal.MISMATCH,
                     f"the request names {named}/{queue_id}/{offset} but its receipt handle "
                     f"names {handle.topic}/{handle.queue_id}/{handle.offset}")


def check_in_flight(state: PopState, group: str, handle: ReceiptHandle,
                    now_ms: int) -> InFlight:
    """The in-flight entry a verified handle names; ReceiptError EXPIRED (its invisible
    time ran out), SUPERSEDED (a newer handle replaced it) or NOT_IN_FLIGHT (acked)."""
    where = f"{handle.topic}/{handle.queue_id}/{handle.offset} for group {group!r}"
    entry = state.entry((group, handle.topic, handle.queue_id), handle.offset)
    if entry is not None and entry.pop_time > handle.pop_time:
        raise refuse(Refusal.SUPERSEDED, f"receipt handle of {where} popped at "
                     f"{handle.pop_time} was replaced by a newer one (popped at "
                     f"{entry.pop_time})")
    if now_ms >= handle.deadline:
        raise refuse(Refusal.EXPIRED, f"receipt handle of {where} expired at "
                     f"{handle.deadline} ({now_ms - handle.deadline} ms ago): the message "
                     f"is delivered again")
    if entry is None:
        raise refuse(Refusal.NOT_IN_FLIGHT, f"message {where} popped at {handle.pop_time} "
                     f"is not in flight: it was acked already")
    if entry.pop_time != handle.pop_time:
        raise refuse(Refusal.NOT_IN_FLIGHT, f"message {where}: this broker does not know "
                     f"the delivery popped at {handle.pop_time} (not replicated before a "
                     f"failover); it is delivered again once its invisible time ends")
    return entry


def describe_refusal(exc: ReceiptError) -> tuple[int, str, str]:
    """(response code, remark, status) of a refused handle."""
    status = Refusal(exc.status)
    return status.code, str(exc), status.value


class ReviveAction(Enum):
    """What becomes of an expired in-flight message."""

    #: A copy goes to the group's pop retry topic (after the backoff delay).
    RETRY = "RETRY"
    #: A copy goes to the group's dead-letter queue.
    DEAD_LETTER = "DEAD_LETTER"
    #: A FIFO message: left in flight, delivered again from its queue.
    LEAVE = "LEAVE"


@dataclass(frozen=True)
class RevivePlan:
    action: ReviveAction
    #: Delay level of the retry copy (0: visible at once).
    delay_level: int = 0


def retry_delay_level(retry_count: int, max_level: int) -> int:
    """RocketMQ's backoff for the n-th retry: level 3 + retry count, capped at the last."""
    return max(1, min(FIRST_RETRY_LEVEL + retry_count, max_level))


def revive_plan(entry: InFlight, retry_max: int, *, backoff: bool, max_level: int) -> RevivePlan:
    """The retry count is the deliveries before this one: a message delivered with
    ``retry_max`` earlier deliveries and not acked goes to the dead-letter queue."""
    if entry.retry_count >= retry_max:
        return RevivePlan(ReviveAction.DEAD_LETTER)
    if entry.fifo:
        return RevivePlan(ReviveAction.LEAVE)
    if not backoff:
        return RevivePlan(ReviveAction.RETRY)
    return RevivePlan(ReviveAction.RETRY, retry_delay_level(entry.retry_count, max_level))


def rest_count(hi: int, cursor: int) -> int:
    """Messages of a queue not popped yet."""
    return max(0, hi - cursor)
