"""Every process logs JSON lines; a broker's lines carry its group, broker id and epoch.

Real processes: a controller, a name server with ``log_file`` set, and a broker group of
two with ``log_file`` set; the master is moved once (designated election) so the epoch on
the lines must change with it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cluster import Cluster, free_port
from rmqha.protocol.codes import RequestCode, ResponseCode


def json_lines(path: Path) -> list[dict]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines, f"{path} is empty"
    out = []
    for line in lines:
        obj = json.loads(line)  # every line is one JSON object
        assert isinstance(obj, dict) and {"ts", "level", "logger", "msg", "process"} <= obj.keys(), line
        out.append(obj)
    return out


def test_broker_lines_carry_group_id_and_epoch(tmp_path):
    with Cluster(tmp_path, cluster_name="logs") as c:
        c.start_controllers(1)
        ns_log = tmp_path / "namesrv.jsonl"
        c.start_namesrv(log_file=str(ns_log))
        a = c.start_broker("broker-a", log_file=str(tmp_path / "a.jsonl"))
        c.wait_role(a, "master")
        b = c.start_broker("broker-a", log_file=str(tmp_path / "b.jsonl"))
        c.wait_role(b, "slave")
        c.wait_for(lambda: (info := c.replica_info("broker-a")) is not None and len(info.sync_state_set) == 2,
                   what="the slave in the SyncStateSet")
        b_id = b.broker_id()
        resp = c.controller_request(RequestCode.CONTROLLER_ELECT_MASTER,
                                    {"clusterName": "logs", "brokerName": "broker-a", "brokerId": b_id,
                                     "designateElect": "true"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        c.wait_role(b, "master")
        c.wait_role(a, "slave")
        c.wait_for(lambda: any("became master" in r["msg"] and r.get("epoch") == 2
                               for r in json_lines(tmp_path / "b.jsonl")), what="b's 'became master' line")

        for name, broker, first_epoch in (("a.jsonl", a, 1), ("b.jsonl", b, 1)):
            records = json_lines(tmp_path / name)
            assert all(r["process"] == "broker" and r["group"] == "broker-a" for r in records)
            assert all("broker_id" in r and "epoch" in r for r in records), name
            # -1 only until the controller settled the id; the real id afterwards.
            ids = [r["broker_id"] for r in records]
            assert ids[-1] == broker.broker_id() and set(ids) <= {-1, broker.broker_id()}
            epochs = [r["epoch"] for r in records]
            assert epochs == sorted(epochs) and first_epoch in epochs and epochs[-1] == 2, (name, epochs)
        became = [r for r in json_lines(tmp_path / "b.jsonl") if r["msg"].startswith("became master")]
        assert became and became[-1]["epoch"] == 2 and became[-1]["broker_id"] == b_id

        ns_records = json_lines(ns_log)
        assert all(r["process"] == "namesrv" for r in ns_records)
        # The broker processes wrote nothing but these files' lines to stderr/stdout.
        assert "became master" not in a.log_text()


def test_controller_log_file_flag(tmp_path):
    rpc, raft = free_port(), free_port()
    log = tmp_path / "controller.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmqha", "controller", "--peers", f"n0-127.0.0.1:{rpc}",
         "--raft-peers", f"n0-127.0.0.1:{raft}", "--self-id", "n0", "--store-path", str(tmp_path / "c"),
         "--log-file", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env={**os.environ, "RMQHA_CLUSTER_SECRET": "log-test-secret-of-16"})  # no controller runs without one
    try:
        with Cluster(tmp_path / "probe") as c:
            c.wait_for(lambda: log.exists() and log.stat().st_size > 0
                       and any("serving" in r["msg"] for r in json_lines(log)),
                       what="the controller's start line in its log file")
    finally:
        proc.terminate()
        proc.wait(10)
    assert all(r["process"] == "controller" for r in json_lines(log))
