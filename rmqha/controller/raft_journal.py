"""The controller's Raft log and vote, made durable before anything acts on them.

pysyncobj keeps its log in an mmap-ed file and its current term and vote in a side file,
and never fsyncs either: a power loss on one controller can make it forget a vote (and
vote twice in one term: two leaders) or forget entries it acknowledged (a committed entry
held by fewer than a majority).  Raft needs both on disk before any message that reflects
them leaves the node.

:class:`DurableJournal` wraps the journal pysyncobj opened (its file format is kept, so
existing stores open as before) and adds:

* the term and vote written atomically and durably (temp file, fsync, rename, fsync of
  the directory) before :meth:`set_current_term` returns, which pysyncobj calls before it
  sends a vote request or grant;
* log changes (appends, truncations) marked dirty and made durable by :meth:`sync`
  (msync + fdatasync); rmqha's transport calls it before every message it sends, so an
  append is on disk before the follower acknowledges it and before the leader ships it
  (hence before the leader counts it toward a commit), and one sync covers every append
  since the last message: group commit, one fdatasync per round of messages, not per entry.

The commit index stays lazily saved: Raft recomputes it from the leader, so losing it
costs nothing.  :attr:`syncs` counts log syncs (the benchmark shows what they cost).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pysyncobj.pickle import dumps

#: Called after each durable point with its kind ("log" or "vote") and the journal; tests
#: use it to copy exactly what a power loss at that point would leave.
SyncHook = Callable[[str, "DurableJournal"], None]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_mkdir(path: Path) -> None:
    """``mkdir -p`` whose new names survive a power loss: a new directory's entry is durable
    only once its parent is fsynced (else the journal inside vanishes with it)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_dir(directory.parent)


def durable_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that after a crash it holds the old or the new bytes."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class DurableJournal:
    """A pysyncobj ``FileJournal`` whose log and vote are fsynced (see the module doc)."""

    def __init__(self, inner: Any, journal_file: Path, *, on_sync: SyncHook | None = None) -> None:
        self._inner = inner
        self.journal_file = Path(journal_file)
        self.meta_file = Path(str(journal_file) + ".meta")
        self._on_sync = on_sync
        self._dirty = True  # whatever pysyncobj wrote while opening is not known durable
        self.syncs = 0
        # pysyncobj 0.3.17 internals (checked by rmqha.controller.raft's version guard).
        self._meta: dict[str, Any] = inner._FileJournal__meta
        self._file = inner._FileJournal__journalFile
        # The journal file pysyncobj just made (or opened) is durable, with its name,
        # before any vote's directory fsync can make its name durable without its header:
        # an empty journal file stops pysyncobj from starting ("cannot mmap an empty file").
        self.sync()
        fsync_dir(self.journal_file.parent)

    # --- what pysyncobj calls (its camelCase API) -----------------------------------------

    def add(self, command: Any, idx: int, term: int) -> None:
        self._inner.add(command, idx, term)
        self._dirty = True

    def clear(self) -> None:
        self._inner.clear()
        self._dirty = True

    def deleteEntriesFrom(self, entry_from: int) -> None:  # noqa: N802
        self._inner.deleteEntriesFrom(entry_from)
        self._dirty = True

    def deleteEntriesTo(self, entry_to: int) -> None:  # noqa: N802
        self._inner.deleteEntriesTo(entry_to)
        self._dirty = True

    def setCurrentTerm(self, term: int, voted_for: Any) -> None:  # noqa: N802
        self.set_current_term(term, voted_for)

    def onOneSecondTimer(self) -> None:  # noqa: N802
        # pysyncobj would rewrite the side file (with the lazily saved commit index) by a
        # rename without fsync, which a power loss can turn into an empty file: a lost vote.
        if not self._inner._FileJournal__metaSaved:
            durable_write(self.meta_file, dumps(self._meta))
            self._inner._FileJournal__metaSaved = True

    def __getattr__(self, name: str) -> Any:
        # Reads (entries, length, term, vote, commit index) and the timer go to the journal.
        return getattr(self._inner, name)

    def __getitem__(self, item: Any) -> Any:
        return self._inner[item]

    def __len__(self) -> int:
        return len(self._inner)

    # --- durability -----------------------------------------------------------------------

    def set_current_term(self, term: int, voted_for: Any) -> None:
        """Term and vote on disk before pysyncobj sends anything that depends on them."""
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = voted_for
        durable_write(self.meta_file, dumps(self._meta))
        self._inner._FileJournal__metaSaved = True
        if self._on_sync is not None:
            self._on_sync("vote", self)

    def sync(self) -> None:
        """Make every log change so far durable (no-op when nothing changed)."""
        if not self._dirty:
            return
        self._file.flush()  # msync of the mapping
        os.fdatasync(self._file._ResizableFile__f.fileno())  # and the file's size
        self._dirty = False
        self.syncs += 1
        if self._on_sync is not None:
            self._on_sync("log", self)
