"""The idempotent producer's wire: a producer id and a per-queue sequence in each message.

What both sides read, so neither imports the other (the client and the broker's send path
each import this).  An idempotent send carries two message properties:

* ``RMQHA_PRODUCER_ID``: the producer's id, 1-64 characters of ``[0-9A-Za-z_.-]`` (the
  client makes 128 random bits, hex, plus a generation suffix, see
  :mod:`rmqha.client.idempotence`);
* ``RMQHA_PRODUCER_SEQ``: the send's sequence number in its queue (topic and queue id of
  the broker group it is bound to), from 0, one per request: a batch is one sequence and
  every entry of it carries the same two properties.

They travel as properties, and so are **stored in the record**: the broker's table of
what each producer stored (``rmqha.messaging.producer_state``) can be rebuilt from the log
alone, on a restart and on a slave that becomes master, with no replication of its own.

A single send carries them in its header's properties (which are its record's); a batch in
its header's properties too (so the broker reads the claim without walking the body) and
in every entry's.  The plain send lanes leave such a send alone (``PLAIN_SEND_REFUSE`` and
``RESERVED_KEYS`` in ``rmqha.messaging.send_rules`` name the key): it takes the ordinary
path, which is where the broker's check is.  The compiled lanes are unchanged.

:data:`WINDOW` (5, as Kafka keeps five in-flight batches per partition) is both the
results a broker keeps per producer and queue and the sequences a client may have in
flight on one queue: a retry of a sequence still in flight is therefore always among the
results the broker kept, never older.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from rmqha.errors import ProtocolError

#: The producer id property.
PRODUCER_ID = "RMQHA_PRODUCER_ID"
#: The sequence property.
PRODUCER_SEQ = "RMQHA_PRODUCER_SEQ"
#: How the id's key starts in encoded properties: what keeps a send off the plain lanes.
ID_KEY_BYTES = f"{PRODUCER_ID}\x01".encode()
#: Sequences a client may have in flight per queue; results a broker keeps per queue.
WINDOW = 5
#: Ext fields of a sequence refusal (beside the remark that says the same in words).
FIELD_PRODUCER = "producerId"
FIELD_EXPECTED = "expectedSeq"
FIELD_GOT = "gotSeq"
FIELD_QUEUE = "producerQueue"

#: A batch entry's head: total size, magic, body CRC, flag, body length.
_BATCH_HEAD = struct.Struct(">iiiii")
_ID = re.compile(r"[0-9A-Za-z_.\-]{1,64}")
#: Sequences are int64 on the wire; a producer wraps long before (2^63 sends per queue).
_MAX_SEQ = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Claim:
    """What an idempotent send claims: its producer and its sequence in its queue."""

    producer: str
    seq: int

    def properties(self) -> str:
        """The encoded pairs appended to a message's encoded properties."""
        return f"{PRODUCER_ID}\x01{self.producer}\x02{PRODUCER_SEQ}\x01{self.seq}\x02"


def claim_of(props: dict[str, str]) -> Claim | None:
    """The claim in decoded properties; None for a send without one; ProtocolError for a
    malformed one (a bad id, a sequence that is not a non-negative int64, one key alone)."""
    producer = props.get(PRODUCER_ID)
    seq = props.get(PRODUCER_SEQ)
    if producer is None and seq is None:
        return None
    if producer is None or seq is None:
        raise ProtocolError(f"an idempotent send needs both {PRODUCER_ID} and {PRODUCER_SEQ}; "
                            f"got only {PRODUCER_ID if seq is None else PRODUCER_SEQ}")
    if not _ID.fullmatch(producer):
        raise ProtocolError(f"{PRODUCER_ID} {producer[:80]!r} is not 1-64 characters of [0-9A-Za-z_.-]")
    if not seq.isdigit() or int(seq) > _MAX_SEQ:
        raise ProtocolError(f"{PRODUCER_SEQ} {seq[:40]!r} is not a non-negative 64-bit integer")
    return Claim(producer, int(seq))


def gap_remark(producer: str, queue: str, expected: int, got: int) -> str:
    """The words of a sequence-gap refusal (the client's SequenceGapError says the same)."""
    return (f"PRODUCER_SEQUENCE_GAP: producer {producer} on queue {queue}: expected sequence "
            f"{expected}, got {got}; nothing was stored (an earlier send of this producer to "
            f"this queue is missing)")


def stale_remark(producer: str, queue: str, oldest: int, got: int) -> str:
    """The words of a refusal of a retry older than the results the broker keeps."""
    return (f"PRODUCER_SEQUENCE_STALE: producer {producer} on queue {queue}: sequence {got} "
            f"is older than the {WINDOW} results kept (oldest {oldest}); its outcome is "
            f"not known here")


_GAP = re.compile(r"PRODUCER_SEQUENCE_GAP: producer (\S+) on queue (\S+): expected sequence (\d+), got (\d+)")


def parse_gap(remark: str) -> tuple[str, str, int, int] | None:
    """(producer, queue, expected, got) from a gap refusal's remark (what
    :func:`gap_remark` wrote), None for any other remark."""
    m = _GAP.search(remark)
    return None if m is None else (m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))


def stamp_batch(body: bytes, pairs: bytes) -> bytes:
    """A batch body whose every entry's properties end with ``pairs`` (encoded
    ``key\\x01value\\x02`` pairs: a claim's), sizes adjusted.  ProtocolError for a body
    that is not a batch or an entry whose properties would pass 32767 bytes."""
    mv = memoryview(body)
    parts: list[bytes | memoryview] = []
    pos, n, extra = 0, len(mv), len(pairs)
    while pos < n:
        if n - pos < 22:
            raise ProtocolError(f"batch entry at {pos} shorter than its header")
        total, magic, crc, flag, body_len = _BATCH_HEAD.unpack_from(mv, pos)
        if total < 22 or total > n - pos or body_len < 0 or 22 + body_len > total:
            raise ProtocolError(f"batch entry at {pos}: bad sizes total={total} body={body_len}")
        props_at = pos + 20 + body_len
        props_len = int.from_bytes(mv[props_at:props_at + 2], "big") + extra
        if props_len > 32767:
            raise ProtocolError(f"batch entry at {pos}: properties of {props_len} bytes exceed 32767")
        parts += (_BATCH_HEAD.pack(total + extra, magic, crc, flag, body_len), mv[pos + 20:props_at],
                  props_len.to_bytes(2, "big"), mv[props_at + 2:pos + total], pairs)
        pos += total
    return b"".join(parts)
