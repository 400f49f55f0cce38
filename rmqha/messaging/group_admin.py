"""Subscription group administration: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200),
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), DELETE_SUBSCRIPTIONGROUP (207).

As topics (see :mod:`rmqha.messaging.topic_admin`): every change is a state record
(``group_put`` / ``group_delete``, :mod:`rmqha.messaging.state`) written by the master and
applied at once, answered once durable, so a group's settings (``consumeMessageOrderly``,
``retryMaxTimes``, ...) replicate with the log and hold on a new master.
"""
from __future__ import annotations

import json
import time

from rmqha.errors import ConfigError, ProtocolError
from rmqha.messaging.context import Handler, MessagingContext, Refused, check_admin_token
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.state import group_delete_record, group_put_record
from rmqha.messaging.state_replication import StateReplication
from rmqha.net.peer import RequestPeer
from rmqha.protocol.code_rules import Kind
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.headers import req_str


class GroupAdmin:
    """Creates, updates, lists and deletes subscription groups."""

    def __init__(self, ctx: MessagingContext, state_log: StateReplication,
                 writer: LogWriter) -> None:
        self.ctx = ctx
        self.state_log = state_log
        self.writer = writer

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.on_update_group,
            rc.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.on_all_groups,
            rc.DELETE_SUBSCRIPTIONGROUP: self.on_delete_group,
        }

    async def on_update_group(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            check_admin_token(self.ctx.config, cmd)
            self.ctx.check_writable()
            try:
                data = json.loads(cmd.body or b"null")
            except ValueError as exc:
                raise ProtocolError(f"subscription group body is not JSON: {exc}") from None
            cfg = SubscriptionGroupConfig.from_rocketmq(data)
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except (ConfigError, ProtocolError) as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        offset, size = self.state_log.write_state(group_put_record(cfg))
        self.ctx.state.groups.put(cfg)
        code, status = await self.writer.await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    async def on_delete_group(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            check_admin_token(self.ctx.config, cmd)
            self.ctx.check_writable()
            name = req_str(cmd.ext_fields, "groupName")
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        offset, size = self.state_log.write_state(group_delete_record(name))
        self.ctx.state.groups.remove(name)
        code, status = await self.writer.await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    async def on_all_groups(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        groups = dict(self.ctx.state.groups.items())
        visible = self.ctx.listed(cmd, conn, Kind.GROUP, groups)  # only the sender's groups
        table = {name: cfg.to_rocketmq() for name, cfg in groups.items() if name in visible}
        return cmd.response(ResponseCode.SUCCESS, None, {}, {
            "subscriptionGroupTable": table,
            "dataVersion": {"timestamp": int(time.time() * 1000), "counter": len(table)}})
