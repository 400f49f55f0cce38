"""Running the Java drivers of interop/ (built by `make interop-build`) as real processes.

The drivers print one JSON object per line on stdout (what they did, what they saw) and exit
non-zero with the Java exception on stderr when a client call fails; the tests judge the JSON.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

INTEROP = Path(__file__).resolve().parents[2] / "interop"
CLASSES = INTEROP / "target" / "classes"
CLASSPATH_FILE = INTEROP / "target" / "classpath.txt"


class DriversNotBuilt(RuntimeError):
    """interop/target is missing or stale: run `make interop-build` (needs Java 17 and Maven)."""


def classpath() -> str:
    if not CLASSPATH_FILE.is_file() or not CLASSES.is_dir():
        raise DriversNotBuilt(f"{CLASSPATH_FILE} is missing: run `make interop-build` first")
    return f"{CLASSES}{os.pathsep}{CLASSPATH_FILE.read_text().strip()}"


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not exe:
        raise DriversNotBuilt("no java on PATH and JAVA_HOME unset: the interop tests need Java 17")
    return exe


def run_driver(main_class: str, *args: str, timeout: float, check: bool = True,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one driver to its end; its heap is kept small (two cores, several JVMs at once)."""
    cmd = [java(), "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-cp", classpath(), main_class, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{main_class} {' '.join(args)} exited {proc.returncode}:\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc
