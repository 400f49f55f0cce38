"""SendMessage and EndTransaction: a client's messages to the master of a broker group.

A send is checked and converted by :mod:`rmqha.proxy.sends`, checked against its topic's
message type, put on a writable queue (a message group always on the same one), and sent
as SEND_MESSAGE_V2 (or SEND_BATCH_MESSAGE) to that group's master, following a failover
until the client's deadline.  The broker's answer becomes the entry's status
(:mod:`rmqha.proxy.status`); a transactional message's entry carries a transaction id
naming where its half message is (:mod:`rmqha.proxy.handles`).

With ``idempotent_sends`` (on by default) an ordinary send (not delayed, not
transactional) is bound to its queue with the next sequence of the proxy's own producer id
(:class:`rmqha.client.idempotence.Idempotence`, at most five in flight per queue): every
attempt, after a failover too, is the same request, and the broker answers a repeat with
the original's result instead of storing it twice.

EndTransaction sends END_TRANSACTION (commit or rollback) to the master of the group the
transaction id names; an UNSPECIFIED resolution is RocketMQ's "unknown": nothing is sent
and the broker checks the transaction back later.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from rmqha.client.idempotence import Idempotence, Ticket
from rmqha.errors import ProxyError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.idempotence import PRODUCER_ID, PRODUCER_SEQ
from rmqha.protocol.message import BatchItem, Prop, SysFlag, encode_batch
from rmqha.protocol.route import MessageQueue
from rmqha.proxy.calls import Call
from rmqha.proxy.cluster import ClusterAccess, Deadline, expect_success
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.handles import compose_transaction_id, parse_transaction_id
from rmqha.proxy.routing import writable_queues
from rmqha.proxy.sends import SendPlan, batch_header, check_type, pick_queue, plan_send, send_header
from rmqha.proxy.status import Code, broker_code
from rmqha.proxy.validation import check_topic

#: Broker answers that still mean "stored" (the entry says how safe).
_STORED = frozenset({ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                     ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE})
_RESOLUTIONS = {pb.TransactionResolution.COMMIT: int(SysFlag.TRANSACTION_COMMIT),
                pb.TransactionResolution.ROLLBACK: int(SysFlag.TRANSACTION_ROLLBACK)}


class Producing:
    """SendMessage and EndTransaction."""

    def __init__(self, cfg: ProxyConfig, cluster: ClusterAccess) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self._turns = itertools.count()
        #: The proxy's own producer id and per-queue sequences (``idempotent_sends``).
        self._idempotence = Idempotence() if cfg.idempotent_sends else None

    def _deadline(self, call: Call) -> Deadline:
        return Deadline(call.budget_s(self.cluster.rpc_timeout_s))

    # --- SendMessage -------------------------------------------------------------------

    async def send(self, request: Any, call: Call) -> Any:
        plan = plan_send(request.messages, call.peer_host, self.cfg, int(time.time() * 1000))
        check_type(plan, await self.cluster.message_type(plan.topic),
                   self.cfg.enable_topic_message_type_check)
        queues = writable_queues(await self.cluster.route(plan.topic))
        if not queues:
            raise ProxyError(Code.FORBIDDEN, f"topic {plan.topic} has no writable queue")
        group, queue_id = queues[pick_queue(plan.sharding_key, len(queues), next(self._turns))]
        deadline = self._deadline(call)
        ticket = await self._bind(plan, group, queue_id, deadline)
        answered = False
        try:
            resp = await self.cluster.to_master(plan.topic, group, lambda: _send_command(plan, queue_id),
                                                deadline, what=f"send to {plan.topic}")
            answered = resp.code in _STORED
        finally:
            if ticket is not None:
                assert self._idempotence is not None
                self._idempotence.release(ticket, answered=answered)
        return _send_response(plan, group, resp)

    async def _bind(self, plan: SendPlan, group: str, queue_id: int, deadline: Deadline) -> Ticket | None:
        """An ordinary send's claim (its properties stamped), or None: idempotence off, or a
        delayed or transactional send (stored elsewhere first).  Waiting for a slot in the
        queue's window is bounded by the call's deadline (PROXY_TIMEOUT past it)."""
        if self._idempotence is None or any(
                m.sys_flag & SysFlag.TRANSACTION_PREPARED or Prop.TIMER_DELIVER_MS in m.properties
                for m in plan.messages):
            return None
        try:
            ticket = await asyncio.wait_for(self._idempotence.claim(MessageQueue(plan.topic, group, queue_id)),
                                            max(0.05, deadline.left()))
        except asyncio.TimeoutError:
            raise ProxyError(Code.PROXY_TIMEOUT, f"send to {plan.topic}: five earlier sends to queue "
                             f"{group}/{queue_id} still in flight at the deadline") from None
        for m in plan.messages:
            m.properties[PRODUCER_ID] = ticket.claim.producer
            m.properties[PRODUCER_SEQ] = str(ticket.claim.seq)
        plan.claim = ticket.claim.properties()
        return ticket

    # --- EndTransaction ----------------------------------------------------------------

    async def end_transaction(self, request: Any, call: Call) -> Any:
        topic = check_topic(request.topic.name)
        if not request.transaction_id.strip():
            raise ProxyError(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
        txn = parse_transaction_id(request.transaction_id)
        kind = _RESOLUTIONS.get(request.resolution)
        if kind is not None:
            header = {"producerGroup": topic, "tranStateTableOffset": 0,
                      "commitLogOffset": txn.commit_offset, "commitOrRollback": kind,
                      "fromTransactionCheck": request.source == pb.TransactionSource.SOURCE_SERVER_CHECK,
                      "msgId": request.message_id, "transactionId": txn.broker_txn_id}
            resp = await self.cluster.to_master(
                topic, txn.broker_name,
                lambda: RemotingCommand.request(RequestCode.END_TRANSACTION, header),
                self._deadline(call), what=f"end transaction {txn.broker_txn_id}")
            expect_success(resp, "END_TRANSACTION", broker_code)
        return spb.EndTransactionResponse(status=pb.Status(code=Code.OK, message="OK"))


def _send_command(plan: SendPlan, queue_id: int) -> RemotingCommand:
    if len(plan.messages) == 1:
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, send_header(plan, queue_id),
                                       plan.messages[0].body)
    body = encode_batch(BatchItem(m.body, m.properties) for m in plan.messages)
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, batch_header(plan, queue_id), body)


def _entry_status(code: int) -> Code:
    return Code.OK if code == ResponseCode.SUCCESS else broker_code(code)


def _send_response(plan: SendPlan, group: str, resp: RemotingCommand) -> Any:
    """The SendMessageResponse of the broker's answer: one entry per message."""
    out = spb.SendMessageResponse()
    code = _entry_status(resp.code)
    stored = resp.code in _STORED
    message = "OK" if code == Code.OK else f"send message failed: {resp.remark or resp.code}"
    first_offset = int(resp.ext_fields.get("queueOffset", "0") or 0)
    commit_offset = int(resp.ext_fields.get("commitLogOffset", "-1") or -1)
    for i, m in enumerate(plan.messages):
        entry = out.entries.add()
        entry.status.code, entry.status.message = code, message
        if not stored:
            continue
        entry.message_id = m.properties["UNIQ_KEY"]
        entry.offset = first_offset + i
        if m.sys_flag & SysFlag.TRANSACTION_PREPARED:
            entry.transaction_id = compose_transaction_id(commit_offset, group, entry.message_id)
    # One broker answer: every entry has its code, which is the response's too.
    out.status.code, out.status.message = code, message
    return out
