"""What the parts of an HA slave share: its state, its counters, the master's confirm offset.

:class:`SlaveProgress` is updated by the session, the receive path and the appender, and
read by :meth:`rmqha.ha.slave.HASlave.status`; :class:`ConfirmTracker` holds the confirm
offset the master's blocks carried and tells ``on_confirm`` of each advance, after the ack
that follows the blocks (the ack is what a waiting send needs; what the broker does with a
confirm offset is not).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class SlaveState(str, Enum):
    """HAConnectionState of the slave's link."""

    READY = "READY"
    HANDSHAKE = "HANDSHAKE"
    TRANSFER = "TRANSFER"
    SUSPEND = "SUSPEND"
    SHUTDOWN = "SHUTDOWN"


@dataclass
class SlaveProgress:
    """The slave's state and statistics (for status() and tests)."""

    state: SlaveState = SlaveState.READY
    sessions: int = 0
    last_error: str = ""
    last_truncate: int | None = None
    bytes_dropped: int = 0
    #: Blocks received straight into the commitlog's mapping (framed dialect, large blocks).
    direct_receives: int = 0
    #: Blocks (heartbeats included) applied by the transfer's reader callback and by its
    #: task; how often the callback handed the link back to the task.
    callback_blocks: int = 0
    task_blocks: int = 0
    handbacks: int = 0
    #: Blocks the compiled lane took (rmqha.ha.slave_lane), and its runs (each ends with a
    #: hand-back to the Python path, or the session's end).
    lane_blocks: int = 0
    lane_runs: int = 0
    master_max_offset: int = -1
    #: time.monotonic() of the last read from and write to the master (0: never).
    last_read: float = 0.0
    last_write: float = 0.0


class ConfirmTracker:
    """The master's confirm offset as this slave learnt it, never above what it holds."""

    __slots__ = ("confirm", "told", "_on_confirm")

    def __init__(self, on_confirm: Callable[[int], Any] | None) -> None:
        self.confirm = 0
        #: The confirm offset on_confirm was last told of.
        self.told = 0
        self._on_confirm = on_confirm

    def learn(self, confirm: int) -> None:
        """A block carried ``confirm`` (already capped at this log's max offset)."""
        if confirm > self.confirm:
            self.confirm = confirm

    def lower(self, offset: int) -> None:
        """The log was cut at ``offset``: nothing above it is confirmed here any more."""
        if self.confirm > offset:
            self.confirm = offset
        if self.told > offset:
            self.told = offset

    def tell(self) -> None:
        """Give on_confirm the confirm offset learnt so far, if it advanced since."""
        confirm = self.confirm
        if confirm > self.told:
            self.told = confirm
            if self._on_confirm is not None:
                self._on_confirm(confirm)
