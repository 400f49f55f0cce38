"""The idempotent producer against real brokers on 127.0.0.1 (issue 40.1).

A send claiming a producer id and a sequence (``rmqha.protocol.idempotence``) is stored
once however often it is sent: a retry is answered with the original's result (its commit
offset, queue offset and message id), a sequence gap is refused with an answer naming
producer, queue, expected and got, and both hold across a broker restart (the state is
read back from the log's tail) and a failover (the new master reads the same records from
its own copy of the log).  Through the client: a send retried after ack timeouts (a slave
frozen past the producer's send timeout) is stored once with ``idempotent=True`` and more
than once without (the control), and a gap surfaces as SequenceGapError, after which the
queue starts afresh.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from cluster import Cluster

from rmqha.client import (
    BlockingConsumer,
    BlockingProducer,
    Message,
    Producer,
    ReceivedMessage,
    SendResult,
    SendStatus,
)
from rmqha.errors import SequenceGapError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import SEND_V2_QUEUE_ID, SendHeader
from rmqha.protocol.idempotence import FIELD_EXPECTED, FIELD_GOT, FIELD_PRODUCER, FIELD_QUEUE, Claim
from rmqha.protocol.message import encode_batch_entries, new_uniq_key

TOPIC = "Idempotent"


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One broker alone, shared by the tests that neither stop it nor need a slave (each
    uses its own topic, queue or producer id)."""
    with Cluster(tmp_path_factory.mktemp("idempotent-single")) as c:
        c.start_controllers(1)
        c.start_namesrv()
        c.start_group("broker-a", 1)
        yield c


def raw_send(c: Cluster, addr: str, body: bytes, claim: Claim | None, *, queue_id: int = 0,
             topic: str = TOPIC, uid: str | None = None) -> RemotingCommand:
    """One SEND_MESSAGE_V2 as a producer's attempt makes it (a retry is the same call)."""
    props = f"UNIQ_KEY\x01{uid or new_uniq_key()}\x02WAIT\x01true\x02" + (claim.properties() if claim else "")
    ext = {**SendHeader.fields("idem-test", topic, 0, int(time.time() * 1000), 0, props, False),
           SEND_V2_QUEUE_ID: str(queue_id)}
    return c.request(addr, RequestCode.SEND_MESSAGE_V2, ext, body, timeout=5.0)


