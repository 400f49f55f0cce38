"""Topic administration: creating topics (by request or on first use), deleting, listing.

A create or update may carry RocketMQ 5's ``attributes`` (``+message.type=FIFO``), merged
into the topic's by RocketMQ's rules (:mod:`rmqha.protocol.topic_attributes`).

Every change is a state record (see :mod:`rmqha.messaging.state`), written by the master
and applied at once, so topic configs replicate with the log.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from rmqha.net.peer import RequestPeer
from rmqha.protocol.code_rules import Kind
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ConfigError, ProtocolError
from rmqha.messaging.context import check_admin_token, Handler, MessagingContext, Refused
from rmqha.protocol.headers import CreateTopicHeader, DeleteTopicHeader
from rmqha.protocol.topic_attributes import (
    TopicMessageType,
    alter,
    parse_modification,
    topic_message_type,
)
from rmqha.messaging.state import STATE_TOPIC, topic_delete_record, topic_put_record
from rmqha.protocol.topics import (
    DEFAULT_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_INHERIT,
    PERM_READ_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfig,
)
from rmqha.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from rmqha.messaging.log_writer import LogWriter


class StateWriter(Protocol):
    """What topic administration needs of the state log: a record written and applied
    (:class:`rmqha.messaging.state_replication.StateReplication`, which imports this module
    to seed the default topic, so this side names only the method)."""

    def write_state(self, body: bytes, *, wait_flush: bool = True) -> tuple[int, int]: ...


def seed_default_topic(ctx: MessagingContext) -> None:
    """TBW102 (the C++ client's fallback route) exists on every broker."""
    if DEFAULT_TOPIC not in ctx.topics:
        n = max(1, int(ctx.config.default_topic_queue_nums))
        ctx.topics.put(TopicConfig(DEFAULT_TOPIC, n, n, PERM_READ_WRITE | PERM_INHERIT),
                       persist=False)


class TopicAdmin:
    """UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER, GET_ALL_TOPIC_CONFIG, auto-creation."""

    def __init__(self, ctx: MessagingContext, state_log: StateWriter,
                 writer: LogWriter) -> None:
        self.ctx = ctx
        self.state_log = state_log
        self.writer = writer

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.UPDATE_AND_CREATE_TOPIC: self.on_create_topic,
            rc.DELETE_TOPIC_IN_BROKER: self.on_delete_topic,
            rc.GET_ALL_TOPIC_CONFIG: self.on_all_topics,
            rc.GET_TOPIC_CONFIG: self.on_topic_config,
        }

    def topic_configs(self) -> dict[str, dict[str, Any]]:
        """Topic -> RocketMQ TopicConfig JSON, for name-server registration."""
        return {name: cfg.to_rocketmq() for name, cfg in self.ctx.topics.items()
                if name != STATE_TOPIC}

    def ensure_topic(self, topic: str, queue_nums: int | None = None,
                     perm: int = PERM_READ_WRITE) -> TopicConfig | None:
        ctx = self.ctx
        cfg = ctx.topics.get(topic)
        if cfg is not None:
            return cfg
        retry = topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
        if not (retry or ctx.config.auto_create_topic_enable) or ctx.role != "master":
            return None
        n = 1 if retry else (queue_nums or max(1, int(ctx.config.default_topic_queue_nums)))
        cfg = TopicConfig(topic, n, n, perm)
        self.state_log.write_state(topic_put_record(cfg))
        ctx.topics.put(cfg)
        ctx.topics_changed()
        return cfg

    async def on_create_topic(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            check_admin_token(self.ctx.config, cmd)
            self.ctx.check_writable()
            h = CreateTopicHeader.parse(cmd.ext_fields)
            if h.topic == STATE_TOPIC:
                raise Refused(ResponseCode.NO_PERMISSION, f"topic {h.topic} is internal")
            write_n = h.read_queue_nums if h.write_queue_nums is None else h.write_queue_nums
            cfg = TopicConfig(h.topic, h.read_queue_nums, write_n, h.perm, h.topic_sys_flag,
                              h.order, self._attributes(h.topic, cmd.ext_fields.get("attributes")))
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except (ConfigError, ProtocolError) as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc))
        offset, size = self.state_log.write_state(topic_put_record(cfg))
        self.ctx.topics.put(cfg)
        self.ctx.topics_changed()
        code, status = await self.writer.await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    def _attributes(self, topic: str, modification: str | None) -> dict[str, str]:
        """The topic's attributes after a request's ``attributes`` (``+k=v,-k``; RocketMQ's
        rules, see :mod:`rmqha.protocol.topic_attributes`); ConfigError says why not."""
        current = self.ctx.topics.get(topic)
        out = alter({} if current is None else current.attributes,
                    parse_modification(modification), create=current is None)
        if topic_message_type(out) is TopicMessageType.MIXED:
            raise ConfigError("MIXED message type is not supported.")
        return out

    async def on_delete_topic(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ctx = self.ctx
        try:
            check_admin_token(self.ctx.config, cmd)
            ctx.check_writable()
            topic = DeleteTopicHeader.parse(cmd.ext_fields).topic
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        if topic == STATE_TOPIC:
            return cmd.response(ResponseCode.NO_PERMISSION, f"topic {topic} is internal")
        offset, size = self.state_log.write_state(topic_delete_record(topic))
        ctx.topics.remove(topic)
        ctx.state.offsets.drop_topic(topic)
        ctx.index.drop_topic(topic)
        ctx.topics_changed()
        code, status = await self.writer.await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    async def on_all_topics(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        """Only the topics the sender may see (PUB or SUB on each; a retry topic: its group)."""
        configs = self.topic_configs()
        visible = self.ctx.listed(cmd, conn, Kind.TOPIC, configs)
        table = {name: cfg for name, cfg in configs.items() if name in visible}
        return cmd.response(ResponseCode.SUCCESS, None, {},
                            {"topicConfigTable": table,
                             "dataVersion": {"timestamp": int(time.time() * 1000), "counter": 0}})

    async def on_topic_config(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        """GET_TOPIC_CONFIG (RocketMQ 5's ``TopicConfigAndQueueMapping``: the topic's
        config; rmqha has no static topics, so no ``mappingDetail``)."""
        topic = str(cmd.ext_fields.get("topic") or "")
        config = self.ctx.topics.get(topic)
        if config is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}")
        return cmd.response(ResponseCode.SUCCESS, None, {}, config.to_rocketmq())
