"""The names and durations a gRPC request carries, checked as RocketMQ's proxy checks them
(``GrpcValidator``): topics, consumer groups, tags, invisible and polling times.

Every check raises :class:`~rmqha.errors.ProxyError` with RocketMQ's status code and a
message naming the value; nothing reaches a broker before it passes.  The topic and group
checks remember the names that passed (every request names them again).
"""
from __future__ import annotations

import functools
import unicodedata

from rmqha.errors import ConfigError, ProxyError
from rmqha.protocol.groups import validate_group_name
from rmqha.protocol.topics import validate_topic_name
from rmqha.proxy.status import Code

#: Topics of the brokers' own (RocketMQ's ``TopicValidator`` system topics, rmqha's state
#: and transaction topics): no client reads or writes them through the proxy.
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "RMQ_SYS_WHEEL_TIMER",
    "rmq_sys_wheel_timer",
})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"


def has_control_character(text: str) -> bool:
    """Java's ``CharMatcher.javaIsoControl``: U+0000-U+001F and U+007F-U+009F."""
    return any(unicodedata.category(ch) == "Cc" for ch in text)


@functools.lru_cache(maxsize=4096)
def check_topic(name: str) -> str:
    """A topic a client may use; ILLEGAL_TOPIC otherwise."""
    try:
        validate_topic_name(name)
    except ConfigError as exc:
        raise ProxyError(Code.ILLEGAL_TOPIC, str(exc)) from None
    if name in SYSTEM_TOPICS or name.lower().startswith(SYSTEM_TOPIC_PREFIX):
        raise ProxyError(Code.ILLEGAL_TOPIC, f"cannot access system topic {name}")
    return name


@functools.lru_cache(maxsize=4096)
def check_group(name: str) -> str:
    """A consumer group a client may use; ILLEGAL_CONSUMER_GROUP otherwise."""
    try:
        validate_group_name(name)
    except ConfigError as exc:
        raise ProxyError(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from None
    if name.startswith(SYSTEM_GROUP_PREFIX):
        raise ProxyError(Code.ILLEGAL_CONSUMER_GROUP, f"cannot use system consumer group {name}")
    return name


def check_tag(tag: str) -> None:
    if not tag:
        return
    if not tag.strip():
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot be the char sequence of whitespace")
    if "|" in tag:
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} cannot contain '|'")
    if has_control_character(tag):
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} cannot contain control character")


def check_invisible_time(ms: int, low: int, high: int) -> int:
    """An invisible time in [low, high] ms; ILLEGAL_INVISIBLE_TIME otherwise."""
    if ms < low:
        raise ProxyError(Code.ILLEGAL_INVISIBLE_TIME,
                         f"the invisibleTime {ms} ms is too small. min is {low} ms")
    if ms > high:
        raise ProxyError(Code.ILLEGAL_INVISIBLE_TIME,
                         f"the invisibleTime {ms} ms is too large. max is {high} ms")
    return ms


def polling_time(asked_ms: int | None, remaining_ms: int | None, request_timeout_ms: int,
                 low: int, high: int) -> int:
    """How long a receive may wait for messages (``ReceiveMessageActivity``): what the
    client asked, else its deadline less half its request timeout; clamped to
    [low, high] and to the deadline.  ILLEGAL_POLLING_TIME when the deadline leaves
    less than ``low``."""
    if asked_ms is not None:
        polling = asked_ms
    elif remaining_ms is not None:
        polling = remaining_ms - request_timeout_ms // 2
    else:
        polling = high
    polling = min(max(polling, low), high)
    if remaining_ms is not None and polling > remaining_ms:
        if remaining_ms < low:
            raise ProxyError(Code.ILLEGAL_POLLING_TIME, "The deadline time remaining is not "
                             "enough for polling, please check network condition")
        polling = remaining_ms
    return polling
