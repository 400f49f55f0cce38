"""The broker's epoch map and its checkpoint file (``rmqha.store.EpochMap``).

This module owns the public :class:`EpochMap`: the in-memory entries of the selected twin
(``rmqha._core.epoch_map`` or its pure twin) plus persistence in RocketMQ's
``epochFileCheckpoint`` text format, so files interchange with RocketMQ 5::

    <entry count>\\n
    <CRC32 of all entry lines incl. their newlines, masked with 0x7FFFFFFF, decimal>\\n
    <epoch>-<start offset>\\n        (one line per entry)

Writes are atomic: a temp file is written and fsynced, the previous file is kept as
``<path>.bak`` (hard link, so the main path never goes missing), the temp file is renamed
over the main path and the directory is fsynced.  Loading falls back to ``.bak`` (with a
logged warning) when the main file is missing, truncated, unparsable or fails its CRC; when
both are bad a :class:`rmqha.errors.CheckpointError` names both files.  An emptied map is
written like any other (count 0, CRC 0), unlike RocketMQ, which skipped the write and left
stale entries on disk.
"""
from __future__ import annotations

import logging
import os
import threading
import zlib
from collections.abc import Iterable
from typing import Any, Callable, TypeVar

from rmqha import _core
from rmqha.errors import CheckpointError, EpochError
from rmqha.failpoints import Failpoint, hit

log = logging.getLogger(__name__)

_impl = _core.load("epoch_map")

#: End of the last entry while the log's max offset is not known (Java Long.MAX_VALUE).
OPEN_END: int = (1 << 63) - 1
#: A checkpoint bigger than this is refused before it is read (about a million entries).
MAX_CHECKPOINT_BYTES: int = 32 << 20

Entry = tuple[int, int, int]
_T = TypeVar("_T")


def encode_checkpoint(pairs: Iterable[tuple[int, int]]) -> bytes:
    """The checkpoint file content for ``(epoch, start)`` pairs (RocketMQ byte for byte)."""
    body = "".join(f"{int(e)}-{int(s)}\n" for e, s in pairs).encode("utf-8")
    count = body.count(b"\n")
    crc = zlib.crc32(body) & 0x7FFFFFFF
    return f"{count}\n{crc}\n".encode("ascii") + body


def decode_checkpoint(data: bytes, where: str = "<bytes>") -> list[tuple[int, int]]:
    """Parse and verify checkpoint content; CheckpointError saying what is wrong and where."""
    if not data:
        raise CheckpointError(f"{where}: file is empty")
    first = data.find(b"\n")
    second = data.find(b"\n", first + 1) if first >= 0 else -1
    if first < 0 or second < 0:
        raise CheckpointError(f"{where}: truncated before the count and CRC lines")
    try:
        count = int(data[:first].strip(b"\r"))
        crc = int(data[first + 1 : second].strip(b"\r"))
    except ValueError:
        raise CheckpointError(f"{where}: count or CRC line is not a number") from None
    body = data[second + 1 :]
    if count < 0 or count > len(body):
        raise CheckpointError(f"{where}: entry count {count} does not fit the {len(body)}-byte body")
    if body and not body.endswith(b"\n"):
        raise CheckpointError(f"{where}: truncated inside the last entry line")
    lines = body.split(b"\n")[:-1] if body else []
    if len(lines) != count:
        raise CheckpointError(f"{where}: header says {count} entries, found {len(lines)}")
    actual = zlib.crc32(body) & 0x7FFFFFFF
    if actual != crc:
        raise CheckpointError(f"{where}: CRC mismatch (stored {crc}, computed {actual})")
    pairs = []
    for n, line in enumerate(lines, start=1):
        epoch_text, sep, start_text = line.strip(b"\r").partition(b"-")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(epoch_text), int(start_text)))
        except ValueError:
            raise CheckpointError(f"{where}: entry line {n} {line[:40]!r} is not epoch-start") from None
    return pairs


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: str, pairs: Iterable[tuple[int, int]], *, keep_backup: bool = True) -> None:
    """Atomically replace ``path`` with the checkpoint of ``pairs``, keeping ``path.bak``.

    ``keep_backup=False`` leaves ``.bak`` alone (used to repair a corrupt main file without
    turning the good backup into a copy of the corrupt one).
    """
    data = encode_checkpoint(pairs)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp"
    bak = f"{path}.bak"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    hit(Failpoint.DURING_EPOCH_MAP_WRITE)
    if keep_backup and os.path.exists(path):
        # A hard link keeps the previous version as .bak without a window in which the
        # main path is missing; copy where links are not supported.
        bak_tmp = f"{path}.bak.tmp"
        if os.path.lexists(bak_tmp):
            os.unlink(bak_tmp)
        try:
            os.link(path, bak_tmp)
        except OSError:
            with open(path, "rb") as src, open(bak_tmp, "wb") as dst:
                dst.write(src.read())
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(bak_tmp, bak)
    os.replace(tmp, path)
    _fsync_dir(directory)


