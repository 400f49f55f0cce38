"""Types of the compiled twin ``rmqha._core.message_index`` (message_index.pyx); the API is
message_index_py's.

Checked against :class:`rmqha._core._protocols.MessageIndexTwin` by mypy.
"""
import mmap

HEADER_SIZE: int
ENTRY_SIZE: int
MAGIC_V1: int
BLANK_MAGIC: int
REC_FIXED: int
#: add_records status: what stopped the scan at the returned position.
DONE: int
FULL: int
NOT_A_RECORD: int
BLANK: int

def prop(props: bytes, needle: bytes) -> bytes | None: ...
def add_records(view: memoryview | bytes, pos: int, end: int, base: int, mm: mmap.mmap, slot_count: int,
                entries_at: int, capacity: int, count: int, min_ts: int, max_ts: int,
                skip: tuple[bytes, ...], max_key_bytes: int) -> tuple[int, int, int, int, int, int]: ...