def max_offset(c: Cluster, addr: str, queue_id: int = 0, topic: str = TOPIC) -> int:
    resp = c.request(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int(resp.ext_fields["offset"])


def placement(resp: RemotingCommand) -> tuple[str, str, str]:
    """What a stored send's answer says of where it is (the message id names the answering
    broker's address, so a failover compares the offsets)."""
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    ext = resp.ext_fields
    return ext["commitLogOffset"], ext["queueId"], ext["queueOffset"]


def test_a_retry_is_answered_with_the_original_and_a_gap_is_refused(single: Cluster) -> None:
    cluster = single
    (b,) = cluster.brokers
    claim = Claim("p-retry-0", 0)
    first = raw_send(cluster, b.address, b"one", claim)
    assert raw_send(cluster, b.address, b"one", claim).ext_fields == first.ext_fields
    assert cluster.wait_for(lambda: max_offset(cluster, b.address) == 1, what="one record in the queue")
    # Another producer, and the same producer's next sequence, are stored.
    assert placement(raw_send(cluster, b.address, b"x", Claim("p-other-0", 0)))[2] == "1"
    assert placement(raw_send(cluster, b.address, b"two", Claim("p-retry-0", 1)))[2] == "2"
    gap = raw_send(cluster, b.address, b"four", Claim("p-retry-0", 3))
    assert gap.code == ResponseCode.PRODUCER_SEQUENCE_GAP
    assert gap.ext_fields[FIELD_PRODUCER] == "p-retry-0" and gap.ext_fields[FIELD_QUEUE] == f"{TOPIC}/0"
    assert (gap.ext_fields[FIELD_EXPECTED], gap.ext_fields[FIELD_GOT]) == ("2", "3")
    assert "producer p-retry-0 on queue Idempotent/0: expected sequence 2, got 3" in (gap.remark or "")
    # A malformed claim is refused, naming it; nothing of the refused sends was stored.
    assert raw_send(cluster, b.address, b"plain", None).code == ResponseCode.SUCCESS  # no claim: ordinary
    malformed = raw_send(cluster, b.address, b"bad", Claim("no spaces allowed", 0))
    assert malformed.code == ResponseCode.MESSAGE_ILLEGAL and "RMQHA_PRODUCER_ID" in (malformed.remark or "")
    # A batch whose entries claim what its header does not is refused (a rebuild reads them).
    entries = encode_batch_entries([(b"e", b"UNIQ_KEY\x01u1\x02" + Claim("p-sneak-0", 0).properties().encode(), 0)])
    ext = {**SendHeader.fields("idem-test", TOPIC, 0, int(time.time() * 1000), 0, "", True), SEND_V2_QUEUE_ID: "0"}
    sneak = cluster.request(b.address, RequestCode.SEND_BATCH_MESSAGE, ext, entries)
    assert sneak.code == ResponseCode.MESSAGE_ILLEGAL and "idempotence claim" in (sneak.remark or "")
    assert cluster.wait_for(lambda: max_offset(cluster, b.address) == 4, what="four records in the queue")


def test_a_restart_rebuilds_the_producer_state_from_the_log(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    (b,) = cluster.start_group("broker-a", 1)
    answers = [raw_send(cluster, b.address, f"m{i}".encode(), Claim("p-restart-0", i)) for i in range(3)]
    b.kill()  # no clean shutdown: the state comes from the log alone
    b.start()
    cluster.wait_role(b, "master", 30)
    again = raw_send(cluster, b.address, b"m2", Claim("p-restart-0", 2))
    assert placement(again) == placement(answers[2])
    assert max_offset(cluster, b.address) == 3
    gap = raw_send(cluster, b.address, b"m4", Claim("p-restart-0", 4))
    assert gap.code == ResponseCode.PRODUCER_SEQUENCE_GAP and gap.ext_fields[FIELD_EXPECTED] == "3"
    assert b.log_contains("idempotent producers: 3 sends of 1 producer queues read back")


def test_a_new_master_answers_retries_of_what_the_old_one_stored(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    old, slave = cluster.start_group("broker-a", 2, in_sync=True, all_ack_in_sync_state_set=True)
    answers = [raw_send(cluster, old.address, f"f{i}".encode(), Claim("p-failover-0", i)) for i in range(2)]
    assert all(a.code == ResponseCode.SUCCESS for a in answers)  # so the slave holds both
    old.kill()
    cluster.wait_role(slave, "master", 30)
    again = cluster.wait_for(lambda: (r := raw_send(cluster, slave.address, b"f1", Claim("p-failover-0", 1))).code
                             == ResponseCode.SUCCESS and r, 30, what="the new master to take the retry")
    assert placement(again) == placement(answers[1])
    assert max_offset(cluster, slave.address) == 2
    gap = raw_send(cluster, slave.address, b"f3", Claim("p-failover-0", 3))
    assert gap.code == ResponseCode.PRODUCER_SEQUENCE_GAP and gap.ext_fields[FIELD_EXPECTED] == "2"
    assert placement(raw_send(cluster, slave.address, b"f2", Claim("p-failover-0", 2)))[2] == "2"


def test_a_retry_of_a_flush_slave_timeout_waits_for_the_copies_again(cluster: Cluster) -> None:
    """The original answered FLUSH_SLAVE_TIMEOUT (stored, its copy not in time): a retry
    made while the slave is still frozen is answered short again, not SEND_OK; one made
    after it thawed gets SEND_OK naming the original's record; it is stored once."""
    cluster.start_controllers(1)
    cluster.start_namesrv()
    master, slave = cluster.start_group("broker-a", 2, in_sync=True, all_ack_in_sync_state_set=True,
                                        slave_timeout_ms=600)
    assert raw_send(cluster, master.address, b"warm", None, queue_id=1).code == ResponseCode.SUCCESS  # the topic
    slave.pause()
    try:
        claim = Claim("p-short-0", 0)
        first = raw_send(cluster, master.address, b"once", claim)
        assert first.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, (first.code, first.remark)
        early = raw_send(cluster, master.address, b"once", claim)
        assert early.code != ResponseCode.SUCCESS
        assert early.ext_fields.get("commitLogOffset") in (None, first.ext_fields["commitLogOffset"])
    finally:
        slave.resume()
    late = cluster.wait_for(lambda: (r := raw_send(cluster, master.address, b"once", claim)).code
                            == ResponseCode.SUCCESS and r, 30, what="the retry answered SEND_OK")
    assert late.ext_fields["commitLogOffset"] == first.ext_fields["commitLogOffset"]
    assert late.ext_fields["queueOffset"] == first.ext_fields["queueOffset"]
    assert cluster.wait_for(lambda: max_offset(cluster, master.address, int(first.ext_fields["queueId"])) == 1,
                            what="the queue holding it once")


def _send_through_a_frozen_slave(c: Cluster, idempotent: bool, topic: str) -> tuple[list[str], Counter[str]]:
    """A value sent while the slave is frozen past the producer's send timeout (each
    attempt times out and is retried) until it thaws, with one before and one after; the
    values sent and how often the topic holds each."""
    master = c.master_of("broker-a")
    assert master is not None
    slave = next(b for b in c.brokers if b is not master)
    values: list[str] = []
    with BlockingProducer(c.namesrv_addresses, group=f"idem-{idempotent}", send_timeout_s=0.4,
                          retry_deadline_s=20.0, idempotent=idempotent) as p:
        assert p.send(topic, b"warm-up").ok
        values.append("warm-up")
        slave.pause()
        thaw = threading.Timer(2.0, slave.resume)
        thaw.start()
        try:
            # Stored at once, its copy waits for the thaw: every attempt until then times out.
            r = p.send(topic, b"frozen", queue_id=0)
            assert r.status is SendStatus.SEND_OK and r.attempts > 1, r
            values.append("frozen")
        finally:
            thaw.cancel()
            slave.resume()
        assert p.send(topic, b"after", queue_id=0).ok
        values.append("after")
    stored: Counter[str] = Counter()
    with BlockingConsumer(c.namesrv_addresses, f"read-{topic}", topic) as consumer:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not set(values) <= set(stored):
            for m in consumer.poll(timeout=0.5):
                stored[m.body.decode()] += 1
    return values, stored


@pytest.mark.timeout(180)
def test_retries_after_ack_timeouts_store_once_with_idempotence_and_twice_without(cluster: Cluster) -> None:
    cluster.start_controllers(1)
    cluster.start_namesrv()
    cluster.start_group("broker-a", 2, in_sync=True, all_ack_in_sync_state_set=True, min_in_sync_replicas=2,
                        slave_timeout_ms=10_000)
    values, stored = _send_through_a_frozen_slave(cluster, True, "IdemOn")
    assert {v: stored[v] for v in values} == dict.fromkeys(values, 1)
    # The control: the same retries without idempotence store the values again.
    values, stored = _send_through_a_frozen_slave(cluster, False, "IdemOff")
    assert set(values) <= set(stored)
    assert stored["frozen"] > 1, f"the control stored no duplicate: {stored}"


def test_a_batch_sent_again_is_answered_with_its_original_results(single: Cluster) -> None:
    """A batch request sent twice by the asyncio producer (what a retry does: the same
    claim on the same queue) is stored once, both answers naming the same records; every
    stored entry carries the claim, which is what a rebuild reads."""
    cluster = single
    (b,) = cluster.brokers

    async def main() -> tuple[list[SendResult], list[SendResult]]:
        async with Producer(cluster.namesrv_addresses, group="idem-batch", idempotent=True) as p:
            req = next(p.sender.requests.batches("IdemBatch", [b"b0", Message(b"b1", tags="t"), b"b2"], 2))
            first = await p.sender.send(req)
            assert req.ticket is not None and req.ticket.claim.seq == 0
            return first, await p.sender.send(req)

    first, again = asyncio.run(main())
    assert [(r.offset_msg_id, r.queue_offset) for r in again] == [(r.offset_msg_id, r.queue_offset) for r in first]
    assert all(r.ok for r in first + again) and [r.queue_offset for r in first] == [0, 1, 2]
    assert max_offset(cluster, b.address, 2, "IdemBatch") == 3
    got: list[ReceivedMessage] = []
    with BlockingConsumer(cluster.namesrv_addresses, "read-batch", "IdemBatch") as consumer:
        cluster.wait_for(lambda: got.extend(consumer.poll(timeout=0.5)) or len(got) >= 3,
                         what="the batch read back")
    claims = {(m.properties["RMQHA_PRODUCER_ID"], m.properties["RMQHA_PRODUCER_SEQ"]) for m in got}
    assert len(got) == 3 and len(claims) == 1 and next(iter(claims))[1] == "0"


def test_a_gap_is_a_sequence_gap_error_and_the_queue_starts_afresh(single: Cluster) -> None:
    cluster = single
    with BlockingProducer(cluster.namesrv_addresses, group="idem-gap", idempotent=True) as p:
        first = p.send(TOPIC, b"a", queue_id=1)
        assert first.ok
        # A send of this queue lost for good (as one whose only copy a failover dropped):
        # the producer's next sequence is one the broker never stored.
        mine = p._loop.this_thread()
        assert mine is not None and mine.sender.idempotence is not None
        seqs = mine.sender.idempotence._queues[(TOPIC, first.queue.broker_name, 1)]
        seqs.next += 1
        with pytest.raises(SequenceGapError) as caught:
            p.send(TOPIC, b"b", queue_id=1)
        err = caught.value
        assert (err.expected, err.got, err.queue) == (1, 2, f"{TOPIC}/1")
        assert err.producer.endswith("-0") and "expected sequence 1, got 2" in str(err)
        assert p.send(TOPIC, b"c", queue_id=1).ok  # a new generation: sequences from 0 again
        assert seqs.generation == 1
