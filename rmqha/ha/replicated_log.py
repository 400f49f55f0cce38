"""The commitlog as replication uses it: :class:`ReplicatedLog`.

HA reads the master's log (where it ends, where a segment ends, the bytes of a block, when a
flush reaches an offset) and writes the slave's (received blocks appended at exactly the log's
end, a divergent tail cut). Its classes took the log as ``Any``, so a misspelt member passed
mypy and failed at run time; typed by this Protocol, mypy checks every use against the
sixteen members replication needs, and :class:`rmqha.store.commitlog.CommitLog` (whose
receive side is :class:`rmqha.store.receive.ReceivePath`) satisfies it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol


class ReplicatedLog(Protocol):
    """What the HA master and slave use of a broker's commitlog."""

    @property
    def segment_bytes(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def min_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...

    @property
    def flush_mode(self) -> str: ...

    def segment_end(self, offset: int) -> int: ...

    def read(self, offset: int, size: int) -> memoryview: ...

    def flush(self) -> int: ...

    def flush_future(self, offset: int) -> Future[int]: ...

    def add_append_listener(self, cb: Callable[[int], None]) -> None: ...

    # The slave's side.
    def truncate(self, offset: int) -> None: ...

    def append_data(self, offset: int, data: bytes | bytearray | memoryview, *,
                    wait_flush: bool = True) -> int: ...

    def append_run(self, offset: int, buf: memoryview, spans: Sequence[int], *,
                   wait_flush: bool = True) -> int: ...

    def receive_view(self, offset: int, size: int) -> memoryview: ...

    def commit_received(self, offset: int, size: int, *, wait_flush: bool = True) -> int: ...

    def discard_received(self, offset: int, size: int) -> None: ...


if TYPE_CHECKING:
    from rmqha.store.commitlog import CommitLog

    def _the_commitlog_conforms(log: CommitLog) -> ReplicatedLog:  # checked by mypy only
        return log
