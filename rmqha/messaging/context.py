"""What every piece of the messaging service shares: the store, the settings, replication.

:class:`MessagingContext` is the one small object the request handlers of
:mod:`rmqha.messaging.service`'s pieces (send path, pull path, consumer offsets, topic
admin, ...) are built from: the commitlog, the broker settings, the HA replication hooks,
the topic table, the replicated state, the consume-queue index and the broker's current
role.  It also owns the checks every writer makes (``check_writable``) and the reads every
reader makes (``read_record``, ``queue_bounds``).
"""
from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rmqha.net.peer import RequestPeer
from rmqha.protocol.code_rules import OPEN_CHECK, Found, Kind, Named, ResourceCheck
from rmqha.protocol.codes import ResponseCode
from rmqha.errors import RmqhaError, StoreError
from rmqha.messaging.clients import ClientRegistry, QueueLocks
from rmqha.store.consume_queue import ConsumeQueueIndex
from rmqha.protocol.message import MAGIC_V1
from rmqha.messaging.state import BrokerState
from rmqha.messaging.verdict import ANSWERS, Copies, Flush, Outcome, verdict
from rmqha.protocol.topics import TopicTable
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import tokens_match

log = logging.getLogger(__name__)

Handler = Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand | None]]

#: RocketMQ's default maxReconsumeTimes before a message goes to the group's DLQ.
MAX_RECONSUME_TIMES = 16
#: Largest batch body a compressed batch may inflate to (a bomb is refused, not allocated).
MAX_INFLATED_BATCH_BYTES = 64 * 1024 * 1024
#: Ext field carrying the master's address when a slave or fenced broker refuses a write.
MASTER_ADDRESS_FIELD = "masterAddress"
#: Ext field naming why a write was refused or what became of it (rmqha's client reads it).
PUT_STATUS_FIELD = "putStatus"

_QOFF = struct.Struct(">q")
# Read once: an Enum member read off its class costs hundreds of ns on 3.11 (per group).
_UNASKED, _NO_FLUSH, _ADMITTED = Copies.UNASKED, Flush.NONE, Outcome.PUT_OK


class Replication(Protocol):
    """The one object the messaging layer asks about replication (the broker's
    ``rmqha.broker.replication.Replication``): facts for :func:`~rmqha.messaging.verdict.verdict`
    (the lease, the SyncStateSet's size, whether a send's copies exist) and the pushes.  It
    judges nothing: whether a send gets SEND_OK is the verdict's."""

    def sync_state_set_size(self) -> int: ...

    def push_now(self) -> None: ...

    def defer_push(self) -> None:
        """Until the next push_now, appends on the loop thread wake no slave writer."""

    async def wait_for_copies(self, end_offset: int, timeout_s: float) -> bool:
        """True once the ack policy's copies of ``end_offset`` exist, False after
        ``timeout_s`` or when this broker is not (or stops being) the HA master."""

    def when_copies(self, end_offset: int, timeout_s: float,
                    done: Callable[[bool], None]) -> None:
        """:meth:`wait_for_copies` for a caller without a task: ``done(held)`` runs once,
        in the loop turn that decides it."""

    def copies_held(self, end_offset: int) -> bool:
        """Whether the ack policy's copies of ``end_offset`` exist now."""

    def acknowledged(self) -> None:
        """A write was answered PUT_OK (the broker keeps when it acknowledged, by epoch)."""

    def confirm_offset(self) -> int: ...

    def holds_master_lease(self) -> bool: ...

    def awaiting_first_lease(self) -> bool: ...

    async def wait_for_first_lease(self) -> None: ...


