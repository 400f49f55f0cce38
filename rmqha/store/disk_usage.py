"""What a store directory costs on disk: blocks the filesystem allocated versus the files'
logical sizes (segments are sparse, so the two differ by the unwritten rest of a segment)."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DiskUsage:
    #: Bytes of blocks the filesystem holds for the files (``st_blocks * 512``).
    allocated_bytes: int
    #: Sum of the files' sizes (``st_size``): what ``ls -l`` shows.
    logical_bytes: int
    files: int

    def as_dict(self) -> dict[str, int]:
        return {"allocatedBytes": self.allocated_bytes, "logicalBytes": self.logical_bytes,
                "files": self.files}


def directory_usage(path: str | os.PathLike[str]) -> DiskUsage:
    """Blocks and sizes of every regular file under ``path`` (recursively; symlinks are
    not followed; files vanishing during the walk are skipped)."""
    allocated = logical = files = 0
    stack = [os.fspath(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    allocated += st.st_blocks * 512
                    logical += st.st_size
                    files += 1
            except FileNotFoundError:
                continue
    return DiskUsage(allocated, logical, files)
