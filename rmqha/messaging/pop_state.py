"""Pop consumption state: per group/topic/queue cursors and in-flight messages.

This is the replicated part of pop consumption, the fold of the ``pop_*`` state records
(see :mod:`rmqha.messaging.state`), with no I/O.  Keys are (consumer group, the queue's
topic, queue id); the topic is the one the message is stored under, so the group's pop
retry topic ``%RETRY%<group>_<topic>`` has queues here like any topic.

- ``cursor``: the next queue offset a pop reads (everything below it was delivered, or
  skipped by the group's tag filter);
- ``inflight``: offset -> :class:`InFlight`, a delivered message not acked yet, with the
  pop time that names its current receipt handle and the deadline when it becomes visible
  again.

Records (JSON bodies; short keys keep them small; one per request, not per message):

- ``{"op": "pop_batch", "pt", "it", "ep", "fifo", "b": [[g, t, q, ck, cursor, [[off, rc], ...]], ...]}``
  one pop: per queue the start offset, the cursor after it and the delivered offsets with
  their retry counts, all with pop time ``pt``, invisible time ``it``, master epoch ``ep``;
- ``{"op": "pop_ack", "a": [[g, t, q, off, pt], ...]}`` acks (one request's);
- ``{"op": "pop_change", "c": [[g, t, q, off, pt, new_pt, new_it], ...]}`` a new invisible time;
- ``{"op": "pop_revive", "r": [[g, t, q, off, pt], ...]}`` expired messages the master
  moved to the retry topic or the dead-letter queue;
- ``{"op": "pop_key", "key": base64}`` the broker group's receipt-handle key.

An ack, change or revive names the pop time it applies to and is ignored when the entry
holds another one, so folding is idempotent and a stale request changes nothing.
"""
from __future__ import annotations

import base64
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rmqha.errors import ProtocolError

QueueKey = tuple[str, str, int]  # consumer group, the queue's topic, queue id

POP_OPS = frozenset({"pop_batch", "pop_ack", "pop_change", "pop_revive", "pop_key"})
#: Heap pushes between checks for stale heap entries.
COMPACT_EVERY = 4096


@dataclass(slots=True)
class InFlight:
    """One delivered, unacked message."""

    pop_time: int
    invisible_time: int
    #: Deliveries before this one (RocketMQ's reconsume times).
    retry_count: int
    #: Start offset of the pop that delivered it (the handle's ckOffset).
    ck_offset: int
    epoch: int
    fifo: bool

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_time


@dataclass
class PopQueue:
    """A group's progress on one queue."""

    cursor: int
    inflight: dict[int, InFlight] = field(default_factory=dict)


