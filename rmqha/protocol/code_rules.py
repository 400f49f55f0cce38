"""One declaration per request code: what it is, what it touches, what it needs, who sends it.

Before this table a new request code had hidden places to register (the broker's fenced
write codes, the ACL's own copy of 31 codes and its table of needs), and a code missing
from the ACL's table passed for any signed account.  Now every member of
:class:`~rmqha.protocol.codes.RequestCode` has one :class:`CodeRule` in :data:`RULES`, and
everything that decided something per code reads it:

- the broker fences :data:`APPEND_CODES` (they append messages: master only);
- the ACL (:mod:`rmqha.security.acl`) asks :func:`resources_of` what a request names and
  refuses a code without a rule, and a code no application may send
  (:attr:`CodeRule.admin_only`) from any account but an admin's;
- resources found only in stored data (:attr:`Found.RECORD_AT_OFFSET`) or in the answer
  (:attr:`Found.ANSWER_ENTRIES`) are checked by the handler after reading and before
  answering, through the :class:`ResourceCheck` the broker hands its messaging layer;
- the control codes that need the cluster secret's proof
  (:data:`rmqha.protocol.request_auth.SIGNED_CODES`) are the rules with ``signed``;
- the proxy's gRPC calls each stand for a code (``rmqha.proxy.service.RPC_CODES``) and
  read their needs from its rule;
- the broker, the name server and the controller refuse to serve a code without a rule
  (:func:`require_declared` at start), and ``tests/unit/test_code_rules.py`` fails for a
  code without one and for a server that registers a code its rule does not say it serves.

A topic named ``%RETRY%<group>`` or ``%DLQ%<group>`` is the group's resource (SUB on the
group, whatever the code), so a send into another group's retry topic asks that group's
permission; a pop retry topic ``%RETRY%<group>_<topic>`` (``+`` in version 2) of the
request's own group stands for ``<topic>``.  Of the 84 codes, the broker serves 46, the
name server 7, the controller 12, rmqha's clients 2 (what a broker asks them) and the proxy's
gRPC calls stand for 10; 17 are served by none (declared so that a tool sending one is
refused by name); 50 are for admin accounts or cluster processes only.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rmqha.errors import ProtocolError
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX


class Access(enum.Enum):
    """Whether a request only reads or also changes something."""

    READ = "read"
    WRITE = "write"


class Kind(enum.Enum):
    """The ACL resource kind a request touches."""

    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class Found(enum.Enum):
    """Where the name of a resource is found."""

    #: ``ext_fields[field]``; empty or missing names no resource.
    HEADER = "header field"
    #: ``body[field]`` of a JSON object body.
    BODY_FIELD = "body field"
    #: the topics of the queue list ``body[field]`` (``[{"topic": ...}, ...]``).
    BODY_QUEUE_LIST = "queue list in the body"
    #: HEART_BEAT's body: every consumer's group and the topics it subscribes.
    HEARTBEAT_BODY = "heartbeat body"
    #: BATCH_ACK_MESSAGE's body: the topic (``t``) and group (``c``) of every entry.
    BATCH_ACK_BODY = "batch ack body"
    #: the topic of the record at the commitlog offset ``ext_fields[field]``: known only
    #: after reading it, checked by the handler before it answers or acts.
    RECORD_AT_OFFSET = "record at the commitlog offset in the header field"
    #: the entries of the answer: the handler leaves out what the account may not see.
    ANSWER_ENTRIES = "entries of the answer"
    #: the cluster itself (no name).
    CLUSTER = "the cluster"


class Need(enum.Enum):
    """The permission a resource needs (:class:`rmqha.security.acl.Perm` by name)."""

    PUB = "PUB"
    SUB = "SUB"
    #: PUB or SUB: seeing that a topic exists.
    ANY = "ANY"


class Sender(enum.Flag):
    """Who may send a code.  A code without :attr:`APPLICATION` is admin-only for accounts."""

    APPLICATION = enum.auto()
    BROKER = enum.auto()
    CONTROLLER = enum.auto()
    ADMIN = enum.auto()


class Server(enum.Flag):
    """Which processes serve a code (register a handler for it)."""

    NONE = 0
    BROKER = enum.auto()
    NAMESRV = enum.auto()
    CONTROLLER = enum.auto()
    #: rmqha's clients: what a broker asks a producer or consumer.
    CLIENT = enum.auto()
    #: the gRPC proxy: an RPC standing for the code (rmqha.proxy.service.RPC_CODES).
    PROXY = enum.auto()


@dataclass(frozen=True)
class Resource:
    """One resource a code touches and how its name is found."""

    kind: Kind
    found: Found
    field: str = ""
    need: Need = Need.SUB

    @property
    def derived(self) -> bool:
        """Known only from stored data or the answer: the handler checks it."""
        return self.found in (Found.RECORD_AT_OFFSET, Found.ANSWER_ENTRIES)


@dataclass(frozen=True)
class CodeRule:
    """The declaration of one request code."""

    code: RequestCode
    access: Access
    resources: tuple[Resource, ...]
    senders: Sender
    served_by: Server
    #: Appends messages to the commit log: a broker takes it only as master.
    appends: bool = False
    #: Needs the cluster secret's proof (rmqha.protocol.request_auth).
    signed: bool = False

    @property
    def admin_only(self) -> bool:
        """No application may send it: an account must be an admin's."""
        return Sender.APPLICATION not in self.senders

    @property
    def derived(self) -> tuple[Resource, ...]:
        return tuple(r for r in self.resources if r.derived)


