"""Receipt handles of popped messages: RocketMQ's extraInfo, extended and signed.

A handle is what a popped message carries in ``POP_CK`` and what ACK_MESSAGE,
BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME hand back.  Fields, one space apart::

    0 ckOffset   1 popTime   2 invisibleTime   3 reviveQid   4 retry   5 brokerName
    6 queueId    7 offset    8 epoch   9 retryCount   10 topic   11 mac

Fields 0-7 are RocketMQ's (``ExtraInfoUtil``; Java clients parse them, so their meaning
is RocketMQ's: the start offset of the pop on that queue, when it was popped, for how long
it is invisible, 999 for a FIFO pop, whether it came from the pop retry topic, the broker
group, the queue and the message's queue offset).  rmqha adds the master epoch the pop was
served in, how many times the message was delivered before (its reconsume times), the
queue's topic by name, and a MAC: HMAC-SHA256 under the broker group's pop key over the
consumer group and fields 0-10, truncated to 16 bytes, base64url without padding.  The
handle is tamper-evident: any change to a field, or use by another consumer group, fails
the MAC.  Fields after the MAC are ignored (RocketMQ's proxy appends a commitlog offset).

Checking a handle against the broker's in-flight table (expired, acked, superseded) is
:func:`rmqha.messaging.pop_logic.check_in_flight`; this module knows only the handle.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, replace
from enum import Enum

from rmqha.errors import ReceiptError
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.pop import SEPARATOR

#: Fields before the MAC; a handle has at least these plus the MAC.
SIGNED_FIELDS = 11
#: RocketMQ's own extraInfo (what a broker without signatures hands out).
ROCKETMQ_FIELDS = 8
MAC_BYTES = 16
_MAC_DOMAIN = b"rmqha-pop-receipt-1\n"


class Refusal(str, Enum):
    """Why a handle was refused; each maps to the RocketMQ response code clients see."""

    #: Not a handle at all (too few fields, numbers that are not numbers).
    MALFORMED = "MALFORMED"
    #: RocketMQ's 8-field extraInfo without rmqha's signature.
    UNSIGNED = "UNSIGNED"
    #: The MAC does not match: a field was changed or the handle is another group's.
    FORGED = "FORGED"
    #: Issued by another broker group.
    WRONG_BROKER = "WRONG_BROKER"
    #: The request names another topic, queue or offset than its handle.
    MISMATCH = "MISMATCH"
    #: The invisible time ran out: the message is (or is about to be) delivered again.
    EXPIRED = "EXPIRED"
    #: Acked already (or revived after a change of its invisible time).
    NOT_IN_FLIGHT = "NOT_IN_FLIGHT"
    #: A newer handle replaced it (change-invisible, or a FIFO redelivery).
    SUPERSEDED = "SUPERSEDED"

    @property
    def code(self) -> int:
        if self in (Refusal.EXPIRED, Refusal.NOT_IN_FLIGHT, Refusal.SUPERSEDED):
            return int(ResponseCode.NO_MESSAGE)
        return int(ResponseCode.MESSAGE_ILLEGAL)


def refuse(status: Refusal, message: str) -> ReceiptError:
    return ReceiptError(status.value, message)


@dataclass(frozen=True)
class ReceiptHandle:
    """The fields of one handle (see the module docstring)."""

    ck_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    retry: str
    broker_name: str
    queue_id: int
    offset: int
    epoch: int
    retry_count: int
    topic: str

    @property
    def deadline(self) -> int:
        """When the message becomes visible again (epoch ms)."""
        return self.pop_time + self.invisible_time

    def fields(self) -> list[str]:
        return [str(self.ck_offset), str(self.pop_time), str(self.invisible_time),
                str(self.revive_qid), self.retry, self.broker_name, str(self.queue_id),
                str(self.offset), str(self.epoch), str(self.retry_count), self.topic]

    def sign(self, key: bytes, group: str) -> str:
        """The handle text: the fields and their MAC for ``group``."""
        text = SEPARATOR.join(self.fields())
        return f"{text}{SEPARATOR}{_mac(key, group, text)}"

    def renewed(self, pop_time: int, invisible_time: int, epoch: int) -> ReceiptHandle:
        """The handle of the same delivery after a change of its invisible time by the
        master of ``epoch`` (RocketMQ starts the new checkpoint at the message itself)."""
        return replace(self, ck_offset=self.offset, pop_time=pop_time,
                       invisible_time=invisible_time, epoch=epoch)


def _mac(key: bytes, group: str, text: str) -> str:
    digest = hmac.new(key, _MAC_DOMAIN + group.encode() + b"\n" + text.encode(),
                      hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:MAC_BYTES]).rstrip(b"=").decode()


def parse(text: str) -> ReceiptHandle:
    """The fields of a handle, unverified; ReceiptError (MALFORMED / UNSIGNED) otherwise."""
    parts = text.split(SEPARATOR)
    if ROCKETMQ_FIELDS <= len(parts) < SIGNED_FIELDS + 1:
        raise refuse(Refusal.UNSIGNED, f"receipt handle {text!r} has {len(parts)} fields and "
                     f"no signature: it was not issued by an rmqha broker")
    if len(parts) < ROCKETMQ_FIELDS:
        raise refuse(Refusal.MALFORMED, f"receipt handle {text!r} is not one: "
                     f"{len(parts)} fields, a handle has {SIGNED_FIELDS + 1}")
    try:
        return ReceiptHandle(
            ck_offset=int(parts[0]), pop_time=int(parts[1]), invisible_time=int(parts[2]),
            revive_qid=int(parts[3]), retry=parts[4], broker_name=parts[5],
            queue_id=int(parts[6]), offset=int(parts[7]), epoch=int(parts[8]),
            retry_count=int(parts[9]), topic=parts[10])
    except ValueError:
        raise refuse(Refusal.MALFORMED,
                     f"receipt handle {text!r} has a non-number where a number goes") from None


def verify(text: str, key: bytes, group: str, broker_name: str) -> ReceiptHandle:
    """The fields of a handle this broker group signed for ``group``; ReceiptError
    (MALFORMED, UNSIGNED, WRONG_BROKER, FORGED) otherwise."""
    handle = parse(text)
    parts = text.split(SEPARATOR)
    if handle.broker_name != broker_name:
        raise refuse(Refusal.WRONG_BROKER, f"receipt handle was issued by broker "
                     f"{handle.broker_name!r}; this is {broker_name!r}")
    expected = _mac(key, group, SEPARATOR.join(parts[:SIGNED_FIELDS]))
    if not hmac.compare_digest(expected, parts[SIGNED_FIELDS]):
        raise refuse(Refusal.FORGED, f"receipt handle failed its signature check for group "
                     f"{group!r}: it was altered, or issued to another group")
    return handle
