"""Consumer retries: CONSUMER_SEND_MSG_BACK moves a message to %RETRY%group or %DLQ%group."""
from __future__ import annotations


from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import StoreError
from rmqha.messaging.context import MAX_RECONSUME_TIMES, Handler, MessagingContext, Refused
from rmqha.protocol.headers import opt_int, req_int, req_str
from rmqha.messaging.delayed_delivery import DelayedDelivery
from rmqha.messaging.log_writer import LogWriter
from rmqha.protocol.message import Prop, decode_record, offset_msg_id
from rmqha.messaging.topic_admin import TopicAdmin
from rmqha.protocol.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from rmqha.protocol.command import RemotingCommand


class SendBack:
    """Re-stores a message a consumer failed on, for the group to consume again."""

    def __init__(self, ctx: MessagingContext, writer: LogWriter, topic_admin: TopicAdmin,
                 delayed: DelayedDelivery) -> None:
        self.ctx = ctx
        self.writer = writer
        self.topic_admin = topic_admin
        self.delayed = delayed

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.CONSUMER_SEND_MSG_BACK: self.on_send_back}

    async def on_send_back(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ctx = self.ctx
        ext = cmd.ext_fields
        group = req_str(ext, "group")
        offset = req_int(ext, "offset")
        delay_level = opt_int(ext, "delayLevel", 0)
        max_times = opt_int(ext, "maxReconsumeTimes", MAX_RECONSUME_TIMES)
        try:
            ctx.check_writable()
            raw = ctx.read_record(offset)
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except StoreError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        msg, _ = decode_record(raw, inflate=False)
        try:
            # The record's own topic: a copy into the sender's retry topic is a read of it.
            ctx.check_record(cmd, conn, offset, msg.topic)
        except Refused as r:
            return cmd.response(r.code, r.remark)
        props = dict(msg.properties)
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        props.setdefault(Prop.ORIGIN_MESSAGE_ID,
                         ext.get("originMsgId") or props.get(Prop.UNIQ_KEY)
                         or offset_msg_id(ctx.config.broker_address, offset))
        times = msg.reconsume_times + 1
        if msg.reconsume_times >= max_times or delay_level < 0:
            target = DLQ_GROUP_TOPIC_PREFIX + group
        else:
            target = RETRY_GROUP_TOPIC_PREFIX + group
        props[Prop.RECONSUME_TIME] = str(times)
        cfg = self.topic_admin.ensure_topic(target)
        if cfg is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"cannot create {target}")
        topic, queue_id = target, 0
        for key in (Prop.DELAY, Prop.TIMER_DELIVER_MS, Prop.TIMER_DELAY_SEC, Prop.TIMER_DELAY_MS,
                    Prop.TIMER_OUT_MS, Prop.REAL_TOPIC, Prop.REAL_QID):
            props.pop(key, None)
        if target.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # RocketMQ: the retry waits delay level 3 + reconsumeTimes (10s, 30s, 1m, ...)
            # unless the consumer asked for a level.
            props[Prop.DELAY] = str(delay_level if delay_level > 0 else 3 + msg.reconsume_times)
            where = self.delayed.transform(target, 0, props)
            if where is not None:
                topic, queue_id = where
        placed = await self.writer.append_rows(topic, queue_id,
                                               [(msg.body, props, msg.flag, times)],
                                               msg.sys_flag, msg.born_timestamp,
                                               ctx.born_host(conn))
        code, status = await self.writer.await_durable(placed[0][0] + placed[0][1])
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})
