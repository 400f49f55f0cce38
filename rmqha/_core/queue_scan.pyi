"""Types of the compiled twin ``rmqha._core.queue_scan`` (queue_scan.pyx); the API is queue_scan_py's.

Checked against :class:`rmqha._core._protocols.QueueScanTwin` by mypy.
"""
from collections.abc import Callable

from rmqha._core._protocols import QueueRun

MESSAGE_MAGIC: int
BLANK_MAGIC: int
FIXED_SIZE: int
UNIT_SIZE: int

def java_hash_ascii(raw: bytes) -> int | None: ...
def index_runs(view: memoryview | bytes, base: int, watched_topics: frozenset[bytes], watched_prop: bytes | None,
               tag_hash: Callable[[bytes], int]) -> tuple[int, list[QueueRun], tuple[int, int, int] | None]: ...
def check_units(view: memoryview | bytes, base: int, units: bytes, start: int, stop: int,
                first_qoff: int, queue_id: int, topic: bytes) -> tuple[int, bool]: ...
