"""The broker's messaging layer: RocketMQ's client protocol over the commitlog.

:class:`MessageService` (in :mod:`rmqha.messaging.service`) is what the broker wires in;
the other modules own one concept each: message codec (``message``), consume-queue
index (``consume_queue``), topics (``topics``), replicated state (``state``), client
heartbeats and locks (``clients``), request headers (``headers``).
"""
from __future__ import annotations

from typing import Any

__all__ = ["MessageService", "MessagingConfig"]


def __getattr__(name: str) -> Any:
    # Lazy: the client imports rmqha.messaging.message without the whole broker side.
    if name in __all__:
        from rmqha.messaging import service

        return getattr(service, name)
    raise AttributeError(f"module 'rmqha.messaging' has no attribute {name!r}")
