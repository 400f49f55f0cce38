"""Types of the compiled twin ``rmqha._core.send_codec`` (send_codec.pyx); the API is
send_codec_py's.  Checked against :class:`rmqha._core._protocols.SendCodecTwin` by mypy."""
from collections.abc import Sequence
from typing import Any, final

from rmqha._core.send_codec_py import ANSWER_FIELDS as ANSWER_FIELDS
from rmqha._core.send_codec_py import DEFAULT_TOPIC as DEFAULT_TOPIC
from rmqha._core.send_codec_py import ENTRY_FIXED as ENTRY_FIXED
from rmqha._core.send_codec_py import LANGUAGE as LANGUAGE
from rmqha._core.send_codec_py import Answer as Answer
from rmqha._core.send_codec_py import month_bounds as month_bounds
from rmqha.errors import ProtocolError as ProtocolError

@final
class UniqKeys:
    @property
    def prefix(self) -> str: ...
    def __init__(self, prefix: str) -> None: ...
    def next(self) -> str: ...
    def take(self, count: int) -> list[str]: ...

def encode_send(code: int, opaque: int, version: int, group: str, topic: str, sys_flag: int,
                born_ms: int, flag: int, properties: str, batch: bool, queue_id: int,
                body: bytes) -> bytes: ...
def decode_send_answer(frame: bytes | bytearray | memoryview) -> Answer | None: ...
def match_answers(data: bytes, pending: dict[int, Any], deadlines: dict[int, float],
                  max_frame_bytes: int, limit: int) -> tuple[int, int]: ...
def encode_plain_batch(bodies: Sequence[bytes], uids: Sequence[str], head: str, tail: str,
                       start: int, max_bytes: int) -> tuple[bytes, int]: ...
