"""RocketMQ 5's status codes and how the proxy turns broker answers into them.

:class:`Code` mirrors ``apache.rocketmq.v2.Code`` (numbers as on the wire), so the rules
here need no generated module.  The mapping follows RocketMQ's proxy: its
``ResponseBuilder`` (SYSTEM_BUSY -> TOO_MANY_REQUESTS, REQUEST_CODE_NOT_SUPPORTED ->
NOT_IMPLEMENTED, SUBSCRIPTION_GROUP_NOT_EXIST -> CONSUMER_GROUP_NOT_FOUND, a missing topic
-> TOPIC_NOT_FOUND, a timeout -> PROXY_TIMEOUT), ``SendMessageActivity`` (the flush and
replica outcomes of a send) and ``ReceiveMessageResponseStreamWriter`` (no message ->
MESSAGE_NOT_FOUND, polling full -> TOO_MANY_REQUESTS).  Where RocketMQ falls back to
INTERNAL_SERVER_ERROR for a refusal the client caused, rmqha names it: a broker's
NO_PERMISSION is FORBIDDEN, a bad parameter BAD_REQUEST, a receipt handle the broker
refuses INVALID_RECEIPT_HANDLE.
"""
from __future__ import annotations

from enum import IntEnum

from rmqha.errors import ProxyError, RemotingError, RemotingTimeoutError
from rmqha.protocol.codes import ResponseCode


class Code(IntEnum):
    """``apache.rocketmq.v2.Code``."""

    OK = 20000
    MULTIPLE_RESULTS = 30000
    BAD_REQUEST = 40000
    ILLEGAL_ACCESS_POINT = 40001
    ILLEGAL_TOPIC = 40002
    ILLEGAL_CONSUMER_GROUP = 40003
    ILLEGAL_MESSAGE_TAG = 40004
    ILLEGAL_MESSAGE_KEY = 40005
    ILLEGAL_MESSAGE_GROUP = 40006
    ILLEGAL_MESSAGE_PROPERTY_KEY = 40007
    INVALID_TRANSACTION_ID = 40008
    ILLEGAL_MESSAGE_ID = 40009
    ILLEGAL_FILTER_EXPRESSION = 40010
    ILLEGAL_INVISIBLE_TIME = 40011
    ILLEGAL_DELIVERY_TIME = 40012
    INVALID_RECEIPT_HANDLE = 40013
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014
    UNRECOGNIZED_CLIENT_TYPE = 40015
    MESSAGE_CORRUPTED = 40016
    CLIENT_ID_REQUIRED = 40017
    ILLEGAL_POLLING_TIME = 40018
    UNAUTHORIZED = 40100
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    MESSAGE_NOT_FOUND = 40401
    TOPIC_NOT_FOUND = 40402
    CONSUMER_GROUP_NOT_FOUND = 40403
    MESSAGE_BODY_TOO_LARGE = 41301
    MESSAGE_BODY_EMPTY = 41302
    TOO_MANY_REQUESTS = 42900
    MESSAGE_PROPERTIES_TOO_LARGE = 43101
    INTERNAL_ERROR = 50000
    INTERNAL_SERVER_ERROR = 50001
    HA_NOT_AVAILABLE = 50002
    NOT_IMPLEMENTED = 50100
    PROXY_TIMEOUT = 50400
    MASTER_PERSISTENCE_TIMEOUT = 50401
    SLAVE_PERSISTENCE_TIMEOUT = 50402
    UNSUPPORTED = 50500


#: A broker's refusal -> the status a client sees (anything else: INTERNAL_SERVER_ERROR).
_BROKER_CODES: dict[int, Code] = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.INVALID_PARAMETER: Code.BAD_REQUEST,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.POLLING_FULL: Code.TOO_MANY_REQUESTS,
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}

#: Broker codes that mean "not this broker now": the proxy refreshes the route and tries
#: the group's master again (a failover in progress), as a remoting client would.
RETRIABLE: frozenset[int] = frozenset({
    ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NOT_LEADER_FOR_QUEUE,
    ResponseCode.GO_AWAY,
})


def broker_code(code: int) -> Code:
    """The status of a broker's response code (RocketMQ's table, see the module doc)."""
    return _BROKER_CODES.get(code, Code.INTERNAL_SERVER_ERROR)


def ack_code(code: int) -> Code:
    """The status of a refused ACK / CHANGE_MESSAGE_INVISIBLETIME: a handle the broker
    does not take (expired, acked, forged: NO_MESSAGE or MESSAGE_ILLEGAL) is an invalid
    receipt handle to the client."""
    if code in (ResponseCode.NO_MESSAGE, ResponseCode.MESSAGE_ILLEGAL):
        return Code.INVALID_RECEIPT_HANDLE
    return broker_code(code)


def refusal(code: int, remark: str | None, what: str) -> ProxyError:
    """A ProxyError for a broker's refusal of ``what``, keeping the broker's remark."""
    return ProxyError(broker_code(code), f"{what} refused by the broker: {remark or int(code)}")


def transport_error(exc: RemotingError, what: str) -> ProxyError:
    """A lost or timed-out broker request: PROXY_TIMEOUT / INTERNAL_SERVER_ERROR."""
    if isinstance(exc, RemotingTimeoutError):
        return ProxyError(Code.PROXY_TIMEOUT, f"{what}: the broker did not answer in time ({exc})")
    return ProxyError(Code.INTERNAL_SERVER_ERROR, f"{what}: {exc}")


def combined(codes: list[Code]) -> Code:
    """The status of a response with one status per entry (a batch send, an ack of
    several handles): the entries' one code, MULTIPLE_RESULTS if they differ."""
    distinct = set(codes)
    if not distinct:
        return Code.INTERNAL_SERVER_ERROR
    return distinct.pop() if len(distinct) == 1 else Code.MULTIPLE_RESULTS
