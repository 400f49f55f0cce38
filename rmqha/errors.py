"""The one exception hierarchy of rmqha.

Every error raised on purpose by rmqha derives from :class:`RmqhaError`.  Subclasses say
which layer refused what; messages name the offending value so a person can act on them.
Add new classes here (grouped by layer), never ad hoc in other modules.
"""
from __future__ import annotations


class RmqhaError(Exception):
    """Root of every error rmqha raises on purpose."""


# --- configuration -----------------------------------------------------------------------


class ConfigError(RmqhaError):
    """A configuration key, value or file is wrong (the message names which)."""


# --- storage -----------------------------------------------------------------------------


class StoreError(RmqhaError):
    """The commitlog, an index or a checkpoint refused an operation."""


class MessageTooLargeError(StoreError):
    """A record does not fit in one segment."""


class InvalidMessageError(StoreError):
    """A message's fields are invalid (empty or too long topic, bad properties, ...)."""


class OffsetMismatchError(StoreError):
    """Raw data was offered at an offset other than the log's current max offset."""


class CorruptRecordError(StoreError):
    """A stored record failed validation (magic, sizes, CRC)."""


class MissingSegmentError(StoreError):
    """A commitlog segment file that the store's own records say must exist is gone."""


class DiskFullError(StoreError):
    """The filesystem has no room for the next bytes of the log: the write is refused
    before anything reaches the file (the message carries the OS's reason)."""


class StoreClosedError(StoreError):
    """The store was used after close()."""


class EpochError(StoreError):
    """An epoch-map operation was refused (epochs must increase, starts must not go back)."""


class CheckpointError(StoreError):
    """A checkpoint file (epoch file, meta file) is missing or corrupt, .bak included."""


# --- wire protocols ----------------------------------------------------------------------


class ProtocolError(RmqhaError):
    """A frame on the wire is malformed: out of bounds, unknown type, short body, ..."""


