"""The API of each hot-path feature, one :class:`typing.Protocol` per feature.

A feature has two twins (``<name>.pyx`` compiled, ``<name>_py.py`` pure) with one API;
these protocols write that API down, so :func:`rmqha._core.load` and
:func:`rmqha._core.load_twin` return a typed module (``load("records")`` is a
:class:`RecordsTwin`) instead of an untyped ``ModuleType``.  The compiled twins are typed
by the stubs beside them (``records.pyi``, ...).

Where the twins' types differ (the compiled TRANSFER_DATA frame is an extension type, the
pure one a dataclass; the decoders are two classes each) the protocol names the behaviour
both share (:class:`TransferDataLike`, :class:`FrameDecoderLike`).  Classes a twin exports
are read-only members (properties), so a twin's own class matches the protocol of its
behaviour (a plain attribute would have to be that very type).

The block at the end is checked by mypy only: it assigns every twin, compiled (its stub)
and pure, to its feature's protocol, so a twin whose API drifts from the other's fails
``make lint``.
"""
from __future__ import annotations

import mmap
from array import array
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rmqha._core import frames_py, records_py, send_codec_py

#: A buffer a twin reads records or frames from.
ReadableBuffer = bytes | bytearray | memoryview | mmap.mmap
#: A buffer a twin writes records into (a segment's mapping, or a bytearray in tests).
WritableBuffer = bytearray | memoryview | mmap.mmap
#: An epoch entry: (epoch, start offset, end offset).
EpochEntry = tuple[int, int, int]
#: A record decoded by ``records.decode``: (total_size, magic, body_crc, queue_id, flag,
#: queue_offset, physical_offset, sys_flag, born_timestamp, born_host (8 bytes),
#: store_timestamp, store_host (8 bytes), reconsume_times, prepared_transaction_offset,
#: body, topic, properties).
DecodedRecord = tuple[int, int, int, int, int, int, int, int, int, bytes, int, bytes, int, int,
                      bytes, bytes, bytes]
#: A run of consecutive records of one queue found by ``queue_scan.index_runs``: (topic,
#: queue id, first queue offset, RocketMQ consume-queue units (20 bytes each: physical
#: offset int64, size int32, tag hash int64, big-endian), indexes in the run of the
#: records a watcher wants).
QueueRun = tuple[bytes, int, int, bytes, list[int]]


