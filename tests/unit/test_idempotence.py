"""The idempotent producer's pieces without a network: the broker's table of what each
producer stored (its rules, its bounds, its rebuild from a real commitlog, including a
body that holds the key and the record magic), the client's per-queue sequences and
window, and the wire helpers (claims, gap remarks, stamped batch bodies)."""
from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from rmqha.client.idempotence import Idempotence
from rmqha.errors import ProtocolError
from rmqha.messaging.context import Refused
from rmqha.messaging.producer_state import ProducerTable, claim_in
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.idempotence import (
    ID_KEY_BYTES,
    WINDOW,
    Claim,
    claim_of,
    gap_remark,
    parse_gap,
    stamp_batch,
)
from rmqha.protocol.message import MAGIC_V1, decode_batch, encode_batch_entries
from rmqha.protocol.route import MessageQueue
from rmqha.store import CommitLog


def test_the_table_answers_retries_stores_the_next_and_refuses_gaps() -> None:
    table = ProducerTable()
    c0 = Claim("p-0", 0)
    assert table.check(c0, "T", 0) is None  # an unknown producer: stored
    table.record(c0, "T", 0, [(0, 100)], 0)
    again = table.check(c0, "T", 0)
    assert again is not None and again.placed == [(0, 100)] and again.end == 100
    assert table.check(Claim("p-0", 1), "T", 0) is None
    assert table.check(Claim("p-0", 5), "T", 1) is None  # another queue is another sequence
    with pytest.raises(Refused) as gap:
        table.check(Claim("p-0", 2), "T", 0)
    assert gap.value.code == ResponseCode.PRODUCER_SEQUENCE_GAP
    assert gap.value.ext == {"producerId": "p-0", "producerQueue": "T/0", "expectedSeq": "1", "gotSeq": "2"}
    assert parse_gap(gap.value.remark) == ("p-0", "T/0", 1, 2)


def test_the_table_keeps_five_results_per_queue_and_refuses_older_retries() -> None:
    table = ProducerTable()
    for seq in range(WINDOW + 3):
        table.record(Claim("p-0", seq), "T", 0, [(seq * 10, 10)], 0)
    for seq in range(3, WINDOW + 3):
        assert table.check(Claim("p-0", seq), "T", 0) is not None
    with pytest.raises(Refused) as stale:
        table.check(Claim("p-0", 2), "T", 0)
    assert stale.value.code == ResponseCode.PRODUCER_SEQUENCE_STALE and "oldest 3" in stale.value.remark


def test_the_table_drops_the_least_recently_used_pair_at_its_cap() -> None:
    table = ProducerTable(max_queues=2)
    for name in ("a", "b"):
        table.record(Claim(name, 0), "T", 0, [(0, 10)], 0)
    assert table.check(Claim("a", 0), "T", 0) is not None  # used: b is now the oldest
    table.record(Claim("c", 0), "T", 0, [(20, 10)], 0)
    assert len(table) == 2
    assert table.check(Claim("b", 0), "T", 0) is None  # forgotten: would be stored as new
    assert table.check(Claim("a", 0), "T", 0) is not None


def _append(log: CommitLog, topic: str, body: bytes, queue_id: int, claim: Claim | None) -> tuple[int, int]:
    props = b"UNIQ_KEY\x01u\x02" + (claim.properties().encode() if claim else b"")
    return log.append(topic, body, queue_id, props)


def test_the_rebuild_reads_claims_back_from_the_logs_tail(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "commitlog", segment_bytes=1 << 16, prefault=False)
    try:
        # Bodies that hold the key's bytes and the record magic: the scan must not be fooled.
        tricky = b"x" * 40 + struct.pack(">I", MAGIC_V1) + ID_KEY_BYTES + b"p-9\x02"
        for _ in range(40):
            _append(log, "T", tricky, 0, None)
        placed = [_append(log, "T", b"a", 1, Claim("p-0", 0)),
                  _append(log, "T", tricky, 1, Claim("p-0", 1))]
        batch = [_append(log, "U", b"b%d" % i, 2, Claim("p-1", 7)) for i in range(3)]
        _append(log, "T", b"c", 1, Claim("p-0", 2))
        table = ProducerTable()
        assert table.rebuild(log, 1 << 20) == 4  # p-0 x3 and p-1's batch of three as one send
        one = table.check(Claim("p-0", 1), "T", 1)
        assert one is not None and one.placed == [placed[1]]
        whole = table.check(Claim("p-1", 7), "U", 2)
        assert whole is not None and whole.placed == batch
        with pytest.raises(Refused):
            table.check(Claim("p-0", 4), "T", 1)  # expected 3
        assert table.check(Claim("p-9", 0), "T", 0) is None  # only in bodies: never folded
        # Bounded: a window past only the last record sees only it.
        assert table.rebuild(log, 200) == 1
        assert table.check(Claim("p-0", 2), "T", 1) is not None
        assert table.check(Claim("p-1", 7), "U", 2) is None  # outside the window: unknown
        with pytest.raises(Refused) as stale:
            table.check(Claim("p-0", 0), "T", 1)  # before the kept results: never stored again
        assert stale.value.code == ResponseCode.PRODUCER_SEQUENCE_STALE
    finally:
        log.close()


