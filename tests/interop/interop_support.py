"""Running the Java drivers of interop/ (built by `make interop-build`) as real processes.

The drivers print one JSON object per line on stdout (what they did, what they saw) and exit
non-zero with the Java exception on stderr when a client call fails; the tests judge the JSON.
A driver's JVM gets a small heap (two cores, several JVMs at once) and the serial GC.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INTEROP = Path(__file__).resolve().parents[2] / "interop"
CLASSES = INTEROP / "target" / "classes"
CLASSPATH_FILE = INTEROP / "target" / "classpath.txt"
#: Every driver class lives in this package.
PACKAGE = "io.rmqha.interop"


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


def driver_command(main_class: str, *args: str, jvm_args: Sequence[str] = ()) -> list[str]:
    """The command line of one driver; ``main_class`` may omit the package."""
    name = main_class if "." in main_class else f"{PACKAGE}.{main_class}"
    return [java(), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            *jvm_args, "-cp", classpath(), name, *args]


def run_driver(main_class: str, *args: str, timeout: float, check: bool = True,
               env: dict[str, str] | None = None,
               jvm_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run one driver to its end (AssertionError with its output when it fails and ``check``)."""
    cmd = driver_command(main_class, *args, jvm_args=jvm_args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{main_class} {' '.join(args)} exited {proc.returncode}:\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def start_driver(main_class: str, *args: str, env: dict[str, str] | None = None,
                 jvm_args: Sequence[str] = (), stderr: Path | None = None) -> subprocess.Popen[str]:
    """Start one driver in the background, its stdout a pipe read line by line (the caller
    stops it: kill by pid, then wait); stderr goes to ``stderr`` (a file) or is dropped."""
    cmd = driver_command(main_class, *args, jvm_args=jvm_args)
    full_env = {**os.environ, **(env or {})}
    if stderr is None:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                bufsize=1, env=full_env)
    with stderr.open("a") as err:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
                                env=full_env)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects a driver printed, one a line (other lines, e.g. a JVM warning, skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
