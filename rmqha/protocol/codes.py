"""Request and response codes of the RocketMQ remoting protocol as rmqha uses them.

Values are RocketMQ's own (``remoting/.../protocol/RequestCode.java`` and
``ResponseCode.java``) wherever RocketMQ has one, so RocketMQ's tooling and clients can
talk to rmqha; codes of rmqha's own start at 10000.  The canonical member names are
RocketMQ's (``CONTROLLER_ELECT_MASTER``); short aliases (``ELECT_MASTER``) name the same
values, and ``RequestCode(1002).name`` is always the RocketMQ name (metrics use it).

Layout: controller codes first, then a marked block for the client protocol (route,
send, pull, offsets, ...), then rmqha's own codes.  Add members inside the right block,
and the new code's declaration to :data:`rmqha.protocol.code_rules.RULES` (a test fails
for a code without one).
"""
from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    """``code`` of a request frame."""

    # --- controller mode (RocketMQ 5, RIP-44) ------------------------------------------
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    UPDATE_CONTROLLER_CONFIG = 1009
    GET_CONTROLLER_CONFIG = 1010
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013

    # Short aliases (same values) used by rmqha's code and the issue text.
    ALTER_SYNC_STATE_SET = 1001
    ELECT_MASTER = 1002
    REGISTER_BROKER_TO_CONTROLLER = 1003
    GET_REPLICA_INFO = 1004
    GET_METADATA_INFO = 1005
    GET_SYNC_STATE_DATA = 1006
    GET_NEXT_BROKER_ID = 1012
    APPLY_BROKER_ID = 1013

    # --- client protocol (name server + broker; owned by the broker helper) --------------
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    UPDATE_NAMESRV_CONFIG = 318
    SEND_BATCH_MESSAGE = 320
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_TOPIC_CONFIG = 351
    LITE_PULL_MESSAGE = 361
    QUERY_ASSIGNMENT = 400
    SET_MESSAGE_REQUEST_MODE = 401
    GET_BROKER_MEMBER_GROUP = 901
    # Pop consumption (RocketMQ 5): the broker keeps the consume progress and in-flight
    # messages; receipt handles (``extraInfo``) ack them.
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    NOTIFICATION = 200054
    POLLING_INFO = 200055
    BATCH_ACK_MESSAGE = 200151
    GET_BROKER_HA_STATUS = 907

    # --- rmqha's own codes (>= 10000) ---------------------------------------------------


class ResponseCode(IntEnum):
    """``code`` of a response frame."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    NO_PERMISSION = 16

    # --- client protocol (owned by the broker helper) -----------------------------------
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    NOT_LEADER_FOR_QUEUE = 501
    GO_AWAY = 1500

    # --- controller mode ---------------------------------------------------------------
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014

    # Short aliases (same values).
    FENCED_MASTER_EPOCH = 2000
    FENCED_SYNC_STATE_SET_EPOCH = 2001
    INVALID_MASTER = 2002
    INVALID_REPLICAS = 2003
    MASTER_NOT_AVAILABLE = 2004
    INVALID_REQUEST = 2005
    BROKER_NOT_ALIVE = 2006
    NOT_LEADER = 2007
    BROKER_METADATA_NOT_EXIST = 2008
    INVALID_CLEAN_BROKER_METADATA = 2009
    BROKER_NEED_TO_BE_REGISTERED = 2010
    MASTER_STILL_EXIST = 2011
    ELECT_MASTER_FAILED = 2012
    ALTER_SYNC_STATE_SET_FAILED = 2013
    BROKER_ID_INVALID = 2014

    # --- rmqha's own codes (>= 10000) ---------------------------------------------------
    #: An idempotent send whose sequence skips one its queue has not stored (nothing stored;
    #: ext fields name producer, queue, expected and got: ``rmqha.protocol.idempotence``).
    PRODUCER_SEQUENCE_GAP = 10000
    #: A retry older than the results the broker keeps for its producer and queue.
    PRODUCER_SEQUENCE_STALE = 10001


def code_name(code: int, *, response: bool = False) -> str:
    """RocketMQ's name of a code, or the number as text when it is not one of ours."""
    enum = ResponseCode if response else RequestCode
    try:
        return enum(code).name
    except ValueError:
        return str(code)
