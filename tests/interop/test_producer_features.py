"""RocketMQ 5.5.0's remoting producers against rmqha: transactions, delays and timers, queries,
message trace, and a master SIGKILL in the middle of producing; both modes of the cluster.

Each test runs Java drivers (interop/.../{Producer,Transaction,Query}Driver.java) and judges
from the rmqha side what they were told, reading the topics back with rmqha's own consumer.
The master kill comes last: the module's cluster is not healed after it.
"""
from __future__ import annotations

import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from interop_cluster import Grants, InteropCluster
from interop_support import json_lines
from rmqha_side import Stored, read_topic

TX_TOPIC, TX_CHECK_TOPIC = "interop-tx", "interop-tx-check"
DELAY_TOPIC, TIMER_TOPIC = "interop-delay", "interop-timer"
QUERY_TOPIC, TRACED_TOPIC, TRACE_TOPIC = "interop-query", "interop-traced", "RMQ_SYS_TRACE_TOPIC"
FAILOVER_TOPIC = "interop-failover"
READER = "interop-features-reader"
#: Delay level 2: 5 s with RocketMQ's default levels ("1s 5s 10s ...").
DELAY_LEVEL, DELAY_MS = 2, 5000
TIMER_MS = 4000

Line = dict[str, Any]


@pytest.fixture(scope="module")
def interop_grants() -> Grants:
    topics = {t: "PUB|SUB" for t in (TX_TOPIC, TX_CHECK_TOPIC, DELAY_TOPIC, TIMER_TOPIC, QUERY_TOPIC,
                                      TRACED_TOPIC, FAILOVER_TOPIC)}
    return Grants(topics={**topics, TRACE_TOPIC: "SUB"}, groups=[READER])


@pytest.fixture(scope="module")
def ic(interop_cluster: InteropCluster) -> InteropCluster:
    for topic in (TX_TOPIC, TX_CHECK_TOPIC, DELAY_TOPIC, TIMER_TOPIC, QUERY_TOPIC, TRACED_TOPIC,
                  FAILOVER_TOPIC):
        interop_cluster.create_topic(topic, 4)
    return interop_cluster


def bodies(stored: list[Stored]) -> list[str]:
    return sorted(s.body for s in stored)


# --- transactions ---------------------------------------------------------------------------


def test_transaction_commit_and_rollback(ic: InteropCluster) -> None:
    """executeLocalTransaction answers at once: the commits are delivered, the rollbacks never."""
    out = ic.run("TransactionDriver", "end", TX_TOPIC, "interop-tx-group", "txend", "10")
    sent = [line for line in json_lines(out.stdout) if "status" in line]
    assert [(s["status"], s["localState"]) for s in sent] == [
        ("SEND_OK", "COMMIT_MESSAGE" if i % 2 == 0 else "ROLLBACK_MESSAGE") for i in range(10)], out.stdout
    # As from RocketMQ's broker: TransactionSendResult.getTransactionId() is the unique key.
    assert all(s.get("transactionId") == s["msgId"] for s in sent), sent
    stored = read_topic(ic, TX_TOPIC, READER, 5, settle_s=1.5)
    assert bodies(stored) == sorted(f"body-txend-{i}" for i in range(0, 10, 2))
    assert {s.msg_id for s in stored} == {s["msgId"] for s in sent[::2]}


