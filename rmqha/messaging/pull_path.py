"""The pull path: PULL_MESSAGE with long polling.

Reads go through the consume-queue index, which never passes the confirm offset, so any
replica can serve pulls.  The broker's state topic is not served (it holds the pop
receipt-handle key).  A pull that finds nothing is held until the index grows for its
queue (:meth:`PullPath.wake`) or its suspend timeout ends.  An answer is read in one
compiled pass (:meth:`QueueIndex.answer`); when it finds a unit or record that fails a check
the checked path answers instead (:meth:`PullPath._checked_pull`).  Records whose CRC fails
are never served; lz4 bodies are re-compressed with zlib for clients that cannot inflate lz4.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable, Iterable

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError
from rmqha.messaging.context import Handler, MessagingContext
from rmqha.messaging.state import STATE_TOPIC
from rmqha.protocol.headers import (
    PULL_COMMIT_OFFSET,
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    PullHeader,
)
from rmqha.protocol.message import (
    COMPRESSION_TYPE_MASK,
    REC_FIXED,
    CompressionType,
    DecompressError,
    SysFlag,
    compress,
    decode_record,
    decompress,
    parse_subscription,
    reencode_record,
    strip_compression,
    tag_hash,
)
from rmqha.protocol.version import java_reads_lz4
from rmqha.protocol.command import RemotingCommand
from rmqha.store.queue_index import QueueIndex

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")

#: commit(group, topic, queue_id, offset, immediate=...) for offsets a pull carries.
OffsetCommitter = Callable[..., None]


def reads_lz4(cmd: RemotingCommand) -> bool:
    """Whether the client that sent ``cmd`` can inflate lz4 bodies (Java clients from 4.9.4
    and rmqha's own); C++ 1.2.x aborts on anything but zlib."""
    if cmd.language == "PYTHON":
        return True
    return cmd.language == "JAVA" and java_reads_lz4(cmd.version)


def lz4_to_zlib(body: bytes) -> bytes:
    """Re-compress lz4 bodies of the records in a pull body with zlib (other records are
    passed through as they are stored)."""
    pos, n = 0, len(body)
    out: list[bytes | memoryview] = []
    mv = memoryview(body)
    changed = False
    while n - pos >= REC_FIXED:
        (total,) = _I32.unpack_from(mv, pos)
        (sys_flag,) = _I32.unpack_from(mv, pos + 36)
        rec = mv[pos : pos + total]
        kind = (sys_flag & COMPRESSION_TYPE_MASK) >> 8
        if sys_flag & SysFlag.COMPRESSED and kind == CompressionType.LZ4:
            changed = True
            msg, _ = decode_record(rec, inflate=False)
            try:
                plain = decompress(msg.body, sys_flag, offset=msg.commit_offset)
            except DecompressError as exc:
                # Hand the raw bytes over unflagged rather than crash a C++ consumer.
                log.error("%s; delivered raw to a zlib-only client", exc)
                rec = reencode_record(rec, msg.body, strip_compression(sys_flag))
            else:
                data, flags = compress(plain, CompressionType.ZLIB)
                rec = reencode_record(rec, data, strip_compression(sys_flag) | flags)
        out.append(rec)
        pos += total
    return b"".join(out) if changed else body


class PullPath:
    """Serves pulls from the index and holds the ones that find nothing."""

    def __init__(self, ctx: MessagingContext, commit_offset: OffsetCommitter) -> None:
        self.ctx = ctx
        self._commit_offset = commit_offset
        self._waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}

    def handlers(self) -> dict[int, Handler]:
        # A Java DefaultLitePullConsumer sends LITE_PULL_MESSAGE with the pull header (its
        # sysFlag carries the lite bit, 0x10, and no commit flag): answered the same way.
        return {RequestCode.PULL_MESSAGE: self.on_pull, RequestCode.LITE_PULL_MESSAGE: self.on_pull}

    def wake(self, keys: Iterable[tuple[str, int]]) -> None:
        """The index grew for these (topic, queue id): answer the pulls held on them."""
        if not self._waiters:
            return
        for key in keys:
            waiters = self._waiters.pop(key, None)
            if waiters:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)

    def close(self) -> None:
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()

    def _log_queue_end(self, topic: str, queue_id: int) -> int:
        """The next queue offset the commitlog holds for a queue (confirmed or not)."""
        queue_offset = getattr(self.ctx.log, "queue_offset", None)
        return int(queue_offset(topic, queue_id)) if queue_offset is not None else 0

    async def on_pull(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ctx = self.ctx
        try:
            h = PullHeader.parse(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        if h.topic == STATE_TOPIC:
            # Replicas read it from the log; clients never (it holds the pop handle key).
            return cmd.response(ResponseCode.NO_PERMISSION, f"topic {h.topic} is internal", {})
        if h.sys_flag & PULL_COMMIT_OFFSET and h.commit_offset >= 0:
            self._commit_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset,
                                immediate=False)
        tags = parse_subscription(h.subscription) if h.sys_flag & PULL_SUBSCRIPTION else None
        hashes = None if tags is None else {tag_hash(t) for t in tags}
        max_msgs = max(1, min(h.max_msg_nums, 1024))
        hold_ms = 0
        if h.sys_flag & PULL_SUSPEND:
            hold_ms = min(max(h.suspend_timeout_ms, 0), ctx.config.long_polling_max_ms)
        deadline = time.monotonic() + hold_ms / 1000.0
        key = (h.topic, h.queue_id)
        m = ctx.metrics
        while True:
            answer = self._try_pull(cmd, h, max_msgs, hashes)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0 or ctx.closed:
                lo, hi = ctx.queue_bounds(h.topic, h.queue_id)
                return self._pull_response(cmd, ResponseCode.PULL_NOT_FOUND, h.queue_offset, lo,
                                           hi)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(fut)
            if m is not None:
                m.held_pulls.inc()
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                if m is not None:
                    m.held_pulls.dec()
                waiters = self._waiters.get(key)
                if waiters and fut in waiters:
                    waiters.remove(fut)
                    if not waiters:
                        del self._waiters[key]

    def _pull_response(self, cmd: RemotingCommand, code: int, next_begin: int, lo: int, hi: int,
                       body: bytes = b"") -> RemotingCommand:
        return cmd.response(code, None, {
            "nextBeginOffset": next_begin, "minOffset": lo, "maxOffset": hi,
            "suggestWhichBrokerId": 0,
        }, body)

    def _try_pull(self, cmd: RemotingCommand, h: PullHeader, max_msgs: int,
                  hashes: set[int] | None) -> RemotingCommand | None:
        """The answer now, or None when the caller should wait for data."""
        ctx = self.ctx
        q = ctx.index.queue(h.topic, h.queue_id)
        lo, hi = (0, 0) if q is None else (q.min_offset, q.max_offset)
        offset = h.queue_offset
        if offset < lo:
            return self._pull_response(cmd, ResponseCode.PULL_OFFSET_MOVED, lo, lo, hi)
        if offset > hi:
            if offset <= self._log_queue_end(h.topic, h.queue_id):
                # In the log but not confirmed yet (a new master or a slave catching up):
                # wait for it rather than send the consumer back to re-read.
                return None
            return self._pull_response(cmd, ResponseCode.PULL_OFFSET_MOVED, hi, lo, hi)
        if offset == hi or q is None:
            return None
        fast = q.answer(offset, max_msgs, hashes, ctx.config.max_pull_bytes)
        if fast is not None:
            body, taken = fast
            return self._answer(cmd, offset + taken, lo, hi, taken, body)
        return self._checked_pull(cmd, h, max_msgs, hashes, q, lo, hi)

    def _checked_pull(self, cmd: RemotingCommand, h: PullHeader, max_msgs: int,
                      hashes: set[int] | None, q: QueueIndex, lo: int, hi: int,
                      ) -> RemotingCommand | None:
        """The answer when the one-pass read found a unit or record that fails a check:
        the index repairs the queue, a record that changed at rest is named and never
        served."""
        ctx = self.ctx
        offset = h.queue_offset
        phys, sizes, tags = q.slice(offset, max_msgs)
        runs: list[tuple[int, int]] = []
        total = 0
        taken = 0
        run_start = run_end = -1
        for i in range(len(phys)):
            p, s = phys[i], sizes[i]
            if total and total + s > ctx.config.max_pull_bytes:
                break
            taken = i + 1
            if hashes is not None and tags[i] not in hashes:
                continue
            if run_end == p and p < ctx.log.segment_end(run_start):
                run_end = p + s
            else:
                if run_start >= 0:
                    runs.append((run_start, run_end))
                run_start, run_end = p, p + s
            total += s
        if run_start >= 0:
            runs.append((run_start, run_end))
        bad = self._first_bad_record(runs)
        if bad is not None:
            # Never serve bytes that changed at rest: answer what precedes the bad record,
            # or, when it comes first, an error naming it (the consumer retries; a slave
            # is repaired from its master, a master needs an operator: `rmqha scrub`).
            keep = sum(1 for i in range(taken) if phys[i] < bad)
            if keep == 0:
                return cmd.response(ResponseCode.SYSTEM_ERROR,
                                    f"the record at commitlog offset {bad} on "
                                    f"{ctx.broker_name}/{ctx.broker_id} failed its CRC check and "
                                    f"is not served; run `rmqha scrub` on this store", {})
            return self._try_pull(cmd, h, keep, hashes)
        body = b"".join([ctx.log.read(a, b - a) for a, b in runs])
        return self._answer(cmd, offset + taken, lo, hi, taken, body)

    def _answer(self, cmd: RemotingCommand, next_begin: int, lo: int, hi: int, taken: int,
                body: bytes) -> RemotingCommand:
        """SUCCESS with the records (re-compressed for a zlib-only client), or
        PULL_RETRY_IMMEDIATELY when the tag filter left none of the ``taken`` units."""
        if not body:
            return self._pull_response(cmd, ResponseCode.PULL_RETRY_IMMEDIATELY, next_begin, lo, hi)
        if self.ctx.metrics is not None:
            self.ctx.metrics.messages_served.inc(taken)
        if not reads_lz4(cmd):
            body = lz4_to_zlib(body)
        return self._pull_response(cmd, ResponseCode.SUCCESS, next_begin, lo, hi, body)

    def _first_bad_record(self, runs: list[tuple[int, int]]) -> int | None:
        """The commitlog offset of the first record in ``runs`` whose CRC fails, if any."""
        verify = getattr(self.ctx.log, "verify", None)
        if verify is None:
            return None
        for start, end in runs:
            bad = verify(start, end - start)
            if bad is not None:
                return int(bad.offset)
        return None
