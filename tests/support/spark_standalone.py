"""A standalone Spark cluster (a master and a worker) started from pyspark's own jars.

Moved out of tests/spark/test_spark_cluster.py so other tests can start the same cluster.
The master and the worker run ``spark-class`` on 127.0.0.1 with free ports, each in a
process group of its own, stopped group by group.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cluster import free_port


def _spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _wait(predicate, deadline_s: float, what: str, procs: list[subprocess.Popen]) -> None:  # noqa: ANN001
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a cluster process exited with {p.returncode}")
        if predicate():
            return
        time.sleep(0.2)  # polling interval of a deadline wait, not a fixed sleep
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")


def _master_state(ui_port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return json.load(resp)
    except OSError:
        return None


@contextmanager
def standalone_cluster(work: Path) -> Iterator[str]:
    """A standalone master and one worker (1 core, 1 GiB); yields the master URL."""
    home = _spark_home()
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(work / "logs"), SPARK_WORKER_DIR=str(work / "worker"),
               PYSPARK_PYTHON=sys.executable)
    spark_class = os.path.join(home, "bin", "spark-class")
    port, ui = free_port(), free_port()
    # The worker (and the executors it launches) start in a directory of their own, not the
    # driver's: nothing may be found through the driver's working directory.
    worker_cwd = work / "worker-cwd"
    worker_cwd.mkdir()
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        log = open(work / "master.log", "w")  # noqa: SIM115 - closed in finally
        logs.append(log)
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        _wait(lambda: _master_state(ui) is not None, 90, "the master's web UI", procs)
        log = open(work / "worker.log", "w")  # noqa: SIM115
        logs.append(log)
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
             "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
             "--cores", "1", "--memory", "1g", "--work-dir", str(work / "worker")],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=str(worker_cwd)))
        _wait(lambda: (_master_state(ui) or {}).get("aliveworkers") == 1, 90,
              "the worker to register", procs)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for log in logs:
            log.close()
