"""Lookups on queues and the log: min/max offsets, offset by time, a message by offset."""
from __future__ import annotations


from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, StoreError
from rmqha.messaging.context import Handler, MessagingContext, Refused
from rmqha.messaging.state import STATE_TOPIC
from rmqha.protocol.headers import ViewMessageHeader, opt_int, req_int, req_str
from rmqha.protocol.message import decode_record
from rmqha.protocol.command import RemotingCommand


class QueueQueries:
    """GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME,
    VIEW_MESSAGE_BY_ID (all answered from the index, so never past the confirm offset;
    the broker's own state records are not shown)."""

    def __init__(self, ctx: MessagingContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.GET_MAX_OFFSET: self.on_max_offset,
            rc.GET_MIN_OFFSET: self.on_min_offset,
            rc.SEARCH_OFFSET_BY_TIMESTAMP: self.on_search_offset,
            rc.GET_EARLIEST_MSG_STORETIME: self.on_earliest_time,
            rc.VIEW_MESSAGE_BY_ID: self.on_view_message,
        }

    async def on_max_offset(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        topic, qid = req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")
        return cmd.response(ResponseCode.SUCCESS, None,
                            {"offset": self.ctx.queue_bounds(topic, qid)[1]})

    async def on_min_offset(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        topic, qid = req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")
        return cmd.response(ResponseCode.SUCCESS, None,
                            {"offset": self.ctx.queue_bounds(topic, qid)[0]})

    async def on_search_offset(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ctx = self.ctx
        ext = cmd.ext_fields
        topic, qid = req_str(ext, "topic"), req_int(ext, "queueId")
        ts = opt_int(ext, "timestamp", 0)
        q = ctx.index.queue(topic, qid)
        if q is None or not len(q):
            return cmd.response(ResponseCode.SUCCESS, None,
                                {"offset": ctx.queue_bounds(topic, qid)[1]})
        # RocketMQ 5's boundaryType: LOWER (the default) = the first entry stored at or
        # after ts; UPPER = the last entry stored at or before it.
        upper = (ext.get("boundaryType") or "LOWER").upper() == "UPPER"
        lo, hi = 0, len(q)
        while lo < hi:  # LOWER: first entry stored at or after ts; UPPER: first after ts
            mid = (lo + hi) // 2
            stored = ctx.store_timestamp(q.phys[mid])
            if stored < ts or (upper and stored == ts):
                lo = mid + 1
            else:
                hi = mid
        if upper:
            lo = max(lo - 1, 0)
        return cmd.response(ResponseCode.SUCCESS, None, {"offset": q.base + lo})

    async def on_earliest_time(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        topic, qid = req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")
        q = self.ctx.index.queue(topic, qid)
        ts = self.ctx.store_timestamp(q.phys[0]) if q is not None and len(q) else 0
        return cmd.response(ResponseCode.SUCCESS, None, {"timestamp": ts})

    async def on_view_message(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        offset = ViewMessageHeader.parse(cmd.ext_fields).offset
        try:
            body = self.ctx.read_record(offset)
            topic = decode_record(body, inflate=False)[0].topic
        except (StoreError, ProtocolError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no message at {offset}: {exc}")
        if topic == STATE_TOPIC:
            # The broker's own state (it holds the pop receipt-handle key).
            return cmd.response(ResponseCode.NO_PERMISSION, f"the record at {offset} is internal")
        try:
            self.ctx.check_record(cmd, conn, offset, topic)
        except Refused as r:
            return cmd.response(r.code, r.remark)
        return cmd.response(ResponseCode.SUCCESS, None, {}, body)
