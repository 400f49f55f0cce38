"""A standalone Spark cluster (a master and N workers) started from pyspark's own jars.

Shared by every test that needs a real ``spark://`` master (the trends job on a cluster,
the rmqha source giving the same rows as local mode). The master and each worker run
``spark-class`` on 127.0.0.1 with free ports, each in a process group of its own
(``start_new_session``), so stopping a group also stops the executor JVMs a worker forked
and their Python workers. Stopping is SIGTERM to every group, then SIGKILL to a group
still alive after 20 s.

Cost, on two busy cores: the master's UI answers after ~5-10 s, each worker registers in
~5 s more; each worker is given 1 core and 1 GiB unless asked otherwise.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cluster import free_port

#: How long the master's UI, and then all workers, get to come up (JVM start on a loaded box).
START_DEADLINE_S = 90.0


def spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _wait(predicate: Callable[[], bool], deadline_s: float, what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a cluster process exited with {p.returncode}")
        if predicate():
            return
        time.sleep(0.2)  # polling interval of a deadline wait, not a fixed sleep
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")


def master_state(ui_port: int) -> dict[str, object] | None:
    """The master's ``/json/`` status page, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return json.load(resp)
    except OSError:
        return None


@dataclass
class StandaloneCluster:
    """A running cluster: the URL drivers connect to, and what a test may inspect."""

    master_url: str
    ui_port: int
    work: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def alive_workers(self) -> int:
        state = master_state(self.ui_port) or {}
        value = state.get("aliveworkers", 0)
        return value if isinstance(value, int) else 0


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@contextmanager
def start_standalone(work: Path, *, workers: int = 1, cores: int = 1, memory: str = "1g",
                     extra_env: dict[str, str] | None = None) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers (``cores`` and ``memory`` each), all stopped on exit.

    Each worker starts in a directory of its own, not the driver's: nothing may be found
    through the driver's working directory."""
    home = spark_home()
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(work / "logs"), PYSPARK_PYTHON=sys.executable, **(extra_env or {}))
    spark_class = os.path.join(home, "bin", "spark-class")
    port, ui = free_port(), free_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", ui, work)
    with ExitStack() as stack:
        stack.callback(_stop, cluster.procs)

        def spawn(name: str, args: list[str], cwd: Path | None = None) -> None:
            log = stack.enter_context(open(work / f"{name}.log", "w"))  # noqa: SIM115 - closed by the stack
            cluster.procs.append(subprocess.Popen(
                [spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=str(cwd) if cwd else None))

        spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(ui)])
        _wait(lambda: master_state(ui) is not None, START_DEADLINE_S, "the master's web UI", cluster.procs)
        for i in range(workers):
            cwd = work / f"worker{i}-cwd"
            cwd.mkdir()
            spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", cluster.master_url,
                                 "--host", "127.0.0.1", "--port", str(free_port()),
                                 "--webui-port", str(free_port()), "--cores", str(cores),
                                 "--memory", memory, "--work-dir", str(work / f"worker{i}")], cwd)
        _wait(lambda: cluster.alive_workers() == workers, START_DEADLINE_S,
              f"{workers} worker(s) to register", cluster.procs)
        yield cluster


@contextmanager
def standalone_cluster(work: Path) -> Iterator[str]:
    """A standalone master and one worker (1 core, 1 GiB); yields the master URL."""
    with start_standalone(work) as cluster:
        yield cluster.master_url