class PopState:
    """Every group's pop progress on this broker group, and the receipt-handle key."""

    def __init__(self) -> None:
        self.queues: dict[QueueKey, PopQueue] = {}
        #: The broker group's HMAC key for receipt handles (None until a master made one).
        self.key: bytes | None = None
        #: (deadline, group, topic, queue, offset, pop time): entries may be stale (acked,
        #: changed); :meth:`due` skips those, and :meth:`_put` compacts them away now and
        #: then (a slave never takes anything out).
        self._due: list[tuple[int, str, str, int, int, int]] = []
        self._pushes = 0

    # --- reads -------------------------------------------------------------------------

    def queue(self, key: QueueKey) -> PopQueue | None:
        return self.queues.get(key)

    def entry(self, key: QueueKey, offset: int) -> InFlight | None:
        pq = self.queues.get(key)
        return None if pq is None else pq.inflight.get(offset)

    def in_flight_count(self) -> int:
        return sum(len(pq.inflight) for pq in self.queues.values())

    def due(self, now_ms: int) -> Iterator[tuple[QueueKey, int, InFlight]]:
        """In-flight entries whose deadline passed, earliest first (each once per
        deadline: a FIFO entry left in place comes back only after a new delivery)."""
        while self._due and self._due[0][0] <= now_ms:
            _, g, t, q, off, pt = heapq.heappop(self._due)
            entry = self.entry((g, t, q), off)
            if entry is not None and entry.pop_time == pt:
                yield (g, t, q), off, entry

    def requeue(self, key: QueueKey, offset: int, entry: InFlight, at_ms: int) -> None:
        """Look at an entry :meth:`due` yielded again at ``at_ms`` (its revive failed)."""
        heapq.heappush(self._due, (at_ms, key[0], key[1], key[2], offset, entry.pop_time))

    def next_deadline(self) -> int | None:
        """The earliest deadline still pending, or None (stale entries included: a wake-up
        that finds nothing due is harmless)."""
        return self._due[0][0] if self._due else None

    # --- the fold ----------------------------------------------------------------------

    def apply(self, op: str, data: dict[str, Any]) -> None:
        """Apply one pop record; ProtocolError/KeyError/TypeError/ValueError on a bad one."""
        if op == "pop_batch":
            self._apply_batch(data)
        elif op == "pop_ack":
            for g, t, q, off, pt in data["a"]:
                self._remove((str(g), str(t), int(q)), int(off), int(pt))
        elif op == "pop_revive":
            for g, t, q, off, pt in data["r"]:
                self._remove((str(g), str(t), int(q)), int(off), int(pt))
        elif op == "pop_change":
            for g, t, q, off, pt, new_pt, new_it in data["c"]:
                self._change((str(g), str(t), int(q)), int(off), int(pt), int(new_pt),
                             int(new_it))
        elif op == "pop_key":
            self.key = base64.b64decode(str(data["key"]))
        else:
            raise ProtocolError(f"unknown pop op {op!r}")

    def _apply_batch(self, data: dict[str, Any]) -> None:
        pt, it, ep = int(data["pt"]), int(data["it"]), int(data.get("ep", 0))
        fifo = bool(data.get("fifo", False))
        for g, t, q, ck, cursor, delivered in data["b"]:
            key = (str(g), str(t), int(q))
            pq = self.queues.get(key)
            if pq is None:
                pq = self.queues[key] = PopQueue(int(cursor))
            pq.cursor = max(pq.cursor, int(cursor))
            for off, rc in delivered:
                self._put(key, pq, int(off), InFlight(pt, it, int(rc), int(ck), ep, fifo))

    def _put(self, key: QueueKey, pq: PopQueue, offset: int, entry: InFlight) -> None:
        pq.inflight[offset] = entry
        heapq.heappush(self._due, (entry.deadline, key[0], key[1], key[2], offset,
                                   entry.pop_time))
        self._pushes += 1
        if self._pushes % COMPACT_EVERY == 0 and len(self._due) > 2 * self.in_flight_count():
            self._compact()

    def _compact(self) -> None:
        """The heap of the live entries only (FIFO entries left in place come back: harmless,
        their plan is to stay)."""
        self._due = [(e.deadline, g, t, q, off, e.pop_time)
                     for (g, t, q), pq in self.queues.items() for off, e in pq.inflight.items()]
        heapq.heapify(self._due)

    def _remove(self, key: QueueKey, offset: int, pop_time: int) -> None:
        pq = self.queues.get(key)
        if pq is not None:
            entry = pq.inflight.get(offset)
            if entry is not None and entry.pop_time == pop_time:
                del pq.inflight[offset]

    def _change(self, key: QueueKey, offset: int, pop_time: int, new_pop_time: int,
                new_invisible: int) -> None:
        pq = self.queues.get(key)
        entry = None if pq is None else pq.inflight.get(offset)
        if pq is None or entry is None or entry.pop_time != pop_time:
            return
        self._put(key, pq, offset, InFlight(new_pop_time, new_invisible, entry.retry_count,
                                            offset, entry.epoch, entry.fifo))

    def drop_topic(self, topic: str) -> None:
        """A topic was deleted: forget every group's progress on it."""
        for key in [k for k in self.queues if k[1] == topic]:
            del self.queues[key]

    def clear(self) -> None:
        self.queues.clear()
        self._due.clear()
        self.key = None

    # --- checkpoint --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        queues = []
        for (g, t, q), pq in sorted(self.queues.items()):
            entries = [[off, e.pop_time, e.invisible_time, e.retry_count, e.ck_offset, e.epoch,
                        int(e.fifo)] for off, e in sorted(pq.inflight.items())]
            queues.append([g, t, q, pq.cursor, entries])
        key = None if self.key is None else base64.b64encode(self.key).decode()
        return {"key": key, "queues": queues}

    def load(self, data: dict[str, Any] | None) -> None:
        """Replace everything with a checkpoint's ``pop`` section (None: empty)."""
        self.clear()
        if not data:
            return
        if data.get("key"):
            self.key = base64.b64decode(str(data["key"]))
        for g, t, q, cursor, entries in data.get("queues", []):
            key = (str(g), str(t), int(q))
            pq = self.queues[key] = PopQueue(int(cursor))
            for off, pt, it, rc, ck, ep, fifo in entries:
                self._put(key, pq, int(off), InFlight(int(pt), int(it), int(rc), int(ck),
                                                      int(ep), bool(fifo)))


# --- record bodies (the master writes these and applies the same data) --------------------


def batch_record(pop_time: int, invisible_time: int, epoch: int, fifo: bool,
                 batches: list[list[Any]]) -> dict[str, Any]:
    return {"op": "pop_batch", "pt": pop_time, "it": invisible_time, "ep": epoch,
            "fifo": fifo, "b": batches}


def ack_record(acks: list[list[Any]]) -> dict[str, Any]:
    return {"op": "pop_ack", "a": acks}


def change_record(changes: list[list[Any]]) -> dict[str, Any]:
    return {"op": "pop_change", "c": changes}


def revive_record(revived: list[list[Any]]) -> dict[str, Any]:
    return {"op": "pop_revive", "r": revived}


def key_record(key: bytes) -> dict[str, Any]:
    return {"op": "pop_key", "key": base64.b64encode(key).decode()}
