"""The broker's client-protocol service: send, pull, offsets, groups, locks, topics, retention.

:class:`MessageService` is what the broker process plugs into its remoting server
(:meth:`MessageService.handlers`).  It writes to the commitlog only as master, after the
``min_in_sync_replicas`` check, and answers a send once the ack policy
(``replication.wait_for_replicas``) and, with ``flush = sync``, the fsync hold.  Reads go
through the consume-queue index, which never passes the confirm offset, so any replica can
serve pulls; pulls that find nothing are held (long polling) until the index grows.
Topic configs and consumer offsets are records in the state topic (see
:mod:`rmqha.messaging.state`), so they replicate with the log.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rmqha.codes import RequestCode, ResponseCode
from rmqha.errors import ConfigError, ProtocolError, RmqhaError, StoreError
from rmqha.failpoints import Failpoint, hit
from rmqha.messaging.clients import ClientRegistry, QueueLocks, mq_json, parse_mq_set
from rmqha.messaging.consume_queue import ConsumeQueueIndex, ScannedRecord
from rmqha.messaging.headers import (
    PULL_COMMIT_OFFSET,
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    PullHeader,
    SendHeader,
    opt_int,
    req_int,
    req_str,
)
from rmqha.messaging.message import (
    COMPRESSION_TYPE_MASK,
    MAGIC_V1,
    REC_FIXED,
    CompressionType,
    DecompressError,
    Prop,
    SysFlag,
    compress,
    decode_batch,
    decode_properties,
    decode_record,
    decompress,
    offset_msg_id,
    parse_subscription,
    reencode_record,
    strip_compression,
    tag_hash,
)
from rmqha.messaging.state import (
    STATE_TOPIC,
    BrokerState,
    offsets_record,
    topic_delete_record,
    topic_put_record,
)
from rmqha.messaging.topics import (
    DEFAULT_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_INHERIT,
    PERM_READ_WRITE,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfig,
    TopicTable,
    validate_topic_name,
)
from rmqha.remoting import RemotingCommand

log = logging.getLogger(__name__)

Handler = Callable[[RemotingCommand, Any], Awaitable[RemotingCommand | None]]

#: RocketMQ's default maxReconsumeTimes before a message goes to the group's DLQ.
MAX_RECONSUME_TIMES = 16
#: Largest batch body a compressed batch may inflate to (a bomb is refused, not allocated).
MAX_INFLATED_BATCH_BYTES = 64 * 1024 * 1024
#: Ext field carrying the master's address when a slave or fenced broker refuses a write.
MASTER_ADDRESS_FIELD = "masterAddress"
#: Ext field naming why a write was refused or what became of it (rmqha's client reads it).
PUT_STATUS_FIELD = "putStatus"


class Replication(Protocol):
    """What the broker gives the service from its HA master (see the team contract)."""

    def sync_state_set_size(self) -> int: ...

    async def wait_for_replicas(self, end_offset: int, timeout_s: float) -> bool: ...

    def confirm_offset(self) -> int: ...

    def copies_of(self, offset: int) -> int: ...

    def holds_master_lease(self) -> bool: ...


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


class _Refused(Exception):
    """A handler's early answer (raised to unwind, turned into the response)."""

    def __init__(self, code: int, remark: str, ext: dict[str, Any] | None = None) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark
        self.ext = ext or {}


_QOFF = struct.Struct(">q")
_I32 = struct.Struct(">i")


#: Java ``MQVersion`` ordinal of V5_0_0: Java clients from 5.0 on decompress lz4.
_JAVA_V5_0_0 = 413


def _reads_lz4(cmd: RemotingCommand) -> bool:
    """Whether the client that sent ``cmd`` can inflate lz4 bodies (RocketMQ 5 clients and
    rmqha's own); C++ 1.2.x aborts on anything but zlib."""
    if cmd.language == "PYTHON":
        return True
    return cmd.language == "JAVA" and cmd.version >= _JAVA_V5_0_0


def _lz4_to_zlib(body: bytes) -> bytes:
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


class _Metrics:
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