class ReceiptError(ProtocolError):
    """A pop receipt handle that may not ack or change its message: forged, expired,
    already acked, ... (``status`` names which; see rmqha.messaging.receipt)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class RemotingError(RmqhaError):
    """An RPC failed at the transport level (connection lost, closed)."""


class ServerIdentityError(RemotingError):
    """A server's TLS certificate does not name what the client dialled it as (a name
    server, a broker of the cluster and group its route gives): the connection is closed
    before a request is written, and the message says what was expected and what came."""


class RemotingTimeoutError(RemotingError):
    """An RPC got no answer in time."""


class RequestAuthError(RmqhaError):
    """A control request lacks valid proof that its sender holds the cluster secret
    (missing, wrong or stale signature, or a replayed nonce); the message says which."""


class RemoteCommandError(RmqhaError):
    """The remote side answered a request with a non-success code."""

    def __init__(self, code: int, remark: str | None, request_code: int | None = None) -> None:
        self.code = code
        self.remark = remark or ""
        self.request_code = request_code
        what = f"request {request_code}" if request_code is not None else "request"
        super().__init__(f"{what} refused with code {code}: {self.remark}")


# --- controller / broker -----------------------------------------------------------------


class ControllerError(RmqhaError):
    """The controller could not do what was asked (not leader, no quorum, ...)."""


class NotLeaderError(ControllerError):
    """This controller is not the Raft leader; ``leader`` names the leader if known."""

    def __init__(self, message: str, leader: str | None = None) -> None:
        self.leader = leader
        super().__init__(message)


class BrokerError(RmqhaError):
    """A broker refused an operation (identity mismatch, fenced, wrong role)."""


class BrokerIdentityError(BrokerError):
    """The stored broker identity does not match the configuration."""


class ReplicationError(RmqhaError):
    """The HA link failed: handshake refused, truncation impossible, bad block."""


class LocalClusterError(RmqhaError):
    """A cluster started by rmqha.testing.local_cluster did not reach a state in time, or one of
    its processes died while waited on (the message carries every process's log tail)."""


# --- client ------------------------------------------------------------------------------


class ClientError(RmqhaError):
    """The client could not complete a send or pull."""


class TopicNotFoundError(ClientError):
    """The name servers know no route for a topic (TOPIC_NOT_EXIST)."""


class SendError(ClientError):
    """A send failed after its retries; ``code``/``status`` are the last broker answer
    (``status`` e.g. IN_SYNC_REPLICAS_NOT_ENOUGH, NOT_MASTER, TIMEOUT, CONNECTION)."""

    def __init__(self, message: str, code: int | None = None, status: str = "") -> None:
        self.code = code
        self.status = status
        super().__init__(message)


class SequenceGapError(SendError):
    """An idempotent send was refused because its sequence skips one its queue never
    stored (an earlier send to that queue failed for good): nothing of it was stored.  The
    producer starts that queue afresh (a new producer generation), so sending it again is
    safe.  ``producer``, ``queue``, ``expected`` and ``got`` are the broker's words."""

    def __init__(self, message: str, *, producer: str, queue: str, expected: int, got: int,
                 code: int | None = None) -> None:
        self.producer = producer
        self.queue = queue
        self.expected = expected
        self.got = got
        super().__init__(message, code, "PRODUCER_SEQUENCE_GAP")


# --- the Spark source and sink -----------------------------------------------------------


class SparkOptionError(ConfigError):
    """An option of ``spark.read/readStream/write.format("rmqha")`` is missing or wrong;
    ``option`` names it (as the user spelled it in the docs), the message says why."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"option {option!r}: {message}")


class SparkSourceError(ClientError):
    """The rmqha Spark source cannot read a planned range (offsets gone below the retained
    log with failOnDataLoss, or not served before the deadline) or the sink cannot send."""


# --- security ----------------------------------------------------------------------------


class AuthenticationError(RmqhaError):
    """A peer did not prove who it claims to be: a link handshake or a sealed frame failed
    its MAC, or a TLS peer presented no usable certificate.  Close the connection."""


class PeerIdentityError(AuthenticationError):
    """A peer proved an identity, but not one allowed here (wrong role, group, ...)."""


class AclError(RmqhaError):
    """A request was refused by the RocketMQ ACL 1.0 check (``plain_acl.yml``).

    ``response_code`` is the code to answer with: RocketMQ's broker answers every
    ``AclException`` (bad signature and missing permission alike) with SYSTEM_ERROR (1) and
    the exception text as remark; ``remark`` is that text.  (NO_PERMISSION, 16, is what it
    answers when the broker's or topic's own perm forbids a send, not for the ACL.)  The
    message never holds a secret.
    """

    #: SYSTEM_ERROR: what RocketMQ's NettyRemotingAbstract answers when an RPC hook throws.
    DEFAULT_RESPONSE_CODE = 1

    def __init__(self, message: str, response_code: int = DEFAULT_RESPONSE_CODE) -> None:
        self.response_code = response_code
        self.remark = message
        super().__init__(message)


class AclAuthenticationError(AclError):
    """The request's AccessKey is missing or unknown, or its Signature does not match."""


class AclPermissionError(AclError):
    """The account is known and the signature good, but it lacks the permission asked for
    (a topic or group perm, or admin for an admin request code)."""


# --- the gRPC proxy ----------------------------------------------------------------------


class ProxyError(RmqhaError):
    """The proxy refuses or fails a gRPC request with a RocketMQ 5 status code.

    ``code`` is a number of ``apache.rocketmq.v2.Code`` (:class:`rmqha.proxy.status.Code`):
    the client sees it in the response's ``status`` with this message, as RocketMQ's proxy
    answers (ILLEGAL_TOPIC, TOPIC_NOT_FOUND, MESSAGE_BODY_TOO_LARGE, FORBIDDEN, ...).
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