def test_transaction_checked_back_after_the_producer_dies(ic: InteropCluster) -> None:
    """The producer leaves 6 transactions open (UNKNOW) and is SIGKILLed; a second producer of
    the same group answers the broker's checks (even COMMIT, odd ROLLBACK)."""
    group, run, n = "interop-tx-check-group", "txcheck", 6
    hang = ic.start("TransactionDriver", "hang", TX_CHECK_TOPIC, group, run, str(n))
    try:
        lines = read_until(hang, lambda line: line.get("ready") is True, 90)
    finally:
        hang.send_signal(signal.SIGKILL)
        hang.wait(10)
    assert len([line for line in lines if line.get("status") == "SEND_OK"]) == n, lines
    checker = ic.run("TransactionDriver", "check", TX_CHECK_TOPIC, group, str(n), "60", timeout=120)
    checks = [line for line in json_lines(checker.stdout) if line.get("checkedBy") == "checker"]
    assert {c["key"] for c in checks} == {f"key-{run}-{i}" for i in range(n)}, checker.stdout
    stored = read_topic(ic, TX_CHECK_TOPIC, READER, n // 2, settle_s=2.0)
    assert bodies(stored) == sorted(f"body-{run}-{i}" for i in range(0, n, 2))


def read_until(proc: subprocess.Popen[str], done: Any, timeout: float) -> list[Line]:
    """Lines of a running driver up to the first that satisfies ``done`` (AssertionError at
    the deadline or if it exits first); ``done`` sees each line once, in order."""
    lines: list[Line] = []
    hit = threading.Event()
    ended = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            for line in json_lines(text):
                lines.append(line)
                if done(line):
                    hit.set()
                    ended.set()
                    return
        ended.set()

    threading.Thread(target=pump, daemon=True).start()
    ended.wait(timeout)
    assert hit.is_set(), f"the driver did not get there in {timeout} s (exit {proc.poll()}): {lines[-5:]}"
    return lines


# --- delays and timers ----------------------------------------------------------------------


def test_delay_levels_and_deliver_time_are_kept(ic: InteropCluster) -> None:
    """setDelayTimeLevel(2) and setDeliverTimeMs(now + 4 s): nothing is delivered before its
    time (the delivered copy is stored no earlier), everything is delivered after it."""
    out = ic.run("ProducerDriver", "delay", DELAY_TOPIC, "delay", "4", str(DELAY_LEVEL), "--",
                 "timer", TIMER_TOPIC, "timer", "4", str(TIMER_MS))
    lines = json_lines(out.stdout)
    delayed = [line for line in lines if line.get("cmd") == "delay" and line.get("status") == "SEND_OK"]
    timed = [line for line in lines if line.get("cmd") == "timer" and line.get("status") == "SEND_OK"]
    assert len(delayed) == 4 and len(timed) == 4, out.stdout
    got_delayed = read_topic(ic, DELAY_TOPIC, READER, 4, timeout=40, settle_s=0.5)
    got_timed = read_topic(ic, TIMER_TOPIC, READER, 4, timeout=40, settle_s=0.5)
    assert bodies(got_delayed) == sorted(f"body-delay-{i}" for i in range(4))
    assert bodies(got_timed) == sorted(f"body-timer-{i}" for i in range(4))
    sent_at = {line["msgId"]: line["sentAt"] for line in delayed}
    for s in got_delayed:
        assert s.store_timestamp >= sent_at[s.msg_id] + DELAY_MS, (s, sent_at[s.msg_id])
    due = {line["msgId"]: line["deliverAt"] for line in timed}
    for s in got_timed:
        assert s.store_timestamp >= due[s.msg_id], (s, due[s.msg_id])


# --- queries --------------------------------------------------------------------------------


def test_query_by_key_offset_id_and_unique_key(ic: InteropCluster) -> None:
    """The client's own admin calls find each sent message by key (QUERY_MESSAGE), by its
    offset id (VIEW_MESSAGE_BY_ID) and by its unique key."""
    out = ic.run("QueryDriver", QUERY_TOPIC, "query", "5", timeout=120)
    found = [line for line in json_lines(out.stdout) if "byKey" in line]
    assert len(found) == 5, out.stdout
    for line in found:
        i = line["i"]
        for way in ("byKey", "byOffsetId", "byUniqKey"):
            got = line[way]
            assert got is not None, f"message {i} not found {way}: {line}"
            assert (got["body"], got["keys"], got["seq"], got["topic"]) == (
                f"body-query-{i}", f"key-query-{i}", str(i), QUERY_TOPIC), (way, line)
            assert got["msgId"] == line["msgId"], (way, line)


# --- message trace --------------------------------------------------------------------------


def test_message_trace_is_written_like_rocketmqs(ic: InteropCluster) -> None:
    """enableMsgTrace: the client writes one Pub trace record per send to RMQ_SYS_TRACE_TOPIC
    (created by the operator, as RocketMQ needs with its default traceTopicEnable=false),
    each a TraceDataEncoder line naming the topic, the message id, its keys and success."""
    ic.create_topic(TRACE_TOPIC, 1)
    out = ic.run("ProducerDriver", "trace", TRACED_TOPIC, "traced", "3")
    sent = [line for line in json_lines(out.stdout) if line.get("status") == "SEND_OK"]
    assert len(sent) == 3, out.stdout
    records = read_topic(ic, TRACE_TOPIC, READER, 3, timeout=30, settle_s=0.5)
    pubs = {}
    for rec in records:
        for entry in filter(None, rec.body.split("\x02")):
            fields = entry.split("\x01")
            if fields[0] == "Pub":
                pubs[fields[5]] = fields
    for line in sent:
        assert line["msgId"] in pubs, f"no Pub trace for {line}: {[r.body for r in records]}"
        fields = pubs[line["msgId"]]
        assert (fields[3], fields[4], fields[7]) == ("traced", TRACED_TOPIC, f"key-traced-{line['i']}"), fields
        assert fields[12] == line["offsetMsgId"] and fields[13] == "true", fields


# --- a master SIGKILL in the middle of producing ------------------------------------------


FAILOVER_COUNT, KILL_AFTER = 400, 100


def test_producer_rides_through_a_master_sigkill(ic: InteropCluster) -> None:
    """The Java producer sends sync sends one after the other (its own retries on); once 100
    are acknowledged the master gets SIGKILL and the controllers elect another.  The same
    producer process goes on; every message it saw SEND_OK for is stored, and some of them
    were acknowledged by the new master."""
    proc = ic.start("ProducerDriver", "failover", FAILOVER_TOPIC, "failover", str(FAILOVER_COUNT))
    try:
        lines = read_until(proc, AckCounter(KILL_AFTER), 120)
        killed, new = ic.kill_master()
        killed_at = time.time() * 1000
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines += json_lines(rest)
    assert lines[-1] == {"done": True}, lines[-5:]
    assert proc.returncode == 0
    ok = [line for line in lines if line.get("status") == "SEND_OK"]
    errors = [line for line in lines if "error" in line]
    after = [line for line in ok if line["at"] > killed_at]
    assert after, f"nothing acknowledged after the kill of {killed.name}: {errors[-3:]}"
    assert len(ok) + len(errors) == FAILOVER_COUNT, (len(ok), len(errors))
    stored = read_topic(ic, FAILOVER_TOPIC, READER, len(ok), timeout=60, settle_s=1.0)
    by_id = {s.msg_id: s for s in stored}
    missing = [line for line in ok if line["msgId"] not in by_id]
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:3]}"
    for line in ok:
        assert by_id[line["msgId"]].body == f"body-failover-{line['i']}"
    print(f"failover: {len(ok)} acknowledged ({len(after)} by {new.name} after the kill), "
          f"{len(errors)} sends failed after the client's retries, {len(stored)} stored")


class AckCounter:
    """True at the n-th SEND_OK line it is shown (the driver's lines come in order)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, line: Line) -> bool:
        if line.get("status") != "SEND_OK":
            return False
        self.seen += 1
        return self.seen == self.n