class RecordsTwin(Protocol):
    """``rmqha._core.records`` / ``records_py``: RocketMQ v1 commitlog records."""

    __name__: str

    MESSAGE_MAGIC: int
    BLANK_MAGIC: int
    FIXED_SIZE: int
    MIN_BLANK: int
    MAX_TOPIC_BYTES: int
    MAX_PROPERTIES_BYTES: int
    MAX_BODY_BYTES: int
    CRC_MASK: int
    CRC_CLMUL: bool
    CRC_VCLMUL: bool
    NAME_VALUE_SEPARATOR: str
    PROPERTY_SEPARATOR: str
    BATCH_ENTRY_FIXED: int
    MAX_PLAIN_KEYS: int
    RUN_STOP_DONE: int
    RUN_STOP_FULL: int
    RUN_STOP_SINGLE: int
    RUN_MAX_KEYS: int

    @property
    def ScanStop(self) -> type[records_py.ScanStop]: ...

    def crc32(self, data: bytes | bytearray | memoryview, value: int = ...) -> int: ...

    def body_crc(self, body: bytes | bytearray | memoryview) -> int: ...

    def message_size(self, body_len: int, topic_len: int, properties_len: int) -> int: ...

    def encode_properties(self, properties: Mapping[str, str] | None) -> bytes: ...

    def decode_properties(self, raw: bytes | memoryview) -> dict[str, str]: ...

    def write_message(self, buf: WritableBuffer, pos: int, topic: bytes, body: ReadableBuffer,
                      properties: bytes, queue_id: int, flag: int, queue_offset: int,
                      physical_offset: int, sys_flag: int, born_timestamp: int, born_host: bytes,
                      store_timestamp: int, store_host: bytes, reconsume_times: int,
                      prepared_transaction_offset: int) -> int: ...

    def write_batch(self, buf: WritableBuffer, pos: int, limit: int, topic: bytes,
                    bodies: Sequence[Any], start: int, properties: bytes, queue_id: int, flag: int,
                    queue_offset: int, base_offset: int, sys_flag: int, born_timestamp: int,
                    born_host: bytes, store_timestamp: int, store_host: bytes,
                    reconsume_times: int, prepared_transaction_offset: int,
                    offsets_out: Any = ..., max_record: int = ...) -> tuple[int, int]: ...

    def properties_plain(self, raw: bytes, reserved_keys: tuple[bytes, ...] = ...,
                         reserved_prefixes: tuple[bytes, ...] = ...) -> bool: ...

    def batch_plain(self, batch: ReadableBuffer, max_items: int,
                    reserved_keys: tuple[bytes, ...] = ...,
                    reserved_prefixes: tuple[bytes, ...] = ...) -> int: ...

    def write_batch_entries(self, buf: WritableBuffer, pos: int, limit: int, topic: bytes,
                            batch: ReadableBuffer, src: int, queue_id: int, queue_offset: int,
                            base_offset: int, sys_flag: int, born_timestamp: int, born_host: bytes,
                            store_timestamp: int, store_host: bytes, offsets_out: Any,
                            sizes_out: Any, index: int,
                            max_record: int = ...) -> tuple[int, int, int]: ...

    def write_plain_run(self, buf: WritableBuffer, pos: int, limit: int, base_offset: int,
                        sends: list[Any], start: int, stop: int, queue_ids: Any,
                        topics: dict[Any, bytes], queue_offsets: dict[tuple[bytes, int], int],
                        born_default: int, born_host: bytes, store_timestamp: int,
                        store_host: bytes, offsets_out: Any, sizes_out: Any,
                        queue_offsets_out: Any, max_record: int = ...) -> tuple[int, int, int]: ...

    def write_blank(self, buf: WritableBuffer, pos: int, size: int) -> None: ...

    def scan(self, buf: ReadableBuffer, pos: int, end: int, base_offset: int, verify_from: int,
             table: dict[tuple[bytes, int], int] | None = ..., lower: bool = ...,
             seg_end: int = ...) -> tuple[int, int, int]: ...

    def decode(self, buf: ReadableBuffer, pos: int, limit: int,
               verify_crc: bool = ...) -> DecodedRecord: ...

    def prefault(self, buf: WritableBuffer, start: int = ..., end: int = ...) -> None: ...

    def resident(self, buf: ReadableBuffer, start: int, end: int) -> bool: ...


