"""Checkpoint files.

- :class:`Checkpoint`, the commitlog's: how far the log is known flushed, its start, and
  whether ``close()`` wrote it (a clean shutdown), CRC-protected; its ``flock`` keeps a
  second writer (another CommitLog or process) out of the directory.
- :class:`DispatchCheckpoint`, an index's: the commitlog offset up to which the index
  built from the log (the consume queues) is durable, and during which boot it was written.
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib

from rmqha.errors import StoreError
from rmqha.store.segments import fsync_dir, sidecar_path

log = logging.getLogger(__name__)

#: The commitlog directory's sidecar (:func:`rmqha.store.segments.sidecar_path`):
#: ``store/commitlog.checkpoint`` for ``store/commitlog``.
CHECKPOINT_FILE = "checkpoint"
# magic, flushed offset, min offset, flags, CRC32 of the preceding 32 bytes
_CHECKPOINT = struct.Struct(">8sqqqI")
_CLEAN = 1   # flags bit: written by close(); the log ended exactly at the flushed offset
_CHECKPOINT_MAGIC = b"RMQHACP1"


class Checkpoint:
    """The open checkpoint file of one commitlog directory, locked for this process."""

    def __init__(self, directory: str) -> None:
        self.path = sidecar_path(directory, CHECKPOINT_FILE)
        created = not os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if created:  # the new name is durable only once its directory is synced
            fsync_dir(os.path.dirname(self.path))
        try:
            # One writer per directory, across processes too (released on close or exit).
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise StoreError(f"commitlog {directory} is already open (locked by another "
                             "CommitLog or process)") from None

    def write(self, flushed: int, min_offset: int, clean: bool = False) -> None:
        head = _CHECKPOINT_MAGIC + struct.pack(">qqq", flushed, min_offset,
                                               _CLEAN if clean else 0)
        os.pwrite(self._fd, head + struct.pack(">I", zlib.crc32(head)), 0)
        os.fdatasync(self._fd)

    def read(self) -> tuple[int, bool]:
        """(flushed offset, clean shutdown); (0, False) when missing or corrupt."""
        raw = os.pread(self._fd, _CHECKPOINT.size, 0)
        if not raw:
            return 0, False
        if len(raw) == _CHECKPOINT.size:
            magic, flushed, _min, flags, crc = _CHECKPOINT.unpack(raw)
            if magic == _CHECKPOINT_MAGIC and zlib.crc32(raw[:-4]) == crc and flushed >= 0:
                return flushed, bool(flags & _CLEAN)
        log.warning("commitlog checkpoint %s is corrupt: validating every record", self.path)
        return 0, False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def boot_id() -> bytes:
    """This boot's 16-byte id (``/proc/sys/kernel/random/boot_id``); zeros when unknown.

    A file written by a process of this boot that died has every byte it wrote in the page
    cache; after a reboot, pages written since the last fsync may be lost or reach the
    disk in any order.  Recovery after a process crash can therefore trust more than
    recovery after a power loss."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return bytes.fromhex(fh.read().strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)


DISPATCH_CHECKPOINT_FILE = "checkpoint"
# magic, dispatched offset, flags, boot id, CRC32 of the preceding 36 bytes
_DISPATCH = struct.Struct(">8sqI16sI")
_DISPATCH_MAGIC = b"RMQHACQ1"


class DispatchState:
    """What a dispatch checkpoint says: every index built from the commitlog holds, durably,
    every record below ``offset``; ``clean``: written by a close; ``same_boot``: written
    during this boot (so a crash since was a process crash, not a power loss)."""

    __slots__ = ("offset", "clean", "same_boot")

    def __init__(self, offset: int, clean: bool, same_boot: bool) -> None:
        self.offset = offset
        self.clean = clean
        self.same_boot = same_boot

    def __repr__(self) -> str:
        return (f"DispatchState(offset={self.offset}, clean={self.clean}, "
                f"same_boot={self.same_boot})")


class DispatchCheckpoint:
    """RocketMQ's StoreCheckpoint idea for the indexes the commitlog feeds: the commitlog
    offset up to which they are durable, so a restart re-dispatches only what follows it.
    One small CRC-protected record, rewritten in place and fdatasync-ed."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._boot = boot_id()

    def read(self) -> DispatchState | None:
        """The last checkpoint written; None when the file is missing or corrupt."""
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read(_DISPATCH.size + 1)
        except FileNotFoundError:
            return None
        if len(raw) != _DISPATCH.size:
            log.warning("dispatch checkpoint %s is %d bytes, not %d", self.path, len(raw),
                        _DISPATCH.size)
            return None
        magic, offset, flags, boot, crc = _DISPATCH.unpack(raw)
        if magic != _DISPATCH_MAGIC or zlib.crc32(raw[:-4]) != crc or offset < 0:
            log.warning("dispatch checkpoint %s is corrupt", self.path)
            return None
        return DispatchState(offset, bool(flags & _CLEAN),
                             boot == self._boot and boot != bytes(16))

    def write(self, offset: int, clean: bool = False) -> None:
        """Record ``offset`` durably (the file is created on first use)."""
        head = _DISPATCH_MAGIC + struct.pack(">qI16s", offset, _CLEAN if clean else 0,
                                             self._boot)
        created = not os.path.exists(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, head + struct.pack(">I", zlib.crc32(head)), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if created:  # a power loss would forget a name its directory never synced
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
