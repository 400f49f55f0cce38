"""Client bookkeeping requests: heartbeats, unregistering, group membership, queue locks.

The tables live in :mod:`rmqha.messaging.clients` (per broker, never replicated); this
module answers the requests that change or read them, and tells a consumer group's
members to rebalance when its membership changes.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ProtocolError, RmqhaError
from rmqha.messaging.clients import mq_json, parse_mq_set
from rmqha.messaging.context import Handler, MessagingContext
from rmqha.protocol.headers import (
    ConsumerIdsChangedHeader,
    ConsumerListHeader,
    HeartbeatData,
    UnregisterClientHeader,
)
from rmqha.protocol.topics import RETRY_GROUP_TOPIC_PREFIX
from rmqha.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from rmqha.messaging.topic_admin import TopicAdmin

log = logging.getLogger(__name__)


class ClientRequests:
    """HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK/UNLOCK_BATCH_MQ."""

    def __init__(self, ctx: MessagingContext, topic_admin: TopicAdmin) -> None:
        self.ctx = ctx
        self.topic_admin = topic_admin

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.HEART_BEAT: self.on_heartbeat,
            rc.UNREGISTER_CLIENT: self.on_unregister,
            rc.GET_CONSUMER_LIST_BY_GROUP: self.on_consumer_list,
            rc.LOCK_BATCH_MQ: self.on_lock,
            rc.UNLOCK_BATCH_MQ: self.on_unlock,
        }

    async def on_heartbeat(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            data = HeartbeatData.parse(json.loads(cmd.body or b"{}"))
        except (ValueError, ProtocolError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat: {exc}")
        info = self.ctx.clients.heartbeat(data, conn, language=str(cmd.language), version=int(cmd.version))
        if conn is not None and hasattr(conn, "add_close_callback") and not getattr(
                conn, "attributes", {}).get("rmqha_client_watch"):
            conn.attributes["rmqha_client_watch"] = True
            conn.add_close_callback(self._client_connection_closed)
        if self.ctx.role == "master":
            for group in info.consumer_groups:
                self.topic_admin.ensure_topic(RETRY_GROUP_TOPIC_PREFIX + group)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    def _client_connection_closed(self, conn: RequestPeer) -> None:
        for client_id in self.ctx.clients.connection_closed(conn):
            self.ctx.locks.release_client(client_id)

    async def on_unregister(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        h = UnregisterClientHeader.parse(cmd.ext_fields)
        self.ctx.clients.unregister(h.client_id, h.consumer_group, h.producer_group)
        if h.client_id and h.consumer_group:
            self.ctx.locks.release_client(h.client_id, h.consumer_group)
        return cmd.response(ResponseCode.SUCCESS, None, {})

    async def on_consumer_list(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group = ConsumerListHeader.parse(cmd.ext_fields).consumer_group
        ids = [c.client_id for c in self.ctx.clients.consumers(group)]
        if not ids:
            # RocketMQ's ConsumerManageProcessor answers an unknown or empty group so.
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(ResponseCode.SUCCESS, None, {}, {"consumerIdList": ids})

    def group_changed(self, group: str) -> None:
        """Tell the group's members to rebalance now (NOTIFY_CONSUMER_IDS_CHANGED, one-way)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for info in self.ctx.clients.consumers(group):
            conn = info.connection
            if conn is None or getattr(conn, "closed", True):
                continue
            req = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                          ConsumerIdsChangedHeader(consumer_group=group).build(),
                                          oneway=True)
            task = loop.create_task(self._notify(conn, req))
            self.ctx.tasks.add(task)
            task.add_done_callback(self.ctx.tasks.discard)

    @staticmethod
    async def _notify(conn: RequestPeer, req: RemotingCommand) -> None:
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

    async def on_lock(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group, client, mqs = self._lock_body(cmd)
        held = self.ctx.locks.lock(group, client, mqs)
        return cmd.response(ResponseCode.SUCCESS, None, {},
                            {"lockOKMQSet": [mq_json(m) for m in held]})

    async def on_unlock(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        group, client, mqs = self._lock_body(cmd)
        self.ctx.locks.unlock(group, client, mqs)
        return cmd.response(ResponseCode.SUCCESS, None, {})