@dataclass
class MessagingConfig:
    """The broker settings the service reads (names as in ``rmqha.broker.config``)."""

    broker_address: str = "127.0.0.1:10911"
    cluster: str = "DefaultCluster"
    flush: str = "async"
    min_in_sync_replicas: int = 1
    slave_timeout_ms: int = 3000
    file_reserved_hours: float = 72.0
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 4
    long_polling_max_ms: int = 15000
    admin_token: str = ""
    #: How often retention looks for old segments.
    retention_interval_s: float = 60.0
    #: Upper bound of one pull response body.
    max_pull_bytes: int = 4 * 1024 * 1024
    #: Consumer offsets committed by pulls are written to the state log this often.
    offset_flush_interval_s: float = 1.0
    client_expire_s: float = 120.0
    #: Delay levels 1..N (RocketMQ ``messageDelayLevel``): durations with s, m, h or d.
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    #: How often the scheduler looks for due timer messages (RocketMQ ``timerPrecisionMs``).
    timer_precision_ms: int = 1000
    #: Longest TIMER_* delay accepted (RocketMQ ``timerMaxDelaySec``, 3 days).
    timer_max_delay_s: int = 3 * 24 * 3600
    #: A half message is checked back once this old (RocketMQ ``transactionTimeOut``).
    transaction_timeout_ms: int = 6000
    #: How often pending half messages are checked (RocketMQ ``transactionCheckInterval``).
    transaction_check_interval_ms: int = 30000
    #: Check-backs before a half message is discarded (RocketMQ ``transactionCheckMax``).
    transaction_check_max: int = 15
    #: Units per consume-queue file (RocketMQ ``mappedFileSizeConsumeQueue`` / 20).
    consume_queue_file_units: int = 300_000
    #: How often the consume queues are fdatasync-ed and checkpointed (RocketMQ
    #: ``flushIntervalConsumeQueue``); a crash re-dispatches about this much of the log.
    consume_queue_flush_interval_s: float = 1.0
    #: How often the master looks for popped messages whose invisible time ran out
    #: (RocketMQ ``reviveInterval``).
    pop_revive_interval_ms: int = 1000
    #: An expired pop goes to the retry topic after RocketMQ's backoff (delay level 3 +
    #: its retry count); off: visible there at once.
    pop_revive_backoff: bool = True
    #: A pop of a group nobody created uses RocketMQ's default group settings (RocketMQ
    #: ``autoCreateSubscriptionGroup``); off: SUBSCRIPTION_GROUP_NOT_EXIST.
    auto_create_subscription_group: bool = True
    #: Sends to a topic with a ``message.type`` attribute must be of that type.
    topic_message_type_check: bool = True
    #: QUERY_ASSIGNMENT's mode where no SET_MESSAGE_REQUEST_MODE set one (RocketMQ
    #: ``defaultMessageRequestMode``): PULL or POP.
    default_message_request_mode: str = "PULL"
    #: POP mode's ``popShareQueueNum`` there (RocketMQ ``defaultPopShareQueueNum``).
    default_pop_share_queue_num: int = -1
    #: Idempotent producers: (producer, queue) pairs kept (``rmqha.messaging.producer_state``).
    idempotent_max_producer_queues: int = 10_000
    #: Idempotent producers: the log's tail read back for their state on becoming master.
    idempotent_rebuild_bytes: int = 64 << 20

    @classmethod
    def from_broker_config(cls, cfg: Any) -> MessagingConfig:
        if isinstance(cfg, MessagingConfig):
            return cfg
        out = cls()
        if cfg is None:
            return out
        for name in cls.__dataclass_fields__:
            if hasattr(cfg, name):
                setattr(out, name, getattr(cfg, name))
        return out


class Refused(Exception):
    """A handler's early answer (raised to unwind, turned into the response)."""

    def __init__(self, code: int, remark: str, ext: dict[str, Any] | None = None) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark
        self.ext = ext or {}


class MessagingMetrics:
    """The service's series in a MetricsRegistry (names rmqha_messaging_*)."""

    def __init__(self, registry: Any) -> None:
        self.messages_stored = registry.counter(
            "rmqha_messaging_messages_stored", "Messages appended by sends (any outcome)")
        self.bytes_stored = registry.counter(
            "rmqha_messaging_stored_bytes", "Record bytes appended by sends")
        self.messages_served = registry.counter(
            "rmqha_messaging_messages_served", "Index entries answered by pulls")
        self.held_pulls = registry.gauge(
            "rmqha_messaging_held_pulls", "Pulls waiting for data (long polling)")
        self.send_latency = registry.histogram(
            "rmqha_messaging_send_latency_seconds", "Send request to answer, by put status",
            ("status",))
        self.transactions_ended = registry.counter(
            "rmqha_messaging_transactions_ended", "Transactions closed, by outcome",
            ("outcome",))
        self.transaction_checks = registry.counter(
            "rmqha_messaging_transaction_checks", "CHECK_TRANSACTION_STATE sent to producers")
        self.pending_half_messages = registry.gauge(
            "rmqha_messaging_pending_half_messages", "Open transactions (half messages)")
        self.delayed_delivered = registry.counter(
            "rmqha_messaging_delayed_delivered", "Delayed and timer messages delivered")
        self.pending_timer_messages = registry.gauge(
            "rmqha_messaging_pending_timer_messages", "Timer messages not yet delivered")


