"""Transactional sends for rmqha's producer (RocketMQ's TransactionMQProducer protocol).

:meth:`rmqha.client.Producer.send_transaction` sends a *prepared* message (invisible to
consumers), runs the local transaction, then tells the broker to commit or roll back
(END_TRANSACTION).  When the outcome is unknown, or the answer is lost, the broker asks a
producer of the group later (CHECK_TRANSACTION_STATE); the listener registered with
:meth:`~rmqha.client.Producer.set_transaction_check_listener` answers, one-way, as
RocketMQ's clients do.  A producer with a listener heartbeats its group to every broker
of the topics it sent to, so the brokers (a new master after a failover too) can reach it.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from rmqha.net.peer import RequestPeer
from rmqha.client.model import Message, SendResult
from rmqha.client.send_request import RequestBuilder, SendRequest
from rmqha.client.sender import Sender
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ClientError, ProtocolError, RemotingError
from rmqha.protocol.headers import CheckTransactionStateHeader, EndTransactionHeader, HeartbeatData
from rmqha.protocol.message import (
    Prop,
    ReceivedMessage,
    SysFlag,
    decode_record,
    parse_offset_msg_id,
)
from rmqha.protocol.command import RemotingCommand

log = logging.getLogger(__name__)


class LocalTransactionState(Enum):
    """What the local transaction decided (RocketMQ's names, UNKNOW included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


_END_CODE = {
    LocalTransactionState.COMMIT_MESSAGE: int(SysFlag.TRANSACTION_COMMIT),
    LocalTransactionState.ROLLBACK_MESSAGE: int(SysFlag.TRANSACTION_ROLLBACK),
    LocalTransactionState.UNKNOW: 0,
}

StateOrAwaitable = Union[LocalTransactionState, Awaitable[LocalTransactionState]]
#: local_transaction(message, arg) -> state (may be async).
LocalTransaction = Callable[[Message, Any], StateOrAwaitable]
#: check(message) -> state (may be async); the message is the half message as stored.
CheckListener = Callable[[ReceivedMessage], StateOrAwaitable]


@dataclass
class TransactionSendResult:
    """The prepared send's result and what became of the transaction."""

    send_result: SendResult
    state: LocalTransactionState
    #: False when END_TRANSACTION was not confirmed (the broker's check-back settles it).
    end_confirmed: bool

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


def prepared_request(requests: RequestBuilder, topic: str, message: Message,
                     queue_id: int | None) -> SendRequest:
    """The SEND_MESSAGE_V2 of a prepared (half) message: marked TRAN_MSG with the
    producer group in its properties and in sysFlag, invisible until committed."""
    props = requests.properties(message)
    props[Prop.TRANSACTION_PREPARED] = "true"
    props[Prop.PRODUCER_GROUP] = requests.group
    return requests.message(topic, message, props, queue_id,
                            sys_flag=int(SysFlag.TRANSACTION_PREPARED))


async def _resolve(value: StateOrAwaitable) -> LocalTransactionState:
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, LocalTransactionState):
        raise ClientError(f"a transaction callback returned {value!r}, "
                          f"not a LocalTransactionState")
    return value


