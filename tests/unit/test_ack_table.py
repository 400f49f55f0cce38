"""The HA master's waiting sends (rmqha._core.ack_table twins): one body over both twins.

A reach point must say exactly what the copy rule says offset by offset (checked against
the rule written out as it reads: the master plus each member whose ack reaches the
offset; every member, or ``need`` copies, and never fewer than the floor), and the twins
must agree with each other on random cases; the checker is shown to fire on a rule off by
one.  A queue answers each waiter once, in offset order, True up to the point, False past
its deadline or when failed, and goes on past a callable that raises or adds a waiter.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rmqha._core import load_twin

TWINS = ("cython", "python")


def reached_as_written(acks: Sequence[int], need: int | None, floor: int, max_offset: int,
                       offset: int) -> bool:
    """The copy rule offset by offset (as ConfirmRule wrote it before reach points)."""
    if offset > max_offset:
        return False
    copies = 1 + sum(1 for a in acks if a >= offset)
    if need is not None:
        return copies >= max(need, floor)
    return all(a >= offset for a in acks) and (floor <= 1 or copies >= floor)


def _cases(seed: int, count: int) -> list[tuple[list[int], int | None, int, int]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        n = rnd.choice([0, 1, 2, 2, 3, 4, 9])  # 9: past the compiled twin's small sort
        max_offset = rnd.randrange(0, 60)
        acks = [rnd.choice([-1, rnd.randrange(0, max_offset + 1)]) for _ in range(n)]
        need = rnd.choice([None, 0, 1, 2, 3, 4, 11])
        out.append((acks, need, rnd.randrange(1, 5), max_offset))
    return out


def disagreements(point_of: Callable[[Sequence[int], int | None, int, int], int],
                  cases: list[tuple[list[int], int | None, int, int]]) -> list[Any]:
    """Cases and offsets where ``offset <= point`` is not what the rule says."""
    bad = []
    for acks, need, floor, max_offset in cases:
        point = point_of(acks, need, floor, max_offset)
        for offset in range(0, max_offset + 3):
            if (offset <= point) != reached_as_written(acks, need, floor, max_offset, offset):
                bad.append((acks, need, floor, max_offset, offset, point))
    return bad


@pytest.mark.parametrize("twin", TWINS)
def test_the_reach_point_is_the_copy_rule_offset_by_offset(twin: str) -> None:
    mod = load_twin("ack_table", twin)
    assert disagreements(mod.reach_point, _cases(1, 3000)) == []


def test_the_checker_fires_on_a_rule_off_by_one() -> None:
    point_of = load_twin("ack_table", "python").reach_point
    assert disagreements(lambda *a: point_of(*a) + 1, _cases(2, 300))
    # and on a rule that forgets the floor
    assert disagreements(lambda a, need, floor, mx: point_of(a, need, 1, mx), _cases(3, 300))


def test_the_twins_agree_on_random_cases() -> None:
    cy, py = load_twin("ack_table", "cython"), load_twin("ack_table", "python")
    for case in _cases(4, 5000):
        assert cy.reach_point(*case) == py.reach_point(*case), case


@pytest.mark.parametrize("twin", TWINS)
def test_a_queue_releases_in_offset_order_up_to_the_point(twin: str) -> None:
    mod = load_twin("ack_table", twin)
    q = mod.WaiterQueue()
    got: list[tuple[int, bool]] = []
    for offset in (100, 200, 300, 150, 200, 50):  # the last three out of log order
        q.add(offset, 10.0, lambda ok, o=offset: got.append((o, ok)))
    assert len(q) == 6
    assert q.release(-1, _raise) == 0 and q.release(49, _raise) == 0 and got == []
    assert q.release(200, _raise) == 5
    assert got == [(50, True), (100, True), (150, True), (200, True), (200, True)]
    assert len(q) == 1 and q.release(200, _raise) == 0
    assert q.fail_all(_raise) == 1 and got[-1] == (300, False) and len(q) == 0


@pytest.mark.parametrize("twin", TWINS)
def test_a_queue_expires_what_is_due_and_keeps_the_rest(twin: str) -> None:
    mod = load_twin("ack_table", twin)
    q = mod.WaiterQueue()
    got: list[tuple[int, bool]] = []
    assert q.next_deadline() == mod.NO_DEADLINE
    for offset, deadline in ((10, 5.0), (20, 1.0), (30, 3.0), (40, 1.0)):
        q.add(offset, deadline, lambda ok, o=offset: got.append((o, ok)))
    assert q.next_deadline() == 1.0
    assert q.expire(0.5, _raise) == 0
    assert q.expire(1.0, _raise) == 2 and got == [(20, False), (40, False)]
    assert q.next_deadline() == 3.0
    assert q.release(30, _raise) == 2 and got[2:] == [(10, True), (30, True)]
    assert q.next_deadline() == mod.NO_DEADLINE


@pytest.mark.parametrize("twin", TWINS)
def test_a_callable_that_raises_or_adds_does_not_stop_the_others(twin: str) -> None:
    mod = load_twin("ack_table", twin)
    q = mod.WaiterQueue()
    got: list[Any] = []
    errors: list[BaseException] = []

    def boom(ok: bool) -> None:
        raise RuntimeError("the send's answer failed")

    def adds(ok: bool) -> None:
        got.append(("adds", ok))
        q.add(5, 9.0, lambda ok2: got.append(("added", ok2)))  # a lower offset, mid-release

    q.add(1, 9.0, boom)
    q.add(2, 9.0, adds)
    q.add(3, 9.0, got.append)
    assert q.release(3, errors.append) == 3
    assert [str(e) for e in errors] == ["the send's answer failed"]
    assert got == [("adds", True), True] and len(q) == 1  # the added one waits
    assert q.release(5, errors.append) == 1 and got[-1] == ("added", True)


@pytest.mark.parametrize("twin", TWINS)
def test_a_long_run_of_adds_and_releases_keeps_every_waiter(twin: str) -> None:
    """Many sends in log order, released a few at a time: each answered once, in order
    (the compiled queue's head moves and its arrays compact and grow underneath)."""
    mod = load_twin("ack_table", twin)
    q = mod.WaiterQueue()
    got: list[int] = []
    rnd = random.Random(5)
    nxt = 0
    released = 0
    for _ in range(500):
        for _ in range(rnd.randrange(0, 6)):
            nxt += 1
            q.add(nxt * 10, 1e9, lambda ok, o=nxt * 10: got.append(o))
        point = rnd.randrange(released, nxt + 1) * 10
        q.release(point, _raise)
        released = max(released, point // 10)
        assert got == list(range(10, released * 10 + 1, 10))
        assert len(q) == nxt - released


@pytest.mark.parametrize("twin", TWINS)
def test_settle_releases_each_need_to_its_own_point(twin: str) -> None:
    mod = load_twin("ack_table", twin)
    queues: dict[int | None, Any] = {None: mod.WaiterQueue(), 2: mod.WaiterQueue()}
    got: list[tuple[int | None, int]] = []
    for need in (None, 2):
        for offset in (100, 500, 900):
            queues[need].add(offset, 9.0, lambda ok, n=need, o=offset: got.append((n, o)))
    # Members at 500 and 900; the master holds 1000: every member holds 500, two copies 900.
    assert mod.settle(queues, [500, 900], 1, 1000, _raise) == 5
    assert sorted(got, key=str) == sorted([(None, 100), (None, 500), (2, 100), (2, 500), (2, 900)], key=str)
    # A member without a link holds nothing: no waiter for every member moves.
    assert mod.settle(queues, [-1, 900], 1, 1000, _raise) == 0


def _raise(exc: BaseException) -> None:
    raise AssertionError(f"unexpected callback failure: {exc!r}")
