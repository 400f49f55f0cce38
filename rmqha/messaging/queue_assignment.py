"""QUERY_ASSIGNMENT (400) and SET_MESSAGE_REQUEST_MODE (401): RocketMQ 5's server-side
queue assignment, as its ``QueryAssignmentProcessor`` answers them.

SET_MESSAGE_REQUEST_MODE (an admin request, ``adminToken`` when the broker has one)
stores a topic/group's mode (PULL, or POP with ``popShareQueueNum``) as a state record
written by the master and answered once durable, so slaves and a new master know it.  It
is refused, changing nothing, for a ``%RETRY%`` topic (NO_PERMISSION), a topic this
broker does not have (TOPIC_NOT_EXIST), a group it does not have (SUBSCRIPTION_GROUP_NOT_EXIST,
unless ``auto_create_subscription_group``) and a body that is not RocketMQ's
SetMessageRequestModeRequestBody (INVALID_PARAMETER naming the field).

QUERY_ASSIGNMENT answers a consumer its MessageQueueAssignment set by the rules of
:mod:`rmqha.messaging.assignment`: the topic's queues are those of its route at the name
servers (kept ``ROUTE_TTL_S``, as RocketMQ's broker refreshes routes; a broker without
name servers uses its own topic table), the group's consumers those that heartbeat this
broker.  Any replica answers it.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rmqha.errors import ProtocolError, RemoteCommandError, RemotingError
from rmqha.messaging.assignment import (
    MQ,
    AssignmentQuery,
    ModeSetting,
    RequestMode,
    assign,
    assignments_json,
    effective_mode,
    parse_mode,
    readable_queues,
)
from rmqha.messaging.context import Handler, MessagingContext, Refused, check_admin_token
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.state import request_mode_record
from rmqha.messaging.state_replication import StateReplication
from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import RouteInfoHeader
from rmqha.protocol.route import TopicRoute
from rmqha.protocol.topics import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

#: ``route(topic)``: the topic's (brokerName, readQueueNums, perm) from the name servers;
#: None when no name server knows the topic, RemotingError when none answers.
RouteSource = Callable[[str], Awaitable[list[tuple[str, int, int]] | None]]

#: ``request(name server address, command)``: the broker's own link to a name server.
NamesrvRequest = Callable[[str, RemotingCommand], Awaitable[RemotingCommand]]

#: How long a topic's queues from the name servers are used (RocketMQ's broker: 30 s).
ROUTE_TTL_S = 30.0


def namesrv_route_source(addresses: list[str], request: NamesrvRequest) -> RouteSource:
    """A :data:`RouteSource` asking the name servers in turn (GET_ROUTEINFO_BY_TOPIC)."""

    async def route(topic: str) -> list[tuple[str, int, int]] | None:
        last: Exception = RemotingError("no name server is configured")
        for addr in addresses:
            cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                          RouteInfoHeader(topic=topic).build())
            try:
                resp = await request(addr, cmd)
                if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                    return None
                resp.check_success()
                found = TopicRoute.from_json(topic, resp.json_body() or {})
            except (RemotingError, ProtocolError, RemoteCommandError) as exc:
                last = exc
                continue
            return [(q.broker_name, q.read_queue_nums, q.perm) for q in found.queue_datas]
        raise RemotingError(f"no name server answered the route of {topic}: {last}")

    return route


def _json_object(cmd: RemotingCommand, what: str) -> dict[str, Any]:
    try:
        body = json.loads(cmd.body or b"null")
    except ValueError as exc:
        raise ProtocolError(f"{what} body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} body is not a JSON object")
    return body


def parse_mode_request(body: dict[str, Any]) -> tuple[str, str, ModeSetting]:
    """(topic, group, setting) of a SetMessageRequestModeRequestBody."""
    topic, group = body.get("topic"), body.get("consumerGroup")
    if not isinstance(topic, str) or not topic:
        raise ProtocolError("SET_MESSAGE_REQUEST_MODE body has no topic")
    if not isinstance(group, str) or not group:
        raise ProtocolError("SET_MESSAGE_REQUEST_MODE body has no consumerGroup")
    share = body.get("popShareQueueNum", 0)
    if isinstance(share, bool) or not isinstance(share, int):
        raise ProtocolError(f"popShareQueueNum {share!r} is not an integer")
    return topic, group, ModeSetting(parse_mode(body.get("mode", "PULL")), share)


class QueueAssignment:
    """The two request codes, the route cache, and the modes in the broker state."""

    def __init__(self, ctx: MessagingContext, state_log: StateReplication, writer: LogWriter,
                 route: RouteSource | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.state_log = state_log
        self.writer = writer
        self.route = route
        self._clock = clock
        self._routes: dict[str, tuple[float, list[MQ] | None]] = {}

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.QUERY_ASSIGNMENT: self.on_query_assignment,
                RequestCode.SET_MESSAGE_REQUEST_MODE: self.on_set_request_mode}

    # --- SET_MESSAGE_REQUEST_MODE ---------------------------------------------------------

    async def on_set_request_mode(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            check_admin_token(self.ctx.config, cmd)
            topic, group, setting = parse_mode_request(_json_object(cmd, "SET_MESSAGE_REQUEST_MODE"))
            self._check_mode_target(topic, group)
            self.ctx.check_writable()
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        offset, size = self.state_log.write_state(request_mode_record(topic, group, setting))
        self.ctx.state.request_modes.put(topic, group, setting)
        code, status = await self.writer.await_durable(offset + size)
        return cmd.response(code, None if code == ResponseCode.SUCCESS else status, {})

    def _check_mode_target(self, topic: str, group: str) -> None:
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise Refused(ResponseCode.NO_PERMISSION, "retry topic is not allowed to set mode")
        if self.ctx.topics.get(topic) is None:
            raise Refused(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        known = self.ctx.state.groups.get(group) is not None
        if not known and not self.ctx.config.auto_create_subscription_group:
            raise Refused(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                          f"subscription group {group} does not exist")

    # --- QUERY_ASSIGNMENT -----------------------------------------------------------------

    async def on_query_assignment(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            query = AssignmentQuery.from_json(_json_object(cmd, "QUERY_ASSIGNMENT"))
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        cfg = self.ctx.config
        setting = effective_mode(query.topic, self.ctx.state.request_modes.get(query.topic, query.group),
                                 RequestMode(cfg.default_message_request_mode),
                                 cfg.default_pop_share_queue_num)
        mqs = await self.queues(query.topic)
        cids = [c.client_id for c in self.ctx.clients.consumers(query.group)]
        result = None if mqs is None else assign(query, mqs, cids, setting)
        if result is None:
            log.info("QUERY_ASSIGNMENT: no assignment for %s of group %s on topic %s (queues %s, "
                     "consumers %s, strategy %s)", query.client_id, query.group, query.topic,
                     mqs, cids, query.strategy)
        return cmd.response(ResponseCode.SUCCESS, None, {}, assignments_json(result, setting.mode))

    async def queues(self, topic: str) -> list[MQ] | None:
        """The topic's readable queues (None: unknown), from the route cache when fresh."""
        if self.route is None:
            config = self.ctx.topics.get(topic)
            return None if config is None else readable_queues(
                topic, [(self.ctx.broker_name, config.read_queue_nums, config.perm)])
        cached = self._routes.get(topic)
        if cached is not None and self._clock() - cached[0] < ROUTE_TTL_S:
            return cached[1]
        try:
            datas = await self.route(topic)
        except RemotingError as exc:
            log.warning("QUERY_ASSIGNMENT: route of %s unavailable (%s)%s", topic, exc,
                        "; using the cached one" if cached else "")
            return None if cached is None else cached[1]
        mqs = None if datas is None else readable_queues(topic, datas)
        self._routes[topic] = (self._clock(), mqs)
        return mqs
