"""The power-loss shim's model, one rule at a time, on real child processes (issue 40.2).

Each case runs a small Python program under ``_power_loss_shim.so`` on a fresh data
directory, cuts the power (SIGKILL under the shim's lock) and reads the image: what the
program fsynced survives, nothing else does (rmqha/testing/power_loss_shim.c's header).
Every rule is shown in both directions (with and without the sync that makes it durable),
so the shim cannot pass a test by keeping too much or too little.  A static check keeps
rmqha off the calls the shim does not model (O_SYNC/O_DSYNC opens, sync_file_range).
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rmqha.testing.power_loss import PowerLossDisk

ROOT = Path(__file__).resolve().parents[2]


class _Child:
    """A child process as :meth:`PowerLossDisk.cut` kills it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _image(tmp_path: Path, program: str, *, skip: tuple[str, ...] = (),
           before: dict[str, bytes] | None = None) -> dict[str, bytes | None]:
    """Run ``program`` (cwd = the data directory) under the shim, cut the power once it
    prints ``ready``; the image as path -> bytes (None for a directory)."""
    root = tmp_path / "data"
    root.mkdir()
    for name, data in (before or {}).items():
        (root / name).write_bytes(data)
    disk = PowerLossDisk(root, tmp_path / "shadow", skip)
    disk.prepare()
    code = "import os, mmap, sys\n" + textwrap.dedent(program) + "\nprint('ready', flush=True)\nsys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, env={**disk.env(), "PATH": "/usr/bin:/bin"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n", "the child program failed"
    finally:
        disk.cut(_Child(proc))  # type: ignore[arg-type]
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def test_fsync_keeps_the_file_as_it_was_then_and_nothing_written_after(tmp_path):
    image = _image(tmp_path, """
        with open("f", "r+b") as f:
            f.write(b"new!"); f.flush(); os.fsync(f.fileno())
            f.write(b" and later"); f.flush()
    """, before={"f": b"old bytes"})
    assert image == {"f": b"new!bytes"}


def test_without_fsync_the_old_content_stays(tmp_path):
    image = _image(tmp_path, """
        with open("f", "r+b") as f:
            f.write(b"new!"); f.flush()
    """, before={"f": b"old bytes"})
    assert image == {"f": b"old bytes"}


@pytest.mark.parametrize("sync_dir", [True, False])
def test_a_new_file_needs_its_directory_fsynced(tmp_path, sync_dir):
    image = _image(tmp_path, f"""
        with open("new", "wb") as f:
            f.write(b"data"); f.flush(); os.fdatasync(f.fileno())
        if {sync_dir}:
            fd = os.open(".", os.O_RDONLY); os.fsync(fd); os.close(fd)
    """)
    assert image == ({"new": b"data"} if sync_dir else {})


@pytest.mark.parametrize("sync_dir", [True, False])
def test_a_rename_needs_its_directory_fsynced(tmp_path, sync_dir):
    image = _image(tmp_path, f"""
        with open("f.tmp", "wb") as f:
            f.write(b"new"); f.flush(); os.fsync(f.fileno())
        os.replace("f.tmp", "f")
        if {sync_dir}:
            fd = os.open(".", os.O_RDONLY); os.fsync(fd); os.close(fd)
    """, before={"f": b"old"})
    assert image == ({"f": b"new"} if sync_dir else {"f": b"old"})


def test_a_name_made_durable_before_its_bytes_is_an_empty_file(tmp_path):
    image = _image(tmp_path, """
        with open("f", "wb") as f:
            f.write(b"never synced"); f.flush()
        fd = os.open(".", os.O_RDONLY); os.fsync(fd); os.close(fd)
    """)
    assert image == {"f": b""}


@pytest.mark.parametrize("sync_parent", [True, False])
def test_a_new_directory_needs_its_parent_fsynced(tmp_path, sync_parent):
    image = _image(tmp_path, f"""
        os.mkdir("d")
        with open("d/f", "wb") as f:
            f.write(b"x"); f.flush(); os.fsync(f.fileno())
        fd = os.open("d", os.O_RDONLY); os.fsync(fd); os.close(fd)
        if {sync_parent}:
            fd = os.open(".", os.O_RDONLY); os.fsync(fd); os.close(fd)
    """)
    assert image == ({"d": None, "d/f": b"x"} if sync_parent else {})


def test_msync_keeps_the_synced_range_only(tmp_path):
    image = _image(tmp_path, """
        f = open("m", "r+b")
        mm = mmap.mmap(f.fileno(), 8192)
        mm[0:4] = b"SYNC"; mm.flush(0, 4096)
        mm[4096:4100] = b"LOST"
    """, before={"m": bytes(8192)})
    assert image["m"] == b"SYNC" + bytes(8188)


@pytest.mark.parametrize("call", ["os.sync()", "os.fdatasync(os.open('.', os.O_RDONLY))", ""])
def test_sync_makes_everything_durable(tmp_path, call):
    """sync() (and syncfs) records every file and name under the root; a directory's
    fdatasync its names only; nothing, nothing."""
    image = _image(tmp_path, f"""
        os.mkdir("d")
        with open("d/f", "wb") as f:
            f.write(b"x"); f.flush()
        {call}
    """)
    assert image == {"os.sync()": {"d": None, "d/f": b"x"}, "": {}}.get(call, {"d": None})


def test_a_skipped_pattern_is_as_if_the_sync_was_not_made(tmp_path):
    program = """
        for name in ("kept", "skipped"):
            with open(name, "r+b") as f:
                f.write(b"NEW"); f.flush(); os.fsync(f.fileno())
    """
    image = _image(tmp_path, program, skip=("skip*",), before={"kept": b"old", "skipped": b"old"})
    assert image == {"kept": b"NEW", "skipped": b"old"}


def test_files_outside_the_root_are_not_recorded_and_the_boot_id_is_the_harness_one(tmp_path):
    outside = tmp_path / "outside"
    image = _image(tmp_path, f"""
        with open({str(outside)!r}, "wb") as f:
            f.write(b"x"); f.flush(); os.fsync(f.fileno())
        with open("boot", "w") as f:
            f.write(open("/proc/sys/kernel/random/boot_id").read()); f.flush(); os.fsync(f.fileno())
        fd = os.open(".", os.O_RDONLY); os.fsync(fd); os.close(fd)
    """)
    real = Path("/proc/sys/kernel/random/boot_id").read_text()
    assert set(image) == {"boot"} and image["boot"] != real.encode()
    assert re.fullmatch(rb"[0-9a-f-]{36}\n", image["boot"] or b"")
    assert outside.read_bytes() == b"x"  # passed through, untouched


def test_rmqha_uses_no_sync_call_the_shim_does_not_model():
    """O_SYNC/O_DSYNC writes and sync_file_range would be durable (or not) without the
    shim seeing it: the power-loss tests would be wrong about them."""
    pattern = re.compile(r"\bO_(D?SYNC|DIRECT)\b|sync_file_range|F_FULLFSYNC")
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "rmqha").rglob("*"))
            if p.suffix in {".py", ".pyx", ".pxd"} or p.name.endswith("_helpers.c")
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, f"unmodelled sync calls (extend power_loss_shim.c first): {hits}"
