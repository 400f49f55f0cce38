"""What a send may carry, decided without I/O: the topics only the broker writes, the
properties that keep a send off the plain lane or out of a batch, the committed mark a
client may not set, and RocketMQ 5's topic message type check.

Apart from :mod:`rmqha.messaging.send_path` so the rules read in one page and the path
keeps to its ways in and its answers.
"""
from __future__ import annotations

from rmqha.messaging.context import Refused
from rmqha.messaging.delayed_delivery import SCHEDULE_TOPIC, TIMER_TOPIC, asks_for_delay
from rmqha.messaging.state import STATE_TOPIC
from rmqha.messaging.transactions import CHECK_MAX_TOPIC, COMMITTED_MARK, HALF_TOPIC, OP_TOPIC, transaction_type
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.idempotence import ID_KEY_BYTES, PRODUCER_ID
from rmqha.protocol.message import Prop, SysFlag, decode_properties
from rmqha.protocol.topic_attributes import TopicMessageType, message_type_of, type_mismatch

#: As RocketMQ's MessageDecoder: at most this many messages in one batch body.
MAX_BATCH_ITEMS = 65536
#: Property keys that keep a batch off the stored-as-it-came path: a delay (refused in a
#: batch), the committed-transaction mark (only the broker sets it; stripped) and an
#: idempotent producer's id (its claim is checked entry by entry, the ordinary way).
RESERVED_KEYS = (b"DELAY", COMMITTED_MARK.encode(), PRODUCER_ID.encode())
RESERVED_PREFIXES = (b"TIMER_",)
#: Topics only the broker writes (RocketMQ's NOT_ALLOWED_SEND_TOPIC_SET, and rmqha's state).
INTERNAL_TOPICS = frozenset({STATE_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC, HALF_TOPIC, OP_TOPIC,
                             CHECK_MAX_TOPIC})
#: What a plain send's properties must not contain (the decoder's ``plain_sends``): what
#: asks for a delay (as ``asks_for_delay`` reads it), marks a committed transaction, or
#: claims an idempotent producer's sequence (checked on the ordinary path, not the lanes).
PLAIN_SEND_REFUSE = (b"DELAY\x01", b"TIMER_", COMMITTED_MARK.encode(), ID_KEY_BYTES)


def send_asks_for_delay(props: str | dict[str, str]) -> bool:
    if isinstance(props, str):
        return asks_for_delay(props)
    return any(k == "DELAY" or k.startswith("TIMER_") for k in props)


def without_mark(props: str | dict[str, str]) -> str | dict[str, str]:
    """Properties without COMMITTED_MARK, which only the broker sets."""
    if isinstance(props, str):
        if COMMITTED_MARK not in props:
            return props
        props = decode_properties(props)
    elif COMMITTED_MARK not in props:
        return props
    return {k: v for k, v in props.items() if k != COMMITTED_MARK}


def check_type(expected: TopicMessageType, props: dict[str, str], sys_flag: int) -> None:
    """RocketMQ 5's topic message type check (its proxy's, applied by the broker)."""
    actual = message_type_of(
        props, prepared=transaction_type(sys_flag) == SysFlag.TRANSACTION_PREPARED)
    refusal = type_mismatch(expected, actual)
    if refusal is not None:
        raise Refused(ResponseCode.MESSAGE_ILLEGAL, refusal)


def prepared_transaction_id(cmd: RemotingCommand) -> str | None:
    """The ``transactionId`` of a prepared (transactional) send's answer: its unique key, as
    RocketMQ's SendMessageProcessor answers.  The Java client hands it to the application
    (``TransactionSendResult.getTransactionId()``) and sends it back in END_TRANSACTION.
    Only prepared sends get it: they never take the plain-frame answer path, whose bytes
    both twins write, and nothing reads it on any other send."""
    v2 = cmd.code != RequestCode.SEND_MESSAGE
    ext = cmd.ext_fields
    try:
        sys_flag = int(ext.get("f" if v2 else "sysFlag") or 0)
    except ValueError:
        return None  # the send itself was refused for it before anything was stored
    if transaction_type(sys_flag) != SysFlag.TRANSACTION_PREPARED:
        return None
    return decode_properties(ext.get("i" if v2 else "properties") or "").get(Prop.UNIQ_KEY)
