"""Folding the replicated state log (topics, groups, offsets, pop progress) into the broker's tables.

The records themselves are defined in :mod:`rmqha.messaging.state`; this module writes
them (master only; a master applies its own writes at once), applies the ones other
brokers wrote as the index passes them, and folds the whole state again after a restart
or a truncation.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from rmqha.errors import ProtocolError, StoreError
from rmqha.store.consume_queue import ScannedRecord
from rmqha.messaging.context import MessagingContext
from rmqha.protocol.message import decode_record
from rmqha.messaging.state import STATE_TOPIC
from rmqha.messaging.topic_admin import seed_default_topic

log = logging.getLogger(__name__)


class StateReplication:
    """Writes and applies the state records of one broker."""

    def __init__(self, ctx: MessagingContext) -> None:
        self.ctx = ctx
        #: Commit offsets of state records this process applied when writing them.
        self._self_applied: set[int] = set()
        #: Where the last checkpoint record starts (retention needs one past a cut).
        self.last_checkpoint_offset = -1
        #: A master must log the table seeded from topics.json as a checkpoint.
        self.needs_checkpoint = False

    def rebuild(self, *, initial: bool,
                on_watched: Callable[[ScannedRecord], None] | None = None) -> None:
        """Index the log up to the confirm offset, folding the state records (and handing
        the other watched records to ``on_watched``)."""
        ctx = self.ctx
        confirm = ctx.replication_confirm()
        if initial:
            seed_default_topic(ctx)
        ctx.index.advance(ctx.log, confirm, on_watched or self.on_record_rebuild)
        if initial and ctx.index.queue(STATE_TOPIC, 0) is None and ctx.topics.path.exists():
            # The log holds no state yet: topics.json (kept from an earlier store, or
            # written by an operator) seeds the table; a master logs it as a checkpoint.
            ctx.topics.load()
            seed_default_topic(ctx)
            self.needs_checkpoint = len(ctx.topics) > 1
        ctx.topics.save()

    def on_master(self) -> None:
        """Became master: log the seeded table if the log holds no state yet."""
        if self.needs_checkpoint:
            self.needs_checkpoint = False
            self.write_state(self.ctx.state.checkpoint_record())

    def on_truncate(self, offset: int) -> None:
        # State records past the cut are gone: fold the state again from what is left.
        # The fold covers the indexed records only, so records this process wrote and
        # applied that survive the cut but are not indexed yet must be applied when they
        # are (they are no longer in the rebuilt state).
        self._self_applied = set()
        self.rebuild_state()

    def rebuild_state(self) -> None:
        ctx = self.ctx
        ctx.state.clear()
        ctx.topics.replace_all([], persist=False)
        seed_default_topic(ctx)
        self.last_checkpoint_offset = -1
        q = ctx.index.queue(STATE_TOPIC, 0)
        if q is not None:
            for i in range(len(q)):
                # The index itself is not replayed here: it already reflects deletions.
                self._apply_state_at(q.phys[i], q.sizes[i], persist=False, drop_index=False)
        ctx.topics.save()

    def on_record_rebuild(self, rec: ScannedRecord) -> None:
        self._apply_state_at(rec.commit_offset, rec.size, persist=False)

    def on_record(self, rec: ScannedRecord) -> None:
        if rec.commit_offset in self._self_applied:
            self._self_applied.discard(rec.commit_offset)
            return
        self._apply_state_at(rec.commit_offset, rec.size, persist=True)

    def _apply_state_at(self, offset: int, size: int, *, persist: bool,
                        drop_index: bool = True) -> None:
        ctx = self.ctx
        try:
            msg, _ = decode_record(ctx.log.read(offset, size), inflate=False)
        except (ProtocolError, StoreError) as exc:
            log.error("state record at %d unreadable: %s", offset, exc)
            return
        before = {n for n, _ in ctx.topics.items()}
        rec = ctx.state.apply(msg.body, persist=persist)
        if rec is None:
            return
        if rec.op == "checkpoint":
            self.last_checkpoint_offset = offset
        if rec.op == "topic_delete" and drop_index:
            ctx.index.drop_topic(str(rec.data.get("topic")))
        if {n for n, _ in ctx.topics.items()} != before:
            ctx.topics_changed()

    def write_state(self, body: bytes, *, wait_flush: bool = True) -> tuple[int, int]:
        """Append a state record (master only) and apply it at once.  ``wait_flush=False``:
        with flush = sync, the caller awaits durability itself (or needs none)."""
        offset, size = self.ctx.log.append(STATE_TOPIC, body, 0, wait_flush=wait_flush)
        self._self_applied.add(offset)
        return offset, size
