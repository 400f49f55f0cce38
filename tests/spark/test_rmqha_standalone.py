"""``format("rmqha")`` on a standalone Spark cluster (a master and two workers) gives local mode's rows.

The cluster is tests/support/spark_standalone.py's (pyspark's own jars on 127.0.0.1); the
driver is a process of its own (tests/support/rmqha_batch_driver.py) connected to it,
whose executors (JVMs the workers fork, each with its own Python workers, in the workers'
directories) pull the queues. The same driver in ``local[2]`` reads the same topic; both
write every row, sorted, and the two files are equal, with one row per message sent.
A master, two workers, two executors and two drivers: ``slow``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import Cluster
from rmqha_topics import create_topic, send, start_group
from spark_standalone import start_standalone
from spark_support import PROJECT_ROOT, SPARK_TEST_MARKS

pytestmark = [*SPARK_TEST_MARKS, pytest.mark.slow, pytest.mark.timeout(1200)]

DRIVER = os.path.join(PROJECT_ROOT, "tests", "support", "rmqha_batch_driver.py")


def _read(master: str, namesrv: str, out: Path, cwd: Path) -> list[str]:
    cwd.mkdir()
    proc = subprocess.run([sys.executable, DRIVER, "--master", master, "--namesrv", namesrv, "--topic", "Same",
                           "--out", str(out)], cwd=str(cwd), capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out.read_text().splitlines()


def test_the_standalone_cluster_reads_the_rows_local_mode_reads(tmp_path: Path) -> None:
    with Cluster(tmp_path / "rmq") as rmq:
        start_group(rmq, 0)
        create_topic(rmq, "Same", 4)
        sent = send(rmq.namesrv_addresses, "Same", range(500), size=300)
        namesrv = ";".join(rmq.namesrv_addresses)
        local = _read("local[2]", namesrv, tmp_path / "local.jsonl", tmp_path / "local-cwd")
        work = tmp_path / "spark"
        work.mkdir()
        with start_standalone(work, workers=2, memory="768m") as spark_cluster:
            assert spark_cluster.alive_workers() == 2
            remote = _read(spark_cluster.master_url, namesrv, tmp_path / "cluster.jsonl", tmp_path / "driver-cwd")
        assert len(local) == len(sent) == 500
        assert remote == local
        # The executors ran in the workers' directories, not the driver's.
        assert any((work / "worker0").iterdir()) or any((work / "worker1").iterdir())