APP = Sender.APPLICATION | Sender.ADMIN
OPS = Sender.ADMIN
CLUSTER_OPS = Sender.BROKER | Sender.CONTROLLER | Sender.ADMIN
BROKER_ONLY = Sender.BROKER
R, W = Access.READ, Access.WRITE
B, N, C, CL, NONE = Server.BROKER, Server.NAMESRV, Server.CONTROLLER, Server.CLIENT, Server.NONE
BP, NP = Server.BROKER | Server.PROXY, Server.NAMESRV | Server.PROXY


def topic(field: str = "topic", need: Need = Need.SUB) -> Resource:
    return Resource(Kind.TOPIC, Found.HEADER, field, need)


def group(field: str = "consumerGroup") -> Resource:
    return Resource(Kind.GROUP, Found.HEADER, field, Need.SUB)


def record(field: str, need: Need = Need.SUB) -> Resource:
    return Resource(Kind.TOPIC, Found.RECORD_AT_OFFSET, field, need)


def listed(kind: Kind, need: Need) -> Resource:
    return Resource(kind, Found.ANSWER_ENTRIES, "", need)


CLUSTER = Resource(Kind.CLUSTER, Found.CLUSTER)
SEND_V2 = (topic("b", Need.PUB),)
POP = (topic(), group())


def _rule(code: RequestCode, access: Access, resources: tuple[Resource, ...], senders: Sender,
          served_by: Server, **flags: bool) -> tuple[RequestCode, CodeRule]:
    return code, CodeRule(code, access, resources, senders, served_by, **flags)


