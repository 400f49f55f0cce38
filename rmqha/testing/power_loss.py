"""Power-loss images of a process's data directory, recorded where data becomes durable.

A SIGKILL keeps the page cache: a crash test passes whether or not anything was fsynced.
A :class:`PowerLossDisk` starts a process with ``power_loss_shim.c`` preloaded (built by
``make build`` as ``_power_loss_shim.so``), which records, at each ``fsync``/``fdatasync``/
``msync``/directory fsync the process makes under its data directory, what that call made
durable (the model is in the C file's header and docs/guarantees.md).  :meth:`cut` is the
power loss: it waits for any sync being recorded, SIGKILLs the process while holding the
shim's lock, and replaces the data directory with what the shim recorded as durable, so a
restart of the same process finds exactly what a machine that lost power would.  Deleting
a sync call from rmqha (or skipping it with :attr:`PowerLossDisk.skip`, the negative
control) loses what it covered, and the tests in tests/integration/test_power_loss.py fail.

Cost: each sync copies the whole file it syncs (holes skipped): an fsync of a 4 MiB file
took 31 ms with the shim and 2 ms without on the 2-core test machine under load (25), so
the shim is for tests, never for production or benchmarks; tests keep segments at 1 MiB.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rmqha.errors import LocalClusterError
from rmqha.testing.processes import Process

#: The preloaded library (``make build`` compiles it from power_loss_shim.c).
SHIM = Path(__file__).with_name("_power_loss_shim.so")

#: Chunk of the sparse copies (holes are skipped, data is read this much at a time).
_CHUNK = 1 << 20


@dataclass(frozen=True)
class SyncRecord:
    """One sync the shim recorded: the libc call, the inode and the path under the root."""

    call: str
    inode: int
    path: str


@dataclass
class PowerLossDisk:
    """The durable state of one data directory of one process (see the module doc).

    ``skip``: fnmatch patterns of paths relative to the root whose syncs the shim lets
    through to the kernel but does not count as durable, as if the code had not made them.
    """

    root: Path
    shadow: Path
    skip: tuple[str, ...] = ()
    cuts: int = field(default=0, init=False)
    #: What the process reads as /proc/sys/kernel/random/boot_id: new at every power loss.
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()), init=False)

    def __post_init__(self) -> None:
        if not SHIM.exists():
            raise LocalClusterError(f"{SHIM} is missing: run `make build` (it compiles power_loss_shim.c)")
        self.root = Path(os.path.realpath(self.root))

    # --- the process's side ---------------------------------------------------------------

    def prepare(self) -> None:
        """Take what the root holds now as durable (a test's setup, or the image of an
        earlier cut) and start a fresh record from it."""
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.shadow, ignore_errors=True)
        (self.shadow / "ino").mkdir(parents=True)
        (self.shadow / "dir").mkdir()
        (self.shadow / "lock").touch()
        (self.shadow / "root").write_text(str(self.root.stat().st_ino))
        for dirpath, dirnames, filenames in os.walk(self.root):
            d = Path(dirpath)
            lines = []
            for name in dirnames:
                lines.append(f"d {(d / name).stat().st_ino} {name}\n")
            for name in filenames:
                st = (d / name).lstat()
                if os.path.isfile(d / name) and not os.path.islink(d / name):
                    lines.append(f"f {st.st_ino} {name}\n")
                    _copy_sparse(d / name, self.shadow / "ino" / str(st.st_ino))
            (self.shadow / "dir" / str(d.stat().st_ino)).write_text("".join(lines))

    def env(self) -> dict[str, str]:
        """The environment that preloads the shim on this root (for :meth:`Process.start`)."""
        return {
            "LD_PRELOAD": str(SHIM),
            "RMQHA_POWERLOSS_ROOT": str(self.root),
            "RMQHA_POWERLOSS_SHADOW": str(self.shadow),
            "RMQHA_POWERLOSS_SKIP": ",".join(self.skip),
            "RMQHA_POWERLOSS_BOOT_ID": self.boot_id,
        }

    def start(self, proc: Process, **config_overrides: object) -> None:
        """Start ``proc`` with the shim from the root's present state."""
        self.prepare()
        proc.start(env=self.env(), **config_overrides)

    def syncs(self) -> list[SyncRecord]:
        """Every sync recorded since :meth:`prepare` (evidence that the shim saw them)."""
        path = self.shadow / "syncs.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            call, inode, rel = line.split(" ", 2)
            out.append(SyncRecord(call, int(inode), rel))
        return out

    # --- the power loss -------------------------------------------------------------------

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Hold the shim's lock: no sync is half recorded, and none can start."""
        with open(self.shadow / "lock", "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def cut(self, proc: Process) -> None:
        """Power loss: SIGKILL between two syncs, then the root becomes the durable image."""
        cut_together([(self, proc)])

    def restore(self) -> None:
        """Replace the root with the durable image (the process must be dead); the next
        start is after a reboot."""
        self.cuts += 1
        self.boot_id = str(uuid.uuid4())
        image = self.root.with_name(f"{self.root.name}.power-loss-{self.cuts}")
        shutil.rmtree(image, ignore_errors=True)
        self.build_image(image)
        shutil.rmtree(self.root)
        image.rename(self.root)

    def build_image(self, dest: Path) -> None:
        """Write what the record says survives into ``dest`` (a new directory)."""
        dest.mkdir(parents=True)
        self._build_dir(int((self.shadow / "root").read_text()), dest, set())

    def _build_dir(self, inode: int, dest: Path, seen: set[int]) -> None:
        if inode in seen:
            raise LocalClusterError(f"power-loss record of {self.root} has a directory cycle at inode {inode}")
        seen.add(inode)
        listing = self.shadow / "dir" / str(inode)
        if not listing.exists():
            return  # never fsynced: a new directory's entries did not survive
        for line in listing.read_text().splitlines():
            kind, child, name = line.split(" ", 2)
            if kind == "d":
                (dest / name).mkdir()
                self._build_dir(int(child), dest / name, seen)
                continue
            content = self.shadow / "ino" / child
            if content.exists():
                _copy_sparse(content, dest / name)
            else:
                (dest / name).touch()  # the name survived, none of the bytes did


def cut_together(victims: Sequence[tuple[PowerLossDisk, Process]]) -> None:
    """One power loss for several processes (a rack): each is killed between two of its
    syncs, then every root becomes its durable image."""
    with ExitStack() as stack:
        for disk, _ in victims:
            stack.enter_context(disk.frozen())
        for _, proc in victims:
            proc.kill()
    for disk, _ in victims:
        disk.restore()


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` keeping holes as holes (segments are mostly holes)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        fout.truncate(size)
        pos = 0
        while pos < size:
            try:
                data = os.lseek(fin.fileno(), pos, os.SEEK_DATA)
            except OSError:
                break  # only a hole is left
            hole = os.lseek(fin.fileno(), data, os.SEEK_HOLE)
            at = data
            while at < hole:
                chunk = os.pread(fin.fileno(), min(_CHUNK, hole - at), at)
                if not chunk:
                    break
                os.pwrite(fout.fileno(), chunk, at)
                at += len(chunk)
            pos = hole