def test_the_rebuild_crosses_segments(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "commitlog", segment_bytes=4096, prefault=False)
    try:
        for seq in range(60):
            _append(log, "T", b"z" * 100, 0, Claim("p-0", seq))
        assert len(log.segment_files()) > 1
        table = ProducerTable()
        assert table.rebuild(log, 1 << 20) == 60
        assert table.check(Claim("p-0", 59), "T", 0) is not None
        assert table.check(Claim("p-0", 60), "T", 0) is None
    finally:
        log.close()


def test_claims_are_checked() -> None:
    assert claim_of({}) is None
    assert claim_of({"RMQHA_PRODUCER_ID": "abc-1", "RMQHA_PRODUCER_SEQ": "7"}) == Claim("abc-1", 7)
    for props in ({"RMQHA_PRODUCER_ID": "abc"}, {"RMQHA_PRODUCER_SEQ": "1"},
                  {"RMQHA_PRODUCER_ID": "a b", "RMQHA_PRODUCER_SEQ": "1"},
                  {"RMQHA_PRODUCER_ID": "a", "RMQHA_PRODUCER_SEQ": "-1"},
                  {"RMQHA_PRODUCER_ID": "a", "RMQHA_PRODUCER_SEQ": str(1 << 63)}):
        with pytest.raises(ProtocolError):
            claim_of(props)
    with pytest.raises(Refused) as bad:
        claim_in("RMQHA_PRODUCER_ID\x01a\x02")
    assert bad.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert claim_in(Claim("a", 3).properties()) == Claim("a", 3)
    assert parse_gap(gap_remark("a-1", "T/2", 4, 9)) == ("a-1", "T/2", 4, 9)
    assert parse_gap("anything else") is None


def test_a_stamped_batch_carries_the_claim_in_every_entry() -> None:
    body = encode_batch_entries([(b"one", b"UNIQ_KEY\x01a\x02", 0), (b"two", b"", 3)])
    pairs = Claim("p-0", 4).properties().encode()
    items = decode_batch(stamp_batch(body, pairs))
    assert [i.body for i in items] == [b"one", b"two"] and items[1].flag == 3
    assert all(claim_of(i.properties) == Claim("p-0", 4) for i in items)
    assert items[0].properties["UNIQ_KEY"] == "a"
    with pytest.raises(ProtocolError):
        stamp_batch(body[:-1], pairs)


def test_the_client_keeps_five_sequences_in_flight_and_starts_afresh_after_a_loss() -> None:
    async def main() -> None:
        idem = Idempotence()
        mq = MessageQueue("T", "broker-a", 0)
        tickets = [idem.try_claim(mq) for _ in range(WINDOW)]
        assert [t.claim.seq for t in tickets if t is not None] == list(range(WINDOW))
        assert idem.try_claim(mq) is None  # the window is full
        waiter = asyncio.ensure_future(idem.claim(mq))
        await asyncio.sleep(0)
        assert not waiter.done()
        assert tickets[0] is not None and tickets[1] is not None
        assert not idem.earlier_in_flight(tickets[0]) and idem.earlier_in_flight(tickets[1])
        idem.release(tickets[0], answered=True)
        sixth = await asyncio.wait_for(waiter, 1)
        assert sixth.claim.seq == WINDOW and sixth.claim.producer == f"{idem.base}-0"
        idem.release(tickets[1], answered=False)  # outcome unknown: a new generation
        fresh = idem.try_claim(mq)
        assert fresh is not None and fresh.claim == Claim(f"{idem.base}-1", 0)
        idem.release(tickets[2], answered=False)  # an old generation's end changes nothing
        nxt = idem.try_claim(mq)
        assert nxt is not None and nxt.claim == Claim(f"{idem.base}-1", 1)
    asyncio.run(main())
