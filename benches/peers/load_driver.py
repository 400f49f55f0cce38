"""A load driver as a long-lived child process: the Java one (``benches/peers/maven/driver``,
``io.rmqha.peers.Load``: RocketMQ's remoting client or Kafka's client) or the Python
``rocketmq`` 0.4.4 and ``confluent-kafka`` ones (``py_driver.py``), all speaking one line
protocol.  One
process per (system, client), started once, so a JIT is warm and the client's connections
stay open across workloads as in an application.

Each workload is one command line on the driver's stdin and one answer line on its stdout:
``ok ELAPSED_NS CPU_NS COUNT [LATENCY_NS ...]``.  Elapsed time and latencies are measured in
the driver around the client's calls (not around the pipe), and CPU is the driver process's
own, so "client µs/msg" is that client's cost.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from peers.jvm import Heap, classpath, java

MAIN = "io.rmqha.peers.Load"
PY_DRIVER = Path(__file__).resolve().parent / "py_driver.py"


class DriverError(RuntimeError):
    """The driver answered an error (its text) or died."""


@dataclass
class Answer:
    elapsed_s: float
    cpu_s: float
    count: int
    latencies_s: list[float] = field(default_factory=list)


def java_driver(kind: str, address: str, heap: Heap, log: Path) -> LoadDriver:
    """``Load rocketmq NAMESRV`` or ``Load kafka BOOTSTRAP``."""
    return LoadDriver([java(), *heap.options(), "-Djava.net.preferIPv4Stack=true",
                       # The RocketMQ client logs to ~/logs/rocketmqlogs unless told otherwise.
                       f"-Duser.home={log.parent}",
                       "-cp", classpath("driver"), MAIN, kind, address], log)


def rocketmq044_driver(namesrv: str, log: Path) -> LoadDriver:
    """The Python ``rocketmq`` 0.4.4 client (this interpreter's) against ``namesrv``."""
    # The C++ client writes its logs under ~/logs/rocketmq-cpp: keep them beside the run's.
    return LoadDriver([sys.executable, str(PY_DRIVER), "rocketmq044", namesrv], log,
                      {**os.environ, "HOME": str(log.parent)})


def confluent_driver(bootstrap: str, log: Path) -> LoadDriver:
    """``confluent-kafka`` (this interpreter's) against ``bootstrap``."""
    return LoadDriver([sys.executable, str(PY_DRIVER), "confluent", bootstrap], log)


class LoadDriver:
    """One driver process; its stderr (the client's logs) goes to ``log``."""

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                list(argv), cwd=log.parent, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
                start_new_session=True)
        ready = self._line()
        if ready != "ready":
            self.close()
            raise DriverError(f"driver did not start: {ready!r}\n{self.log_tail()}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise DriverError(f"driver exited ({self.proc.poll()})\n{self.log_tail()}")
        return line.strip()

    def raw(self, *command: object) -> list[str]:
        """Send one command; the words of its ``ok`` answer, ``ok`` first (the driver bounds
        every wait itself)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(str(c) for c in command) + "\n")
        self.proc.stdin.flush()
        words = self._line().split()
        if not words or words[0] != "ok":
            raise DriverError(" ".join(words[1:]) or "empty answer")
        return words

    def run(self, *command: object) -> Answer:
        """One workload: its elapsed time, CPU time, count and latencies."""
        words = self.raw(*command)
        return Answer(int(words[1]) / 1e9, int(words[2]) / 1e9, int(words[3]),
                      [int(x) / 1e9 for x in words[4:]])

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
