"""The demo's load: numbered messages (the first ten bytes of a body are its sequence
number, so the reader counts duplicates and losses without trusting any id) sent by
``in_flight`` concurrent senders of one Producer (:class:`ProduceLoad`), and the guard
that fails a phase in which no send is acknowledged (:class:`AckProgress`).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from rmqha.client import Message, Producer
from rmqha.demo.options import TOPIC, DemoOptions
from rmqha.demo.report import warn
from rmqha.errors import ProtocolError, RmqhaError, SendError
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.message import parse_offset_msg_id
from rmqha.testing.local_cluster import (
    Cluster,
)

#: The first bytes of every body: the message's sequence number, so the reader can tell
#: which message it is and count duplicates without trusting any id.
_SEQ_DIGITS = 10


# --- the producer ---------------------------------------------------------------------------


def numbered_body(seq: int, size: int) -> bytes:
    head = str(seq).zfill(_SEQ_DIGITS).encode()
    return head + b"." * max(0, size - len(head))


def seq_of(body: bytes) -> int | None:
    head = body[:_SEQ_DIGITS]
    return int(head) if len(head) == _SEQ_DIGITS and head.isdigit() else None


class ProduceLoad:
    """Numbered messages sent in batches by ``in_flight`` concurrent senders of one
    :class:`Producer`, on the demo's client loop; counters read from the main thread."""

    #: How the first send acknowledged after the kill got there (the demo says it).
    after_kill_note = "the producer retried by itself"

    def __init__(self, loop: EventLoopThread, namesrv: list[str], opts: DemoOptions,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.loop = loop
        self.namesrv = namesrv
        self.opts = opts
        #: The Producer's certificate and account (secured demo).
        self.client_options = dict(client_options or {})
        self.sent = 0
        self.acked: set[int] = set()
        self.not_acked = 0
        self.send_errors = 0
        self.last_error = ""
        self.started_at = 0.0
        self.finished_at: float | None = None
        #: Set by the main thread just before it kills the master.
        self.kill_time: float | None = None
        self.killed_address: str | None = None
        self.first_ack_after_kill: float | None = None
        #: Senders start no batch at or past this sequence number until :meth:`release`:
        #: a fast producer could otherwise finish between two looks of the main thread,
        #: and the master would be killed after the load instead of in the middle of it.
        self.hold_at: int | None = None
        self._released = asyncio.Event()
        self._next = 0
        self._future: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._producer: Producer | None = None

    @property
    def done(self) -> bool:
        return self._future is not None and self._future.done()

    @property
    def settled(self) -> int:
        """Messages whose send has an outcome (acknowledged, refused or failed)."""
        return len(self.acked) + self.not_acked + self.send_errors

    def release(self) -> None:
        """Let the senders past :attr:`hold_at` (from the main thread)."""
        self.loop.loop.call_soon_threadsafe(self._released.set)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self.loop.loop)

    def result(self) -> None:
        """Re-raise what made the load fail (SendErrors are counted, not raised)."""
        if self._future is not None and self._future.done():
            self._future.result()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the senders and wait until the producer is closed (for an early exit)."""
        if self._future is None or self._future.done():
            return

        async def cancel() -> None:
            # The flag as well as the cancel: asyncio.wait_for (3.11) can swallow a
            # cancellation that races with a response, and the sender would go on.
            self._stopping = True
            if self._task is not None:
                self._task.cancel()
                await asyncio.wait([self._task], timeout=timeout)

        try:
            self.loop.run(cancel(), timeout + 1)
        except (TimeoutError, RuntimeError) as exc:  # a stuck close must not stop the clean-up
            warn(f"the producer did not stop cleanly: {exc!r}")

    async def _run(self) -> None:
        self._task = asyncio.current_task()
        await self._open()
        try:
            self._tasks = [asyncio.ensure_future(self._sender()) for _ in range(self.opts.in_flight)]
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._close()
            self.finished_at = time.monotonic()

    async def _open(self) -> None:
        self._producer = Producer(self.namesrv, "demo-producer", send_timeout_s=3.0,
                                  backoff_s=0.02, max_backoff_s=0.2, retry_deadline_s=30.0,
                                  compress_over_bytes=-1, **self.client_options)

    async def _close(self) -> None:
        if self._producer is not None:
            await self._producer.close()

    async def _take(self, n: int) -> range | None:
        """The next ``n`` sequence numbers to send (fewer at the end), counted as sent;
        None once all are taken or the load stops.  Waits at :attr:`hold_at`."""
        while self._next < self.opts.messages and not self._stopping:
            if self.hold_at is not None and self._next >= self.hold_at \
                    and not self._released.is_set():
                await self._released.wait()
                continue
            seqs = range(self._next, min(self._next + n, self.opts.messages))
            self._next = seqs.stop
            self.sent += len(seqs)
            return seqs
        return None

    async def _sender(self) -> None:
        assert self._producer is not None
        opts = self.opts
        while (seqs := await self._take(opts.batch)) is not None:
            try:
                results = await self._producer.send_batch(
                    TOPIC, [Message(numbered_body(s, opts.body_bytes)) for s in seqs])
            except SendError as exc:
                self.send_errors += len(seqs)
                self.last_error = str(exc)
                continue
            now = time.monotonic()
            for seq, r in zip(seqs, results):
                if not r.ok:
                    self.not_acked += 1
                    continue
                self.acked.add(seq)
                if self.kill_time is not None and self.first_ack_after_kill is None:
                    try:
                        host, _ = parse_offset_msg_id(r.offset_msg_id)
                    except ProtocolError:
                        host = ""
                    if host and host != self.killed_address:
                        self.first_ack_after_kill = now


class AckProgress:
    """Fails a produce phase in which no send is acknowledged for ``timeout_s``: every send
    ends within the producer's retry deadline, but a cluster that refuses them all would
    keep the demo going batch after batch, saying nothing."""

    def __init__(self, load: ProduceLoad, timeout_s: float) -> None:
        self.load = load
        self.timeout_s = timeout_s
        self._acked = len(load.acked)
        self._since = time.monotonic()

    def check(self, cluster: Cluster) -> None:
        acked, now = len(self.load.acked), time.monotonic()
        if acked != self._acked:
            self._acked, self._since = acked, now
        elif now - self._since > self.timeout_s:
            raise RmqhaError(f"no send acknowledged for {self.timeout_s:.0f} s (last send error: "
                             f"{self.load.last_error or 'none'})\n{cluster.describe()}")
