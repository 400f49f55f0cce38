"""rmqha's producer: send single messages and batches to the masters a topic's route names.

:class:`Producer` (asyncio) is the public face of four pieces, each importing only the
ones below it:

- :mod:`~rmqha.client.transaction`: prepared sends, END_TRANSACTION, the broker's
  check-backs and the heartbeats that let it reach this producer;
- :mod:`~rmqha.client.accumulator`: ``auto_batch``, concurrent sends of one loop turn as
  one batch;
- :mod:`~rmqha.client.sender`: routes, queue choice and retries (every send goes through
  it, with the same UNIQ_KEYs on every attempt);
- :mod:`~rmqha.client.send_request`: the SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE requests
  (properties, compression, batch chunks).

The blocking producer for synchronous code is :mod:`~rmqha.client.blocking_producer`.
``idempotent=True`` makes retries safe: a producer id and a per-queue sequence on each
ordinary send and batch, so the broker never stores a retried send twice
(:mod:`~rmqha.client.idempotence`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rmqha.client.accumulator import DEFAULT_MAX_BYTES as DEFAULT_AUTO_BATCH_BYTES
from rmqha.client.accumulator import SendAccumulator
from rmqha.client.idempotence import Idempotence
from rmqha.client.model import Message, SendResult
from rmqha.client.route import ClientSession
from rmqha.client.send_request import RequestBuilder, as_message
from rmqha.client.sender import Sender
from rmqha.client.transaction import (
    CheckListener,
    LocalTransaction,
    TransactionSendResult,
    TransactionSupport,
)
from rmqha.net.client_security import ClientSecurity, TlsOption
from rmqha.protocol.message import DEFAULT_COMPRESS_OVER_BYTES, CompressionType


class Producer:
    """Asyncio producer.  Use ``async with Producer(...) as p`` or ``start()``/``close()``."""

    def __init__(
        self,
        namesrv: str | list[str],
        group: str = "rmqha_producer",
        *,
        send_timeout_s: float = 3.0,
        max_attempts: int = 64,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        retry_deadline_s: float = 30.0,
        compress_over_bytes: int = DEFAULT_COMPRESS_OVER_BYTES,
        compression: CompressionType = CompressionType.LZ4,
        max_batch_bytes: int = 4 * 1024 * 1024,
        compress_batches: bool = False,
        auto_batch: bool = False,
        auto_batch_max_bytes: int = DEFAULT_AUTO_BATCH_BYTES,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: TlsOption = None,
        idempotent: bool = False,
    ) -> None:
        self.group = group
        security = ClientSecurity.from_options(access_key=access_key, secret_key=secret_key, tls=tls)
        self.session = ClientSession(namesrv, rpc_timeout_s=send_timeout_s, security=security)
        requests = RequestBuilder(group, compress_over_bytes=compress_over_bytes,
                                  compression=compression, max_batch_bytes=max_batch_bytes,
                                  compress_batches=compress_batches, idempotent=idempotent)
        #: Routes, queue choice and retries; builds requests with ``sender.requests``.
        self.sender = Sender(self.session, requests, send_timeout_s=send_timeout_s,
                             max_attempts=max_attempts, backoff_s=backoff_s,
                             max_backoff_s=max_backoff_s, retry_deadline_s=retry_deadline_s,
                             idempotence=Idempotence() if idempotent else None)
        #: Holds concurrent sends until the end of the loop turn (``auto_batch``).
        self.accumulator = (SendAccumulator(self.sender, auto_batch_max_bytes) if auto_batch
                            else None)
        self._txn: TransactionSupport | None = None

    async def start(self) -> Producer:
        return self

    async def close(self) -> None:
        if self._txn is not None:
            await self._txn.close()
        await self.session.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, topic: str, message: Message | bytes | str, *,
                   queue_id: int | None = None, delay_level: int | None = None,
                   deliver_at: int | None = None) -> SendResult:
        """Send one message; returns its result or raises SendError after the retries.

        ``delay_level`` (1..N of the broker's ``message_delay_level``) or ``deliver_at``
        (epoch ms) hold the message back until then.  With ``auto_batch`` a plain send
        goes in one batch with the other sends to the topic made in this loop turn (see
        :mod:`rmqha.client.accumulator`)."""
        acc = self.accumulator
        if (acc is not None and queue_id is None and delay_level is None
                and deliver_at is None):
            msg = as_message(message)
            if acc.accepts(msg):
                return await acc.send(topic, msg)
        sender = self.sender
        req = sender.requests.single(topic, message, queue_id, delay_level, deliver_at)
        return (await sender.send(req))[0]

    async def send_batch(self, topic: str, messages: Sequence[Message | bytes | str], *,
                         queue_id: int | None = None) -> list[SendResult]:
        """Send messages as batches (one queue per batch); one result per message, in order."""
        results: list[SendResult] = []
        sender = self.sender
        for req in sender.requests.batches(topic, messages, queue_id):
            results += await sender.send(req)
        return results

    async def send_transaction(self, topic: str, message: Message | bytes | str,
                               local_transaction: LocalTransaction, arg: Any = None, *,
                               queue_id: int | None = None) -> TransactionSendResult:
        """Send a prepared message, run ``local_transaction(message, arg)`` and commit or
        roll back by what it returns (see :mod:`rmqha.client.transaction`)."""
        return await self._transactions().send(topic, as_message(message), local_transaction,
                                               arg, queue_id)

    def set_transaction_check_listener(self, check: CheckListener, *,
                                       topics: Sequence[str] = ()) -> None:
        """``check(message) -> LocalTransactionState`` answers the broker's check-backs;
        ``topics`` start heartbeats to their brokers now (call it from the event loop)."""
        self._transactions().set_check_listener(check, topics)

    def _transactions(self) -> TransactionSupport:
        if self._txn is None:
            self._txn = TransactionSupport(self.sender)
        return self._txn
