"""The newest link of each slave id on the HA master (:class:`LinkTable`).

Everything the master counts for a slave id (its ack offset, the copies a waiting send
sees, its caught-up time in the SyncStateSet) follows the link this table holds for the id,
and that one only.  A link claims its id as soon as its hello is accepted, so a link still
handshaking is replaced like an established one; whoever claims closes the link its claim
replaced.  A link that ends releases only itself, never a newer link of its id.
"""
from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class _Counted(Protocol):
    broker_id: int
    #: Last offset the slave acknowledged on this link (-1 until it reported one).
    ack: int


C = TypeVar("C", bound=_Counted)


class LinkTable(Generic[C]):
    """Slave id -> the one link that counts for it."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, C] = {}

    def claim(self, link: C) -> C | None:
        """Hold ``link`` for its id; returns the link it replaces (the caller closes it)."""
        old = self._by_id.get(link.broker_id)
        self._by_id[link.broker_id] = link
        return old if old is not link else None

    def release(self, link: C) -> None:
        """Forget ``link`` if it is the one held for its id (a newer one stays)."""
        if self._by_id.get(link.broker_id) is link:
            del self._by_id[link.broker_id]

    def holds(self, link: C) -> bool:
        return self._by_id.get(link.broker_id) is link

    def get(self, broker_id: int) -> C | None:
        return self._by_id.get(broker_id)

    def ack_of(self, broker_id: int) -> int:
        """The held link's ack offset; -1 without a link (see :mod:`rmqha.ha.confirm`)."""
        link = self._by_id.get(broker_id)
        return -1 if link is None else link.ack

    def ids(self) -> list[int]:
        return list(self._by_id)

    def links(self) -> list[C]:
        """The held links (a copy: callers may close links while they walk it)."""
        return list(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)
