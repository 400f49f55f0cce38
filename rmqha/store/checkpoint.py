"""The commitlog's checkpoint file: how far the log is known flushed, its start, and
whether ``close()`` wrote it (a clean shutdown), CRC-protected; its ``flock`` keeps a
second writer (another CommitLog or process) out of the directory."""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib

from rmqha.errors import StoreError

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "commitlog.checkpoint"
# magic, flushed offset, min offset, flags, CRC32 of the preceding 32 bytes
_CHECKPOINT = struct.Struct(">8sqqqI")
_CLEAN = 1   # flags bit: written by close(); the log ended exactly at the flushed offset
_CHECKPOINT_MAGIC = b"RMQHACP1"


class Checkpoint:
    """The open checkpoint file of one commitlog directory, locked for this process."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CHECKPOINT_FILE)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
