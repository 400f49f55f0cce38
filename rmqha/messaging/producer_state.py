"""Idempotent producers on the broker: what each producer stored in each queue, so a retried
send is answered with its original's result instead of being stored again.

A send claiming a producer id and a sequence (:mod:`rmqha.protocol.idempotence`) is
checked against the :class:`ProducerTable` before anything is written (by the send path's
ordinary way; the plain lanes never take such a send):

* the next sequence of its producer and queue (or a pair the table does not know): stored
  as any send, and its placement recorded (:meth:`ProducerTable.record`);
* a sequence stored already (a retry after a timeout, a lost connection, a
  FLUSH_SLAVE_TIMEOUT, a failover): **not stored again**; the send path waits for the
  original's end as it waits for any send (``LogWriter.when_durable``), so the retry's
  answer is the verdict of the original's copies *now*: a retry of a send still waiting
  for its copies is answered when they are known (never SEND_OK before they are in), and
  a retry of one answered FLUSH_SLAVE_TIMEOUT waits for the replicas again and gets
  SEND_OK once they hold it (or FLUSH_SLAVE_TIMEOUT again);
* a sequence past the next one: refused, PRODUCER_SEQUENCE_GAP, nothing stored, the
  answer naming producer, queue, expected and got;
* a sequence older than the kept results: PRODUCER_SEQUENCE_STALE (a client that keeps to
  :data:`~rmqha.protocol.idempotence.WINDOW` sequences in flight never sends one).

**Memory is bounded.**  Per (producer, topic, queue) the last
:data:`~rmqha.protocol.idempotence.WINDOW` (5) results: ~2 KiB with its key.  At most
``idempotent_max_producer_queues`` (10,000 by default: ~20 MiB at most) pairs are kept,
the least recently used dropped first.  A dropped (or never seen) pair starts again at
whatever sequence it sends next: idempotence holds while the broker remembers the pair,
which is all a retry needs (its original is among the latest sends of its queue).

**Rebuilt from the log, in bounded work.**  The claim is stored in each record's
properties, and a slave holds the same log as its master, so no state is replicated:
whenever a broker becomes master the table is rebuilt (:meth:`ProducerTable.rebuild`)
from the last ``idempotent_rebuild_bytes`` (64 MiB by default) of its log, which holds
every send still in flight at a failover or crash (they are the log's newest records).  The
scan finds the key's bytes with ``bytes.find`` and each record by its magic and its own
physical offset field (a body that happens to hold either does not fool it), so a log
without idempotent sends costs one search at C speed, and restart time does not grow with
the log: 64 MiB are read whatever its length.  A slave keeps no table (it takes no
writes); a master that steps down drops its table (its tail may be cut as a slave).
"""
from __future__ import annotations

import logging
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from rmqha.errors import ProtocolError, StoreError
from rmqha.messaging.context import Refused
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.idempotence import (
    FIELD_EXPECTED,
    FIELD_GOT,
    FIELD_PRODUCER,
    FIELD_QUEUE,
    ID_KEY_BYTES,
    WINDOW,
    Claim,
    claim_of,
    gap_remark,
    stale_remark,
)
from rmqha.protocol.message import MAGIC_V1, decode_properties

log = logging.getLogger(__name__)

_MAGIC = struct.pack(">I", MAGIC_V1)
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: The largest record the scan looks back over for a hit's start (RocketMQ's 4 MiB
#: message limit and its fields).
_MAX_RECORD = (4 << 20) + (64 << 10)

Key = tuple[str, str, int]


@dataclass(slots=True)
class StoredSend:
    """Where one sequence's send was stored: its records and the queue its answer names."""

    seq: int
    placed: list[tuple[int, int]]
    reply_queue_id: int

    @property
    def end(self) -> int:
        off, size = self.placed[-1]
        return off + size


@dataclass(slots=True)
class _QueueSeqs:
    """One producer's last sends to one queue, newest last."""

    last: int
    recent: deque[StoredSend] = field(default_factory=lambda: deque(maxlen=WINDOW))