class TransactionSupport:
    """A producer's transactional half: sends, END_TRANSACTION, check-backs, heartbeats.
    Sends, routes and connections are ``sender``'s."""

    def __init__(self, sender: Sender, heartbeat_interval_s: float = 5.0) -> None:
        self.sender = sender
        self.group = sender.requests.group
        self.heartbeat_interval_s = heartbeat_interval_s
        host = socket.gethostbyname(socket.gethostname())
        self.client_id = f"{host}@{os.getpid()}#txn#{time.monotonic_ns()}"
        self.check_listener: CheckListener | None = None
        self._topics: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        sender.session.on_check_transaction = self._on_check

    def set_check_listener(self, listener: CheckListener, topics: Iterable[str] = ()) -> None:
        """Register the listener; with ``topics``, start heartbeating their brokers now (a
        restarted producer answers check-backs of transactions it began before)."""
        self.check_listener = listener
        new = set(topics) - self._topics
        if new:
            self._topics |= new
            if self._task is not None:
                self._task.cancel()
                self._task = None
            self._start_heartbeats()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def send(self, topic: str, message: Message, local_transaction: LocalTransaction,
                   arg: Any, queue_id: int | None) -> TransactionSendResult:
        if self.check_listener is None:
            raise ClientError("set a check listener (set_transaction_check_listener) before "
                              "sending transactional messages: the broker asks it when an "
                              "outcome is unknown")
        if topic not in self._topics:
            # Brokers of a new topic learn of us before a check-back could be needed.
            self._topics.add(topic)
            await self._heartbeat_all()
            if self._task is None:
                self._start_heartbeats()
        req = prepared_request(self.sender.requests, topic, message, queue_id)
        sent = (await self.sender.send(req))[0]
        if not sent.ok:
            state = LocalTransactionState.ROLLBACK_MESSAGE  # RocketMQ: never run it
        else:
            try:
                state = await _resolve(local_transaction(message, arg))
            except Exception as exc:  # the user's code: its failure is an unknown outcome
                log.warning("local transaction of %s raised %r: outcome unknown, the broker "
                            "will check back", sent.msg_id, exc)
                state = LocalTransactionState.UNKNOW
        confirmed = await self._end(sent, state)
        return TransactionSendResult(sent, state, confirmed)

    async def _end(self, sent: SendResult, state: LocalTransactionState) -> bool:
        if state is LocalTransactionState.UNKNOW:
            return False
        sender = self.sender
        route = await sender.session.route(sent.queue.topic)
        bd = route.broker_datas.get(sent.queue.broker_name)
        addr = bd.master if bd is not None else None
        if addr is None:
            return False
        _, commit_offset = parse_offset_msg_id(sent.offset_msg_id)
        header = EndTransactionHeader(
            producer_group=self.group, tran_state_table_offset=sent.queue_offset,
            commit_log_offset=commit_offset, commit_or_rollback=_END_CODE[state],
            from_transaction_check=False, msg_id=sent.msg_id, transaction_id=sent.msg_id,
        ).build()
        try:
            resp = await sender.session.request(addr, RemotingCommand.request(
                RequestCode.END_TRANSACTION, header), sender.send_timeout_s)
        except RemotingError as exc:
            log.warning("END_TRANSACTION of %s not confirmed (%s): the broker will check back",
                        sent.msg_id, exc)
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.warning("END_TRANSACTION of %s refused: %s %s", sent.msg_id, resp.code,
                        resp.remark)
            return False
        return True

    async def _on_check(self, cmd: RemotingCommand, conn: RequestPeer) -> None:
        """CHECK_TRANSACTION_STATE from a broker: ask the listener, answer one-way."""
        if self.check_listener is None:
            return None
        try:
            check = CheckTransactionStateHeader.parse(cmd.ext_fields)
            msg, _ = decode_record(cmd.body or b"")
            state = await _resolve(self.check_listener(msg))
        except (ProtocolError, ClientError) as exc:
            log.warning("transaction check from %s not answered: %s",
                        getattr(conn, "name", "?"), exc)
            return None
        except Exception as exc:  # the user's listener: unknown, asked again later
            log.warning("transaction check listener raised %r", exc)
            return None
        header = EndTransactionHeader(
            producer_group=self.group, tran_state_table_offset=check.tran_state_table_offset,
            commit_log_offset=check.commit_log_offset, commit_or_rollback=_END_CODE[state],
            from_transaction_check=True, msg_id=check.msg_id,
            transaction_id=check.transaction_id,
        ).build()
        try:
            await conn.send(RemotingCommand.request(RequestCode.END_TRANSACTION, header,
                                                    oneway=True))
        except RemotingError as exc:
            log.info("answer to a transaction check was lost (%s); the broker asks again", exc)
        return None

    def _start_heartbeats(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._heartbeat_all()
            await asyncio.sleep(self.heartbeat_interval_s)

    async def _heartbeat_all(self) -> None:
        """Tell every broker of our topics (slaves too: one may be master tomorrow) that
        this client is a producer of the group, on the connection checks come back on."""
        sender = self.sender
        body = HeartbeatData(self.client_id, producer_groups=[self.group]).build()
        addrs: set[str] = set()
        for topic in self._topics:
            try:
                addrs.update((await sender.route(topic, refresh=True)).addresses())
            except ClientError as exc:
                log.debug("no route for %s: %s", topic, exc)
        for addr in sorted(addrs):
            try:
                await sender.session.request(addr, RemotingCommand.request(
                    RequestCode.HEART_BEAT, None, body), sender.send_timeout_s)
            except RemotingError as exc:
                log.debug("producer heartbeat to %s failed: %s", addr, exc)
