"""What rmqha's client hands in and gets back: messages to send, queues, send results."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from rmqha.protocol.message import ReceivedMessage
from rmqha.protocol.route import MessageQueue

__all__ = ["Message", "MessageQueue", "SendStatus", "SendResult", "ReceivedMessage"]


@dataclass
class Message:
    """A message to send; ``properties`` are user keys (reserved ones are set for you)."""

    body: bytes
    tags: str | None = None
    keys: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


class SendStatus(Enum):
    """How safe a sent message is (RocketMQ's SendStatus)."""

    #: Stored and acknowledged by the ack policy (and flushed with flush=sync).
    SEND_OK = "SEND_OK"
    #: Stored on the master, but the fsync did not finish in time.
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    #: Stored on the master, but the replicas did not acknowledge in time.
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass
class SendResult:
    """One message's outcome."""

    status: SendStatus
    #: The message's UNIQ_KEY (the id consumers see; retried sends keep it).
    msg_id: str
    #: RocketMQ's offsetMsgId: store host + commitlog offset.
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    #: How many attempts the send took (1 = no retry).
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK
