"""rmqha's Python client: :class:`Producer` and :class:`Consumer` (asyncio) and their
blocking wrappers, speaking RocketMQ's client protocol to name servers and brokers."""
from __future__ import annotations

from rmqha.client.blocking_producer import BlockingProducer
from rmqha.client.consumer import BlockingConsumer, Consumer, allocate_averagely
from rmqha.client.message_query import BlockingMessageQuery, MessageQuery
from rmqha.client.model import Message, MessageQueue, ReceivedMessage, SendResult, SendStatus
from rmqha.client.producer import Producer
from rmqha.client.transaction import LocalTransactionState, TransactionSendResult

__all__ = [
    "BlockingConsumer",
    "BlockingMessageQuery",
    "BlockingProducer",
    "Consumer",
    "LocalTransactionState",
    "Message",
    "MessageQuery",
    "MessageQueue",
    "Producer",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "TransactionSendResult",
    "allocate_averagely",
]
