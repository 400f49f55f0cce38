"""The send verdict (rmqha.messaging.verdict) over every combination of its facts.

Each row's expected answer comes from the rules below, written out here as the broker's
documented behaviour (ARCHITECTURE.md, "The data path of a send", step 9): a priority list
of (condition, answer) clauses per stage, first match wins.  The verdict's own code is not
consulted to build them.  Edge rows name the cases the rules were written for, and a
negative control shows the table catches a verdict that forgets one fact.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from rmqha.messaging.verdict import ANSWERS, Copies, Flush, Outcome, answer, verdict
from rmqha.protocol.codes import ResponseCode

SEND_OK = (ResponseCode.SUCCESS, "PUT_OK")
NOT_MASTER = (ResponseCode.SERVICE_NOT_AVAILABLE, "NOT_MASTER")
LEASE_EXPIRED = (ResponseCode.SERVICE_NOT_AVAILABLE, "MASTER_LEASE_EXPIRED")
TOO_FEW = (ResponseCode.SYSTEM_ERROR, "IN_SYNC_REPLICAS_NOT_ENOUGH")
DISK_FAILED = (ResponseCode.SYSTEM_ERROR, "FLUSH_DISK_FAILED")
DISK_TIMEOUT = (ResponseCode.FLUSH_DISK_TIMEOUT, "FLUSH_DISK_TIMEOUT")
SLAVE_TIMEOUT = (ResponseCode.FLUSH_SLAVE_TIMEOUT, "FLUSH_SLAVE_TIMEOUT")

Facts = tuple[bool, bool, int, int, Copies, Flush]

#: Counts around every boundary the rules have (0, 1, equal, one more).
COUNTS = range(0, 4)
ROWS: list[Facts] = list(itertools.product(
    (True, False), (True, False), COUNTS, COUNTS, list(Copies), list(Flush)))


def expected(master: bool, lease: bool, in_sync: int, floor: int, copies: Copies,
             flush: Flush) -> tuple[int, str]:
    """The documented answer of these facts (see the module docstring)."""
    if copies is Copies.UNASKED:
        # Nothing stored: a refusal clients may retry elsewhere, or one that stores nothing.
        refusals = [
            (not master, NOT_MASTER),
            (not lease, LEASE_EXPIRED),
            (in_sync < floor, TOO_FEW),
        ]
    else:
        # Stored: the disk speaks first, then whether a master that may promise has copies.
        refusals = [
            (flush is Flush.FAILED, DISK_FAILED),
            (flush is Flush.LATE, DISK_TIMEOUT),
            (copies is Copies.SHORT, SLAVE_TIMEOUT),
            (not (master and lease), SLAVE_TIMEOUT),
        ]
    for applies, outcome in refusals:
        if applies:
            return outcome
    return SEND_OK


def test_table_covers_every_combination() -> None:
    assert len(ROWS) == 2 * 2 * len(COUNTS) ** 2 * len(Copies) * len(Flush)
    assert len(set(ROWS)) == len(ROWS)


@pytest.mark.parametrize("facts", ROWS, ids=lambda f: "-".join(str(getattr(x, "name", x)) for x in f))
def test_every_row(facts: Facts) -> None:
    assert answer(verdict(*facts)) == expected(*facts)


@pytest.mark.parametrize("facts, want", [
    # A new write with exactly the floor in sync is admitted; one fewer is refused.
    ((True, True, 2, 2, Copies.UNASKED, Flush.NONE), SEND_OK),
    ((True, True, 1, 2, Copies.UNASKED, Flush.NONE), TOO_FEW),
    # A lone broker (a set of one) with the default floor of one.
    ((True, True, 1, 1, Copies.UNASKED, Flush.NONE), SEND_OK),
    ((True, True, 1, 1, Copies.HELD, Flush.NONE), SEND_OK),
    # Not master beats a lapsed lease, which beats too few replicas (the remark names one).
    ((False, False, 0, 3, Copies.UNASKED, Flush.NONE), NOT_MASTER),
    ((True, False, 0, 3, Copies.UNASKED, Flush.NONE), LEASE_EXPIRED),
    # The set shrank below the floor after the write was stored, its copies exist: OK.
    ((True, True, 1, 2, Copies.HELD, Flush.DONE), SEND_OK),
    # ... and without them it is "stored, not confirmed", never the refusal.
    ((True, True, 1, 2, Copies.SHORT, Flush.DONE), SLAVE_TIMEOUT),
    # The lease ran out while the send waited: copies or not, no promise.
    ((True, False, 3, 2, Copies.HELD, Flush.DONE), SLAVE_TIMEOUT),
    # The broker stepped down while the send waited.
    ((False, True, 3, 2, Copies.HELD, Flush.NONE), SLAVE_TIMEOUT),
    # The disk first: a failed fsync, then a late one, whatever the copies.
    ((True, True, 3, 2, Copies.HELD, Flush.FAILED), DISK_FAILED),
    ((True, True, 3, 2, Copies.SHORT, Flush.LATE), DISK_TIMEOUT),
    ((False, False, 0, 2, Copies.SHORT, Flush.FAILED), DISK_FAILED),
    # Before the write the flush is not read (it cannot have happened).
    ((True, True, 3, 2, Copies.UNASKED, Flush.FAILED), SEND_OK),
])
def test_edge_rows(facts: Facts, want: tuple[int, str]) -> None:
    assert answer(verdict(*facts)) == want


def test_answers_table_matches_the_outcomes() -> None:
    """Each outcome's put status is its own name, and SLAVE_NOT_AVAILABLE is never given."""
    assert len(ANSWERS) == len(Outcome)
    for outcome in Outcome:
        assert ANSWERS[outcome][1] == outcome.name
    codes = {verdict(*facts) for facts in ROWS}
    assert codes == set(Outcome)  # every outcome is reachable
    assert ResponseCode.SLAVE_NOT_AVAILABLE not in {ANSWERS[o][0] for o in codes}


def _mismatches(candidate: Callable[..., Outcome]) -> list[Facts]:
    return [f for f in ROWS if answer(candidate(*f)) != expected(*f)]


def test_negative_control_a_verdict_that_forgets_the_lease_after_the_write_fails() -> None:
    def forgets_lease(master: bool, lease: bool, in_sync: int, floor: int, copies: Copies,
                      flush: Flush) -> Outcome:
        if copies is not Copies.UNASKED:
            lease = True
        return verdict(master, lease, in_sync, floor, copies, flush)

    wrong = _mismatches(forgets_lease)
    assert wrong, "the table did not notice a verdict that ignores the lease once stored"
    assert all(not f[1] and f[4] is Copies.HELD for f in wrong)
    assert _mismatches(verdict) == []


def test_negative_control_a_verdict_that_checks_the_floor_after_the_write_fails() -> None:
    def floor_after(master: bool, lease: bool, in_sync: int, floor: int, copies: Copies,
                    flush: Flush) -> Outcome:
        if copies is Copies.HELD and in_sync < floor:
            return Outcome.IN_SYNC_REPLICAS_NOT_ENOUGH
        return verdict(master, lease, in_sync, floor, copies, flush)

    assert _mismatches(floor_after)