class MessageService:
    """RocketMQ's client protocol on top of one broker's commitlog."""

    def __init__(
        self,
        commitlog: Any,
        *,
        store_dir: str | Path,
        config: Any,
        broker_name: str,
        broker_id: int,
        replication: Replication | None,
        on_segments_deleted: Callable[[int], None] | None = None,
        on_topics_changed: Callable[[], None] | None = None,
        metrics: Any = None,
    ) -> None:
        self.log = commitlog
        #: Prometheus series when the broker passes its rmqha.metrics.MetricsRegistry.
        self._m = _Metrics(metrics) if metrics is not None else None
        self.config = MessagingConfig.from_broker_config(config)
        if hasattr(config, "broker_address") and not isinstance(config, MessagingConfig):
            self.config.broker_address = config.broker_address
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.replication = replication
        #: Called with the new min offset after retention deleted segments (epoch map trim).
        self.on_segments_deleted = on_segments_deleted
        #: Called after a topic was created or deleted (the broker re-registers its routes).
        self.on_topics_changed = on_topics_changed
        self.role = "fenced"
        self.master_address: str | None = None
        self.dir = Path(store_dir) / "messaging"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.topics = TopicTable(self.dir / "topics.json")
        self.state = BrokerState(self.topics)
        self.index = ConsumeQueueIndex([STATE_TOPIC])
        self.clients = ClientRegistry(self.config.client_expire_s, self._group_changed)
        self.locks = QueueLocks()
        #: Commit offsets of state records this process applied when writing them.
        self._self_applied: set[int] = set()
        self._last_checkpoint_offset = -1
        self._waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        self._dirty_offsets: dict[tuple[str, str, int], int] = {}
        self._offset_flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._append_lock = threading.Lock()
        self._needs_checkpoint = False
        self._retention_task: asyncio.Task[None] | None = None
        self._closed = False
        # offsetMsgId = hex(store ip, port) + hex(commitlog offset): the host part once.
        self._msg_id_prefix = offset_msg_id(self.config.broker_address, 0)[:16]
        self._rebuild(initial=True)

    # --- broker integration ----------------------------------------------------------------

    def handlers(self) -> dict[int, Handler]:
        """Request code -> handler for every client-protocol code this service answers."""
        rc = RequestCode
        return {
            rc.SEND_MESSAGE: self._on_send,
            rc.SEND_MESSAGE_V2: self._on_send,
            rc.SEND_BATCH_MESSAGE: self._on_send,
            rc.PULL_MESSAGE: self._on_pull,
            rc.QUERY_CONSUMER_OFFSET: self._on_query_offset,
            rc.UPDATE_CONSUMER_OFFSET: self._on_update_offset,
            rc.GET_MAX_OFFSET: self._on_max_offset,
            rc.GET_MIN_OFFSET: self._on_min_offset,
            rc.SEARCH_OFFSET_BY_TIMESTAMP: self._on_search_offset,
            rc.GET_EARLIEST_MSG_STORETIME: self._on_earliest_time,
            rc.VIEW_MESSAGE_BY_ID: self._on_view_message,
            rc.HEART_BEAT: self._on_heartbeat,
            rc.UNREGISTER_CLIENT: self._on_unregister,
            rc.CONSUMER_SEND_MSG_BACK: self._on_send_back,
            rc.GET_CONSUMER_LIST_BY_GROUP: self._on_consumer_list,
            rc.LOCK_BATCH_MQ: self._on_lock,
            rc.UNLOCK_BATCH_MQ: self._on_unlock,
            rc.UPDATE_AND_CREATE_TOPIC: self._on_create_topic,
            rc.DELETE_TOPIC_IN_BROKER: self._on_delete_topic,
            rc.GET_ALL_TOPIC_CONFIG: self._on_all_topics,
        }

    def set_role(self, role: str, master_address: str | None = None) -> None:
        if role not in ("master", "slave", "fenced"):
            raise ValueError(f"unknown role {role!r}")
        was = self.role
        self.role = role
        self.master_address = master_address
        log.info("messaging role %s -> %s (master %s)", was, role, master_address)
        if role == "master":
            self._poll_confirm()
            self._seed_topics()
            if self._needs_checkpoint:
                self._needs_checkpoint = False
                self._write_state(self.state.checkpoint_record())
            if self._dirty_offsets:
                self._schedule_offset_flush(0.0)
        # Every replica deletes its own old segments (a slave waits for the master's
        # state checkpoint before deleting state records).
        self._start_retention()

    def on_confirm_offset(self, offset: int) -> None:
        """The confirm offset advanced: index up to it and wake held pulls."""
        if self._closed or offset <= self.index.indexed_offset:
            return
        try:
            grown = self.index.advance(self.log, offset, self._on_state_record)
        except (StoreError, ValueError) as exc:
            log.error("indexing up to %d failed: %s", offset, exc)
            return
        for key in grown:
            waiters = self._waiters.pop(key, None)
            if waiters:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)

    def on_truncate(self, offset: int) -> None:
        """The commitlog was cut at ``offset`` (a slave dropped a divergent tail)."""
        self.index.truncate(offset)
        self._self_applied = {o for o in self._self_applied if o < offset}
        # State records past the cut are gone: fold the state again from what is left.
        self._rebuild_state()

    def topic_configs(self) -> dict[str, dict[str, Any]]:
        """Topic -> RocketMQ TopicConfig JSON, for name-server registration."""
        return {name: cfg.to_rocketmq() for name, cfg in self.topics.items()
                if name != STATE_TOPIC}

    def close(self) -> None:
        self._closed = True
        if self._offset_flush is not None:
            self._offset_flush.cancel()
        if self._retention_task is not None:
            self._retention_task.cancel()
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
        for task in list(self._tasks):
            task.cancel()

    # --- state ------------------------------------------------------------------------------

    def _seed_topics(self) -> None:
        """TBW102 (the C++ client's fallback route) exists on every broker."""
        if DEFAULT_TOPIC not in self.topics:
            n = max(1, int(self.config.default_topic_queue_nums))
            self.topics.put(TopicConfig(DEFAULT_TOPIC, n, n, PERM_READ_WRITE | PERM_INHERIT),
                            persist=False)

    def _rebuild(self, *, initial: bool) -> None:
        confirm = self._replication_confirm()
        if initial:
            self._seed_topics()
        self.index.advance(self.log, confirm, self._on_state_record_rebuild)
        if initial and self.index.queue(STATE_TOPIC, 0) is None and self.topics.path.exists():
            # The log holds no state yet: topics.json (kept from an earlier store, or
            # written by an operator) seeds the table; a master logs it as a checkpoint.
            self.topics.load()
            self._seed_topics()
            self._needs_checkpoint = len(self.topics) > 1
        self.topics.save()

    def _rebuild_state(self) -> None:
        self.state.offsets.clear()
        self.topics.replace_all([], persist=False)
        self._seed_topics()
        self._last_checkpoint_offset = -1
        q = self.index.queue(STATE_TOPIC, 0)
        if q is not None:
            for i in range(len(q)):
                # The index itself is not replayed here: it already reflects deletions.
                self._apply_state_at(q.phys[i], q.sizes[i], persist=False, drop_index=False)
        self.topics.save()

    def _replication_confirm(self) -> int:
        if self.replication is None:
            return self._whole_offset()  # a lone broker: everything written is confirmed
        try:
            return int(self.replication.confirm_offset())
        except (RmqhaError, AttributeError) as exc:
            log.debug("confirm offset not available yet: %s", exc)
            return 0

    def _whole_offset(self) -> int:
        return int(getattr(self.log, "whole_offset", self.log.max_offset))

    def _poll_confirm(self) -> None:
        self.on_confirm_offset(self._replication_confirm())

    def _on_state_record_rebuild(self, rec: ScannedRecord) -> None:
        self._apply_state_at(rec.commit_offset, rec.size, persist=False)

    def _on_state_record(self, rec: ScannedRecord) -> None:
        if rec.commit_offset in self._self_applied:
            self._self_applied.discard(rec.commit_offset)
            return
        self._apply_state_at(rec.commit_offset, rec.size, persist=True)

    def _apply_state_at(self, offset: int, size: int, *, persist: bool,
                        drop_index: bool = True) -> None:
        try:
            msg, _ = decode_record(self.log.read(offset, size), inflate=False)
        except (ProtocolError, StoreError) as exc:
            log.error("state record at %d unreadable: %s", offset, exc)
            return
        before = {n for n, _ in self.topics.items()}
        rec = self.state.apply(msg.body, persist=persist)
        if rec is None:
            return
        if rec.op == "checkpoint":
            self._last_checkpoint_offset = offset
        if rec.op == "topic_delete" and drop_index:
            self.index.drop_topic(str(rec.data.get("topic")))
        if {n for n, _ in self.topics.items()} != before:
            self._topics_changed()

    def _topics_changed(self) -> None:
        if self.on_topics_changed is not None:
            try:
                self.on_topics_changed()
            except Exception:  # a broken listener must not break the write path
                log.exception("on_topics_changed listener failed")

    def _write_state(self, body: bytes) -> tuple[int, int]:
        """Append a state record (master only) and apply it at once."""
        offset, size = self.log.append(STATE_TOPIC, body, 0)
        self._self_applied.add(offset)
        return offset, size

    def _ensure_topic(self, topic: str, queue_nums: int | None = None,
                      perm: int = PERM_READ_WRITE) -> TopicConfig | None:
        cfg = self.topics.get(topic)
        if cfg is not None:
            return cfg
        retry = topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
        if not (retry or self.config.auto_create_topic_enable) or self.role != "master":
            return None
        n = 1 if retry else (queue_nums or max(1, int(self.config.default_topic_queue_nums)))
        cfg = TopicConfig(topic, n, n, perm)
        self._write_state(topic_put_record(cfg))
        self.topics.put(cfg)
        self._topics_changed()
        return cfg

    # --- writes -----------------------------------------------------------------------------

    def _append(self, topic: str, queue_id: int, body: bytes,
                properties: str | dict[str, str], flag: int,
                sys_flag: int, born_timestamp: int, born_host: tuple[str, int],
                reconsume_times: int) -> tuple[int, int]:
        return self.log.append(
            topic, body, queue_id,
            properties if isinstance(properties, dict) else decode_properties(properties),
            flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp, born_host=born_host,
            reconsume_times=reconsume_times, wait_flush=False,
        )

    async def _append_rows(self, topic: str, queue_id: int,
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

    def _check_writable(self) -> None:
        if self.role != "master":
            master = self.master_address or ""
            raise _Refused(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"broker {self.broker_name}/{self.broker_id} is {self.role}, not master;"
                f" master is {master or 'unknown'}",
                {MASTER_ADDRESS_FIELD: master, PUT_STATUS_FIELD: "NOT_MASTER"},
            )
        if self.replication is not None and not self.replication.holds_master_lease():
            # Cut off from the controller: another master may be elected any moment now.
            raise _Refused(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"broker {self.broker_name}/{self.broker_id} is master but its lease from the "
                f"controller expired; retry on another broker",
                {PUT_STATUS_FIELD: "MASTER_LEASE_EXPIRED"},
            )
        # A broker without replication is a SyncStateSet of one (itself).
        size = 1 if self.replication is None else int(self.replication.sync_state_set_size())
        need = int(self.config.min_in_sync_replicas)
        if size < need:
            raise _Refused(
                ResponseCode.SYSTEM_ERROR,
                f"IN_SYNC_REPLICAS_NOT_ENOUGH: SyncStateSet has {size}, need {need}",
                {PUT_STATUS_FIELD: "IN_SYNC_REPLICAS_NOT_ENOUGH"},
            )

    async def _await_durable(self, end_offset: int) -> tuple[int, str]:
        """Wait for the ack policy and the flush policy; (response code, put status)."""
        timeout_s = self.config.slave_timeout_ms / 1000.0
        ok = True
        if self.replication is not None:
            ok = await self.replication.wait_for_replicas(end_offset, timeout_s)
            self._poll_confirm()
        else:
            self.on_confirm_offset(end_offset)
        if self.config.flush == "sync":
            try:
                await asyncio.wait_for(asyncio.wrap_future(self.log.flush_future(end_offset)),
                                       timeout_s)
            except asyncio.TimeoutError:
                return ResponseCode.FLUSH_DISK_TIMEOUT, "FLUSH_DISK_TIMEOUT"
        if not ok:
            need = int(self.config.min_in_sync_replicas)
            if need > 1 and self.replication is not None and \
                    self.replication.sync_state_set_size() < need and \
                    self.replication.copies_of(end_offset) < need:
                # The set shrank below the floor while the send waited: RocketMQ's
                # IN_SYNC_REPLICAS_NOT_ENOUGH (a failure clients retry), never SEND_OK, even
                # though every member of what is left of the set holds it.
                return ResponseCode.SYSTEM_ERROR, "IN_SYNC_REPLICAS_NOT_ENOUGH"
            return ResponseCode.FLUSH_SLAVE_TIMEOUT, "FLUSH_SLAVE_TIMEOUT"
        return ResponseCode.SUCCESS, "PUT_OK"

    async def _on_send(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        started = time.perf_counter()
        try:
            resp = await self._send(cmd, conn)
        except _Refused as r:
            resp = cmd.response(r.code, r.remark, r.ext)
        if self._m is not None:
            status = resp.ext_fields.get(PUT_STATUS_FIELD) or str(resp.code)
            self._m.send_latency.labels(status).observe(time.perf_counter() - started)
        return resp

    def _born_host(self, conn: Any) -> tuple[str, int]:
        host, _, port = (getattr(conn, "peer", "") or "").rpartition(":")
        return (host, int(port)) if host and port.isdigit() and host.count(".") == 3 else (
            "127.0.0.1", 0)

    async def _send(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        v2 = cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
        try:
            h = SendHeader.from_ext(cmd.ext_fields, v2=v2)
        except ProtocolError as exc:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        batch = h.batch or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        self._check_writable()
        try:
            validate_topic_name(h.topic)
        except ConfigError as exc:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        if h.topic == STATE_TOPIC:
            raise _Refused(ResponseCode.NO_PERMISSION, f"topic {h.topic} is internal")
        cfg = self._ensure_topic(h.topic)
        if cfg is None:
            raise _Refused(ResponseCode.TOPIC_NOT_EXIST,
                           f"topic {h.topic} does not exist on {self.broker_name}")
        if not cfg.perm & PERM_WRITE:
            raise _Refused(ResponseCode.NO_PERMISSION, f"topic {h.topic} is not writable")
        queue_id = h.queue_id
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)
        queue_id %= cfg.write_queue_nums
        born_host = self._born_host(conn)
        born_ts = h.born_timestamp or int(time.time() * 1000)
        if batch:
            body = cmd.body
            sys_flag = h.sys_flag
            if sys_flag & SysFlag.COMPRESSED:
                # C++ compresses a whole batch over 4 KiB; inflate before splitting.
                try:
                    body = decompress(body, sys_flag, limit=MAX_INFLATED_BATCH_BYTES)
                except DecompressError as exc:
                    raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
                sys_flag = strip_compression(sys_flag)
            try:
                items = decode_batch(body)
            except ProtocolError as exc:
                raise _Refused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
            if not items:
                raise _Refused(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
            rows: list[tuple[bytes, str | dict[str, str], int, int]] = [
                (item.body, item.properties, item.flag, 0) for item in items]
        else:
            rows = [(cmd.body, h.properties, h.flag, h.reconsume_times)]
            sys_flag = h.sys_flag
        try:
            placed = await self._append_rows(h.topic, queue_id, rows, sys_flag, born_ts,
                                             born_host)
        except StoreError as exc:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        first_offset, _ = placed[0]
        last_offset, last_size = placed[-1]
        queue_offset = self._queue_offset_at(first_offset)
        if self._m is not None:
            self._m.messages_stored.inc(len(placed))
            self._m.bytes_stored.inc(sum(size for _, size in placed))
        code, status = await self._await_durable(last_offset + last_size)
        prefix = self._msg_id_prefix
        ids = ",".join(prefix + _QOFF.pack(off).hex().upper() for off, _ in placed)
        ext = {"msgId": ids, "queueId": queue_id, "queueOffset": queue_offset,
               PUT_STATUS_FIELD: status, "commitLogOffset": first_offset}
        if code == ResponseCode.SUCCESS:
            remark = None
        elif status == "IN_SYNC_REPLICAS_NOT_ENOUGH":
            remark = (f"in-sync replicas not enough: stored at {first_offset} but held by fewer "
                      f"than min_in_sync_replicas={self.config.min_in_sync_replicas} copies")
        else:
            remark = f"{status}: stored at {first_offset} but not confirmed in time"
        return cmd.response(code, remark, ext)

    def _queue_offset_at(self, commit_offset: int) -> int:
        return _QOFF.unpack_from(self.log.read(commit_offset + 20, 8), 0)[0]

    # --- reads ------------------------------------------------------------------------------

    def _log_queue_end(self, topic: str, queue_id: int) -> int:
        """The next queue offset the commitlog holds for a queue (confirmed or not)."""
        queue_offset = getattr(self.log, "queue_offset", None)
        return int(queue_offset(topic, queue_id)) if queue_offset is not None else 0

    def _queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        q = self.index.queue(topic, queue_id)
        return (0, 0) if q is None else (q.min_offset, q.max_offset)

    async def _on_pull(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        try:
            h = PullHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        if h.sys_flag & PULL_COMMIT_OFFSET and h.commit_offset >= 0:
            self._commit_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset,
                                immediate=False)
        tags = parse_subscription(h.subscription) if h.sys_flag & PULL_SUBSCRIPTION else None
        hashes = None if tags is None else {tag_hash(t) for t in tags}
        max_msgs = max(1, min(h.max_msg_nums, 1024))
        hold_ms = 0
        if h.sys_flag & PULL_SUSPEND:
            hold_ms = min(max(h.suspend_timeout_ms, 0), self.config.long_polling_max_ms)
        deadline = time.monotonic() + hold_ms / 1000.0
        key = (h.topic, h.queue_id)
        while True:
            answer = self._try_pull(cmd, h, max_msgs, hashes)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                lo, hi = self._queue_bounds(h.topic, h.queue_id)
                return self._pull_response(cmd, ResponseCode.PULL_NOT_FOUND, h.queue_offset, lo,
                                           hi)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(fut)
            if self._m is not None:
                self._m.held_pulls.inc()
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                if self._m is not None:
                    self._m.held_pulls.dec()
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
        q = self.index.queue(h.topic, h.queue_id)
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
        phys, sizes, tags = q.slice(offset, max_msgs)
        runs: list[tuple[int, int]] = []
        total = 0
        taken = 0
        run_start = run_end = -1
        for i in range(len(phys)):
            p, s = phys[i], sizes[i]
            if total and total + s > self.config.max_pull_bytes:
                break
            taken = i + 1
            if hashes is not None and tags[i] not in hashes:
                continue
            if run_end == p and p < self.log.segment_end(run_start):
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
                                    f"{self.broker_name}/{self.broker_id} failed its CRC check and "
                                    f"is not served; run `rmqha scrub` on this store", {})
            return self._try_pull(cmd, h, keep, hashes)
        parts = [self.log.read(a, b - a) for a, b in runs]
        next_begin = offset + taken
        if not parts:
            return self._pull_response(cmd, ResponseCode.PULL_RETRY_IMMEDIATELY, next_begin, lo, hi)
        if self._m is not None:
            self._m.messages_served.inc(taken)
        body = b"".join(parts)
        if not _reads_lz4(cmd):
            body = _lz4_to_zlib(body)
        return self._pull_response(cmd, ResponseCode.SUCCESS, next_begin, lo, hi, body)

    def _first_bad_record(self, runs: list[tuple[int, int]]) -> int | None:
        """The commitlog offset of the first record in ``runs`` whose CRC fails, if any."""
        verify = getattr(self.log, "verify", None)
        if verify is None:
            return None
        for start, end in runs:
            bad = verify(start, end - start)
            if bad is not None:
                return int(bad.offset)
        return None

    async def _on_max_offset(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        topic, qid = req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")
        return cmd.response(ResponseCode.SUCCESS, None,
                            {"offset": self._queue_bounds(topic, qid)[1]})

    async def _on_min_offset(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        topic, qid = req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")
        return cmd.response(ResponseCode.SUCCESS, None,
                            {"offset": self._queue_bounds(topic, qid)[0]})

    def _store_timestamp(self, commit_offset: int) -> int:
        return _QOFF.unpack_from(self.log.read(commit_offset + 56, 8), 0)[0]

    async def _on_search_offset(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ext = cmd.ext_fields
        topic, qid = req_str(ext, "topic"), req_int(ext, "queueId")
        ts = opt_int(ext, "timestamp", 0)
        q = self.index.queue(topic, qid)
        if q is None or not len(q):
            return cmd.response(ResponseCode.SUCCESS, None,
                                {"offset": self._queue_bounds(topic, qid)[1]})
        lo, hi = 0, len(q)
        while lo < hi:  # first entry stored at or after ts
            mid = (lo + hi) // 2
            if self._store_timestamp(q.phys[mid]) < ts:
                lo = mid + 1
            else:
                hi = mid
        return cmd.response(ResponseCode.SUCCESS, None, {"offset": q.base + lo})

    async def _on_earliest_time(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        topic, qid = req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")
        q = self.index.queue(topic, qid)
        ts = self._store_timestamp(q.phys[0]) if q is not None and len(q) else 0
        return cmd.response(ResponseCode.SUCCESS, None, {"timestamp": ts})

    async def _on_view_message(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        offset = req_int(cmd.ext_fields, "offset")
        try:
            body = self._read_record(offset)
        except (StoreError, ProtocolError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no message at {offset}: {exc}")
        return cmd.response(ResponseCode.SUCCESS, None, {}, body)

    def _read_record(self, offset: int) -> bytes:
        """The raw record at a commit offset (only confirmed, existing records)."""
        if not self.log.min_offset <= offset < self.index.indexed_offset:
            raise StoreError(f"offset {offset} outside [{self.log.min_offset}, "
                             f"{self.index.indexed_offset})")
        head = self.log.read(offset, 8)
        total, magic = struct.unpack_from(">iI", head, 0)
        if magic != MAGIC_V1 or total <= 0 or offset + total > self.log.segment_end(offset):
            raise StoreError(f"no record starts at {offset}")
        return bytes(self.log.read(offset, total))

    # --- offsets ----------------------------------------------------------------------------

    async def _on_query_offset(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ext = cmd.ext_fields
        group, topic = req_str(ext, "consumerGroup"), req_str(ext, "topic")
        qid = req_int(ext, "queueId")
        offset = self.state.offsets.get(group, topic, qid)
        if offset is None:
            # A new group starts at the oldest message (the C++ client skips the backlog
            # on QUERY_NOT_FOUND), RocketMQ's reference note 11.
            offset = self._queue_bounds(topic, qid)[0]
        return cmd.response(ResponseCode.SUCCESS, None, {"offset": offset})

    async def _on_update_offset(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ext = cmd.ext_fields
        group, topic = req_str(ext, "consumerGroup"), req_str(ext, "topic")
        qid, offset = req_int(ext, "queueId"), req_int(ext, "commitOffset")
        if offset >= 0:
            self._commit_offset(group, topic, qid, offset, immediate=True)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    def _commit_offset(self, group: str, topic: str, queue_id: int, offset: int, *,
                       immediate: bool) -> None:
        key = (group, topic, queue_id)
        if self.state.offsets.set(group, topic, queue_id, offset) or key in self._dirty_offsets:
            self._dirty_offsets[key] = offset
            self._schedule_offset_flush(0.0 if immediate else self.config.offset_flush_interval_s)

    def _schedule_offset_flush(self, delay: float) -> None:
        if self._closed or self.role != "master":
            return  # a slave keeps them until it becomes master (set_role flushes)
        if self._offset_flush is not None:
            if delay > 0:
                return
            self._offset_flush.cancel()
        loop = asyncio.get_running_loop()
        self._offset_flush = loop.call_later(delay, self._flush_offsets)

    def _flush_offsets(self) -> None:
        self._offset_flush = None
        if not self._dirty_offsets or self.role != "master" or self._closed:
            return
        entries = [(g, t, q, o) for (g, t, q), o in self._dirty_offsets.items()]
        self._dirty_offsets.clear()
        try:
            self._write_state(offsets_record(entries))
        except StoreError as exc:
            log.error("could not write %d consumer offsets: %s", len(entries), exc)

    # --- clients, groups, locks -----------------------------------------------------------

    async def _on_heartbeat(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        try:
            data = json.loads(cmd.body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("not an object")
            info = self.clients.heartbeat(data, conn)
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat: {exc}")
        if conn is not None and hasattr(conn, "add_close_callback") and not getattr(
                conn, "attributes", {}).get("rmqha_client_watch"):
            conn.attributes["rmqha_client_watch"] = True
            conn.add_close_callback(self._client_connection_closed)
        if self.role == "master":
            for group in info.consumer_groups:
                self._ensure_topic(RETRY_GROUP_TOPIC_PREFIX + group)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    def _client_connection_closed(self, conn: Any) -> None:
        for client_id in self.clients.connection_closed(conn):
            self.locks.release_client(client_id)

    async def _on_unregister(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ext = cmd.ext_fields
        client_id, group = ext.get("clientID", ""), ext.get("consumerGroup", "")
        self.clients.unregister(client_id, group, ext.get("producerGroup", ""))
        if client_id and group:
            self.locks.release_client(client_id, group)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    async def _on_consumer_list(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        group = req_str(cmd.ext_fields, "consumerGroup")
        ids = [c.client_id for c in self.clients.consumers(group)]
        return cmd.response(ResponseCode.SUCCESS, None, {}, {"consumerIdList": ids})

    def _group_changed(self, group: str) -> None:
        """Tell the group's members to rebalance now (NOTIFY_CONSUMER_IDS_CHANGED, one-way)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for info in self.clients.consumers(group):
            conn = info.connection
            if conn is None or getattr(conn, "closed", True):
                continue
            req = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                          {"consumerGroup": group}, oneway=True)
            task = loop.create_task(self._notify(conn, req))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _notify(conn: Any, req: RemotingCommand) -> None:
        try:
            await conn.send(req)
        except RmqhaError as exc:
            log.debug("notify to %s failed: %s", getattr(conn, "name", "?"), exc)

    def _lock_body(self, cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        try:
            body = json.loads(cmd.body or b"{}")
        except ValueError as exc:
            raise ProtocolError(f"lock body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ProtocolError("lock body is not an object")
        return str(body.get("consumerGroup", "")), str(body.get("clientId", "")), parse_mq_set(body)

    async def _on_lock(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        group, client, mqs = self._lock_body(cmd)
        held = self.locks.lock(group, client, mqs)
        return cmd.response(ResponseCode.SUCCESS, None, {},
                            {"lockOKMQSet": [mq_json(m) for m in held]})

    async def _on_unlock(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        group, client, mqs = self._lock_body(cmd)
        self.locks.unlock(group, client, mqs)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    # --- send back (consumer retries) -------------------------------------------------------

    async def _on_send_back(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ext = cmd.ext_fields
        group = req_str(ext, "group")
        offset = req_int(ext, "offset")
        delay_level = opt_int(ext, "delayLevel", 0)
        max_times = opt_int(ext, "maxReconsumeTimes", MAX_RECONSUME_TIMES)
        try:
            self._check_writable()
            raw = self._read_record(offset)
        except _Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except StoreError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        msg, _ = decode_record(raw, inflate=False)
        props = dict(msg.properties)
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        props.setdefault(Prop.ORIGIN_MESSAGE_ID,
                         ext.get("originMsgId") or props.get(Prop.UNIQ_KEY)
                         or offset_msg_id(self.config.broker_address, offset))
        times = msg.reconsume_times + 1
        if msg.reconsume_times >= max_times or delay_level < 0:
            target = DLQ_GROUP_TOPIC_PREFIX + group
        else:
            target = RETRY_GROUP_TOPIC_PREFIX + group
        props[Prop.RECONSUME_TIME] = str(times)
        cfg = self._ensure_topic(target)
        if cfg is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"cannot create {target}")
        placed = await self._append_rows(target, 0, [(msg.body, props, msg.flag, times)],
                                         msg.sys_flag, msg.born_timestamp, self._born_host(conn))
        code, status = await self._await_durable(placed[0][0] + placed[0][1])
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    # --- topic admin ------------------------------------------------------------------------

    def _check_admin(self, cmd: RemotingCommand) -> None:
        token = self.config.admin_token
        if token and cmd.ext_fields.get("adminToken") != token:
            raise _Refused(ResponseCode.NO_PERMISSION, "admin token missing or wrong")

    async def _on_create_topic(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ext = cmd.ext_fields
        try:
            self._check_admin(cmd)
            self._check_writable()
            topic = req_str(ext, "topic")
            if topic == STATE_TOPIC:
                raise _Refused(ResponseCode.NO_PERMISSION, f"topic {topic} is internal")
            read_n = opt_int(ext, "readQueueNums", 8)
            cfg = TopicConfig(topic, read_n, opt_int(ext, "writeQueueNums", read_n),
                              opt_int(ext, "perm", PERM_READ_WRITE),
                              opt_int(ext, "topicSysFlag", 0),
                              ext.get("order", "false").lower() == "true")
        except _Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except (ConfigError, ProtocolError) as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc))
        offset, size = self._write_state(topic_put_record(cfg))
        self.topics.put(cfg)
        self._topics_changed()
        code, status = await self._await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    async def _on_delete_topic(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        try:
            self._check_admin(cmd)
            self._check_writable()
            topic = req_str(cmd.ext_fields, "topic")
        except _Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        if topic == STATE_TOPIC:
            return cmd.response(ResponseCode.NO_PERMISSION, f"topic {topic} is internal")
        offset, size = self._write_state(topic_delete_record(topic))
        self.topics.remove(topic)
        self.state.offsets.drop_topic(topic)
        self.index.drop_topic(topic)
        self._topics_changed()
        code, status = await self._await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    async def _on_all_topics(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, {},
                            {"topicConfigTable": self.topic_configs(),
                             "dataVersion": {"timestamp": int(time.time() * 1000), "counter": 0}})

    # --- retention --------------------------------------------------------------------------

    def _start_retention(self) -> None:
        if self._retention_task is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._retention_task = loop.create_task(self._retention_loop())

    async def _retention_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.retention_interval_s)
            try:
                await self.run_retention()
            except (RmqhaError, OSError) as exc:
                log.error("retention failed: %s", exc)

    def _segment_mtime(self, start: int) -> float | None:
        directory = getattr(self.log, "directory", None)
        if directory is None:
            return None
        try:
            return os.stat(Path(directory) / f"{start:020d}").st_mtime
        except OSError:
            return None

    async def run_retention(self, now: float | None = None) -> int:
        """Delete whole segments last written more than ``file_reserved_hours`` ago.

        Never touches the segment being written, nor anything the index has not passed;
        before deleting state records the master writes a checkpoint (and waits for its
        replication) so the topic and offset tables survive.  Returns the new min offset.
        """
        now = time.time() if now is None else now
        cutoff = now - float(self.config.file_reserved_hours) * 3600.0
        cut = self.log.min_offset
        limit = min(self.index.indexed_offset, self.log.max_offset)
        while True:
            start = self.log.segment_start(cut)
            end = self.log.segment_end(cut)
            if end > limit:
                break
            mtime = self._segment_mtime(start)
            if mtime is None or mtime > cutoff:
                break
            cut = end
        if cut <= self.log.min_offset:
            return self.log.min_offset
        state_q = self.index.queue(STATE_TOPIC, 0)
        needs_checkpoint = (state_q is not None and len(state_q) and state_q.phys[0] < cut
                            and self._last_checkpoint_offset < cut)
        if needs_checkpoint:
            if self.role != "master":
                return self.log.min_offset  # wait for the master's checkpoint to arrive
            offset, size = self._write_state(self.state.checkpoint_record())
            self._last_checkpoint_offset = offset
            code, _ = await self._await_durable(offset + size)
            if code != ResponseCode.SUCCESS:
                log.warning("retention postponed: checkpoint at %d not confirmed", offset)
                return self.log.min_offset
        self.log.delete_segments_before(cut)
        new_min = self.log.min_offset
        self.index.trim_below(new_min)
        log.info("retention deleted segments below %d", new_min)
        if self.on_segments_deleted is not None:
            self.on_segments_deleted(new_min)
        return new_min
