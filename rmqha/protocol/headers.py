"""Request headers of the client protocol: one class per request, used by both sides.

As RocketMQ's ``remoting/protocol/header/`` classes: the client builds a request's
``extFields`` with :meth:`RequestHeader.build`, the broker (or client, for what a broker
asks) reads them back with :meth:`RequestHeader.parse`, so a field's name is written once,
here.  RocketMQ clients send header fields as JSON numbers or strings (C++ mixes both; the
codec turns them all into strings), Java's V2 send header uses one-letter names, and
booleans come as ``true``/``false`` or ``1``/``0``.  Parsing accepts all of these and
raises :class:`~rmqha.errors.ProtocolError` naming the field that is missing or wrong.

Most headers are plain dataclasses whose fields carry their wire names
(:func:`_wire`); :class:`RequestHeader` builds and parses them by that table, as RocketMQ
decodes a ``CommandCustomHeader`` by reflection.  A field without a default is required; a
field whose value is None is not sent.  :class:`SendHeader` has its own parse, inlined
(every send parses it), and :class:`HeartbeatData` is the HEART_BEAT body, the one request
whose fields travel in its body.
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, NamedTuple, Self

from rmqha.errors import ProtocolError
from rmqha.protocol.topics import DEFAULT_TOPIC, PERM_READ_WRITE

Ext = Mapping[str, str]

#: PullMessageRequestHeader.sysFlag bits (``PullSysFlag``).
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_CLASS_FILTER = 0x8


def req_str(ext: Ext, name: str) -> str:
    value = ext.get(name)
    if value is None:
        raise ProtocolError(f"header field {name!r} is missing")
    return value


def opt_int(ext: Ext, name: str, default: int) -> int:
    value = ext.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"header field {name!r} is not an integer: {value!r}") from None


def req_int(ext: Ext, name: str) -> int:
    value = req_str(ext, name)
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"header field {name!r} is not an integer: {value!r}") from None


def opt_bool(ext: Ext, name: str, default: bool = False) -> bool:
    value = ext.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true")


def _ext_value(value: Any) -> str:
    """How a value travels in ``extFields``: a string (booleans as Java writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- the table-driven headers ---------------------------------------------------------------


def _wire(name: str, default: Any = MISSING) -> Any:
    """A header field travelling as ``name``; required unless it has a default."""
    return field(default=default, metadata={"wire": name})


class _Field(NamedTuple):
    attr: str
    wire: str
    #: str, int or bool (the type without its ``| None``).
    kind: type
    required: bool
    default: Any


_FIELDS: dict[type, tuple[_Field, ...]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """A header class's fields, read from its dataclass fields once."""
    known = _FIELDS.get(cls)
    if known is not None:
        return known
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kinds = [k for k in typing.get_args(hints[f.name]) or (hints[f.name],)
                 if k is not type(None)]
        out.append(_Field(f.name, f.metadata["wire"], kinds[0], f.default is MISSING,
                          None if f.default is MISSING else f.default))
    _FIELDS[cls] = tuple(out)
    return _FIELDS[cls]


class RequestHeader:
    """Builds and parses a dataclass header by its fields' wire names (see the module
    docstring); subclasses are ``@dataclass(kw_only=True)`` with :func:`_wire` fields,
    in the order they travel."""

    @classmethod
    def parse(cls, ext: Ext) -> Self:
        """The header from ``extFields``; ProtocolError names a missing or malformed field.
        An empty value counts as absent (but for a string)."""
        values = {}
        # One loop, no call per field: brokers parse a header per pull and offset commit.
        for attr, wire, kind, required, default in _fields(cls):
            raw = ext.get(wire)
            if raw is None or (raw == "" and kind is not str):
                if required:
                    raise ProtocolError(f"header field {wire!r} is missing")
                values[attr] = default
            elif kind is int:
                try:
                    values[attr] = int(raw)
                except ValueError:
                    raise ProtocolError(
                        f"header field {wire!r} is not an integer: {raw!r}") from None
            else:
                values[attr] = raw.strip().lower() in ("1", "true") if kind is bool else raw
        return cls(**values)

    def build(self) -> dict[str, str]:
        """The ``extFields`` of this header: every value a string, None left out."""
        out = {}
        for f in _fields(type(self)):
            value = getattr(self, f.attr)
            if value is not None:
                out[f.wire] = _ext_value(value)
        return out


@dataclass(kw_only=True)
class PullHeader(RequestHeader):
    """PULL_MESSAGE."""

    consumer_group: str = _wire("consumerGroup")
    topic: str = _wire("topic")
    queue_id: int = _wire("queueId")
    queue_offset: int = _wire("queueOffset")
    max_msg_nums: int = _wire("maxMsgNums", 32)
    #: PULL_* bits.
    sys_flag: int = _wire("sysFlag", 0)
    commit_offset: int = _wire("commitOffset", -1)
    suspend_timeout_ms: int = _wire("suspendTimeoutMillis", 0)
    #: The subscription expression (tags), read when sys_flag has PULL_SUBSCRIPTION.
    subscription: str | None = _wire("subscription", None)
    sub_version: int = _wire("subVersion", 0)


@dataclass(kw_only=True)
class QueryConsumerOffsetHeader(RequestHeader):
    """QUERY_CONSUMER_OFFSET: a group's committed offset of one queue."""

    consumer_group: str = _wire("consumerGroup")
    topic: str = _wire("topic")
    queue_id: int = _wire("queueId")
    #: False: answer QUERY_NOT_FOUND rather than 0 for a young queue (None: not sent, yes).
    set_zero_if_not_found: bool | None = _wire("setZeroIfNotFound", None)


@dataclass(kw_only=True)
class UpdateConsumerOffsetHeader(RequestHeader):
    """UPDATE_CONSUMER_OFFSET: commit a group's offset of one queue."""

    consumer_group: str = _wire("consumerGroup")
    topic: str = _wire("topic")
    queue_id: int = _wire("queueId")
    commit_offset: int = _wire("commitOffset")


@dataclass(kw_only=True)
class ConsumerListHeader(RequestHeader):
    """GET_CONSUMER_LIST_BY_GROUP: the client ids of a group's members."""

    consumer_group: str = _wire("consumerGroup")


@dataclass(kw_only=True)
class ConsumerIdsChangedHeader(RequestHeader):
    """NOTIFY_CONSUMER_IDS_CHANGED (broker to client, one-way): rebalance now."""

    consumer_group: str = _wire("consumerGroup", "")


@dataclass(kw_only=True)
class UnregisterClientHeader(RequestHeader):
    """UNREGISTER_CLIENT: a client leaves a consumer and/or producer group."""

    client_id: str = _wire("clientID", "")
    consumer_group: str = _wire("consumerGroup", "")
    producer_group: str = _wire("producerGroup", "")


@dataclass(kw_only=True)
class EndTransactionHeader(RequestHeader):
    """END_TRANSACTION: commit or roll back the half message at ``commit_log_offset``."""

    producer_group: str = _wire("producerGroup")
    tran_state_table_offset: int = _wire("tranStateTableOffset", 0)
    commit_log_offset: int = _wire("commitLogOffset")
    #: SysFlag.TRANSACTION_COMMIT / TRANSACTION_ROLLBACK, or 0 (unknown yet).
    commit_or_rollback: int = _wire("commitOrRollback")
    from_transaction_check: bool = _wire("fromTransactionCheck", False)
    msg_id: str = _wire("msgId", "")
    transaction_id: str | None = _wire("transactionId", None)


@dataclass(kw_only=True)
class CheckTransactionStateHeader(RequestHeader):
    """CHECK_TRANSACTION_STATE (broker to producer, one-way; the body is the half message):
    what the producer's END_TRANSACTION answer names."""

    tran_state_table_offset: int = _wire("tranStateTableOffset", 0)
    commit_log_offset: int = _wire("commitLogOffset", 0)
    msg_id: str = _wire("msgId", "")
    transaction_id: str = _wire("transactionId", "")
    offset_msg_id: str | None = _wire("offsetMsgId", None)
    topic: str | None = _wire("topic", None)
    broker_name: str | None = _wire("brokerName", None)


@dataclass(kw_only=True)
class QueryMessageHeader(RequestHeader):
    """QUERY_MESSAGE: messages of a topic by key (or by unique id) in a time range."""

    topic: str = _wire("topic")
    key: str = _wire("key")
    #: At most this many records (0 or less: the broker's most).
    max_num: int = _wire("maxNum", 0)
    begin_timestamp: int = _wire("beginTimestamp", 0)
    end_timestamp: int = _wire("endTimestamp", 2**63 - 1)  # Long.MAX_VALUE: no bound
    #: RocketMQ's ``MixAll.UNIQUE_MSG_QUERY_FLAG``: ``key`` is a unique id (UNIQ_KEY).
    unique_key: bool | None = _wire("_UNIQUE_KEY_QUERY", None)


@dataclass(kw_only=True)
class ViewMessageHeader(RequestHeader):
    """VIEW_MESSAGE_BY_ID: the record at a commitlog offset."""

    offset: int = _wire("offset")


@dataclass(kw_only=True)
class RouteInfoHeader(RequestHeader):
    """GET_ROUTEINFO_BY_TOPIC (to a name server)."""

    topic: str = _wire("topic")


@dataclass(kw_only=True)
class CreateTopicHeader(RequestHeader):
    """UPDATE_AND_CREATE_TOPIC: create or update a topic on a broker."""

    topic: str = _wire("topic")
    default_topic: str = _wire("defaultTopic", DEFAULT_TOPIC)
    read_queue_nums: int = _wire("readQueueNums", 8)
    #: None: as many as read queues.
    write_queue_nums: int | None = _wire("writeQueueNums", None)
    perm: int = _wire("perm", PERM_READ_WRITE)
    topic_filter_type: str = _wire("topicFilterType", "SINGLE_TAG")
    topic_sys_flag: int = _wire("topicSysFlag", 0)
    order: bool = _wire("order", False)
    admin_token: str | None = _wire("adminToken", None)


@dataclass(kw_only=True)
class DeleteTopicHeader(RequestHeader):
    """DELETE_TOPIC_IN_BROKER."""

    topic: str = _wire("topic")
    admin_token: str | None = _wire("adminToken", None)


# --- SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE ---------------------------------------

#: SendHeader field -> its name in SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE and in SEND_MESSAGE.
_SEND_V2_NAMES = dict(producer_group="a", topic="b", queue_id="e", sys_flag="f",
                      born_timestamp="g", flag="h", properties="i", reconsume_times="j",
                      batch="m", max_reconsume_times="l")
_SEND_V1_NAMES = dict(producer_group="producerGroup", topic="topic", queue_id="queueId",
                      sys_flag="sysFlag", born_timestamp="bornTimestamp", flag="flag",
                      properties="properties", reconsume_times="reconsumeTimes",
                      batch="batch", max_reconsume_times="maxReconsumeTimes")
#: V2 letter -> V1 name of every field :meth:`SendHeader.build` writes.
_SEND_V2_TO_V1 = {**{v: _SEND_V1_NAMES[k] for k, v in _SEND_V2_NAMES.items()},
                  "c": "defaultTopic", "d": "defaultTopicQueueNums", "k": "unitMode"}
#: The queue id's V2 name: the producer adds it per attempt (:meth:`SendHeader.fields`).
SEND_V2_QUEUE_ID = _SEND_V2_NAMES["queue_id"]


@dataclass
class SendHeader:
    """SEND_MESSAGE (V1 names), SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (letters a..n)."""

    producer_group: str
    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    batch: bool
    max_reconsume_times: int | None = None

    @classmethod
    def parse(cls, ext: Ext, *, v2: bool) -> SendHeader:
        names = _SEND_V2_NAMES if v2 else _SEND_V1_NAMES
        # Every send parses this: the fields inline, as opt_int would read them; anything
        # that does not convert goes through the per-field path, which names it.
        get = ext.get
        topic = get(names["topic"])
        if topic is not None:
            try:
                qid, sf, born, fl, rt = (get(names["queue_id"]), get(names["sys_flag"]),
                                         get(names["born_timestamp"]), get(names["flag"]),
                                         get(names["reconsume_times"]))
                max_rt = get(names["max_reconsume_times"]) or ""
                batch = get(names["batch"])
                return cls(
                    producer_group=get(names["producer_group"], ""),
                    topic=topic,
                    queue_id=int(qid) if qid else -1,
                    sys_flag=int(sf) if sf else 0,
                    born_timestamp=int(born) if born else 0,
                    flag=int(fl) if fl else 0,
                    properties=get(names["properties"], "") or "",
                    reconsume_times=int(rt) if rt else 0,
                    batch=False if not batch else batch.strip().lower() in ("1", "true"),
                    max_reconsume_times=int(max_rt) if max_rt.lstrip("-").isdigit() else None,
                )
            except ValueError:
                pass
        # Something is missing or does not convert: find which and say so.
        req_str(ext, names["topic"])
        for name in ("queue_id", "sys_flag", "born_timestamp", "flag", "reconsume_times"):
            opt_int(ext, names[name], 0)
        raise ProtocolError(f"header field {names['max_reconsume_times']!r} is not an integer: "
                            f"{ext.get(names['max_reconsume_times'])!r}")

    def build(self, *, v2: bool = True) -> dict[str, str]:
        """The ``extFields`` of this header (the queue id last), by V2 letters or V1 names."""
        ext = self.fields(self.producer_group, self.topic, self.sys_flag, self.born_timestamp,
                          self.flag, self.properties, self.batch, self.reconsume_times)
        if self.max_reconsume_times is not None:
            ext[_SEND_V2_NAMES["max_reconsume_times"]] = str(self.max_reconsume_times)
        ext[SEND_V2_QUEUE_ID] = str(self.queue_id)
        return ext if v2 else {_SEND_V2_TO_V1[k]: v for k, v in ext.items()}

    @staticmethod
    def fields(producer_group: str, topic: str, sys_flag: int, born_timestamp: int, flag: int,
               properties: str, batch: bool, reconsume_times: int = 0) -> dict[str, str]:
        """What :meth:`build` writes (V2) but the queue id, from values rather than a header
        object: the producer makes one per send (no header object per message) and adds
        the queue id (:data:`SEND_V2_QUEUE_ID`) per attempt.  ``defaultTopic`` and its queue
        count are RocketMQ's client defaults (a broker creates topics by its own config)."""
        return {
            "a": producer_group, "b": topic, "c": DEFAULT_TOPIC, "d": "4",
            "f": str(sys_flag), "g": str(born_timestamp), "h": str(flag), "i": properties,
            "j": str(reconsume_times) if reconsume_times else "0", "k": "false",
            "m": "true" if batch else "false",
        }


# --- HEART_BEAT -------------------------------------------------------------------------------


def _json_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _json_str(value: Any, default: str) -> str:
    return value if isinstance(value, str) else default


def _json_int(value: Any) -> int:
    """A JSON number that is informational only (0 when it is anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class SubscriptionData:
    """One topic a consumer group subscribes to, and its tag expression."""

    topic: str
    expression: str = "*"
    #: When the subscription was made (ms); brokers keep the newest.
    version: int = 0


@dataclass
class ConsumerData:
    """A consumer group this client is a member of (RocketMQ's ConsumerData)."""

    group: str
    subscriptions: list[SubscriptionData] = field(default_factory=list)
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_FIRST_OFFSET"


def _consumer_data(cd: dict[str, Any]) -> ConsumerData:
    """One entry of ``consumerDataSet``.  The consume type, model and start are kept when
    they are Java's names (the C++ client sends ordinals; no broker decision reads them)."""
    default = ConsumerData("")
    subs = [SubscriptionData(str(s.get("topic")), str(s.get("subString", "*")),
                             _json_int(s.get("subVersion")))
            for s in _json_list(cd.get("subscriptionDataSet")) if isinstance(s, dict)]
    return ConsumerData(str(cd["groupName"]), subs,
                        _json_str(cd.get("consumeType"), default.consume_type),
                        _json_str(cd.get("messageModel"), default.message_model),
                        _json_str(cd.get("consumeFromWhere"), default.consume_from_where))


@dataclass
class HeartbeatData:
    """The HEART_BEAT body (RocketMQ's HeartbeatData, JSON): who the client is and which
    consumer and producer groups it belongs to."""

    client_id: str
    consumers: list[ConsumerData] = field(default_factory=list)
    producer_groups: list[str] = field(default_factory=list)

    def build(self) -> dict[str, Any]:
        """The JSON object of the body."""
        return {
            "clientID": self.client_id,
            "consumerDataSet": [{
                "groupName": c.group,
                "consumeType": c.consume_type,
                "messageModel": c.message_model,
                "consumeFromWhere": c.consume_from_where,
                "subscriptionDataSet": [{"topic": s.topic, "subString": s.expression,
                                         "subVersion": s.version} for s in c.subscriptions],
            } for c in self.consumers],
            "producerDataSet": [{"groupName": g} for g in self.producer_groups],
        }

    @classmethod
    def parse(cls, data: Any) -> HeartbeatData:
        """The body's JSON object, as Java and C++ clients send it (``clientID`` or
        ``clientId``; entries without a group name are skipped); ProtocolError if it is
        not an object or names no client."""
        if not isinstance(data, dict):
            raise ProtocolError("heartbeat body is not a JSON object")
        client_id = str(data.get("clientID") or data.get("clientId") or "")
        if not client_id:
            raise ProtocolError("heartbeat field 'clientID' is missing")
        consumers = [_consumer_data(cd) for cd in _json_list(data.get("consumerDataSet"))
                     if isinstance(cd, dict) and cd.get("groupName")]
        producers = [str(p["groupName"]) for p in _json_list(data.get("producerDataSet"))
                     if isinstance(p, dict) and p.get("groupName")]
        return cls(client_id, consumers, producers)


@dataclass
class PopHeader:
    """POP_MESSAGE request header (RocketMQ's ``PopMessageRequestHeader``)."""

    consumer_group: str
    topic: str
    #: -1: any readable queue of the topic.
    queue_id: int
    max_msg_nums: int
    invisible_time: int
    poll_time: int
    born_time: int
    init_mode: int
    exp_type: str | None
    exp: str | None
    order: bool
    attempt_id: str | None

    @classmethod
    def from_ext(cls, ext: Ext) -> PopHeader:
        queue_id = req_int(ext, "queueId")
        return cls(
            consumer_group=req_str(ext, "consumerGroup"),
            topic=req_str(ext, "topic"),
            queue_id=-1 if queue_id < 0 else queue_id,
            max_msg_nums=req_int(ext, "maxMsgNums"),
            invisible_time=req_int(ext, "invisibleTime"),
            poll_time=opt_int(ext, "pollTime", 0),
            born_time=opt_int(ext, "bornTime", 0),
            init_mode=opt_int(ext, "initMode", 0),
            exp_type=ext.get("expType") or None,
            exp=ext.get("exp") or None,
            order=opt_bool(ext, "order"),
            attempt_id=ext.get("attemptId") or None,
        )


@dataclass
class AckHeader:
    """ACK_MESSAGE (``AckMessageRequestHeader``) and CHANGE_MESSAGE_INVISIBLETIME
    (``ChangeInvisibleTimeRequestHeader``, which adds ``invisibleTime``) request headers."""

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int
    #: Only CHANGE_MESSAGE_INVISIBLETIME carries it.
    invisible_time: int | None = None

    @classmethod
    def from_ext(cls, ext: Ext, *, change: bool = False) -> AckHeader:
        return cls(
            consumer_group=req_str(ext, "consumerGroup"),
            topic=req_str(ext, "topic"),
            queue_id=req_int(ext, "queueId"),
            extra_info=req_str(ext, "extraInfo"),
            offset=req_int(ext, "offset"),
            invisible_time=req_int(ext, "invisibleTime") if change else None,
        )