rc = RequestCode
#: Every request code's declaration (RocketMQ's ACL 2.0 ``@RocketMQAction`` where it has one).
RULES: Mapping[RequestCode, CodeRule] = dict([
    # --- messages in ---------------------------------------------------------------------
    _rule(rc.SEND_MESSAGE, W, (topic("topic", Need.PUB),), APP, B, appends=True),
    _rule(rc.SEND_MESSAGE_V2, W, SEND_V2, APP, BP, appends=True),
    _rule(rc.SEND_BATCH_MESSAGE, W, SEND_V2, APP, B, appends=True),
    _rule(rc.CONSUMER_SEND_MSG_BACK, W, (group("group"), record("offset")), APP, BP),
    # A producer group is no ACL resource (RocketMQ's groupPerms are consumer groups').
    _rule(rc.END_TRANSACTION, W, (record("commitLogOffset", Need.PUB),), APP, BP),
    # --- messages out --------------------------------------------------------------------
    _rule(rc.PULL_MESSAGE, R, (topic(), group()), APP, B),
    _rule(rc.LITE_PULL_MESSAGE, R, (topic(), group()), APP, B),
    _rule(rc.POP_MESSAGE, R, POP, APP, BP),
    _rule(rc.PEEK_MESSAGE, R, POP, APP, NONE),
    _rule(rc.ACK_MESSAGE, W, POP, APP, BP),
    _rule(rc.CHANGE_MESSAGE_INVISIBLETIME, W, POP, APP, BP),
    _rule(rc.BATCH_ACK_MESSAGE, W, (Resource(Kind.TOPIC, Found.BATCH_ACK_BODY),
                                    Resource(Kind.GROUP, Found.BATCH_ACK_BODY)), APP, B),
    _rule(rc.NOTIFICATION, R, POP, APP, NONE),
    _rule(rc.POLLING_INFO, R, POP, APP, NONE),
    _rule(rc.QUERY_MESSAGE, R, (topic(),), APP, B),
    _rule(rc.VIEW_MESSAGE_BY_ID, R, (record("offset"),), APP, B),
    # --- queues and offsets --------------------------------------------------------------
    _rule(rc.GET_MAX_OFFSET, R, (topic(),), APP, B),
    _rule(rc.GET_MIN_OFFSET, R, (topic(),), APP, B),
    _rule(rc.SEARCH_OFFSET_BY_TIMESTAMP, R, (topic(),), APP, B),
    _rule(rc.GET_EARLIEST_MSG_STORETIME, R, (topic(),), APP, B),
    _rule(rc.QUERY_CONSUMER_OFFSET, R, (group(), topic()), APP, B),
    _rule(rc.UPDATE_CONSUMER_OFFSET, W, (group(), topic()), APP, B),
    _rule(rc.QUERY_BROKER_OFFSET, R, (CLUSTER,), OPS, NONE),
    _rule(rc.GET_ALL_CONSUMER_OFFSET, R, (CLUSTER,), OPS, NONE),
    _rule(rc.GET_ALL_DELAY_OFFSET, R, (CLUSTER,), OPS, NONE),
    _rule(rc.INVOKE_BROKER_TO_RESET_OFFSET, W, (topic(), group("group")), OPS, B),
    # --- clients and groups --------------------------------------------------------------
    _rule(rc.HEART_BEAT, W, (Resource(Kind.GROUP, Found.HEARTBEAT_BODY),
                             Resource(Kind.TOPIC, Found.HEARTBEAT_BODY)), APP, BP),
    _rule(rc.UNREGISTER_CLIENT, W, (group(),), APP, BP),
    _rule(rc.GET_CONSUMER_LIST_BY_GROUP, R, (group(),), APP, B),
    _rule(rc.LOCK_BATCH_MQ, W, (Resource(Kind.GROUP, Found.BODY_FIELD, "consumerGroup"),
                                Resource(Kind.TOPIC, Found.BODY_QUEUE_LIST, "mqSet")), APP, B),
    _rule(rc.UNLOCK_BATCH_MQ, W, (Resource(Kind.GROUP, Found.BODY_FIELD, "consumerGroup"),
                                  Resource(Kind.TOPIC, Found.BODY_QUEUE_LIST, "mqSet")), APP, B),
    _rule(rc.CHECK_CLIENT_CONFIG, R, (Resource(Kind.GROUP, Found.BODY_FIELD, "group"),), APP, B),
    _rule(rc.QUERY_ASSIGNMENT, R, (Resource(Kind.TOPIC, Found.BODY_FIELD, "topic"),
                                   Resource(Kind.GROUP, Found.BODY_FIELD, "consumerGroup")), APP, BP),
    _rule(rc.SET_MESSAGE_REQUEST_MODE, W, (CLUSTER,), OPS, B),
    _rule(rc.GET_CONSUMER_CONNECTION_LIST, R, (group(),), OPS, B),
    _rule(rc.GET_PRODUCER_CONNECTION_LIST, R, (group("producerGroup"),), OPS, B),
    _rule(rc.GET_CONSUME_STATS, R, (group(),), OPS, B),
    _rule(rc.QUERY_TOPIC_CONSUME_BY_WHO, R, (topic("topic", Need.ANY),), OPS, B),
    _rule(rc.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, W, (CLUSTER,), OPS, B),
    _rule(rc.DELETE_SUBSCRIPTIONGROUP, W, (CLUSTER,), OPS, B),
    _rule(rc.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, R, (listed(Kind.GROUP, Need.SUB),), APP, B),
    # --- topics --------------------------------------------------------------------------
    _rule(rc.UPDATE_AND_CREATE_TOPIC, W, (CLUSTER,), OPS, B),
    _rule(rc.DELETE_TOPIC_IN_BROKER, W, (CLUSTER,), OPS, B),
    _rule(rc.GET_ALL_TOPIC_CONFIG, R, (listed(Kind.TOPIC, Need.ANY),), APP, B),
    _rule(rc.GET_TOPIC_CONFIG_LIST, R, (CLUSTER,), OPS, NONE),
    _rule(rc.GET_TOPIC_NAME_LIST, R, (CLUSTER,), OPS, NONE),
    _rule(rc.GET_TOPIC_STATS_INFO, R, (topic("topic", Need.ANY),), OPS, B),
    _rule(rc.GET_TOPIC_CONFIG, R, (topic("topic", Need.ANY),), OPS, B),
    # --- broker administration -----------------------------------------------------------
    _rule(rc.UPDATE_BROKER_CONFIG, W, (CLUSTER,), OPS, B),
    _rule(rc.GET_BROKER_CONFIG, R, (CLUSTER,), OPS, B),
    _rule(rc.GET_BROKER_RUNTIME_INFO, R, (CLUSTER,), OPS, B),
    _rule(rc.WIPE_WRITE_PERM_OF_BROKER, W, (CLUSTER,), OPS, NONE),
    _rule(rc.ADD_WRITE_PERM_OF_BROKER, W, (CLUSTER,), OPS, NONE),
    _rule(rc.GET_BROKER_EPOCH_CACHE, R, (CLUSTER,), CLUSTER_OPS, B),
    _rule(rc.GET_BROKER_HA_STATUS, R, (CLUSTER,), CLUSTER_OPS, B),
    _rule(rc.NOTIFY_BROKER_ROLE_CHANGED, W, (CLUSTER,), Sender.CONTROLLER, B, signed=True),
    # --- name server ---------------------------------------------------------------------
    _rule(rc.REGISTER_BROKER, W, (CLUSTER,), BROKER_ONLY, N, signed=True),
    _rule(rc.UNREGISTER_BROKER, W, (CLUSTER,), BROKER_ONLY, N, signed=True),
    _rule(rc.GET_ROUTEINFO_BY_TOPIC, R, (topic("topic", Need.ANY),), APP | Sender.BROKER, NP),
    _rule(rc.GET_BROKER_CLUSTER_INFO, R, (CLUSTER,), APP | Sender.BROKER, N),
    _rule(rc.GET_BROKER_MEMBER_GROUP, R, (CLUSTER,), CLUSTER_OPS, N),
    _rule(rc.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, R, (listed(Kind.TOPIC, Need.ANY),), APP, N),
    _rule(rc.DELETE_TOPIC_IN_NAMESRV, W, (CLUSTER,), OPS, N),
    _rule(rc.PUT_KV_CONFIG, W, (CLUSTER,), OPS, NONE),
    _rule(rc.DELETE_KV_CONFIG, W, (CLUSTER,), OPS, NONE),
    _rule(rc.UPDATE_NAMESRV_CONFIG, W, (CLUSTER,), OPS, NONE),
    # --- controller ----------------------------------------------------------------------
    _rule(rc.BROKER_HEARTBEAT, W, (CLUSTER,), BROKER_ONLY, C, signed=True),
    _rule(rc.CONTROLLER_ALTER_SYNC_STATE_SET, W, (CLUSTER,), BROKER_ONLY, C, signed=True),
    _rule(rc.CONTROLLER_ELECT_MASTER, W, (CLUSTER,), Sender.BROKER | OPS, C, signed=True),
    _rule(rc.CONTROLLER_REGISTER_BROKER, W, (CLUSTER,), BROKER_ONLY, C, signed=True),
    _rule(rc.CONTROLLER_GET_REPLICA_INFO, R, (CLUSTER,), CLUSTER_OPS, C),
    _rule(rc.CONTROLLER_GET_METADATA_INFO, R, (CLUSTER,), CLUSTER_OPS, C),
    _rule(rc.CONTROLLER_GET_SYNC_STATE_DATA, R, (CLUSTER,), CLUSTER_OPS, C),
    _rule(rc.UPDATE_CONTROLLER_CONFIG, W, (CLUSTER,), OPS, C, signed=True),
    _rule(rc.GET_CONTROLLER_CONFIG, R, (CLUSTER,), OPS, C),
    _rule(rc.CLEAN_BROKER_DATA, W, (CLUSTER,), OPS, C, signed=True),
    _rule(rc.CONTROLLER_GET_NEXT_BROKER_ID, R, (CLUSTER,), BROKER_ONLY, C),
    _rule(rc.CONTROLLER_APPLY_BROKER_ID, W, (CLUSTER,), BROKER_ONLY, C, signed=True),
    # --- what a broker asks a client -----------------------------------------------------
    _rule(rc.CHECK_TRANSACTION_STATE, R, (CLUSTER,), BROKER_ONLY, CL),
    _rule(rc.NOTIFY_CONSUMER_IDS_CHANGED, W, (CLUSTER,), BROKER_ONLY, CL),
    _rule(rc.RESET_CONSUMER_CLIENT_OFFSET, W, (CLUSTER,), BROKER_ONLY, NONE),
    _rule(rc.GET_CONSUMER_STATUS_FROM_CLIENT, R, (CLUSTER,), BROKER_ONLY, NONE),
    _rule(rc.GET_CONSUMER_RUNNING_INFO, R, (CLUSTER,), BROKER_ONLY, NONE),
    _rule(rc.CONSUME_MESSAGE_DIRECTLY, R, (CLUSTER,), BROKER_ONLY, NONE),
])
del rc

