"""The consumer's buffer: pulled messages waiting for ``poll()``, kept a pull answer at a
time.

A pull task adds the messages of one answer as one chunk, and waits first while the buffer
holds ``limit`` messages or more (so it holds at most ``limit`` plus one answer).  ``take``
hands out messages in arrival order across chunks, splitting the last one it touches, and
says per chunk what it handed out: the queue, how many, and the offset after the last one.
Marking a poll's messages processed is then one step per chunk, not per message.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from rmqha.protocol.message import ReceivedMessage

Q = TypeVar("Q", bound=Hashable)


class Handed(NamedTuple, Generic[Q]):
    """Messages of one queue a ``take`` handed out: ``size`` of them, the last one's queue
    offset + 1 as ``next_offset``."""

    queue: Q
    size: int
    next_offset: int


@dataclass(slots=True)
class _Chunk(Generic[Q]):
    queue: Q
    messages: list[ReceivedMessage]
    #: The first message not handed out yet.
    start: int = 0


class PullBuffer(Generic[Q]):
    """A FIFO of pull answers (one queue each) with a soft bound on messages held."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._chunks: deque[_Chunk[Q]] = deque()
        self._count = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return self._count

    async def put(self, queue: Q, messages: list[ReceivedMessage]) -> None:
        """Add one answer's messages (in queue-offset order), once there is room."""
        while self._count >= self.limit:
            self._room.clear()
            await self._room.wait()
        if messages:
            self._chunks.append(_Chunk(queue, messages))
            self._count += len(messages)
            self._ready.set()

    async def take(self, timeout: float, max_messages: int,
                   ) -> tuple[list[ReceivedMessage], list[Handed[Q]]]:
        """Up to ``max_messages`` (at least one) messages, waiting up to ``timeout`` for the
        first; and what was handed out per chunk."""
        if not self._count:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                return [], []
        want = max(1, max_messages)
        out: list[ReceivedMessage] = []
        handed: list[Handed[Q]] = []
        while self._chunks and len(out) < want:
            chunk = self._chunks[0]
            msgs, start = chunk.messages, chunk.start
            stop = min(len(msgs), start + want - len(out))
            out.extend(msgs if start == 0 and stop == len(msgs) else msgs[start:stop])
            handed.append(Handed(chunk.queue, stop - start, msgs[stop - 1].queue_offset + 1))
            if stop == len(msgs):
                self._chunks.popleft()
            else:
                chunk.start = stop
        self._taken(len(out))
        return out, handed

    def drop(self, queue: Q) -> None:
        """Forget what is buffered of ``queue`` (it moved to another member)."""
        gone = sum(len(c.messages) - c.start for c in self._chunks if c.queue == queue)
        self._chunks = deque(c for c in self._chunks if c.queue != queue)
        self._taken(gone)

    def _taken(self, n: int) -> None:
        self._count -= n
        if self._count < self.limit:
            self._room.set()
