"""Types of the compiled twin ``rmqha._core.pull_answer`` (pull_answer.pyx); the API is pull_answer_py's.

Checked against :class:`rmqha._core._protocols.PullAnswerTwin` by mypy.
"""
from collections.abc import Callable, Container
from typing import Any

MESSAGE_MAGIC: int
FIXED_SIZE: int
UNIT_SIZE: int
CRC_MASK: int
COMPRESSED: int
DONE: int
OUTSIDE: int
MISMATCH: int
BAD_RECORD: int

def assemble(view: memoryview | bytes, base: int, units: bytes, start: int, stop: int,
             first_qoff: int, queue_id: int, topic: bytes, hashes: Container[int] | None,
             max_bytes: int, total: int, taken: int) -> tuple[int, int, int, int, bytes]: ...
def decode(data: bytes | memoryview, broker_name: str, make: Callable[..., Any],
           inflate: Callable[[bytes, int, int], tuple[bytes, str | None]],
           max_records: int) -> list[Any]: ...