#: Codes that append messages: a broker takes them only as master (fencing, #6508).
APPEND_CODES: frozenset[int] = frozenset(c for c, r in RULES.items() if r.appends)
#: Codes no application account may send (admin accounts only, where an ACL decides).
ADMIN_ONLY_CODES: frozenset[int] = frozenset(c for c, r in RULES.items() if r.admin_only)


def rule_of(code: int, rules: Mapping[RequestCode, CodeRule] = RULES) -> CodeRule | None:
    """The declaration of ``code`` in ``rules``; None for a code without one (refuse it)."""
    try:
        return rules.get(RequestCode(code))
    except ValueError:
        return None


def unclassified(codes: Iterable[int]) -> list[int]:
    """The codes of ``codes`` without a rule, sorted."""
    return sorted(int(c) for c in codes if rule_of(int(c)) is None)


def codes_served_by(server: Server) -> frozenset[int]:
    return frozenset(c for c, r in RULES.items() if server in r.served_by)


def require_declared(codes: Iterable[int], who: str) -> None:
    """Raise ProtocolError naming every code of ``codes`` without a declaration: a server
    calls it on what it is about to serve, so an undeclared code is never served."""
    missing = unclassified(codes)
    if missing:
        names = ", ".join(str(c) for c in missing)
        raise ProtocolError(f"{who} would serve request code(s) {names} without a declaration in "
                            f"rmqha.protocol.code_rules.RULES: declare what each reads or writes, "
                            f"its resource, permission and senders first")


