"""ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue:
a pop consumer's calls, as POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME and
CONSUMER_SEND_MSG_BACK to the master of a broker group (RocketMQ's
``ReceiveMessageActivity``, ``ConsumerProcessor``, ``AckMessageActivity``, ...).

A receive pops every queue of one broker group (the one the client's queue names, else
the next readable one), the broker holding the pop until messages come or the polling
time ends (the long poll lives in the broker, so an idle consumer costs one held request
per polling time).  The proxy keeps polling until the client's polling time is used up
when the broker answers early without messages, pausing first so no request storm
follows a broker that answers at once; a pop answered after its client went away has its
messages handed back at once (:meth:`~rmqha.proxy.renewal.Renewal.hand_back`).  The
messages go to the client with their receipt handles (:mod:`rmqha.proxy.handles`); acks
and changes go to the master of the group the handle names, whatever route the client
holds.  A receive with ``auto_renew`` (push consumers) gets ``defaultInvisibleTimeMills``
and its messages are renewed by the proxy until the client settles them (:mod:`rmqha.proxy.renewal`): an ack, change or
dead-lettering of such a message is sent with the latest handle.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from rmqha.errors import ProtocolError, ProxyError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.message import ReceivedMessage, decode_records
from rmqha.protocol.pop import MAX_POP_MESSAGES, POP_CK, ConsumeInitMode
from rmqha.proxy.calls import Call
from rmqha.proxy.cluster import ClusterAccess, Deadline, expect_success
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.deliveries import delivered
from rmqha.proxy.handles import ReceiptHandle, compose_handle, parse_handle
from rmqha.proxy.renewal import Renewal, change_invisible
from rmqha.proxy.routing import readable_groups
from rmqha.proxy.status import Code, ack_code, broker_code, combined
from rmqha.proxy.validation import check_group, check_invisible_time, check_topic, polling_time

log = logging.getLogger(__name__)

#: A pop that comes back this much before its polling time without messages was not held
#: (a broker with a shorter long-poll cap, a failover): the next one waits a little first.
EARLY_S = 0.05
PAUSE_AFTER_EARLY_S = 0.2
_NOT_FOUND = frozenset({ResponseCode.POLLING_TIMEOUT, ResponseCode.NO_MESSAGE,
                        ResponseCode.PULL_NOT_FOUND})


def _ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def _status(code: Code, message: str | None = None) -> Any:
    return pb.Status(code=code, message=message or code.name)


def _expression(request: Any) -> str:
    expression = request.filter_expression
    if expression.type == pb.FilterType.SQL:
        raise ProxyError(Code.ILLEGAL_FILTER_EXPRESSION,
                         "SQL92 filters are not supported by rmqha's brokers; subscribe with a TAG expression")
    return expression.expression.strip() or "*"


class Consuming:
    """Receive, ack, change invisible time and dead-letter for pop consumers."""

    def __init__(self, cfg: ProxyConfig, cluster: ClusterAccess, renewal: Renewal) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.renewal = renewal
        self._turns = itertools.count()

    # --- ReceiveMessage ----------------------------------------------------------------

    async def receive(self, request: Any, call: Call, settings: Any) -> AsyncIterator[Any]:
        """The response stream: a status, then the messages, then a delivery timestamp."""
        try:
            messages = await self._receive(request, call, settings)
        except ProxyError as exc:
            yield spb.ReceiveMessageResponse(status=_status(Code(exc.code), exc.message))
        else:
            if messages:
                yield spb.ReceiveMessageResponse(status=_status(Code.OK))
                for message in messages:
                    yield spb.ReceiveMessageResponse(message=message)
            else:
                yield spb.ReceiveMessageResponse(status=_status(Code.MESSAGE_NOT_FOUND, "no new message"))
        done = spb.ReceiveMessageResponse()
        done.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
        yield done

    def _invisible_ms(self, request: Any) -> int:
        if request.auto_renew and (self.renewal.enabled or not request.HasField("invisible_duration")):
            return self.cfg.default_invisible_time_mills
        return check_invisible_time(_ms(request.invisible_duration),
                                    self.cfg.min_invisible_time_mills_for_recv,
                                    self.cfg.max_invisible_time_mills)

    def _polling_ms(self, request: Any, call: Call, settings: Any) -> int:
        asked = _ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else None
        remaining = None if call.remaining_s is None else int(call.remaining_s * 1000)
        timeout_ms = _ms(settings.request_timeout) if settings is not None else 3000
        return polling_time(asked, remaining, timeout_ms,
                            self.cfg.grpc_client_consumer_min_long_polling_timeout_millis,
                            self.cfg.grpc_client_consumer_max_long_polling_timeout_millis)

    async def _group_of(self, request: Any, topic: str) -> str:
        """The broker group this receive pops: the client's, if it can be read."""
        groups = [qd.broker_name for qd in readable_groups(await self.cluster.route(topic))]
        if not groups:
            raise ProxyError(Code.FORBIDDEN, f"topic {topic} has no readable queue")
        wanted = request.message_queue.broker.name
        return wanted if wanted in groups else groups[next(self._turns) % len(groups)]

    async def _receive(self, request: Any, call: Call, settings: Any) -> list[Any]:
        topic = check_topic(request.message_queue.topic.name)
        group = check_group(request.group.name)
        invisible = self._invisible_ms(request)
        polling = self._polling_ms(request, call, settings)
        expression = _expression(request)
        config = await self.cluster.group_config(group, topic)
        fifo = bool(config is not None and config.consume_message_orderly)
        broker_group = await self._group_of(request, topic)
        header = {"consumerGroup": group, "topic": topic, "queueId": -1,
                  "maxMsgNums": min(max(1, request.batch_size), MAX_POP_MESSAGES),
                  "invisibleTime": invisible, "initMode": int(ConsumeInitMode.MAX),
                  "expType": "TAG", "exp": expression, "order": fifo}
        messages = await self._poll(topic, broker_group, header, polling / 1000, call)
        if messages and request.auto_renew and self.renewal.enabled:
            self.renewal.track(call.client_id, group, topic, messages)
        return messages

    async def _poll(self, topic: str, broker_group: str, header: dict[str, Any],
                    polling_s: float, call: Call) -> list[Any]:
        end = time.monotonic() + polling_s
        deadline = Deadline(call.budget_s(polling_s + self.cluster.rpc_timeout_s))
        while True:
            hold = max(0.0, end - time.monotonic())
            started = time.monotonic()
            pop = asyncio.ensure_future(self.cluster.to_master(
                topic, broker_group, functools.partial(_pop_command, header, end), deadline,
                extra_s=hold, what=f"receive from {topic}"))
            try:
                resp = await asyncio.shield(pop)
            except asyncio.CancelledError:  # the client went away while the broker holds the pop
                pop.add_done_callback(functools.partial(self._orphaned, topic, header["consumerGroup"],
                                                        broker_group))
                raise
            if resp.code == ResponseCode.SUCCESS:
                return _messages(resp, broker_group)
            if resp.code not in _NOT_FOUND:
                raise ProxyError(broker_code(resp.code), f"receive refused by the broker: {resp.remark}")
            left = end - time.monotonic()
            if left <= EARLY_S:
                return []
            if time.monotonic() - started < hold - EARLY_S:
                await asyncio.sleep(min(PAUSE_AFTER_EARLY_S, left))

    def _orphaned(self, topic: str, group: str, broker_group: str, pop: asyncio.Future[Any]) -> None:
        """A pop answered after its receive was cancelled: its messages go back."""
        if pop.cancelled() or pop.exception() is not None or pop.result().code != ResponseCode.SUCCESS:
            return
        try:
            messages = _messages(pop.result(), broker_group)
        except ProxyError:
            return
        log.info("handing back %d messages popped for a receive of %s that went away", len(messages), group)
        self.renewal.hand_back(group, topic, messages)

    # --- AckMessage --------------------------------------------------------------------

    async def ack(self, request: Any, call: Call) -> Any:
        topic = check_topic(request.topic.name)
        group = check_group(request.group.name)
        entries = request.entries
        if len(entries) == 1:  # what the clients send: no task per entry
            results = [await self._ack_one(topic, group, entries[0], call)]
        else:
            results = await asyncio.gather(*(self._ack_one(topic, group, entry, call)
                                             for entry in entries))
        out = spb.AckMessageResponse()
        out.entries.extend(results)
        code = combined([Code(r.status.code) for r in results])
        out.status.CopyFrom(_status(code))
        return out

    async def _ack_one(self, topic: str, group: str, entry: Any, call: Call) -> Any:
        result = spb.AckMessageResultEntry(message_id=entry.message_id,
                                           receipt_handle=entry.receipt_handle)
        try:
            text = await self.renewal.settle(call.client_id, group, entry.message_id, entry.receipt_handle)
            handle = parse_handle(text)
            await self._ack_handle(topic, group, handle, call)
            result.status.CopyFrom(_status(Code.OK))
        except ProxyError as exc:
            result.status.CopyFrom(_status(Code(exc.code), exc.message))
        return result

    async def _ack_handle(self, topic: str, group: str, handle: ReceiptHandle, call: Call) -> None:
        header = {"consumerGroup": group, "topic": topic, "queueId": handle.queue_id,
                  "extraInfo": handle.broker_handle, "offset": handle.offset}
        resp = await self.cluster.to_master(
            topic, handle.broker_name, lambda: RemotingCommand.request(RequestCode.ACK_MESSAGE, header),
            Deadline(call.budget_s(self.cluster.rpc_timeout_s)), what="ack")
        expect_success(resp, "ACK_MESSAGE", ack_code)

    # --- ChangeInvisibleDuration -------------------------------------------------------

    async def change_invisible(self, request: Any, call: Call) -> Any:
        topic = check_topic(request.topic.name)
        group = check_group(request.group.name)
        invisible = check_invisible_time(_ms(request.invisible_duration), 0,
                                         self.cfg.max_invisible_time_mills)
        handle = parse_handle(await self.renewal.settle(call.client_id, group, request.message_id,
                                                        request.receipt_handle))
        renewed = await change_invisible(self.cluster, group, topic, handle, invisible,
                                         Deadline(call.budget_s(self.cluster.rpc_timeout_s)))
        return spb.ChangeInvisibleDurationResponse(status=_status(Code.OK), receipt_handle=renewed)

    # --- ForwardMessageToDeadLetterQueue -----------------------------------------------

    async def forward_to_dlq(self, request: Any, call: Call) -> Any:
        topic = check_topic(request.topic.name)
        group = check_group(request.group.name)
        handle = parse_handle(await self.renewal.settle(call.client_id, group, request.message_id,
                                                        request.receipt_handle))
        if handle.commit_offset < 0:
            raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt handle names no commitlog offset")
        header = {"group": group, "offset": handle.commit_offset, "delayLevel": -1,
                  "originMsgId": request.message_id, "originTopic": topic, "maxReconsumeTimes": 0}
        resp = await self.cluster.to_master(
            topic, handle.broker_name,
            lambda: RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header),
            Deadline(call.budget_s(self.cluster.rpc_timeout_s)), what="forward to the DLQ")
        expect_success(resp, "CONSUMER_SEND_MSG_BACK", broker_code)
        await self._ack_handle(topic, group, handle, call)
        return spb.ForwardMessageToDeadLetterQueueResponse(status=_status(Code.OK))


def _pop_command(header: dict[str, Any], end: float) -> RemotingCommand:
    """A POP_MESSAGE held by the broker until ``end`` (monotonic) at most."""
    hold_ms = max(0, int((end - time.monotonic()) * 1000))
    fields = dict(header, pollTime=hold_ms, bornTime=int(time.time() * 1000))
    return RemotingCommand.request(RequestCode.POP_MESSAGE, fields)


def _messages(resp: RemotingCommand, broker_group: str) -> list[Any]:
    """The client's messages of a POP_MESSAGE answer, each with its receipt handle."""
    try:
        records = decode_records(resp.body, broker_name=broker_group)
    except ProtocolError as exc:
        raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"the broker's pop answer does not decode: {exc}") from None
    return [_message(m) for m in records]


def _message(msg: ReceivedMessage) -> Any:
    handle = msg.properties.get(POP_CK)
    if handle is None:
        raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"popped message {msg.msg_id} carries no receipt handle")
    return delivered(msg, compose_handle(handle, msg.commit_offset))
