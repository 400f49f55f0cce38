"""Negative controls of the interop tests' judges: each fires on what it must catch (no
cluster, no JVM: the judges are plain functions over the drivers' lines and what was read)."""
from __future__ import annotations

import pytest
from rmqha_side import Stored
from test_producer import check_stored, unique
from test_producer_features import AckCounter


def stored(i: int, run: str = "r", *, msg_id: str | None = None, body: str | None = None,
           queue_offset: int | None = None) -> Stored:
    return Stored(msg_id or f"id{i}", body or f"body-{run}-{i}", f"key-{run}-{i}", f"t{i % 3}", 0,
                  i if queue_offset is None else queue_offset, {"seq": str(i)}, 0)


def acked(i: int) -> dict[str, object]:
    return {"i": i, "msgId": f"id{i}", "queueId": 0, "queueOffset": i, "status": "SEND_OK"}


def test_check_stored_passes_what_matches() -> None:
    check_stored([acked(0), acked(1)], [stored(0), stored(1)], "r")


@pytest.mark.parametrize("read, why", [
    ([stored(0)], "not stored"),                                   # an acknowledged message lost
    ([stored(0), stored(1, body="changed")], "body"),              # stored, but not as sent
    ([stored(0), stored(1, queue_offset=7)], "offset"),            # not where the client was told
    ([stored(0), stored(1), stored(1)], "twice"),                  # stored twice
])
def test_check_stored_fires(read: list[Stored], why: str) -> None:
    with pytest.raises(AssertionError):
        check_stored([acked(0), acked(1)], read, "r")


def test_unique_fires_on_a_duplicate() -> None:
    with pytest.raises(AssertionError, match="twice"):
        unique([stored(0), stored(0)])


def test_ack_counter_fires_once_at_the_nth_ack() -> None:
    count = AckCounter(2)
    lines = [{"status": "SEND_OK"}, {"error": "x"}, {"status": "SEND_OK"}, {"status": "SEND_OK"}]
    assert [count(line) for line in lines] == [False, False, True, False]