# --- the names a request gives -----------------------------------------------------------


@dataclass(frozen=True)
class Named:
    """One resource a request names: a topic or a group, and the permission it needs."""

    kind: Kind
    name: str
    need: Need


def group_of_topic(topic: str) -> str | None:
    """The group behind ``%RETRY%<group>`` / ``%DLQ%<group>``, else None."""
    for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix):]
    return None


def topic_resource(topic: str, need: Need, groups: tuple[str, ...] = ()) -> Named:
    """What naming ``topic`` asks for: a group's retry or dead-letter topic is the group's
    resource (SUB); a pop retry topic of one of ``groups`` stands for its topic."""
    for own in groups:
        for sep in ("_", "+"):
            prefix = f"{RETRY_GROUP_TOPIC_PREFIX}{own}{sep}"
            if topic.startswith(prefix) and len(topic) > len(prefix):
                return Named(Kind.TOPIC, topic[len(prefix):], need)
    behind = group_of_topic(topic)
    if behind is not None:
        return Named(Kind.GROUP, behind, Need.SUB)
    return Named(Kind.TOPIC, topic, need)


def resources_of(code: int, ext_fields: Mapping[str, str], body: bytes | None,
                 rules: Mapping[RequestCode, CodeRule] = RULES) -> list[Named]:
    """The topics and groups a request names before anything is read (the derived ones are
    the handler's).  ProtocolError when a body the rule reads cannot be read; a code
    without a rule names nothing (its caller refuses it)."""
    rule = rule_of(code, rules)
    if rule is None:
        return []
    parsed = _Body(body)
    found = [(res, [n for n in _FINDERS[res.found](res, ext_fields, parsed) if n])
             for res in rule.resources if not res.derived and res.kind != Kind.CLUSTER]
    groups = tuple(n for res, names in found if res.kind == Kind.GROUP for n in names)
    # In the declared order (RocketMQ checks the header's topic before its group).
    return [Named(Kind.GROUP, n, Need.SUB) if res.kind == Kind.GROUP else topic_resource(n, res.need, groups)
            for res, names in found for n in names]


