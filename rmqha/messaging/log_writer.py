"""Appending messages to the commitlog and waiting until they are durable.

Every writer (sends, send-back, ...) appends through :class:`LogWriter` so rows of one
request land back to back, and answers once the ack policy (``replication.
wait_for_copies``) and, with ``flush = sync``, the fsync hold for the end of what it
wrote: what the waits find is handed, as facts, to
:func:`rmqha.messaging.verdict.verdict`, which decides the answer.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from array import array
from collections.abc import Callable

from rmqha._core._protocols import SendFrame
from rmqha.errors import InvalidMessageError, StoreError
from rmqha.failpoints import Failpoint, hit
from rmqha.messaging.context import MessagingContext
from rmqha.messaging.verdict import ANSWERS, Copies, Flush, Outcome, verdict
from rmqha.protocol.message import decode_properties

log = logging.getLogger(__name__)

#: The put status of a send whose group commit fsync failed (answered SYSTEM_ERROR, which
#: clients retry: the record is stored but not known to be on disk).
FLUSH_DISK_FAILED = ANSWERS[Outcome.FLUSH_DISK_FAILED][1]
# The verdict's enum members read once: a read off the Enum class goes through the enum
# machinery (hundreds of ns on 3.11), and these are read for every send group.
_HELD, _SHORT = Copies.HELD, Copies.SHORT
_NO_FLUSH, _FLUSHED, _FLUSH_LATE, _FLUSH_FAILED = Flush.NONE, Flush.DONE, Flush.LATE, Flush.FAILED
_PUT_OK = Outcome.PUT_OK

class LogWriter:
    """Appends rows and awaits their durability; ``on_confirmed(offset)`` runs when the
    confirm offset may have advanced (the service indexes and wakes held pulls), or
    ``confirmed_soon(offset)`` (the same, at the end of the loop turn) for a caller that
    only answers a client and reads nothing the indexing derives."""

    def __init__(self, ctx: MessagingContext, on_confirmed: Callable[[int], None],
                 confirmed_soon: Callable[[int], None] | None = None) -> None:
        self.ctx = ctx
        self._on_confirmed = on_confirmed
        self._confirmed_soon = confirmed_soon or on_confirmed
        self._append_lock = threading.Lock()
        #: The group commit of this loop turn's appends (sync flush), once asked for.
        self._commit: asyncio.Future[int] | None = None

    def _append(self, topic: str, queue_id: int, body: bytes,
                properties: str | dict[str, str], flag: int,
                sys_flag: int, born_timestamp: int, born_host: tuple[str, int],
                reconsume_times: int) -> tuple[int, int]:
        log_ = self.ctx.log
        if not isinstance(properties, dict):
            # A send's header string: stored as its bytes when they are canonical (what
            # the map would encode to; the commitlog checks), without building the map.
            try:
                return log_.append(
                    topic, body, queue_id, properties.encode(),
                    flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
                    born_host=born_host, reconsume_times=reconsume_times, wait_flush=False)
            except (UnicodeEncodeError, InvalidMessageError):
                properties = decode_properties(properties)
        return log_.append(
            topic, body, queue_id, properties,
            flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp, born_host=born_host,
            reconsume_times=reconsume_times, wait_flush=False,
        )

    async def append_rows(self, topic: str, queue_id: int,
                          rows: list[tuple[bytes, str | dict[str, str], int, int]],
                          sys_flag: int,
                          born_timestamp: int,
                          born_host: tuple[str, int]) -> list[tuple[int, int]]:
        """:meth:`append_rows_now` for coroutines."""
        return self.append_rows_now(topic, queue_id, rows, sys_flag, born_timestamp, born_host)

    def append_rows_now(self, topic: str, queue_id: int,
                        rows: list[tuple[bytes, str | dict[str, str], int, int]],
                        sys_flag: int,
                        born_timestamp: int,
                        born_host: tuple[str, int]) -> list[tuple[int, int]]:
        """Append (body, properties, flag, reconsume_times) rows to one queue, in order and
        back to back (a batch gets consecutive queue offsets).

        Appends never wait for the fsync here: with flush=sync the caller awaits
        ``flush_future`` for the batch's end, so one group commit covers the whole batch
        and every send that arrived meanwhile."""
        with self._append_lock:
            placed = [self._append(topic, queue_id, body, props, flag, sys_flag,
                                   born_timestamp, born_host, reconsume)
                      for body, props, flag, reconsume in rows]
        hit(Failpoint.AFTER_APPEND)
        return placed

    def append_plain_now(self, topic: str, queue_id: int, body: bytes, properties: bytes,
                         flag: int, sys_flag: int, born_timestamp: int,
                         born_host: tuple[str, int], reconsume_times: int) -> tuple[int, int, int]:
        """One plain send's record, with its properties' bytes as they came: (offset,
        size, queue offset), the last as the append assigned it (the answer carries it,
        without reading the record back).  InvalidMessageError when they are not
        canonical (nothing is stored)."""
        with self._append_lock:
            placed: tuple[int, int, int] = self.ctx.log.append_plain(
                topic, body, queue_id, properties, flag, sys_flag, born_timestamp, born_host,
                reconsume_times)
        hit(Failpoint.AFTER_APPEND)
        return placed

    def append_plain_run(self, sends: list[SendFrame], start: int, stop: int,
                         queue_ids: array[int], born_default: int, born_host: tuple[str, int],
                         offsets: array[int], sizes: array[int],
                         queue_offsets: array[int]) -> int:
        """:meth:`append_plain_now` of a run of plain sends in one call (see
        ``CommitLog.append_plain_run``): how many, from ``start``, were stored; the
        arrays receive each one's offset, size and queue offset."""
        with self._append_lock:
            taken = self.ctx.log.append_plain_run(sends, start, stop, queue_ids, born_default,
                                                  born_host, offsets, sizes, queue_offsets)
        hit(Failpoint.AFTER_APPEND)
        return taken

    def append_batch_now(self, topic: str, queue_id: int, batch: bytes | memoryview, count: int,
                         sys_flag: int, born_timestamp: int,
                         born_host: tuple[str, int]) -> list[tuple[int, int]]:
        """Append the ``count`` entries of a batch body as they came (checked with the
        records codec's ``batch_plain``): :meth:`append_rows_now` without a Python object
        per message."""
        with self._append_lock:
            res = self.ctx.log.append_batch_entries(
                topic, batch, count, queue_id, sys_flag=sys_flag,
                born_timestamp=born_timestamp, born_host=born_host, wait_flush=False)
        hit(Failpoint.AFTER_APPEND)
        return list(zip(res.offsets, res.sizes))

    def _group_commit(self, end_offset: int) -> asyncio.Future[int]:
        """A future done once an fsync covers ``end_offset``.

        The fsync runs on the loop at the start of the next turn, after the append
        listener has pushed the new bytes to the slaves (both are queued in this turn, the
        push first), so it overlaps their copy; every send appended in this turn shares it.
        Handing it to the flusher thread instead costs two thread wake-ups and the GIL,
        which on a busy machine is more than the fsync itself (about 0.1 ms here)."""
        fut = self._commit
        if fut is None or fut.done():
            loop = asyncio.get_running_loop()
            fut = self._commit = loop.create_future()
            loop.call_soon(self._commit_now, fut)
        return fut

    def _commit_now(self, fut: asyncio.Future[int]) -> None:
        if self._commit is fut:
            self._commit = None
        if fut.cancelled():
            return
        try:
            fut.set_result(self.ctx.log.sync_now())
        except (OSError, StoreError) as exc:
            # Every send of the turn fails on it; the log says why, once.
            log.error("group commit fsync failed: %s", exc)
            fut.set_exception(exc)

    async def await_durable(self, end_offset: int, *, index_now: bool = True) -> tuple[int, str]:
        """Wait for the ack policy and the flush policy; (response code, put status), the
        :func:`~rmqha.messaging.verdict.verdict` of what the waits found.

        With flush = sync the master's fsync (the group commit of this loop turn) runs
        while the slaves copy the bytes: the answer waits for the longer of the two, not
        for their sum.  ``index_now=False``: the indexing up to the new confirm offset
        runs at the end of the turn, after the caller's answer left (the send path);
        callers that read state the index folds (topic configs, transactions) keep it
        inline."""
        ctx = self.ctx
        on_confirmed = self._on_confirmed if index_now else self._confirmed_soon
        timeout_s = ctx.config.slave_timeout_ms / 1000.0
        flushed: asyncio.Future[int] | None = None
        if ctx.config.flush == "sync":
            flushed = self._group_commit(end_offset)
            started = time.monotonic()
        held = True
        flush = _NO_FLUSH
        try:
            if ctx.replication is not None:
                held = await ctx.replication.wait_for_copies(end_offset, timeout_s)
                on_confirmed(ctx.replication_confirm())
            else:
                on_confirmed(end_offset)
            if flushed is not None:
                flush = _FLUSHED
                if not flushed.done():  # usually it is: it ran during the round trip
                    left = max(0.0, timeout_s - (time.monotonic() - started))
                    try:
                        # Shielded: the group commit is shared with the turn's other sends.
                        await asyncio.wait_for(asyncio.shield(flushed), left)
                    except asyncio.TimeoutError:
                        flush = _FLUSH_LATE
                    except (OSError, StoreError):
                        pass  # read below
                if flush == _FLUSHED and (flushed.cancelled() or flushed.exception() is not None):
                    flush = _FLUSH_FAILED
        finally:
            if flushed is not None and flushed.done() and not flushed.cancelled():
                flushed.exception()  # seen: a failed fsync is answered by whoever awaited it
        return self.answer(_HELD if held else _SHORT, flush)

    def when_durable(self, end_offset: int, done: Callable[[int, str], None]) -> None:
        """:meth:`await_durable` (``index_now=False``) for a caller without a task:
        ``done(code, put status)`` runs once, in the loop turn that decides it (the last
        ack, or with flush = sync the group commit if that ends later).  Reads nothing
        the indexing derives.  The HA master's waiter calls ``copied`` itself: no hop in
        between."""
        ctx = self.ctx
        replication = ctx.replication
        timeout_s = ctx.config.slave_timeout_ms / 1000.0
        flushed = self._group_commit(end_offset) if ctx.config.flush == "sync" else None
        started = time.monotonic()
        copies: list[Copies] = []

        def settle() -> None:
            if not copies or (flushed is not None and not flushed.done()):
                return
            flush = _NO_FLUSH
            if flushed is not None:
                # As await_durable finds it: a failed fsync, then one slower than the wait.
                if flushed.cancelled() or flushed.exception() is not None:
                    flush = _FLUSH_FAILED
                elif time.monotonic() - started > timeout_s:
                    flush = _FLUSH_LATE
                else:
                    flush = _FLUSHED
            done(*self.answer(copies[0], flush))

        def copied(held: bool) -> None:
            self._confirmed_soon(ctx.replication_confirm())
            copies.append(_HELD if held else _SHORT)
            settle()

        if flushed is not None:
            flushed.add_done_callback(lambda _: settle())
        if replication is None:
            self._confirmed_soon(end_offset)
            copies.append(_HELD)
            settle()
        else:
            replication.when_copies(end_offset, timeout_s, copied)

    def answer(self, copies: Copies, flush: Flush) -> tuple[int, str]:
        """(response code, put status) of a stored write whose copies and flush are known:
        :func:`~rmqha.messaging.verdict.verdict` of them and of the broker's role, lease
        and SyncStateSet now.  A PUT_OK is noted with the replication (its ack windows)."""
        ctx = self.ctx
        replication = ctx.replication
        if replication is None:  # a lone broker: no lease, a SyncStateSet of one
            outcome = verdict(ctx.role == "master", True, 1, int(ctx.config.min_in_sync_replicas),
                              copies, flush)
        else:
            outcome = verdict(ctx.role == "master", replication.holds_master_lease(),
                              replication.sync_state_set_size(),
                              int(ctx.config.min_in_sync_replicas), copies, flush)
            if outcome == _PUT_OK:
                replication.acknowledged()
        return ANSWERS[outcome]

    def answer_now(self, end_offset: int) -> tuple[int, str]:
        """:meth:`answer` for a write ending at ``end_offset`` whose flush is known to have
        succeeded in time (if asked for), with its copies as they are now: a send of a
        group whose end fell short may be held."""
        replication = self.ctx.replication
        held = replication is None or replication.copies_held(end_offset)
        flush = _FLUSHED if self.ctx.config.flush == "sync" else _NO_FLUSH
        return self.answer(_HELD if held else _SHORT, flush)
