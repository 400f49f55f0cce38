"""Types of the compiled twin ``rmqha._core.records`` (records.pyx); the API is records_py's.

Checked against :class:`rmqha._core._protocols.RecordsTwin` by mypy.
"""
from collections.abc import Sequence
from typing import Any

from rmqha._core._protocols import DecodedRecord, ReadableBuffer, WritableBuffer
from rmqha._core.records_py import ScanStop as ScanStop
from rmqha._core.records_py import decode_properties as decode_properties
from rmqha._core.records_py import encode_properties as encode_properties
from rmqha.errors import CorruptRecordError as CorruptRecordError
from rmqha.errors import InvalidMessageError as InvalidMessageError
from rmqha.errors import MessageTooLargeError as MessageTooLargeError
from rmqha.errors import StoreError as StoreError

MESSAGE_MAGIC: int
BLANK_MAGIC: int
FIXED_SIZE: int
MIN_BLANK: int
MAX_TOPIC_BYTES: int
MAX_PROPERTIES_BYTES: int
MAX_BODY_BYTES: int
CRC_MASK: int
#: Whether the CRC runs on carry-less multiplication, 128-bit / 512-bit (CPU dependent).
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

def crc32(data: ReadableBuffer, value: int = ...) -> int: ...
def body_crc(body: ReadableBuffer) -> int: ...
def message_size(body_len: int, topic_len: int, properties_len: int) -> int: ...
def write_message(buf: WritableBuffer, pos: int, topic: bytes, body: ReadableBuffer, properties: bytes,
                  queue_id: int, flag: int, queue_offset: int, physical_offset: int, sys_flag: int,
                  born_timestamp: int, born_host: bytes, store_timestamp: int, store_host: bytes,
                  reconsume_times: int, prepared_transaction_offset: int) -> int: ...
def write_batch(buf: WritableBuffer, pos: int, limit: int, topic: bytes, bodies: Sequence[Any], start: int,
                properties: bytes, queue_id: int, flag: int, queue_offset: int, base_offset: int,
                sys_flag: int, born_timestamp: int, born_host: bytes, store_timestamp: int,
                store_host: bytes, reconsume_times: int, prepared_transaction_offset: int,
                offsets_out: Any = ..., max_record: int = ...) -> tuple[int, int]: ...
def properties_plain(raw: bytes, reserved_keys: tuple[bytes, ...] = ...,
                     reserved_prefixes: tuple[bytes, ...] = ...) -> bool: ...
def batch_plain(batch: ReadableBuffer, max_items: int, reserved_keys: tuple[bytes, ...] = ...,
                reserved_prefixes: tuple[bytes, ...] = ...) -> int: ...
def write_batch_entries(buf: WritableBuffer, pos: int, limit: int, topic: bytes, batch: ReadableBuffer,
                        src: int, queue_id: int, queue_offset: int, base_offset: int, sys_flag: int,
                        born_timestamp: int, born_host: bytes, store_timestamp: int, store_host: bytes,
                        offsets_out: Any, sizes_out: Any, index: int,
                        max_record: int = ...) -> tuple[int, int, int]: ...
def write_plain_run(buf: WritableBuffer, pos: int, limit: int, base_offset: int,
                    sends: list[Any], start: int, stop: int, queue_ids: Any,
                    topics: dict[Any, bytes], queue_offsets: dict[tuple[bytes, int], int],
                    born_default: int, born_host: bytes, store_timestamp: int,
                    store_host: bytes, offsets_out: Any, sizes_out: Any,
                    queue_offsets_out: Any, max_record: int = ...) -> tuple[int, int, int]: ...
def write_blank(buf: WritableBuffer, pos: int, size: int) -> None: ...
def scan(buf: ReadableBuffer, pos: int, end: int, base_offset: int, verify_from: int,
         table: dict[tuple[bytes, int], int] | None = ..., lower: bool = ...,
         seg_end: int = ...) -> tuple[int, int, int]: ...
def decode(buf: ReadableBuffer, pos: int, limit: int, verify_crc: bool = ...) -> DecodedRecord: ...
def prefault(buf: WritableBuffer, start: int = ..., end: int = ...) -> None: ...
def resident(buf: ReadableBuffer, start: int, end: int) -> bool: ...
