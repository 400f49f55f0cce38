"""What mqadmin asks a broker about its topics and clients: topicStatus, consumerProgress,
consumerConnection, producerConnection and resetOffsetByTime.

- GET_TOPIC_STATS_INFO (202): each queue's min and max offset and the store time of its
  last message (``TopicStatsTable``), TOPIC_NOT_EXIST for a topic this broker lacks;
- GET_CONSUME_STATS (208): per queue of each topic the group has offsets on (or the one
  asked), the queue's max offset, the group's committed offset (0 when none) and the store
  time of the last message it consumed (``ConsumeStats``);
- GET_CONSUMER_CONNECTION_LIST (203) / GET_PRODUCER_CONNECTION_LIST (204): the clients of
  the group heartbeating this broker, with RocketMQ's answers when there are none
  (CONSUMER_NOT_ONLINE, SYSTEM_ERROR "the producer group[...] not exist");
- QUERY_TOPIC_CONSUME_BY_WHO (300): the groups consuming a topic (queryMsgById's track);
- INVOKE_BROKER_TO_RESET_OFFSET (222): with no consumer of the group online the answer is
  CONSUMER_NOT_ONLINE, as from RocketMQ, and mqadmin then resets the committed offsets itself
  (SEARCH_OFFSET_BY_TIMESTAMP and UPDATE_CONSUMER_OFFSET, which the broker serves).  With
  consumers online RocketMQ's broker pushes the new offsets into them
  (RESET_CONSUMER_CLIENT_OFFSET); rmqha does not, and refuses with a remark saying to stop
  the group's consumers first, changing nothing.

Every answer comes from the consume-queue index, so offsets never pass the confirm offset.
"""
from __future__ import annotations

from typing import Any

from rmqha.messaging.context import Handler, MessagingContext
from rmqha.net.peer import RequestPeer
from rmqha.protocol.admin_bodies import (
    ClientConnection,
    QueueProgress,
    consume_stats_body,
    consumer_connection_body,
    producer_connection_body,
    topic_stats_body,
)
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import ConsumerData, req_str


class AdminStats:
    """The broker's answers to mqadmin's topic, progress and connection queries."""

    def __init__(self, ctx: MessagingContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.GET_TOPIC_STATS_INFO: self.on_topic_stats,
            rc.GET_CONSUME_STATS: self.on_consume_stats,
            rc.GET_CONSUMER_CONNECTION_LIST: self.on_consumer_connections,
            rc.GET_PRODUCER_CONNECTION_LIST: self.on_producer_connections,
            rc.INVOKE_BROKER_TO_RESET_OFFSET: self.on_reset_offset,
            rc.QUERY_TOPIC_CONSUME_BY_WHO: self.on_consumed_by,
        }

    def _last_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """The store time of the message at queue ``offset`` (0 when the index has none)."""
        q = self.ctx.index.queue(topic, queue_id)
        if q is None or not q.base <= offset < q.base + len(q):
            return 0
        return self.ctx.store_timestamp(q.phys[offset - q.base])

    async def on_topic_stats(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        topic = req_str(cmd.ext_fields, "topic")
        config = self.ctx.topics.get(topic)
        if config is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        rows = []
        for qid in range(config.write_queue_nums):
            lo, hi = self.ctx.queue_bounds(topic, qid)
            rows.append(((topic, self.ctx.broker_name, qid), lo, hi,
                         self._last_store_time(topic, qid, hi - 1) if hi > 0 else 0))
        return cmd.response(ResponseCode.SUCCESS, None, {}, topic_stats_body(rows))

    async def on_consume_stats(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group = req_str(cmd.ext_fields, "consumerGroup")
        asked = (cmd.ext_fields.get("topic") or "").strip()
        listed = [t for t in (cmd.ext_fields.get("topicList") or "").split(";") if t]
        topics = set(listed) or ({asked} if asked else self.ctx.state.offsets.topics_of(group))
        progress = []
        for topic in sorted(topics):
            config = self.ctx.topics.get(topic)
            if config is None:
                continue  # as RocketMQ: a topic without config is skipped
            for qid in range(config.read_queue_nums):
                committed = max(self.ctx.state.offsets.get(group, topic, qid) or 0, 0)
                progress.append(QueueProgress(
                    (topic, self.ctx.broker_name, qid), self.ctx.queue_bounds(topic, qid)[1], committed,
                    self._last_store_time(topic, qid, committed - 1) if committed > 0 else 0))
        return cmd.response(ResponseCode.SUCCESS, None, {}, consume_stats_body(progress))

    async def on_consumer_connections(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group = req_str(cmd.ext_fields, "consumerGroup")
        members = self.ctx.clients.consumers(group)
        if not members:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        data = members[-1].consumers.get(group) or ConsumerData(group)
        subscriptions: dict[str, str] = {}
        for member in members:
            subscriptions.update(member.subscriptions.get(group, {}))
        body = consumer_connection_body(
            [_connection(m) for m in members], subscriptions, consume_type=data.consume_type,
            message_model=data.message_model, consume_from_where=data.consume_from_where)
        return cmd.response(ResponseCode.SUCCESS, None, {}, body)

    async def on_producer_connections(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group = req_str(cmd.ext_fields, "producerGroup")
        members = self.ctx.clients.producer_members(group)
        if not members:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return cmd.response(ResponseCode.SUCCESS, None, {},
                            producer_connection_body([_connection(m) for m in members]))

    async def on_consumed_by(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO (queryMsgById's track): the groups with offsets on the
        topic or a member subscribed to it (``GroupList``)."""
        topic = req_str(cmd.ext_fields, "topic")
        groups = {str(g) for g, t, _, _ in self.ctx.state.offsets.entries() if t == topic}
        for group in self.ctx.clients.consumer_groups():
            if any(topic in m.subscriptions.get(group, {}) for m in self.ctx.clients.consumers(group)):
                groups.add(group)
        return cmd.response(ResponseCode.SUCCESS, None, {}, {"groupList": sorted(groups)})

    async def on_reset_offset(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group = req_str(cmd.ext_fields, "group")
        if not self.ctx.clients.consumers(group):
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE,
                                f"Consumer not online, so can not reset offset, Group: {group}")
        return cmd.response(ResponseCode.SYSTEM_ERROR,
                            f"rmqha does not push reset offsets into running consumers: stop the consumers "
                            f"of group {group} first, then reset (the offsets stay as they are)")


def _connection(member: Any) -> ClientConnection:
    peer = getattr(member.connection, "peer", "") or ""
    return ClientConnection(member.client_id, str(peer), member.language, member.version)