class EpochMapCoreLike(Protocol):
    """The ordered (epoch, start) entries of one broker's log (``EpochMapCore`` of a twin)."""

    def __init__(self, entries: Iterable[Any] = ...) -> None: ...

    def __len__(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def entries(self) -> list[EpochEntry]: ...

    def pairs(self) -> list[tuple[int, int]]: ...

    def last_epoch(self) -> int: ...

    def first_entry(self) -> EpochEntry | None: ...

    def last_entry(self) -> EpochEntry | None: ...

    def entry_for_epoch(self, epoch: int) -> EpochEntry | None: ...

    def next_entry(self, epoch: int) -> EpochEntry | None: ...

    def entry_for_offset(self, offset: int) -> EpochEntry | None: ...

    def find_consistent_point(self, remote: Any) -> int: ...

    def append(self, epoch: int, start: int) -> None: ...

    def set_max_offset(self, offset: int | None) -> None: ...

    def truncate_suffix(self, offset: int) -> int: ...

    def truncate_suffix_by_epoch(self, epoch: int) -> int: ...

    def truncate_prefix(self, offset: int) -> int: ...

    def clear(self) -> None: ...

    def copy(self) -> EpochMapCoreLike: ...


class EpochMapTwin(Protocol):
    """``rmqha._core.epoch_map`` / ``epoch_map_py``: the in-memory epoch map."""

    __name__: str

    OPEN_END: int
    MAX_EPOCH: int

    @property
    def EpochMapCore(self) -> type[EpochMapCoreLike]: ...


class TransferDataLike(Protocol):
    """A TRANSFER_DATA frame: the compiled twin's extension type or the pure dataclass."""

    block_start_offset: int
    epoch_start_offset: int
    confirm_offset: int
    data: Any
    timestamp_ms: int
    epoch: int

    def __init__(self, block_start_offset: int, epoch_start_offset: int, confirm_offset: int,
                 data: Any = ..., timestamp_ms: int = ..., epoch: int = ...) -> None: ...


class FrameDecoderLike(Protocol):
    """An incremental decoder of one dialect: ``feed(chunk) -> frames completed by it``."""

    def __init__(self, direction: Any = ..., max_frame_bytes: int = ...) -> None: ...

    @property
    def max_frame_bytes(self) -> int: ...

    @property
    def buffered(self) -> int: ...

    @property
    def stream_offset(self) -> int: ...

    def feed(self, chunk: Any) -> list[Any]: ...


class FramesTwin(Protocol):
    """``rmqha._core.frames`` / ``frames_py``: both HA wire dialects.

    The frame dataclasses and enums are ``frames_py``'s in both twins; only TRANSFER_DATA
    has a type of each twin's own.
    """

    __name__: str

    HEADER_SIZE: int
    TRANSFER_HEADER_SIZE: int
    RETURN_EPOCH_ENTRY_SIZE: int
    RMQ_SLAVE_HANDSHAKE_SIZE: int
    RMQ_SLAVE_ACK_SIZE: int
    RMQ_MASTER_HANDSHAKE_SIZE: int
    RMQ_MASTER_TRANSFER_SIZE: int
    RMQ_EPOCH_ENTRY_SIZE: int
    DEFAULT_MAX_FRAME_BYTES: int
    MASTER_TO_SLAVE_TYPES: frozenset[int]
    SLAVE_TO_MASTER_TYPES: frozenset[int]

    @property
    def FrameType(self) -> type[frames_py.FrameType]: ...

    @property
    def ConnectionState(self) -> type[frames_py.ConnectionState]: ...

    @property
    def Direction(self) -> type[frames_py.Direction]: ...

    @property
    def Dialect(self) -> type[frames_py.Dialect]: ...

    @property
    def CheckResult(self) -> type[frames_py.CheckResult]: ...

    @property
    def HandshakeSlave(self) -> type[frames_py.HandshakeSlave]: ...

    @property
    def HandshakeMaster(self) -> type[frames_py.HandshakeMaster]: ...

    @property
    def QueryEpoch(self) -> type[frames_py.QueryEpoch]: ...

    @property
    def ReturnEpoch(self) -> type[frames_py.ReturnEpoch]: ...

    @property
    def ConfirmTruncate(self) -> type[frames_py.ConfirmTruncate]: ...

    @property
    def TransferAck(self) -> type[frames_py.TransferAck]: ...

    @property
    def RmqSlaveHandshake(self) -> type[frames_py.RmqSlaveHandshake]: ...

    @property
    def RmqSlaveAck(self) -> type[frames_py.RmqSlaveAck]: ...

    @property
    def RmqMasterHandshake(self) -> type[frames_py.RmqMasterHandshake]: ...

    @property
    def RmqMasterTransfer(self) -> type[frames_py.RmqMasterTransfer]: ...

    @property
    def TransferData(self) -> type[TransferDataLike]: ...

    @property
    def FramedDecoder(self) -> type[FrameDecoderLike]: ...

    @property
    def RocketMQDecoder(self) -> type[FrameDecoderLike]: ...

    def detect_dialect(self, first4: Any) -> str: ...

    def pack_transfer_header(self, block_start_offset: int, epoch_start_offset: int,
                             confirm_offset: int, data_len: int, epoch: int,
                             timestamp_ms: int = ...) -> bytes: ...

    def unpack_transfer_header(self, buf: Any,
                               pos: int = ...) -> tuple[int, int, int, int, int, int]: ...

    def pack_transfer_headers(self, block_starts: Any, epoch_starts: Any, confirm_offsets: Any,
                              data_lens: Any, epochs: Any, timestamps: Any) -> bytes: ...

    def unpack_transfer_headers(self, buf: Any) -> tuple[array[int], array[int], array[int],
                                                         array[int], array[int], array[int]]: ...

    def encode_framed(self, frame: Any) -> bytes: ...

    RUN_END: int
    RUN_PARTIAL: int
    RUN_OTHER: int

    def pack_transfer_ack(self, slave_max_offset: int, timestamp_ms: int, epoch: int) -> bytes: ...

    def scan_transfer_acks(self, buf: Any, tag_bytes: int, acked: int, sent: int,
                           last_epoch: int) -> tuple[int, int]: ...

    def scan_transfer_run(self, buf: Any, start: int, end: int, max_frame_bytes: int, tag_bytes: int,
                          log_end: int, epoch: int, epoch_start: int,
                          segment_bytes: int) -> tuple[int, array[int], int, int]: ...

    def decode_framed(self, buf: Any, direction: Any = ..., max_frame_bytes: int = ...) -> Any: ...

    def pack_rocketmq_transfer_header(self, offset: int, epoch: int, epoch_start_offset: int,
                                      confirm_offset: int, body_size: int) -> bytes: ...

    def pack_rocketmq_transfer_headers(self, offsets: Any, epochs: Any, epoch_starts: Any,
                                       confirm_offsets: Any, body_sizes: Any) -> bytes: ...

    def encode_rocketmq(self, frame: Any) -> bytes: ...

    def decode_rocketmq(self, buf: Any, direction: Any, max_frame_bytes: int = ...) -> Any: ...


class HaOffsetsTwin(Protocol):
    """``rmqha._core.ha_offsets`` / ``ha_offsets_py``: batch limiting and the confirm offset."""

    __name__: str

    DEFAULT_MAX_BATCH: int
    DEFAULT_MAX_LAG_MS: int

    def limit_batch(self, epoch_map: Any, from_offset: int, want: int, segment_end: int,
                    max_batch: int = ...) -> tuple[int, int, int]: ...

    def confirm_offset(self, master_max: int, acks: Iterable[int | None], previous: int) -> int: ...

    def should_expand(self, ack: int, confirm: int, epoch_start: int) -> bool: ...

    def should_shrink(self, now_ms: int, last_caught_up_ms: int, max_lag_ms: int = ...) -> bool: ...


class MessageIndexTwin(Protocol):
    """``rmqha._core.message_index`` / ``message_index_py``: the message index's scan."""

    __name__: str

    HEADER_SIZE: int
    ENTRY_SIZE: int
    MAGIC_V1: int
    BLANK_MAGIC: int
    REC_FIXED: int
    DONE: int
    FULL: int
    NOT_A_RECORD: int
    BLANK: int

    def prop(self, props: bytes, needle: bytes) -> bytes | None: ...

    def add_records(self, view: memoryview | bytes, pos: int, end: int, base: int, mm: mmap.mmap,
                    slot_count: int, entries_at: int, capacity: int, count: int, min_ts: int,
                    max_ts: int, skip: tuple[bytes, ...],
                    max_key_bytes: int) -> tuple[int, int, int, int, int, int]: ...


class QueueScanTwin(Protocol):
    """``rmqha._core.queue_scan`` / ``queue_scan_py``: the consume-queue index's walk."""

    __name__: str

    MESSAGE_MAGIC: int
    BLANK_MAGIC: int
    FIXED_SIZE: int
    UNIT_SIZE: int

    def java_hash_ascii(self, raw: bytes) -> int | None: ...

    def check_units(self, view: memoryview | bytes, base: int, units: bytes, start: int, stop: int,
                    first_qoff: int, queue_id: int, topic: bytes) -> tuple[int, bool]: ...

    def index_runs(self, view: memoryview | bytes, base: int, watched_topics: frozenset[bytes],
                   watched_prop: bytes | None, tag_hash: Callable[[bytes], int],
                   ) -> tuple[int, list[QueueRun], tuple[int, int, int] | None]: ...

    def QueueSink(self, key: object, topic: bytes, queue_id: int) -> QueueSinkLike: ...

    def dispatch(self, view: memoryview | bytes, base: int, sinks: dict[tuple[bytes, int], Any],
                 watched_topics: frozenset[bytes], watched_prop: bytes | None,
                 tag_hash: Callable[[bytes], int], gen: int) -> tuple[int, int, list[Any]]: ...


class QueueSinkLike(Protocol):
    """Where ``queue_scan.dispatch`` writes one queue's next units (either twin's
    ``QueueSink``)."""

    key: object
    topic: bytes
    queue_id: int
    mm: object
    start: int
    next: int
    limit: int
    gen: int


class UniqKeysLike(Protocol):
    """A process's UNIQ_KEY maker (``send_codec.UniqKeys`` of either twin)."""

    @property
    def prefix(self) -> str: ...

    def next(self) -> str: ...

    def take(self, count: int) -> list[str]: ...


class SendCodecTwin(Protocol):
    """``rmqha._core.send_codec`` / ``send_codec_py``: the client's send request encode and
    send answer decode, and its UNIQ_KEYs."""

    __name__: str

    DEFAULT_TOPIC: str
    LANGUAGE: str
    ANSWER_FIELDS: tuple[str, ...]
    ENTRY_FIXED: int

    def UniqKeys(self, prefix: str) -> UniqKeysLike: ...

    def month_bounds(self, now_ms: int) -> tuple[int, int]: ...

    def encode_send(self, code: int, opaque: int, version: int, group: str, topic: str,
                    sys_flag: int, born_ms: int, flag: int, properties: str, batch: bool,
                    queue_id: int, body: bytes) -> bytes: ...

    def decode_send_answer(self, frame: bytes | bytearray | memoryview,
                           ) -> send_codec_py.Answer | None: ...

    def match_answers(self, data: bytes, pending: dict[int, Any], deadlines: dict[int, float],
                      max_frame_bytes: int, limit: int) -> tuple[int, int]: ...

    def encode_plain_batch(self, bodies: Sequence[bytes], uids: Sequence[str], head: str,
                           tail: str, start: int, max_bytes: int) -> tuple[bytes, int]: ...


class PullAnswerTwin(Protocol):
    """``rmqha._core.pull_answer`` / ``pull_answer_py``: a pull answer's body, assembled on
    the broker and decoded on the client."""

    __name__: str

    MESSAGE_MAGIC: int
    FIXED_SIZE: int
    UNIT_SIZE: int
    CRC_MASK: int
    COMPRESSED: int
    DONE: int
    OUTSIDE: int
    MISMATCH: int
    BAD_RECORD: int

    def assemble(self, view: memoryview | bytes, base: int, units: bytes, start: int, stop: int,
                 first_qoff: int, queue_id: int, topic: bytes, hashes: Container[int] | None,
                 max_bytes: int, total: int, taken: int) -> tuple[int, int, int, int, bytes]: ...

    def decode(self, data: bytes | memoryview, broker_name: str, make: Callable[..., Any],
               inflate: Callable[[bytes, int, int], tuple[bytes, str | None]],
               max_records: int) -> list[Any]: ...


#: A plain send parsed by ``send_frames``: (code, opaque, serialize_type, topic, queue_id,
#: sys_flag, born_timestamp, flag, properties, reconsume_times, body, head, access_key,
#: signature, signed_fields: the signed content before the body); the last three None unless
#: parsed ``signed``.
SendFrame = tuple[int, int, int, str, int, int, int, int, bytes, int, bytes, bytes,
                  str | None, bytes | None, bytes | None]


class SendFramesTwin(Protocol):
    """``rmqha._core.send_frames`` / ``send_frames_py``: the broker's plain sends."""

    __name__: str

    SEND_MESSAGE: int
    SEND_MESSAGE_V2: int
    SEND_BATCH_MESSAGE: int
    COMPRESSED: int
    TRANSACTION_BITS: int
    LANGUAGE: str
    LANGUAGE_CODE: int
    MAX_SIGNED_FIELDS: int
    V4_9_3: int

    def scan(self, buf: bytes | bytearray | memoryview, max_frame_bytes: int,
             decode_other: Callable[[memoryview], Any],
             refuse: tuple[bytes, ...], signed: bool = ...) -> tuple[list[Any], int]: ...

    def parse_send(self, frame: bytes | bytearray | memoryview,
                   refuse: tuple[bytes, ...], signed: bool = ...) -> SendFrame | None: ...

    def encode_send_ok(self, serialize_type: int, opaque: int, version: int, msg_id: str,
                       queue_id: int, queue_offset: int, status: str,
                       commit_offset: int) -> bytes: ...

    def encode_send_oks(self, sends: list[SendFrame], start: int, stop: int, version: int,
                        msg_id_prefix: str, queue_ids: Any, queue_offsets: Any, offsets: Any,
                        status: str) -> bytes: ...


class WaiterQueueLike(Protocol):
    """A twin's ``WaiterQueue``: the waiting sends of one ``need``, lowest offset first."""

    def __len__(self) -> int: ...
    def add(self, offset: int, deadline: float, done: Callable[[bool], Any]) -> None: ...
    def next_deadline(self) -> float: ...
    def release(self, point: int, on_error: Callable[[BaseException], Any]) -> int: ...
    def expire(self, now: float, on_error: Callable[[BaseException], Any]) -> int: ...
    def fail_all(self, on_error: Callable[[BaseException], Any]) -> int: ...


class AckTableTwin(Protocol):
    """``rmqha._core.ack_table`` / ``ack_table_py``: the HA master's waiting sends."""

    __name__: str

    NO_DEADLINE: float

    @property
    def WaiterQueue(self) -> Callable[[], WaiterQueueLike]: ...

    def reach_point(self, acks: Sequence[int], need: int | None, floor: int,
                    max_offset: int) -> int: ...

    def settle(self, queues: Mapping[int | None, Any], acks: Sequence[int], floor: int,
               max_offset: int, on_error: Callable[[BaseException], Any]) -> int: ...

