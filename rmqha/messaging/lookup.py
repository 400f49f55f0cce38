"""Message lookup by key and by unique id: QUERY_MESSAGE (12), served from the message
index (:mod:`rmqha.store.message_index`).

What the clients send (RocketMQ's ``MQAdminImpl``): ``queryMessage`` asks every broker
of the topic with QueryMessageRequestHeader (``topic``, ``key``, ``maxNum``,
``beginTimestamp``, ``endTimestamp``); ``queryMessageByUniqKey`` sends the same request
with the ext field ``_UNIQUE_KEY_QUERY=true`` and the message's unique id (``UNIQ_KEY``) as
the key.  The answer is the matching records, raw and back to back (the pull body
format), newest first, with ``indexLastUpdateTimestamp`` / ``indexLastUpdatePhyoffset``;
nothing found is QUERY_NOT_FOUND.  The offset form of a message id (store host + commit
offset) is VIEW_MESSAGE_BY_ID, answered by :mod:`rmqha.messaging.queue_queries`.

Every candidate the index gives is read and checked (topic, and the key among ``KEYS`` or
equal to ``UNIQ_KEY``), and only records below the consume queue's indexed offset (the
confirm offset) are answered.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, StoreError
from rmqha.messaging.context import Handler, MessagingContext
from rmqha.protocol.headers import QueryMessageHeader
from rmqha.store.message_index import FoundMessage, MessageIndex, record_matches
from rmqha.messaging.state import STATE_TOPIC
from rmqha.protocol.command import RemotingCommand

log = logging.getLogger(__name__)

#: RocketMQ's defaultQueryMaxNum: the most records one answer carries.
MAX_QUERY_RESULTS = 32
#: Candidates read per query at most (a hot key with many hash-colliding neighbours must
#: not turn one request into a scan of the log).
MAX_CANDIDATES = 4096
#: The index follows the consume queue in batches: at least this often, or once this far
#: behind (bytes of log), whichever comes first.  Small batches: a catch-up runs on the
#: broker's loop, and 8 MiB of log at a time (about 7,000 messages of 1 KiB) held every
#: send and ack for 5-14 ms.
CATCH_UP_EVERY_S = 0.1
CATCH_UP_BYTES = 1 << 20


class MessageLookup:
    """Owns the message index of one store and answers QUERY_MESSAGE from it."""

    def __init__(self, ctx: MessagingContext, *, internal_topics: Iterable[str] = (STATE_TOPIC,),
                 **index_options: Any) -> None:
        """``internal_topics`` (state, half and op, timer logs) are not indexed: nobody looks
        a message up there, and their real-topic copies are indexed when written."""
        self.ctx = ctx
        self.index = MessageIndex(Path(ctx.dir) / "index", skip_topics=internal_topics,
                                  **index_options)
        self._last_catch_up = 0.0
        self.catch_up()

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.QUERY_MESSAGE: self.on_query_message}

    # --- keeping up with the log ---------------------------------------------------------------

    def on_confirm(self) -> None:
        """The consume queue grew: index in batches (every CATCH_UP_EVERY_S or
        CATCH_UP_BYTES behind), not per send; a lookup always catches up first."""
        now = time.monotonic()
        behind = self.ctx.index.indexed_offset - self.index.indexed_offset
        if behind >= CATCH_UP_BYTES or now - self._last_catch_up >= CATCH_UP_EVERY_S:
            self.catch_up()

    def catch_up(self) -> None:
        """Index up to where the consume queue is (after a restart: from the checkpoint)."""
        ctx = self.ctx
        if ctx.closed:
            return
        self._last_catch_up = time.monotonic()
        try:
            self.index.advance(ctx.log, ctx.index.indexed_offset)
        except (StoreError, OSError, ValueError) as exc:
            log.error("message index: indexing up to %d failed: %s",
                      ctx.index.indexed_offset, exc)

    def on_truncate(self, offset: int) -> None:
        self.index.truncate(offset)

    def close(self) -> None:
        self.index.close()

    # --- lookups -------------------------------------------------------------------------------

    def find(self, topic: str, key: str, *, unique: bool = False,
             max_num: int = MAX_QUERY_RESULTS, begin_ts: int = 0,
             end_ts: int = 2**63 - 1) -> list[FoundMessage]:
        """Confirmed records of ``topic`` whose KEYS hold ``key`` (or whose UNIQ_KEY is
        ``key`` when ``unique``), newest first, at most ``max_num``."""
        ctx = self.ctx
        self.catch_up()
        low, high = ctx.log.min_offset, ctx.index.indexed_offset
        out: list[FoundMessage] = []
        seen: set[int] = set()
        topic_b, key_b = topic.encode(), key.encode()
        for n, offset in enumerate(self.index.candidates(topic, key, begin_ts=begin_ts,
                                                         end_ts=end_ts)):
            if len(out) >= max_num or n >= MAX_CANDIDATES:
                break
            if offset in seen or not low <= offset < high:
                continue
            seen.add(offset)
            try:
                raw = ctx.read_record(offset)
            except (StoreError, ProtocolError) as exc:
                log.warning("message index points at %d, which is not readable: %s", offset, exc)
                continue
            if record_matches(raw, topic_b, key_b, unique=unique):
                out.append(FoundMessage(offset, raw))
        return out

    async def on_query_message(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            h = QueryMessageHeader.parse(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc))
        unique = bool(h.unique_key)
        max_num = MAX_QUERY_RESULTS if unique or h.max_num <= 0 else h.max_num
        found = self.find(h.topic, h.key, unique=unique, max_num=min(max_num, MAX_QUERY_RESULTS),
                          begin_ts=h.begin_timestamp, end_ts=h.end_timestamp)
        head = {"indexLastUpdateTimestamp": self.index.last_update_ts,
                "indexLastUpdatePhyoffset": self.index.indexed_offset}
        if not found:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND,
                                "can not find message, maybe time range not correct", head)
        return cmd.response(ResponseCode.SUCCESS, None, head, b"".join(f.raw for f in found))
