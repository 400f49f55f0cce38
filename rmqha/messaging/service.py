"""The broker's client-protocol service: a thin dispatcher over one piece per concern.

:class:`MessageService` is what the broker process plugs into its remoting server
(:meth:`MessageService.handlers`).  It builds one :class:`~rmqha.messaging.context.
MessagingContext` (store, settings, replication, tables) and the pieces that share it:

- :mod:`~rmqha.messaging.send_path` stores sends (master only, after the
  ``min_in_sync_replicas`` check) through :mod:`~rmqha.messaging.log_writer`, which answers
  once the ack policy and, with ``flush = sync``, the fsync hold;
- :mod:`~rmqha.messaging.pull_path` serves pulls from the consume-queue index (which never
  passes the confirm offset, so any replica can serve them) and holds empty pulls;
- :mod:`~rmqha.messaging.queue_queries` answers offset and time lookups,
  :mod:`~rmqha.messaging.lookup` queries by key and unique id (the message index),
  :mod:`~rmqha.messaging.admin_stats` mqadmin's topic, progress and connection queries;
- :mod:`~rmqha.messaging.consumer_offsets`, :mod:`~rmqha.messaging.topic_admin` and
  :mod:`~rmqha.messaging.state_replication` keep consumer offsets and topic configs as
  records in the state topic (see :mod:`rmqha.messaging.state`), so they replicate with
  the log;
- :mod:`~rmqha.messaging.client_requests` answers heartbeats and queue locks,
  :mod:`~rmqha.messaging.send_back` consumer retries, :mod:`~rmqha.messaging.retention`
  deletes old segments;
- :mod:`~rmqha.messaging.group_admin` keeps subscription groups in the state log;
- pop consumption (RocketMQ 5): :mod:`~rmqha.messaging.pop_path` (POP_MESSAGE),
  :mod:`~rmqha.messaging.pop_acks` (ACK, BATCH_ACK, CHANGE_INVISIBLETIME),
  :mod:`~rmqha.messaging.pop_revive` (expired messages to the retry topic or DLQ), sharing
  :mod:`~rmqha.messaging.pop_ledger`; the rules are in :mod:`~rmqha.messaging.pop_logic`,
  the replicated state in :mod:`~rmqha.messaging.pop_state`, receipt handles in
  :mod:`~rmqha.messaging.receipt`; server-side queue assignment for pop consumers
  (QUERY_ASSIGNMENT, SET_MESSAGE_REQUEST_MODE) in :mod:`~rmqha.messaging.queue_assignment`.

This class owns what ties them together: the broker's role changes, the confirm offset
advancing (index, then wake held pulls) and truncation.  The consume queues are files
(``<store>/consumequeue``, RocketMQ's layout): a start recovers them from their
checkpoint, folds what they already hold (state, transactions, timers) and dispatches only
the log that follows.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmqha.errors import StoreError
from rmqha.messaging.admin_stats import AdminStats
from rmqha.messaging.client_requests import ClientRequests
from rmqha.messaging.clients import ClientRegistry, QueueLocks
from rmqha.store.commitlog import CommitLog
from rmqha.store.consume_queue import ConsumeQueueIndex, ScannedRecord
from rmqha.messaging.consumer_modes import ConsumerModes
from rmqha.messaging.consumer_offsets import ConsumerOffsets
from rmqha.messaging.context import (
    MASTER_ADDRESS_FIELD,
    MAX_INFLATED_BATCH_BYTES,
    MAX_RECONSUME_TIMES,
    PUT_STATUS_FIELD,
    Handler,
    MessagingConfig,
    MessagingContext,
    MessagingMetrics,
    Replication,
)
from rmqha.messaging.delayed_delivery import TIMER_TOPIC, DelayedDelivery
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.lookup import MessageLookup
from rmqha.messaging.group_admin import GroupAdmin
from rmqha.messaging.pop_acks import PopAcks
from rmqha.messaging.pop_ledger import PopLedger
from rmqha.messaging.pop_path import PopPath
from rmqha.messaging.pop_revive import PopReviver
from rmqha.messaging.producer_state import ProducerTable
from rmqha.messaging.pull_path import PullPath
from rmqha.messaging.queue_assignment import QueueAssignment, RouteSource
from rmqha.messaging.queue_queries import QueueQueries
from rmqha.messaging.retention import Retention
from rmqha.messaging.send_back import SendBack
from rmqha.messaging.send_path import SendPath
from rmqha.messaging.state import STATE_TOPIC, BrokerState
from rmqha.messaging.state_replication import StateReplication
from rmqha.messaging.topic_admin import TopicAdmin, seed_default_topic
from rmqha.protocol.code_rules import ResourceCheck
from rmqha.protocol.topics import TopicTable
from rmqha.messaging.transactions import COMMITTED_MARK, HALF_TOPIC, OP_TOPIC, Transactions

__all__ = [
    "MASTER_ADDRESS_FIELD", "MAX_INFLATED_BATCH_BYTES", "MAX_RECONSUME_TIMES",
    "PUT_STATUS_FIELD", "Handler", "MessageService", "MessagingConfig", "Replication",
]

log = logging.getLogger(__name__)

#: The consume queues' root in the store directory (RocketMQ's ``consumequeue``, beside
#: ``commitlog``).
CONSUME_QUEUE_DIR = "consumequeue"


class MessageService:
    """RocketMQ's client protocol on top of one broker's commitlog."""

    def __init__(
        self,
        commitlog: CommitLog,
        *,
        store_dir: str | Path,
        config: Any,
        broker_name: str,
        broker_id: int,
        replication: Replication | None,
        on_segments_deleted: Callable[[int], None] | None = None,
        on_topics_changed: Callable[[], None] | None = None,
        metrics: Any = None,
        epoch: Callable[[], int] | None = None,
        topic_route: RouteSource | None = None,
    ) -> None:
        """``epoch``: the broker's current master epoch (named in pop receipt handles);
        ``topic_route``: a topic's queues at the name servers (QUERY_ASSIGNMENT; None:
        this broker's own topic table)."""
        cfg = MessagingConfig.from_broker_config(config)
        if hasattr(config, "broker_address") and not isinstance(config, MessagingConfig):
            cfg.broker_address = config.broker_address
        directory = Path(store_dir) / "messaging"
        directory.mkdir(parents=True, exist_ok=True)
        topics = TopicTable(directory / "topics.json")
        self.ctx = ctx = MessagingContext(
            log=commitlog, config=cfg, broker_name=broker_name, broker_id=broker_id,
            replication=replication, dir=directory, topics=topics,
            state=BrokerState(topics),
            index=ConsumeQueueIndex(Path(store_dir) / CONSUME_QUEUE_DIR,
                                    [STATE_TOPIC, HALF_TOPIC, OP_TOPIC, TIMER_TOPIC],
                                    COMMITTED_MARK.encode(),
                                    units_per_file=cfg.consume_queue_file_units,
                                    flush_interval_s=cfg.consume_queue_flush_interval_s),
            clients=ClientRegistry(cfg.client_expire_s, self._group_changed),
            locks=QueueLocks(),
            metrics=MessagingMetrics(metrics) if metrics is not None else None,
            on_topics_changed=on_topics_changed,
        )
        self._state_log = StateReplication(ctx)
        #: The newest confirm offset :meth:`confirm_soon` was told of, and whether the
        #: indexing up to it is queued on the loop.
        self._confirm_target = 0
        self._confirm_scheduled = False
        self._writer = LogWriter(ctx, self.on_confirm_offset, self.confirm_soon)
        self._topic_admin = TopicAdmin(ctx, self._state_log, self._writer)
        self._clients = ClientRequests(ctx, self._topic_admin)
        self._offsets = ConsumerOffsets(ctx, self._state_log)
        self.delayed = DelayedDelivery(ctx, self._writer, self._topic_admin, self._state_log,
                                       self._offsets)
        self.transactions = Transactions(ctx, self._writer, self._topic_admin, self.delayed)
        self._send = SendPath(ctx, self._writer, self._topic_admin, self.delayed,
                              self.transactions)
        self._pulls = PullPath(ctx, self._offsets.commit)
        self._queries = QueueQueries(ctx)
        self._admin_stats = AdminStats(ctx)
        self._consumer_modes = ConsumerModes()
        self._send_back = SendBack(ctx, self._writer, self._topic_admin, self.delayed)
        self._retention = Retention(ctx, self._state_log, self._writer, on_segments_deleted)
        self._groups = GroupAdmin(ctx, self._state_log, self._writer)
        self._pop_ledger = PopLedger(ctx, self._state_log, epoch=epoch or (lambda: 0))
        self._pops = PopPath(ctx, self._pop_ledger, self._offsets.young_queue)
        self._pop_acks = PopAcks(ctx, self._pop_ledger, self._writer)
        self._assignment = QueueAssignment(ctx, self._state_log, self._writer, topic_route)
        self.pop_reviver = PopReviver(ctx, self._pop_ledger, self._writer, self._topic_admin,
                                      self.delayed)
        #: Index scans hand records of these topics to the piece that folds them.
        self._watchers = {
            STATE_TOPIC: self._state_log.on_record,
            HALF_TOPIC: self.transactions.on_half_record,
            OP_TOPIC: self.transactions.on_op_record,
            TIMER_TOPIC: self.delayed.on_timer_record,
        }
        if ctx.metrics is not None:
            ctx.metrics.pending_half_messages.set_function(lambda: len(self.transactions.pending))
            ctx.metrics.pending_timer_messages.set_function(self.delayed.pending_timers)
        ctx.index.recover(commitlog)
        self._replay_indexed()
        self._state_log.rebuild(initial=True, on_watched=self._on_watched_rebuild)
        # After the consume queue: the message index follows it (from its own checkpoint).
        self._lookup = MessageLookup(
            ctx, internal_topics=(STATE_TOPIC, HALF_TOPIC, OP_TOPIC, TIMER_TOPIC))

    # --- what the broker and tests read ---------------------------------------------------

    @property
    def log(self) -> Any:
        return self.ctx.log

    @property
    def config(self) -> MessagingConfig:
        return self.ctx.config

    @property
    def role(self) -> str:
        return self.ctx.role

    @property
    def topics(self) -> TopicTable:
        return self.ctx.topics

    @property
    def state(self) -> BrokerState:
        return self.ctx.state

    @property
    def index(self) -> ConsumeQueueIndex:
        return self.ctx.index

    @property
    def clients(self) -> ClientRegistry:
        return self.ctx.clients

    @property
    def locks(self) -> QueueLocks:
        return self.ctx.locks

    @property
    def on_segments_deleted(self) -> Callable[[int], None] | None:
        """Called with the new min offset after retention deleted segments (epoch map trim)."""
        return self._retention.on_segments_deleted

    @on_segments_deleted.setter
    def on_segments_deleted(self, callback: Callable[[int], None] | None) -> None:
        self._retention.on_segments_deleted = callback

    # --- broker integration ----------------------------------------------------------------

    def handlers(self) -> dict[int, Handler]:
        """Request code -> handler for every client-protocol code this service answers."""
        out: dict[int, Handler] = {}
        for piece in (self._send, self._pulls, self._offsets, self._queries, self._clients,
                      self._send_back, self._topic_admin, self.transactions,
                      self._consumer_modes, self._lookup, self._groups, self._pops,
                      self._pop_acks, self._assignment, self._admin_stats):
            out.update(piece.handlers())
        return out

    def immediate_handlers(self) -> dict[int, Callable[[Any, Any], bool]]:
        """Request code -> handler run in the loop turn that decoded the request (see
        :class:`rmqha.net.dispatcher.Dispatcher`): the send path."""
        return self._send.immediate_handlers()

    def plain_send_handler(self) -> tuple[Callable[[Any, Any], bool], tuple[bytes, ...]]:
        """The send path's handler of plain sends parsed from their frames, and what their
        properties must not hold (see :meth:`rmqha.net.dispatcher.Dispatcher.register_plain_send`)."""
        return self._send.plain_send_handler()

    def plain_sends_handler(self) -> Callable[[Any, Any], int]:
        """The send path's handler of a run of plain sends (see
        :meth:`rmqha.net.dispatcher.Dispatcher.register_plain_sends`)."""
        return self._send.on_plain_sends

    def set_access(self, check: ResourceCheck) -> None:
        """What the handlers ask about resources found in stored data or listed in an
        answer (the broker's ACL guard, :mod:`rmqha.broker.acl_guard`)."""
        self.ctx.access = check

    def set_role(self, role: str, master_address: str | None = None) -> None:
        if role not in ("master", "slave", "fenced"):
            raise ValueError(f"unknown role {role!r}")
        ctx = self.ctx
        was = ctx.role
        ctx.role = role
        ctx.master_address = master_address
        log.info("messaging role %s -> %s (master %s)", was, role, master_address)
        if role == "master":
            self._rebuild_producers()
            self.on_confirm_offset(ctx.replication_confirm())
            seed_default_topic(ctx)
            self._state_log.on_master()
            self._offsets.on_master()
            self.delayed.start()
            self.transactions.start()
            self._pop_ledger.on_master()
            self.pop_reviver.start()
        else:
            self._send.producers.clear()  # a slave takes no writes, and its tail may be cut
            self.delayed.stop()
            self.transactions.stop()
            self.pop_reviver.stop()
        # Every replica deletes its own old segments (a slave waits for the master's
        # state checkpoint before deleting state records).
        self._retention.start()

    def _rebuild_producers(self) -> None:
        """Idempotent producers' state from the log's tail (see
        :mod:`rmqha.messaging.producer_state`): the same records on every replica."""
        started = time.perf_counter()
        table = self._send.producers
        found = table.rebuild(self.ctx.log, int(self.ctx.config.idempotent_rebuild_bytes))
        log.info("idempotent producers: %d sends of %d producer queues read back from the log's "
                 "tail in %.3f s", found, len(table), time.perf_counter() - started)

    @property
    def producers(self) -> ProducerTable:
        """What idempotent producers stored (tests read it)."""
        return self._send.producers

    def confirm_soon(self, offset: int) -> None:
        """:meth:`on_confirm_offset` at the end of this loop turn, once for all the advances
        of the turn: the acks that move the confirm offset are also what a waiting send
        needs, and its answer should leave before the indexing (a pull or lookup comes in
        a later turn and finds the index caught up).  Called off the loop: at once."""
        if offset > self._confirm_target:
            self._confirm_target = offset
        if self._confirm_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.on_confirm_offset(offset)
            return
        self._confirm_scheduled = True
        loop.call_soon(self._confirm_scheduled_now)

    def _confirm_scheduled_now(self) -> None:
        self._confirm_scheduled = False
        self.on_confirm_offset(self._confirm_target)

    def on_confirm_offset(self, offset: int) -> None:
        """The confirm offset advanced: index up to it and wake held pulls."""
        ctx = self.ctx
        if ctx.closed or offset <= ctx.index.indexed_offset:
            return
        try:
            grown = ctx.index.advance(ctx.log, offset, self._on_watched)
        except (StoreError, ValueError) as exc:
            log.error("indexing up to %d failed: %s", offset, exc)
            return
        if grown:
            self._pulls.wake(grown)
            self._pops.wake(grown)
        self._lookup.on_confirm()

    def on_truncate(self, offset: int) -> None:
        """The commitlog was cut at ``offset`` (a slave dropped a divergent tail, or emptied
        its log and reset its start)."""
        self.ctx.index.truncate(offset)
        self.ctx.index.trim_below(self.ctx.log.min_offset)
        self._lookup.on_truncate(offset)
        self._state_log.on_truncate(offset)
        self.transactions.reload()
        self.delayed.reload()

    def topic_configs(self) -> dict[str, dict[str, Any]]:
        """Topic -> RocketMQ TopicConfig JSON, for name-server registration."""
        return self._topic_admin.topic_configs()

    async def run_retention(self, now: float | None = None) -> int:
        """Delete segments older than ``file_reserved_hours`` now (see :mod:`retention`)."""
        return await self._retention.run_retention(now)

    def close(self) -> None:
        self.ctx.closed = True
        self._offsets.close()
        self._retention.close()
        self._pulls.close()
        self._lookup.close()
        self.ctx.index.close()
        self.delayed.stop()
        self.transactions.stop()
        self.pop_reviver.stop()
        self._pop_ledger.close()
        for task in list(self.ctx.tasks):
            task.cancel()

    def _on_watched(self, rec: ScannedRecord) -> None:
        # Records of other topics are here for their COMMITTED_MARK property.
        self._watchers.get(rec.topic, self.transactions.on_committed_record)(rec)

    def _replay_indexed(self) -> None:
        """Fold the records the consume queues held at start, as the dispatch of the log
        would have: the state log, open transactions and timers from their own queues;
        then the committed marks that may close an open transaction, from the oldest open
        half message on (a commit follows its half message)."""
        ctx = self.ctx
        if not ctx.index.queues:
            return
        self._state_log.rebuild_state()
        self.transactions.reload()
        self.delayed.reload()
        if self.transactions.pending:
            oldest = min(p.commit_offset for p in self.transactions.pending.values())
            ctx.index.replay_watched(ctx.log, oldest, ctx.index.indexed_offset,
                                     self.transactions.on_committed_record)

    def _on_watched_rebuild(self, rec: ScannedRecord) -> None:
        if rec.topic == STATE_TOPIC:
            self._state_log.on_record_rebuild(rec)
        else:
            self._on_watched(rec)

    def _group_changed(self, group: str) -> None:
        # The registry is built before the piece that answers for it (heartbeats come later).
        self._clients.group_changed(group)