def _read_file(path: str) -> bytes:
    size = os.path.getsize(path)
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path}: {size} bytes exceeds the {MAX_CHECKPOINT_BYTES}-byte limit")
    with open(path, "rb") as f:
        return f.read(MAX_CHECKPOINT_BYTES + 1)


def read_checkpoint(path: str) -> list[tuple[int, int]] | None:
    """Pairs from ``path`` or its ``.bak``; None when neither exists; CheckpointError if both bad."""
    found = _read_checkpoint(path)
    return None if found is None else found[0]


def _read_checkpoint(path: str) -> tuple[list[tuple[int, int]], str] | None:
    bak = f"{path}.bak"
    problems = []
    for candidate in (path, bak):
        if not os.path.exists(candidate):
            problems.append(f"{candidate}: missing")
            continue
        try:
            pairs = decode_checkpoint(_read_file(candidate), candidate)
            _check_order(pairs, candidate)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        except OSError as exc:
            problems.append(f"{candidate}: {exc}")
            continue
        if candidate == bak:
            log.warning("epoch checkpoint %s unusable (%s); loaded the backup %s", path, problems[0], bak)
        return pairs, candidate
    if all(p.endswith(": missing") for p in problems):
        return None
    raise CheckpointError("no usable epoch checkpoint: " + "; ".join(problems))


def _check_order(pairs: list[tuple[int, int]], where: str) -> None:
    try:
        _impl.EpochMapCore(pairs)
    except EpochError as exc:
        raise CheckpointError(f"{where}: entries out of order: {exc}") from None


