"""The consumer's buffer of pull answers: order, what a take says it handed out, the
bound on what it holds, and forgetting a queue."""
from __future__ import annotations

import asyncio

from rmqha.client.pull_buffer import Handed, PullBuffer
from rmqha.protocol.message import ReceivedMessage


def _msgs(queue: str, first: int, n: int) -> list[ReceivedMessage]:
    return [ReceivedMessage(topic="T", queue_id=0, queue_offset=first + i, commit_offset=0,
                            body=queue.encode(), properties={}) for i in range(n)]


def test_take_hands_out_in_order_and_says_what_per_queue() -> None:
    async def main() -> None:
        buf: PullBuffer[str] = PullBuffer(100)
        await buf.put("a", _msgs("a", 10, 3))
        await buf.put("b", _msgs("b", 0, 4))
        await buf.put("a", [])
        assert len(buf) == 7
        out, handed = await buf.take(1.0, 5)
        assert [(m.body, m.queue_offset) for m in out] == [
            (b"a", 10), (b"a", 11), (b"a", 12), (b"b", 0), (b"b", 1)]
        assert handed == [Handed("a", 3, 13), Handed("b", 2, 2)]
        out, handed = await buf.take(1.0, 0)  # at least one
        assert [m.queue_offset for m in out] == [2] and handed == [Handed("b", 1, 3)]
        out, handed = await buf.take(1.0, 100)
        assert [m.queue_offset for m in out] == [3] and len(buf) == 0
        assert await buf.take(0.01, 10) == ([], [])
    asyncio.run(main())


def test_a_full_buffer_holds_the_next_answer_until_a_take() -> None:
    async def main() -> None:
        buf: PullBuffer[str] = PullBuffer(4)
        await buf.put("a", _msgs("a", 0, 3))
        await buf.put("a", _msgs("a", 3, 3))  # room (3 < 4): may go over by one answer
        third = asyncio.ensure_future(buf.put("a", _msgs("a", 6, 3)))
        await asyncio.sleep(0.01)
        assert not third.done() and len(buf) == 6
        await buf.take(1.0, 3)
        await asyncio.wait_for(third, 1.0)
        assert len(buf) == 6
        # A take waiting for the first message wakes on a put.
        empty: PullBuffer[str] = PullBuffer(4)
        waiting = asyncio.ensure_future(empty.take(5.0, 10))
        await asyncio.sleep(0.01)
        await empty.put("b", _msgs("b", 0, 2))
        out, _ = await asyncio.wait_for(waiting, 1.0)
        assert len(out) == 2
    asyncio.run(main())


def test_drop_forgets_a_queue_and_frees_room() -> None:
    async def main() -> None:
        buf: PullBuffer[str] = PullBuffer(5)
        await buf.put("a", _msgs("a", 0, 4))
        await buf.put("b", _msgs("b", 0, 2))
        await buf.take(1.0, 1)  # a chunk partly handed out
        blocked = asyncio.ensure_future(buf.put("b", _msgs("b", 2, 2)))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        buf.drop("a")
        assert len(buf) == 2
        await asyncio.wait_for(blocked, 1.0)
        out, handed = await buf.take(1.0, 10)
        assert [m.body for m in out] == [b"b"] * 4 and handed == [Handed("b", 2, 2), Handed("b", 2, 4)]
    asyncio.run(main())
