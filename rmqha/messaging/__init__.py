"""The broker's messaging layer: RocketMQ's client protocol over the commitlog.

:class:`MessageService` (in :mod:`rmqha.messaging.service`) is what the broker wires in: a
thin dispatcher over one piece per concern, all sharing one ``MessagingContext``
(``context``): the send path (``send_path``, appending through ``log_writer``), the pull
path (``pull_path``), queue lookups (``queue_queries``), consumer offsets
(``consumer_offsets``), topic admin (``topic_admin``), the replicated state
(``state_replication`` folding the records of ``state``), client requests
(``client_requests`` over the tables of ``clients``), consumer retries (``send_back``),
retention (``retention``), subscription groups (``group_admin``) and pop consumption
(``pop_path``, ``pop_acks``, ``pop_revive`` over ``pop_ledger``, ``pop_logic``,
``pop_state`` and ``receipt``).  The message codec, topics and request headers it shares with
the client are in :mod:`rmqha.protocol`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["MessageService", "MessagingConfig"]


def __getattr__(name: str) -> Any:
    # Lazy: importing one piece (e.g. rmqha.messaging.state) must not load the whole broker side.
    if name in __all__:
        from rmqha.messaging import service

        return getattr(service, name)
    raise AttributeError(f"module 'rmqha.messaging' has no attribute {name!r}")
