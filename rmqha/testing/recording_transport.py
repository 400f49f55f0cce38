"""A stand-in asyncio transport for driving a real Connection without a socket.

:class:`RecordingTransport` is what the plain-send lane's tests and benches put under a
:class:`~rmqha.net.connection.Connection`: it keeps what the connection writes (or only
its length, for a benchmark), names a fixed peer and never closes or pushes back.
"""
from __future__ import annotations

import asyncio
from typing import Any


class RecordingTransport(asyncio.Transport):
    """What a connection writes (``out``, unless ``keep`` is false) and how many bytes
    (``written``); the peer is always 127.0.0.1:40000."""

    def __init__(self, keep: bool = True) -> None:
        super().__init__()
        self.keep = keep
        self.out = bytearray()
        self.written = 0

    def write(self, data: Any) -> None:
        self.written += len(data)
        if self.keep:
            self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # nothing is ever buffered, so no limit applies

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass  # nothing to release
