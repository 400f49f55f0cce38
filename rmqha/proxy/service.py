"""``apache.rocketmq.v2.MessagingService`` on grpc.aio: the glue between gRPC calls and
the proxy's activities.

Each RPC reads its :class:`~rmqha.proxy.calls.Call`, passes the ACL when it is on
(:mod:`rmqha.proxy.auth`, with the resources the RPC names), and hands the request to
:class:`~rmqha.proxy.client_activity.ClientActivity`,
:class:`~rmqha.proxy.producing.Producing` or :class:`~rmqha.proxy.consuming.Consuming`.
A refusal (:class:`~rmqha.errors.ProxyError`) becomes the response's ``status``, as
RocketMQ's proxy answers: the call itself succeeds.  Telemetry is the exception: bad
Settings end the stream with INVALID_ARGUMENT, as RocketMQ's does.  RPCs rmqha does not
serve (PullMessage, offsets, RecallMessage, lite topics) answer NOT_IMPLEMENTED.

What an RPC's topics and groups need is the declaration of the request code it stands for
(:data:`RPC_CODES`, :mod:`rmqha.protocol.code_rules`): the same table the brokers decide
by, so a gRPC client may do what a remoting client of the same account may.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc

from rmqha.errors import ProxyError, RmqhaError
from rmqha.protocol.code_rules import RULES, Kind, Need
from rmqha.protocol.codes import RequestCode
from rmqha.proxy import auth
from rmqha.proxy.calls import Call, call_of
from rmqha.proxy.client_activity import ClientActivity
from rmqha.proxy.clients import ClientRegistry, Stream
from rmqha.proxy.consuming import Consuming
from rmqha.proxy.producing import Producing
from rmqha.proxy.status import Code
from rmqha.security.acl import AclValidator, Perm

log = logging.getLogger(__name__)

Op = Callable[[Any, Call], Awaitable[Any]]
NeedsOf = Callable[[Any], auth.Needs]


#: The request code each served RPC stands for.  Telemetry's Settings are a heartbeat.
RPC_CODES: Mapping[str, RequestCode] = {
    "QueryRoute": RequestCode.GET_ROUTEINFO_BY_TOPIC,
    "QueryAssignment": RequestCode.QUERY_ASSIGNMENT,
    "Heartbeat": RequestCode.HEART_BEAT,
    "NotifyClientTermination": RequestCode.UNREGISTER_CLIENT,
    "SendMessage": RequestCode.SEND_MESSAGE_V2,
    "EndTransaction": RequestCode.END_TRANSACTION,
    "ReceiveMessage": RequestCode.POP_MESSAGE,
    "AckMessage": RequestCode.ACK_MESSAGE,
    "ChangeInvisibleDuration": RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
    "ForwardMessageToDeadLetterQueue": RequestCode.CONSUMER_SEND_MSG_BACK,
    "Telemetry": RequestCode.HEART_BEAT,
}
#: RPCs answered NOT_IMPLEMENTED: they stand for no code.
UNSERVED_RPCS = frozenset({"PullMessage", "UpdateOffset", "GetOffset", "QueryOffset", "RecallMessage",
                           "SyncLiteSubscription"})
_PERM = {Need.PUB: Perm.PUB, Need.SUB: Perm.SUB, Need.ANY: Perm.ANY}


def needs_of(rpc: str, topics: Iterable[str] = (), groups: Iterable[str] = ()) -> auth.Needs:
    """What ``rpc`` naming ``topics`` and ``groups`` needs, by its code's declaration:
    each topic the declared topic permission, each group SUB (a code declaring no group
    resource asks nothing of a group the message names)."""
    rule = RULES[RPC_CODES[rpc]]
    topic_needs = [r.need for r in rule.resources if r.kind == Kind.TOPIC]
    has_group = any(r.kind == Kind.GROUP for r in rule.resources)
    return auth.Needs({t: _PERM[topic_needs[0]] for t in topics} if topic_needs else {},
                      {g: Perm.SUB for g in groups} if has_group else {})


def _topic_and_group(rpc: str) -> NeedsOf:
    return lambda r: needs_of(rpc, [r.topic.name], [r.group.name])


def _settings_needs(command: Any) -> auth.Needs:
    s = command.settings
    if s.WhichOneof("pub_sub") == "publishing":
        # A producer's Settings name the topics it will send to: what a send needs.
        return needs_of("SendMessage", [t.name for t in s.publishing.topics])
    sub = s.subscription
    return needs_of("Telemetry", [e.topic.name for e in sub.subscriptions], [sub.group.name])


class MessagingService(service_pb2_grpc.MessagingServiceServicer):  # type: ignore[misc]
    """The servicer: every RPC of ``MessagingService``."""

    def __init__(self, activity: ClientActivity, producing: Producing, consuming: Consuming,
                 clients: ClientRegistry, acl: AclValidator | None) -> None:
        self.activity = activity
        self.producing = producing
        self.consuming = consuming
        self.clients = clients
        self.acl = acl

    # --- the common path ---------------------------------------------------------------

    def _admit(self, request: Any, context: Any, needs: NeedsOf) -> Call:
        call = call_of(context)
        if self.acl is not None:
            self.acl.reload_if_changed()
            auth.check(self.acl.config, call.metadata, call.peer_host, needs(request))
        return call

    async def _unary(self, request: Any, context: Any, answer: type, needs: NeedsOf, op: Op) -> Any:
        try:
            return await op(request, self._admit(request, context, needs))
        except ProxyError as exc:
            return answer(status=pb.Status(code=exc.code, message=exc.message))
        except (RmqhaError, OSError) as exc:
            log.exception("%s failed", answer.__name__)
            return answer(status=pb.Status(code=Code.INTERNAL_SERVER_ERROR, message=str(exc)))

    # --- routes and clients ------------------------------------------------------------

    async def QueryRoute(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.QueryRouteResponse,
                                 lambda r: needs_of("QueryRoute", [r.topic.name]), self.activity.query_route)

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.QueryAssignmentResponse,
                                 _topic_and_group("QueryAssignment"), self.activity.query_assignment)

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.HeartbeatResponse,
                                 lambda r: needs_of("Heartbeat", groups=[r.group.name]), self.activity.heartbeat)

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.NotifyClientTerminationResponse,
                                 lambda r: needs_of("NotifyClientTermination", groups=[r.group.name]),
                                 self.activity.terminate)

    # --- producers ---------------------------------------------------------------------

    async def SendMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.SendMessageResponse,
                                 lambda r: needs_of("SendMessage", [m.topic.name for m in r.messages]),
                                 self.producing.send)

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.EndTransactionResponse,
                                 lambda r: needs_of("EndTransaction", [r.topic.name]),
                                 self.producing.end_transaction)

    # --- consumers ---------------------------------------------------------------------

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            call = self._admit(request, context, lambda r: needs_of(
                "ReceiveMessage", [r.message_queue.topic.name], [r.group.name]))
        except ProxyError as exc:
            yield spb.ReceiveMessageResponse(status=pb.Status(code=exc.code, message=exc.message))
            return
        async for response in self.consuming.receive(request, call, self.clients.settings(call.client_id)):
            yield response

    async def AckMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.AckMessageResponse,
                                 _topic_and_group("AckMessage"), self.consuming.ack)

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.ChangeInvisibleDurationResponse,
                                 _topic_and_group("ChangeInvisibleDuration"), self.consuming.change_invisible)

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        return await self._unary(request, context, spb.ForwardMessageToDeadLetterQueueResponse,
                                 _topic_and_group("ForwardMessageToDeadLetterQueue"), self.consuming.forward_to_dlq)

    # --- Telemetry ---------------------------------------------------------------------

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        stream: Stream = asyncio.Queue()
        try:
            call = call_of(context)
        except ProxyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
            return
        reader = asyncio.create_task(self._read_telemetry(request_iterator, context, call, stream))
        try:
            while (item := await stream.get()) is not None:
                if isinstance(item, ProxyError):
                    await context.abort(_abort_code(item), f"process client telemetryCommand failed. {item.message}")
                    return
                yield item
        finally:
            reader.cancel()
            self.clients.stream_closed(call.client_id, stream)

    async def _read_telemetry(self, requests: Any, context: Any, call: Call, stream: Stream) -> None:
        try:
            async for command in requests:
                if command.WhichOneof("command") != "settings":
                    continue  # thread stacks and verify results: nothing asked them here
                if self.acl is not None:
                    auth.check(self.acl.config, call.metadata, call.peer_host, _settings_needs(command))
                stream.put_nowait(await self.activity.settings(command, call, stream))
        except ProxyError as exc:
            stream.put_nowait(exc)
            return
        except (RmqhaError, OSError) as exc:
            log.exception("telemetry of %s failed", call.client_id)
            stream.put_nowait(ProxyError(Code.INTERNAL_SERVER_ERROR, str(exc)))
            return
        stream.put_nowait(None)

    # --- what rmqha does not serve -----------------------------------------------------

    def _unsupported(self, answer: type, what: str) -> Any:
        return answer(status=pb.Status(code=Code.NOT_IMPLEMENTED, message=f"{what} is not supported by rmqha's proxy"))

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield self._unsupported(spb.PullMessageResponse, "PullMessage")

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return self._unsupported(spb.UpdateOffsetResponse, "UpdateOffset")

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return self._unsupported(spb.GetOffsetResponse, "GetOffset")

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return self._unsupported(spb.QueryOffsetResponse, "QueryOffset")

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        return self._unsupported(spb.RecallMessageResponse, "RecallMessage")

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return self._unsupported(spb.SyncLiteSubscriptionResponse, "SyncLiteSubscription")


def _abort_code(exc: ProxyError) -> Any:
    """INVALID_ARGUMENT for a client's mistake (4xxxx), INTERNAL otherwise (RocketMQ's)."""
    if Code.BAD_REQUEST <= exc.code < Code.INTERNAL_ERROR:
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL
