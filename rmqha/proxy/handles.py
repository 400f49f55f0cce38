"""What the proxy hands clients to come back with: receipt handles and transaction ids.

Both carry what the proxy needs to reach the right broker group again, so any proxy of
the cluster (or this one after a restart) can serve the next request: the proxy keeps no
table of them.

- A **receipt handle** is the broker's handle (``POP_CK``: RocketMQ's extraInfo fields,
  ``ckOffset popTime invisibleTime reviveQid retry brokerName queueId offset``, then the
  broker's own fields and signature) followed by one space and the message's commitlog
  offset, as RocketMQ's proxy appends it (``ReceiptHandle.encode``).  The broker name says
  which group's master acks it; the commitlog offset lets ForwardMessageToDeadLetterQueue
  name the message; the broker gets its own handle back and checks it.
- A **transaction id** is ``<commitlog offset>#<broker name>#<broker transaction id>``:
  where the half message is (END_TRANSACTION names it by its commitlog offset) and which
  group holds it.  A broker name never holds ``#``.
"""
from __future__ import annotations

from dataclasses import dataclass

from rmqha.errors import ProxyError
from rmqha.protocol.pop import SEPARATOR
from rmqha.proxy.status import Code

#: RocketMQ's extraInfo has eight fields; the proxy's handle one more at least.
_BROKER_FIELDS = 8


@dataclass(frozen=True)
class ReceiptHandle:
    """A receipt handle as the proxy reads it (the broker checks the rest)."""

    #: The broker's own handle, what ACK_MESSAGE's ``extraInfo`` carries.
    broker_handle: str
    broker_name: str
    queue_id: int
    offset: int
    pop_time: int
    invisible_time: int
    commit_offset: int
    #: The broker's retry field: which topic the queue and offset are of (the topic's, or
    #: its pop retry topic's).
    retry: str = "0"


def compose_handle(broker_handle: str, commit_offset: int) -> str:
    return f"{broker_handle}{SEPARATOR}{commit_offset}"


def parse_handle(text: str) -> ReceiptHandle:
    """The fields of a receipt handle; ProxyError INVALID_RECEIPT_HANDLE if it is none."""
    broker_handle, _, tail = text.rpartition(SEPARATOR)
    fields = broker_handle.split(SEPARATOR)
    if len(fields) < _BROKER_FIELDS or not tail.lstrip("-").isdigit():
        raise ProxyError(Code.INVALID_RECEIPT_HANDLE,
                         f"receipt handle {text[:120]!r} is not one this proxy issued")
    try:
        return ReceiptHandle(broker_handle, fields[5], int(fields[6]), int(fields[7]),
                             int(fields[1]), int(fields[2]), int(tail), fields[4])
    except ValueError:
        raise ProxyError(Code.INVALID_RECEIPT_HANDLE,
                         f"receipt handle {text[:120]!r} has a non-number where a number goes") from None


def compose_transaction_id(commit_offset: int, broker_name: str, broker_txn_id: str) -> str:
    return f"{commit_offset}#{broker_name}#{broker_txn_id}"


@dataclass(frozen=True)
class TransactionId:
    commit_offset: int
    broker_name: str
    broker_txn_id: str


def parse_transaction_id(text: str) -> TransactionId:
    """The parts of a transaction id; ProxyError INVALID_TRANSACTION_ID otherwise."""
    parts = text.split("#", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1] or not parts[2]:
        raise ProxyError(Code.INVALID_TRANSACTION_ID,
                         f"transaction id {text[:120]!r} is not one this proxy issued")
    return TransactionId(int(parts[0]), parts[1], parts[2])