@dataclass
class MessagingContext:
    """The store, settings, replication and tables one broker's messaging pieces share."""

    log: Any
    config: MessagingConfig
    broker_name: str
    broker_id: int
    replication: Replication | None
    dir: Path
    topics: TopicTable
    state: BrokerState
    index: ConsumeQueueIndex
    clients: ClientRegistry
    locks: QueueLocks
    #: Prometheus series when the broker passes its rmqha.metrics.MetricsRegistry.
    metrics: MessagingMetrics | None = None
    #: Called after a topic was created or deleted (the broker re-registers its routes).
    on_topics_changed: Callable[[], None] | None = None
    role: str = "fenced"
    master_address: str | None = None
    closed: bool = False
    #: Background tasks (notifications, ...) cancelled on close.
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    #: Whether a request's sender may see a resource found in stored data or listed in an
    #: answer (the broker's ACL guard; open without ACL).  See rmqha.protocol.code_rules.
    access: ResourceCheck = OPEN_CHECK

    def listed(self, cmd: RemotingCommand, conn: RequestPeer, kind: Kind, names: Iterable[str]) -> set[str]:
        """The entries of a listing ``cmd``'s sender may see, as its code's declaration
        says (:attr:`rmqha.protocol.code_rules.Found.ANSWER_ENTRIES`; none declared: all)."""
        rule = self.access.declared(cmd.code)
        needs = [r.need for r in rule.derived if r.kind == kind and r.found == Found.ANSWER_ENTRIES] if rule else []
        return {name for name in names
                if all(self.access.allows(cmd, conn, Named(kind, name, need)) for need in needs)}

    def check_record(self, cmd: RemotingCommand, conn: RequestPeer, offset: int, topic: str) -> None:
        """Refuse (:class:`Refused`) unless the sender may read ``topic``, the topic of the
        record it named by ``offset``, as its code's declaration says
        (:attr:`rmqha.protocol.code_rules.Found.RECORD_AT_OFFSET`).  The answer carries
        nothing of the record (not its topic, not its size), in the same words whatever
        the topic was."""
        rule = self.access.declared(cmd.code)
        for res in rule.derived if rule else ():
            if res.found == Found.RECORD_AT_OFFSET and not self.access.allows(
                    cmd, conn, Named(Kind.TOPIC, topic, res.need)):
                raise Refused(ResponseCode.SYSTEM_ERROR, f"request code {cmd.code}: no {res.need.value} "
                                                         f"permission for the record at offset {offset}")

    def check_writable(self) -> None:
        """Refuse a write unless :func:`~rmqha.messaging.verdict.verdict` admits it (master,
        its lease held, enough in-sync replicas); Refused says why, naming the master."""
        replication = self.replication
        master = self.role == "master"
        lease = replication is None or replication.holds_master_lease()
        # A broker without replication is a SyncStateSet of one (itself).
        size = 1 if replication is None else int(replication.sync_state_set_size())
        need = int(self.config.min_in_sync_replicas)
        outcome = verdict(master, lease, size, need, _UNASKED, _NO_FLUSH)
        if outcome == _ADMITTED:
            return
        code, status = ANSWERS[outcome]
        ext: dict[str, Any] = {PUT_STATUS_FIELD: status}
        if outcome == Outcome.NOT_MASTER:
            address = self.master_address or ""
            ext = {MASTER_ADDRESS_FIELD: address, PUT_STATUS_FIELD: status}
            remark = (f"broker {self.broker_name}/{self.broker_id} is {self.role}, not master;"
                      f" master is {address or 'unknown'}")
        elif outcome == Outcome.MASTER_LEASE_EXPIRED:
            # Cut off from the controller: another master may be elected any moment now.
            remark = (f"broker {self.broker_name}/{self.broker_id} is master but its lease from "
                      f"the controller expired; retry on another broker")
        else:
            remark = f"{status}: SyncStateSet has {size}, need {need}"
        raise Refused(code, remark, ext)

    def replication_confirm(self) -> int:
        if self.replication is None:
            return self.whole_offset()  # a lone broker: everything written is confirmed
        try:
            return int(self.replication.confirm_offset())
        except (RmqhaError, AttributeError) as exc:
            log.debug("confirm offset not available yet: %s", exc)
            return 0

    def whole_offset(self) -> int:
        return int(getattr(self.log, "whole_offset", self.log.max_offset))

    def read_record(self, offset: int) -> bytes:
        """The raw record at a commit offset (only confirmed, existing records)."""
        if not self.log.min_offset <= offset < self.index.indexed_offset:
            raise StoreError(f"offset {offset} outside [{self.log.min_offset}, "
                             f"{self.index.indexed_offset})")
        head = self.log.read(offset, 8)
        total, magic = struct.unpack_from(">iI", head, 0)
        if magic != MAGIC_V1 or total <= 0 or offset + total > self.log.segment_end(offset):
            raise StoreError(f"no record starts at {offset}")
        return bytes(self.log.read(offset, total))

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        q = self.index.queue(topic, queue_id)
        return (0, 0) if q is None else (q.min_offset, q.max_offset)

    def queue_offset_at(self, commit_offset: int) -> int:
        return _QOFF.unpack_from(self.log.read(commit_offset + 20, 8), 0)[0]

    def store_timestamp(self, commit_offset: int) -> int:
        return _QOFF.unpack_from(self.log.read(commit_offset + 56, 8), 0)[0]

    def topics_changed(self) -> None:
        if self.on_topics_changed is not None:
            try:
                self.on_topics_changed()
            except Exception:  # a broken listener must not break the write path
                log.exception("on_topics_changed listener failed")

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background (cancelled on close); needs a running loop."""
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @staticmethod
    def born_host(conn: RequestPeer) -> tuple[str, int]:
        host, _, port = (getattr(conn, "peer", "") or "").rpartition(":")
        return (host, int(port)) if host and port.isdigit() and host.count(".") == 3 else (
            "127.0.0.1", 0)


def check_admin_token(config: MessagingConfig, cmd: RemotingCommand) -> None:
    """Refuse an admin write without the broker's ``admin_token`` (when one is set); the
    comparison takes the same time however much of a guess is right."""
    token = config.admin_token
    if token and not tokens_match(cmd.ext_fields.get("adminToken"), token):
        raise Refused(ResponseCode.NO_PERMISSION, "admin token missing or wrong")
