"""Negative controls of test_consumer's judges: each fires on the fault it is there to see
(a missing, unknown or doubled message; queues not split; a queue out of order), on
hand-made driver events, without a cluster."""
from __future__ import annotations

from consumer_support import Sent, Verdict, received_all
from test_consumer import PUSH_TOPIC, split_between

SENT = Sent({"a": (0, 0, "x0"), "b": (1, 0, "x1"), "c": (0, 1, "x2")})


def msg(msg_id: str, consumer: int = 0) -> dict:
    return {"event": "msg", "msgId": msg_id, "consumer": consumer}


def test_verdict_counts_missing_unknown_and_duplicates() -> None:
    assert Verdict.of(SENT, [msg("a"), msg("b"), msg("c")]).exact
    lost = Verdict.of(SENT, [msg("a"), msg("b")])
    assert lost.missing == {"c"} and not lost.exact
    stray = Verdict.of(SENT, [msg("a"), msg("b"), msg("c"), msg("z")])
    assert stray.unexpected == {"z"} and not stray.exact
    twice = Verdict.of(SENT, [msg("a"), msg("b"), msg("c"), msg("a")])
    assert twice.duplicates == {"a": 2} and not twice.exact


def test_received_all_waits_for_every_id_at_the_named_consumer() -> None:
    events = [msg("a", 0), msg("b", 1), msg("c", 0)]
    assert received_all(SENT)(events)
    assert not received_all(SENT, 0)(events)
    assert not received_all(SENT)(events[:2])


def test_split_between_needs_disjoint_non_empty_sets_covering_the_topic() -> None:
    def assigned(consumer: int, *queues: int) -> dict:
        return {"event": "assignment", "consumer": consumer,
                "queues": [f"pull:broker-a/{PUSH_TOPIC}/{q}" for q in queues]}
    done = split_between(2, PUSH_TOPIC)
    assert done([assigned(0, 0, 1), assigned(1, 2, 3)])
    assert not done([assigned(0, 0, 1, 2, 3), assigned(1)])            # one holds everything
    assert not done([assigned(0, 0, 1, 2), assigned(1, 2, 3)])         # overlap
    assert not done([assigned(0, 0, 1), assigned(1, 2)])               # queue 3 unheld
    assert done([assigned(0, 0, 1, 2, 3), assigned(1, 2, 3), assigned(0, 0, 1)])  # the latest counts
    assert SENT.per_queue() == {0: ["x0", "x2"], 1: ["x1"]}            # what the order check compares