class ProducerTable:
    """What idempotent producers stored, per (producer, topic, queue); see the module
    docstring."""

    def __init__(self, max_queues: int = 10_000) -> None:
        if max_queues <= 0:
            raise ValueError(f"idempotent_max_producer_queues must be positive, got {max_queues}")
        self.max_queues = max_queues
        self._queues: OrderedDict[Key, _QueueSeqs] = OrderedDict()

    def __len__(self) -> int:
        return len(self._queues)

    def check(self, claim: Claim, topic: str, queue_id: int) -> StoredSend | None:
        """The original of a retried send (answer it, store nothing), or None (store it);
        Refused for a gap or a retry older than the kept results."""
        key = (claim.producer, topic, queue_id)
        seqs = self._queues.get(key)
        if seqs is None or claim.seq == seqs.last + 1:
            return None
        self._queues.move_to_end(key)
        queue = f"{topic}/{queue_id}"
        if claim.seq > seqs.last + 1:
            raise Refused(ResponseCode.PRODUCER_SEQUENCE_GAP,
                          gap_remark(claim.producer, queue, seqs.last + 1, claim.seq),
                          self._fields(claim, queue, seqs.last + 1))
        for stored in seqs.recent:
            if stored.seq == claim.seq:
                return stored
        oldest = seqs.recent[0].seq if seqs.recent else seqs.last
        raise Refused(ResponseCode.PRODUCER_SEQUENCE_STALE,
                      stale_remark(claim.producer, queue, oldest, claim.seq),
                      self._fields(claim, queue, oldest))

    @staticmethod
    def _fields(claim: Claim, queue: str, expected: int) -> dict[str, Any]:
        return {FIELD_PRODUCER: claim.producer, FIELD_QUEUE: queue,
                FIELD_EXPECTED: str(expected), FIELD_GOT: str(claim.seq)}

    def record(self, claim: Claim, topic: str, queue_id: int, placed: list[tuple[int, int]],
               reply_queue_id: int) -> None:
        """``claim``'s send was stored at ``placed``."""
        self._put((claim.producer, topic, queue_id), StoredSend(claim.seq, placed, reply_queue_id))

    def _put(self, key: Key, stored: StoredSend) -> None:
        seqs = self._queues.get(key)
        if seqs is None:
            seqs = self._queues[key] = _QueueSeqs(stored.seq)
            if len(self._queues) > self.max_queues:
                self._queues.popitem(last=False)
        else:
            self._queues.move_to_end(key)
        seqs.last = stored.seq
        seqs.recent.append(stored)

    def clear(self) -> None:
        self._queues.clear()

    # --- rebuilding from the log -----------------------------------------------------------

    def rebuild(self, commitlog: Any, window_bytes: int) -> int:
        """Forget everything and fold the idempotent records of the log's last
        ``window_bytes``: how many sends were found."""
        self.clear()
        end = int(commitlog.max_offset)
        off = max(int(commitlog.min_offset), end - max(0, window_bytes))
        found = 0
        last: tuple[Key, int, int] | None = None  # key, seq and end of the last record folded
        while off < end:
            chunk_end = min(commitlog.segment_start(off) + commitlog.segment_bytes, end)
            try:
                data = bytes(commitlog.read(off, chunk_end - off))
            except StoreError as exc:  # a segment deleted under us: what was read stands
                log.warning("producer state rebuild stopped at %d: %s", off, exc)
                break
            found, last = self._fold_chunk(data, off, found, last)
            off = chunk_end
        return found

    def _fold_chunk(self, data: bytes, base: int, found: int,
                    last: tuple[Key, int, int] | None) -> tuple[int, tuple[Key, int, int] | None]:
        pos = data.find(ID_KEY_BYTES)
        while pos >= 0:
            start = _record_start(data, base, pos)
            if start < 0:
                pos = data.find(ID_KEY_BYTES, pos + 1)
                continue
            size = _I32.unpack_from(data, start)[0]
            folded = self._fold_record(data, base, start, size, last)
            if folded is not None:
                if last is None or folded[:2] != last[:2] or last[2] != base + start:
                    found += 1
                last = folded
            pos = data.find(ID_KEY_BYTES, start + size)
        return found, last

    def _fold_record(self, data: bytes, base: int, start: int, size: int,
                     last: tuple[Key, int, int] | None) -> tuple[Key, int, int] | None:
        """One record's claim into the table: the entries of one batch (the same claim,
        back to back) extend one send."""
        body_len = _I32.unpack_from(data, start + 84)[0]
        t = start + 88 + body_len
        topic = data[t + 1:t + 1 + data[t]].decode("utf-8", "replace")
        p = t + 1 + data[t]
        props = decode_properties(data[p + 2:p + 2 + int.from_bytes(data[p:p + 2], "big")])
        try:
            claim = claim_of(props)
        except ProtocolError:
            return None  # never stored so by the send path; nothing to fold
        if claim is None:
            return None
        queue_id = _I32.unpack_from(data, start + 12)[0]
        key = (claim.producer, topic, queue_id)
        offset = base + start
        seqs = self._queues.get(key)
        if (last is not None and last[0] == key and last[1] == claim.seq and last[2] == offset
                and seqs is not None and seqs.recent and seqs.recent[-1].seq == claim.seq):
            seqs.recent[-1].placed.append((offset, size))
        else:
            self._put(key, StoredSend(claim.seq, [(offset, size)], queue_id))
        return key, claim.seq, offset + size


def claim_in(props: str | dict[str, str]) -> Claim | None:
    """An idempotent send's claim in its properties (encoded or not); Refused
    (MESSAGE_ILLEGAL) names what is malformed."""
    try:
        return claim_of(decode_properties(props) if isinstance(props, str) else props)
    except ProtocolError as exc:
        raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None


def _record_start(data: bytes, base: int, hit: int) -> int:
    """The start of the record holding byte ``hit`` of ``data`` (which begins at log offset
    ``base``), found by its magic and its own physical offset field; -1 if none in ``data``
    (the record began before it, or the hit is not in a record)."""
    lo = max(0, hit - _MAX_RECORD)
    m = data.rfind(_MAGIC, lo, hit)
    while m >= 4:
        start = m - 4
        if (start + 36 <= len(data) and _I64.unpack_from(data, start + 28)[0] == base + start):
            size = _I32.unpack_from(data, start)[0]
            if start + size > hit and start + size <= len(data) and size > 91:
                return start
        m = data.rfind(_MAGIC, lo, m)
    return -1
