"""Types of the compiled twin ``rmqha._core.queue_scan`` (queue_scan.pyx); the API is queue_scan_py's.

Checked against :class:`rmqha._core._protocols.QueueScanTwin` by mypy.
"""
from collections.abc import Callable

from typing_extensions import disjoint_base

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

@disjoint_base
class QueueSink:
    key: object
    topic: bytes
    queue_id: int
    mm: object
    start: int
    next: int
    limit: int
    gen: int
    def __init__(self, key: object, topic: bytes, queue_id: int) -> None: ...

def dispatch(view: memoryview | bytes, base: int, sinks: dict[tuple[bytes, int], QueueSink],
             watched_topics: frozenset[bytes], watched_prop: bytes | None,
             tag_hash: Callable[[bytes], int], gen: int) -> tuple[int, int, list[object]]: ...
