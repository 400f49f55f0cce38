"""The send path: SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE.

A send is checked (master, enough in-sync replicas, a writable topic, created on first
use when allowed), appended through the :class:`~rmqha.messaging.log_writer.LogWriter`
and answered once it is durable by the broker's ack and flush policies.
"""
from __future__ import annotations

import random
import struct
import time
from typing import Any

from rmqha.codes import RequestCode, ResponseCode
from rmqha.errors import ConfigError, ProtocolError, StoreError
from rmqha.messaging.context import (
    MAX_INFLATED_BATCH_BYTES,
    PUT_STATUS_FIELD,
    Handler,
    MessagingContext,
    Refused,
)
from rmqha.messaging.headers import SendHeader
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.message import (
    DecompressError,
    SysFlag,
    decode_batch,
    decompress,
    offset_msg_id,
    strip_compression,
)
from rmqha.messaging.state import STATE_TOPIC
from rmqha.messaging.topic_admin import TopicAdmin
from rmqha.messaging.topics import PERM_WRITE, validate_topic_name
from rmqha.remoting import RemotingCommand

_QOFF = struct.Struct(">q")


class SendPath:
    """Stores what producers send."""

    def __init__(self, ctx: MessagingContext, writer: LogWriter, topics: TopicAdmin) -> None:
        self.ctx = ctx
        self.writer = writer
        self.topic_admin = topics
        # offsetMsgId = hex(store ip, port) + hex(commitlog offset): the host part once.
        self._msg_id_prefix = offset_msg_id(ctx.config.broker_address, 0)[:16]

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.SEND_MESSAGE: self.on_send,
            rc.SEND_MESSAGE_V2: self.on_send,
            rc.SEND_BATCH_MESSAGE: self.on_send,
        }

    async def on_send(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        started = time.perf_counter()
        try:
            resp = await self._send(cmd, conn)
        except Refused as r:
            resp = cmd.response(r.code, r.remark, r.ext)
        m = self.ctx.metrics
        if m is not None:
            status = resp.ext_fields.get(PUT_STATUS_FIELD) or str(resp.code)
            m.send_latency.labels(status).observe(time.perf_counter() - started)
        return resp

    async def _send(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        ctx = self.ctx
        v2 = cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
        try:
            h = SendHeader.from_ext(cmd.ext_fields, v2=v2)
        except ProtocolError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        batch = h.batch or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        ctx.check_writable()
        try:
            validate_topic_name(h.topic)
        except ConfigError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        if h.topic == STATE_TOPIC:
            raise Refused(ResponseCode.NO_PERMISSION, f"topic {h.topic} is internal")
        cfg = self.topic_admin.ensure_topic(h.topic)
        if cfg is None:
            raise Refused(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic {h.topic} does not exist on {ctx.broker_name}")
        if not cfg.perm & PERM_WRITE:
            raise Refused(ResponseCode.NO_PERMISSION, f"topic {h.topic} is not writable")
        queue_id = h.queue_id
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)
        queue_id %= cfg.write_queue_nums
        born_host = ctx.born_host(conn)
        born_ts = h.born_timestamp or int(time.time() * 1000)
        if batch:
            body = cmd.body
            sys_flag = h.sys_flag
            if sys_flag & SysFlag.COMPRESSED:
                # C++ compresses a whole batch over 4 KiB; inflate before splitting.
                try:
                    body = decompress(body, sys_flag, limit=MAX_INFLATED_BATCH_BYTES)
                except DecompressError as exc:
                    raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
                sys_flag = strip_compression(sys_flag)
            try:
                items = decode_batch(body)
            except ProtocolError as exc:
                raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
            if not items:
                raise Refused(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
            rows: list[tuple[bytes, str | dict[str, str], int, int]] = [
                (item.body, item.properties, item.flag, 0) for item in items]
        else:
            rows = [(cmd.body, h.properties, h.flag, h.reconsume_times)]
            sys_flag = h.sys_flag
        try:
            placed = await self.writer.append_rows(h.topic, queue_id, rows, sys_flag, born_ts,
                                                   born_host)
        except StoreError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        first_offset, _ = placed[0]
        last_offset, last_size = placed[-1]
        queue_offset = ctx.queue_offset_at(first_offset)
        if ctx.metrics is not None:
            ctx.metrics.messages_stored.inc(len(placed))
            ctx.metrics.bytes_stored.inc(sum(size for _, size in placed))
        code, status = await self.writer.await_durable(last_offset + last_size)
        prefix = self._msg_id_prefix
        ids = ",".join(prefix + _QOFF.pack(off).hex().upper() for off, _ in placed)
        ext = {"msgId": ids, "queueId": queue_id, "queueOffset": queue_offset,
               PUT_STATUS_FIELD: status, "commitLogOffset": first_offset}
        if code == ResponseCode.SUCCESS:
            remark = None
        elif status == "IN_SYNC_REPLICAS_NOT_ENOUGH":
            remark = (f"in-sync replicas not enough: stored at {first_offset} but held by fewer "
                      f"than min_in_sync_replicas={ctx.config.min_in_sync_replicas} copies")
        else:
            remark = f"{status}: stored at {first_offset} but not confirmed in time"
        return cmd.response(code, remark, ext)