class _Body:
    """A JSON body parsed once, on first use."""

    def __init__(self, raw: bytes | None) -> None:
        self.raw = raw
        self._value: Any = None
        self._parsed = False

    def json(self) -> Any:
        if not self._parsed:
            try:
                self._value = json.loads(self.raw or b"null")
            except ValueError as exc:
                raise ProtocolError(f"the body is not JSON: {exc}") from None
            self._parsed = True
        return self._value

    def obj(self) -> dict[str, Any]:
        value = self.json()
        if not isinstance(value, dict):
            raise ProtocolError("the body is not a JSON object")
        return value


def _header(res: Resource, ext: Mapping[str, str], body: _Body) -> list[str]:
    return [ext.get(res.field) or ""]


def _body_field(res: Resource, ext: Mapping[str, str], body: _Body) -> list[str]:
    value = body.obj().get(res.field)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"body field {res.field!r} is not a string")
    return [value or ""]


def _queue_list(res: Resource, ext: Mapping[str, str], body: _Body) -> list[str]:
    queues = body.obj().get(res.field) or []
    if not isinstance(queues, list) or not all(isinstance(q, dict) for q in queues):
        raise ProtocolError(f"body field {res.field!r} is not a list of queues")
    return [_str(q.get("topic"), f"a queue of {res.field!r}") for q in queues]


