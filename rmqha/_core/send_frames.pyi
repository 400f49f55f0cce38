"""Types of the compiled twin ``rmqha._core.send_frames`` (send_frames.pyx); the API is send_frames_py's.

Checked against :class:`rmqha._core._protocols.SendFramesTwin` by mypy.
"""
from collections.abc import Callable
from typing import Any

from rmqha._core._protocols import SendFrame

SEND_MESSAGE: int
SEND_MESSAGE_V2: int
SEND_BATCH_MESSAGE: int
COMPRESSED: int
TRANSACTION_BITS: int
LANGUAGE: str
LANGUAGE_CODE: int
MAX_SIGNED_FIELDS: int
V4_9_3: int

def scan(buf: bytes | bytearray | memoryview, max_frame_bytes: int,
         decode_other: Callable[[memoryview], Any],
         refuse: tuple[bytes, ...], signed: bool = ...) -> tuple[list[Any], int]: ...
def parse_send(frame: bytes | bytearray | memoryview, refuse: tuple[bytes, ...],
               signed: bool = ...) -> SendFrame | None: ...
def encode_send_ok(serialize_type: int, opaque: int, version: int, msg_id: str, queue_id: int,
                   queue_offset: int, status: str, commit_offset: int) -> bytes: ...
def encode_send_oks(sends: list[SendFrame], start: int, stop: int, version: int,
                    msg_id_prefix: str, queue_ids: Any, queue_offsets: Any, offsets: Any,
                    status: str) -> bytes: ...