class EpochMap:
    """The ordered ``(epoch, start_offset)`` entries of a log, optionally bound to a file.

    ``implementation`` picks a twin ("cython" or "python"); None uses the one in use.  A map
    made by :meth:`open` persists every mutating call before returning; if that write fails
    the in-memory change is undone and CheckpointError is raised.
    """

    __slots__ = ("_core", "_path", "_lock", "implementation")

    def __init__(
        self, entries: Iterable[Any] = (), *, implementation: str | None = None
    ) -> None:
        mod = _impl if implementation is None else _core.load_twin("epoch_map", implementation)
        self.implementation: str = (
            "cython" if mod.__name__.endswith(".epoch_map") else "python"
        )
        self._core = mod.EpochMapCore(entries)
        self._path: str | None = None
        self._lock = threading.RLock()

    # --- files -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, implementation: str | None = None) -> EpochMap:
        """Load ``path`` (or its .bak), or create it empty; later mutations persist to it."""
        path = os.fspath(path)
        found = _read_checkpoint(path)
        m = cls(found[0] if found else (), implementation=implementation)
        m._path = path
        if found is None:
            m.save(path)
        elif found[1] != path:
            # Repair the main file from the backup, leaving the good backup untouched.
            write_checkpoint(path, m.pairs(), keep_backup=False)
        return m

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, implementation: str | None = None) -> EpochMap:
        """Read ``path`` (or its .bak) into an unbound map; CheckpointError if none is usable."""
        path = os.fspath(path)
        pairs = read_checkpoint(path)
        if pairs is None:
            raise CheckpointError(f"no epoch checkpoint: {path} and {path}.bak are both missing")
        return cls(pairs, implementation=implementation)

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Write the checkpoint atomically to ``path`` (default: the bound path)."""
        target = os.fspath(path) if path is not None else self._path
        if target is None:
            raise CheckpointError("save() needs a path: this epoch map is not bound to a file")
        with self._lock:
            try:
                write_checkpoint(target, self._core.pairs())
            except OSError as exc:
                raise CheckpointError(f"could not write epoch checkpoint {target}: {exc}") from exc

    @property
    def path(self) -> str | None:
        return self._path

    def _mutate(self, fn: Callable[[], _T]) -> _T:
        with self._lock:
            if self._path is None:
                return fn()
            before = self._core.copy()
            result = fn()
            if self._core.pairs() == before.pairs():
                return result
            try:
                write_checkpoint(self._path, self._core.pairs())
            except OSError as exc:
                self._core = before
                raise CheckpointError(f"could not persist epoch checkpoint {self._path}: {exc}") from exc
            return result

    # --- mutations -------------------------------------------------------------------------

    def append(self, epoch: int, start: int) -> None:
        """New epoch starting at ``start``; an equal start replaces the last (empty) epoch."""
        self._mutate(lambda: self._core.append(epoch, start))

    def truncate_suffix(self, offset: int) -> int:
        """Drop entries starting at or after ``offset``; the last entry becomes open-ended."""
        return self._mutate(lambda: self._core.truncate_suffix(offset))

    def truncate_suffix_by_epoch(self, epoch: int) -> int:
        """Drop entries whose epoch is >= ``epoch``; the last entry becomes open-ended."""
        return self._mutate(lambda: self._core.truncate_suffix_by_epoch(epoch))

    def truncate_prefix(self, offset: int) -> int:
        """Drop entries ending at or before ``offset`` (the newest entry always stays)."""
        return self._mutate(lambda: self._core.truncate_prefix(offset))

    def clear(self) -> None:
        self._mutate(self._core.clear)

    def set_max_offset(self, offset: int | None) -> None:
        """The log's max offset = the last entry's end (memory only; None = open-ended)."""
        with self._lock:
            self._core.set_max_offset(offset)

    # --- queries ---------------------------------------------------------------------------
    # Reads take the lock too: the pure twin's queries are several bytecodes long, and the
    # commitlog writer thread may truncate or append while the HA loop reads.

    @property
    def max_offset(self) -> int:
        return self._core.max_offset

    def entries(self) -> list[Entry]:
        """``(epoch, start, end)`` triples, oldest first; the last end is the max offset."""
        with self._lock:
            return self._core.entries()

    def pairs(self) -> list[tuple[int, int]]:
        with self._lock:
            return self._core.pairs()

    def last_epoch(self) -> int:
        """The newest epoch, -1 when empty."""
        with self._lock:
            return self._core.last_epoch()

    def first_entry(self) -> Entry | None:
        with self._lock:
            return self._core.first_entry()

    def last_entry(self) -> Entry | None:
        with self._lock:
            return self._core.last_entry()

    def entry_for_epoch(self, epoch: int) -> Entry | None:
        with self._lock:
            return self._core.entry_for_epoch(epoch)

    def entry_for_offset(self, offset: int) -> Entry | None:
        """The entry with start <= offset < end, or None."""
        with self._lock:
            return self._core.entry_for_offset(offset)

    def next_entry(self, epoch: int) -> Entry | None:
        """The entry with the smallest epoch greater than ``epoch``, or None."""
        with self._lock:
            return self._core.next_entry(epoch)

    def find_consistent_point(self, remote: Any) -> int:
        """Truncation point against a remote history (map or (epoch, start, end) triples); -1 if none."""
        with self._lock:
            return self._core.find_consistent_point(getattr(remote, "_core", remote))

    def copy(self) -> EpochMap:
        """An unbound copy (same twin)."""
        other = EpochMap.__new__(EpochMap)
        other.implementation = self.implementation
        with self._lock:
            other._core = self._core.copy()
        other._path = None
        other._lock = threading.RLock()
        return other

    def __len__(self) -> int:
        return len(self._core)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpochMap):
            return NotImplemented
        return self.entries() == other.entries()

    __hash__ = None  # type: ignore[assignment]  # mutable: equal maps, no hash

    def __repr__(self) -> str:
        where = f", path={self._path!r}" if self._path else ""
        return f"EpochMap({self.entries()!r}{where})"


__all__ = [
    "EpochMap",
    "OPEN_END",
    "MAX_CHECKPOINT_BYTES",
    "encode_checkpoint",
    "decode_checkpoint",
    "read_checkpoint",
    "write_checkpoint",
]
