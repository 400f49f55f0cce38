"""Pure-Python twin of the in-memory epoch map (a hot path; ARCHITECTURE.md lists them).

This module owns the ordered ``(epoch, start_offset)`` entries of one broker's log and every
query and mutation on them; persistence lives in :mod:`rmqha.store.epoch_map`.  The compiled twin
``rmqha._core.epoch_map`` has the same API and results.

Model: an entry ends where the next one starts; the last entry ends at the log's max offset,
which only the caller knows (``set_max_offset``).  Until it is set, or after a suffix
truncation, the last entry is open-ended and reports :data:`OPEN_END` (int64 max, the value
RocketMQ's ``EpochEntry`` uses for "no end").

Quirks of RocketMQ's ``EpochFileCache``, decided here:
  (a) ``truncate_suffix`` really leaves the new last entry open-ended (RocketMQ only changed
      a copy, so the stale end survived);
  (b) an ``append`` whose start equals the last start replaces the last entry (that epoch
      held no data) instead of being rejected, so the newest epoch is never lost;
  (c) emptying the map is persisted like any other change (see rmqha.store.epoch_map).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rmqha.errors import EpochError

#: End of the last entry while the log's max offset is not known (Java Long.MAX_VALUE).
OPEN_END: int = (1 << 63) - 1
#: Epochs travel as int32 in both HA dialects.
MAX_EPOCH: int = (1 << 31) - 1

Entry = tuple[int, int, int]


def _remote_triples(remote: Any) -> list[tuple[int, int, int]]:
    """(epoch, start, end) triples of a remote history: a map of either twin or a sequence."""
    entries = getattr(remote, "entries", None)
    if callable(entries):
        return list(entries())
    out = []
    for item in remote:
        if len(item) != 3:
            raise EpochError(f"remote epoch entry {item!r} is not an (epoch, start, end) triple")
        out.append((int(item[0]), int(item[1]), int(item[2])))
    return out


class EpochMapCore:
    """Ordered epoch entries with strictly increasing epochs and increasing starts."""

    __slots__ = ("_epochs", "_starts", "_max_offset")

    def __init__(self, entries: Iterable[Any] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self._max_offset: int = OPEN_END
        for item in entries:
            self.append(item[0], item[1])

    # --- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._epochs)

    def __repr__(self) -> str:
        return f"EpochMapCore({self.entries()!r})"

    @property
    def max_offset(self) -> int:
        """The caller-given end of the last entry; OPEN_END while unknown."""
        return self._max_offset

    def _end(self, i: int) -> int:
        return self._starts[i + 1] if i + 1 < len(self._starts) else self._max_offset

    def entries(self) -> list[Entry]:
        return [(self._epochs[i], self._starts[i], self._end(i)) for i in range(len(self._epochs))]

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    def last_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else -1

    def first_entry(self) -> Entry | None:
        return (self._epochs[0], self._starts[0], self._end(0)) if self._epochs else None

    def last_entry(self) -> Entry | None:
        n = len(self._epochs)
        return (self._epochs[-1], self._starts[-1], self._max_offset) if n else None

    def _find_epoch(self, epoch: int) -> int:
        """Index of the first entry with epoch >= ``epoch`` (bisect on the sorted epochs)."""
        lo, hi = 0, len(self._epochs)
        eps = self._epochs
        while lo < hi:
            mid = (lo + hi) >> 1
            if eps[mid] < epoch:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def entry_for_epoch(self, epoch: int) -> Entry | None:
        i = self._find_epoch(epoch)
        if i < len(self._epochs) and self._epochs[i] == epoch:
            return (epoch, self._starts[i], self._end(i))
        return None

    def next_entry(self, epoch: int) -> Entry | None:
        """The entry with the smallest epoch greater than ``epoch`` (RocketMQ ceiling(e+1))."""
        i = self._find_epoch(epoch + 1)
        if i < len(self._epochs):
            return (self._epochs[i], self._starts[i], self._end(i))
        return None

    def _find_offset(self, offset: int) -> int:
        """Index of the last entry with start <= offset, -1 if none."""
        lo, hi = 0, len(self._starts)
        st = self._starts
        while lo < hi:
            mid = (lo + hi) >> 1
            if st[mid] <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def entry_for_offset(self, offset: int) -> Entry | None:
        """The entry with start <= offset < end, None if no entry holds the offset."""
        i = self._find_offset(offset)
        if i < 0:
            return None
        end = self._end(i)
        if offset < end:
            return (self._epochs[i], self._starts[i], end)
        return None

    def find_consistent_point(self, remote: Any) -> int:
        """Newest local entry the remote also has (same epoch, same start) -> min of the ends.

        ``remote`` is another map (either twin, or the public EpochMap) or a sequence of
        (epoch, start, end) triples whose last end is the remote max offset.  -1 when the
        histories share no entry.
        """
        by_epoch = {e: (s, end) for e, s, end in _remote_triples(remote)}
        for i in range(len(self._epochs) - 1, -1, -1):
            hit = by_epoch.get(self._epochs[i])
            if hit is not None and hit[0] == self._starts[i]:
                return min(self._end(i), hit[1])
        return -1

    # --- mutations -------------------------------------------------------------------------

    def append(self, epoch: int, start: int) -> None:
        """Add the entry of a new epoch; an equal start replaces the last entry."""
        epoch = int(epoch)
        start = int(start)
        if epoch < 0 or epoch > MAX_EPOCH:
            raise EpochError(f"epoch {epoch} is outside 0..{MAX_EPOCH}")
        if start < 0 or start >= OPEN_END:
            raise EpochError(f"start offset {start} of epoch {epoch} is outside 0..{OPEN_END - 1}")
        if self._epochs:
            last_epoch = self._epochs[-1]
            last_start = self._starts[-1]
            if epoch <= last_epoch:
                raise EpochError(
                    f"epoch {epoch} (start {start}) is not greater than the last epoch {last_epoch}"
                )
            if start < last_start:
                raise EpochError(
                    f"start offset {start} of epoch {epoch} is below the start {last_start} "
                    f"of the last epoch {last_epoch}"
                )
            if start == last_start:
                # The last epoch never held data: the new one takes its place.
                self._epochs[-1] = epoch
                return
        self._epochs.append(epoch)
        self._starts.append(start)

    def set_max_offset(self, offset: int | None) -> None:
        """Set the log's max offset (the last entry's end); None makes it open-ended again."""
        if offset is None:
            self._max_offset = OPEN_END
            return
        offset = int(offset)
        if offset < 0 or offset > OPEN_END:
            raise EpochError(f"max offset {offset} is outside 0..{OPEN_END}")
        self._max_offset = offset

    def truncate_suffix(self, offset: int) -> int:
        """Drop entries starting at or after ``offset``; the new last entry becomes open-ended.

        Returns how many entries were dropped.
        """
        offset = int(offset)
        n = len(self._starts)
        keep = n
        while keep > 0 and self._starts[keep - 1] >= offset:
            keep -= 1
        del self._epochs[keep:]
        del self._starts[keep:]
        self._max_offset = OPEN_END
        return n - keep

    def truncate_suffix_by_epoch(self, epoch: int) -> int:
        """Drop entries whose epoch is >= ``epoch``; the new last entry becomes open-ended."""
        keep = self._find_epoch(int(epoch))
        n = len(self._epochs)
        del self._epochs[keep:]
        del self._starts[keep:]
        self._max_offset = OPEN_END
        return n - keep

    def truncate_prefix(self, offset: int) -> int:
        """Drop entries that end at or before ``offset``; the newest entry is always kept.

        Returns how many entries were dropped.
        """
        offset = int(offset)
        n = len(self._starts)
        drop = 0
        # Entry i ends at starts[i + 1]; the last entry is where new data goes, so it stays.
        while drop + 1 < n and self._starts[drop + 1] <= offset:
            drop += 1
        del self._epochs[:drop]
        del self._starts[:drop]
        return drop

    def clear(self) -> None:
        self._epochs.clear()
        self._starts.clear()
        self._max_offset = OPEN_END

    def copy(self) -> EpochMapCore:
        other = EpochMapCore()
        other._epochs = list(self._epochs)
        other._starts = list(self._starts)
        other._max_offset = self._max_offset
        return other