def _heartbeat(res: Resource, ext: Mapping[str, str], body: _Body) -> list[str]:
    consumers = body.obj().get("consumerDataSet") or []
    if not isinstance(consumers, list):
        raise ProtocolError("heartbeat consumerDataSet is not a list")
    out: list[str] = []
    for consumer in consumers:
        if not isinstance(consumer, dict):
            raise ProtocolError("a heartbeat consumer is not an object")
        if res.kind == Kind.GROUP:
            out.append(_str(consumer.get("groupName"), "a heartbeat consumer's groupName"))
        else:
            subs = consumer.get("subscriptionDataSet") or []
            if not isinstance(subs, list):
                raise ProtocolError("a heartbeat subscriptionDataSet is not a list")
            out += [_str(s.get("topic") if isinstance(s, dict) else None, "a subscription's topic")
                    for s in subs]
    return out


def _batch_ack(res: Resource, ext: Mapping[str, str], body: _Body) -> list[str]:
    """Short keys ``t`` / ``c`` as fastjson writes them, or the long names."""
    acks = body.obj().get("acks")
    if not isinstance(acks, list):
        raise ProtocolError("batch ack body has no acks list")
    short, long = ("c", "consumerGroup") if res.kind == Kind.GROUP else ("t", "topic")
    return [_str(e.get(short, e.get(long)) if isinstance(e, dict) else None,
                 "a batch ack entry's topic and group") for e in acks]


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} is not a string")
    return value


_FINDERS: dict[Found, Callable[[Resource, Mapping[str, str], _Body], list[str]]] = {
    Found.HEADER: _header,
    Found.BODY_FIELD: _body_field,
    Found.BODY_QUEUE_LIST: _queue_list,
    Found.HEARTBEAT_BODY: _heartbeat,
    Found.BATCH_ACK_BODY: _batch_ack,
}


# --- the check after reading -------------------------------------------------------------


class ResourceCheck(Protocol):
    """Whether the sender of ``cmd`` over ``conn`` may see ``named``: asked by a handler
    about what it found in stored data, before it answers or acts on it, as the code's
    declaration (:meth:`declared`) says."""

    def allows(self, cmd: Any, conn: Any, named: Named) -> bool: ...

    def declared(self, code: int) -> CodeRule | None: ...


class OpenCheck:
    """No ACL: everything is allowed."""

    def allows(self, cmd: Any, conn: Any, named: Named) -> bool:
        return True

    def declared(self, code: int) -> CodeRule | None:
        return rule_of(code)


OPEN_CHECK = OpenCheck()


# --- the table in docs/security.md -------------------------------------------------------


def _where(res: Resource) -> str:
    if res.kind == Kind.CLUSTER:
        return "cluster"
    place = {Found.HEADER: f"header `{res.field}`", Found.BODY_FIELD: f"body `{res.field}`",
             Found.BODY_QUEUE_LIST: f"queues in body `{res.field}`",
             Found.RECORD_AT_OFFSET: f"record at offset `{res.field}`"}.get(res.found, res.found.value)
    return f"{res.kind.value} {res.need.value}: {place}"


def _names(flag: enum.Flag) -> str:
    return ", ".join(str(m.name).lower() for m in type(flag) if m.value and m in flag) or "-"


def markdown_table() -> str:
    """:data:`RULES` as the Markdown table docs/security.md lists (a test keeps them equal)."""
    lines = ["| Code | Name | Access | Resources (permission: where found) | Senders | Served by |",
             "|---:|---|---|---|---|---|"]
    for code, rule in sorted(RULES.items(), key=lambda item: int(item[0])):
        senders = "admin only" if rule.senders == Sender.ADMIN else _names(rule.senders)
        flags = " (appends)" if rule.appends else " (signed)" if rule.signed else ""
        lines.append(f"| {int(code)} | {code.name} | {rule.access.value}{flags} | "
                     f"{'; '.join(_where(r) for r in rule.resources)} | {senders} | {_names(rule.served_by)} |")
    return "\n".join(lines) + "\n"
