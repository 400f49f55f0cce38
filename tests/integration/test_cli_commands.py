"""Every ``rmqha`` admin and client command against one live cluster, human and ``--json``.

One module-scoped cluster (a controller, a name server, broker group ``broker-a`` of two,
all with an admin token) serves every test; commands run through ``rmqha.cli.main`` in
this process (output captured) except where the exit code and stderr of a real
``python -m rmqha`` process are the point.  The tests that change the cluster (clean,
elect) come last.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster import Cluster, free_port
from rmqha.cli import build_parser, main

TOKEN = "s3cret-token"
TOPIC = "CliTopic"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("cli"), cluster_name="cli-cluster") as c, \
            pytest.MonkeyPatch.context() as env:
        # As an operator's shell would: admin writes are signed with the cluster secret.
        env.setenv("RMQHA_CLUSTER_SECRET_FILE", str(c.secret_file))
        c.start_controllers(1, admin_token=TOKEN)
        c.start_namesrv(admin_token=TOKEN)
        a, b = c.start_group("broker-a", 2, in_sync=True, admin_token=TOKEN)
        c.wait_for(lambda: (c.group_route("broker-a") or {}).get("brokerAddrs", {}).keys() >= {"0", "2"},
                   what="both brokers registered with the name server")
        c.a, c.b = a, b
        yield c


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def ctl(live) -> str:
    return live.controller_addresses[0]


def ns(live) -> str:
    return live.namesrvs[0].address


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("controller", "namesrv", "broker", "get-sync-state-set", "get-broker-epoch",
                 "get-controller-metadata", "get-controller-config", "update-controller-config",
                 "elect-master", "clean-broker-metadata", "ha-status", "cluster-list", "topic-list",
                 "update-topic", "delete-topic", "send", "produce", "consume",
                 "getSyncStateSet", "clusterList", "topicList"):
        assert name in out, name
    for name in ("send", "ha-status", "cluster-list", "get-sync-state-set", "elect-master"):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args([name, "--help"])
        assert exc.value.code == 0
        assert "--json" in capsys.readouterr().out


def test_get_controller_metadata(live, capsys):
    code, out, _ = run(capsys, "get-controller-metadata", "-a", ctl(live))
    assert code == 0
    assert f"#ControllerLeaderAddress\t{ctl(live)}" in out
    code, out, _ = run(capsys, "getControllerMetaData", "-a", ctl(live), "--json")
    assert code == 0 and json.loads(out)["leader_address"] == ctl(live)


def test_get_sync_state_set_by_name_and_by_cluster(live, capsys):
    code, out, _ = run(capsys, "get-sync-state-set", "-a", ctl(live), "-b", "broker-a")
    assert code == 0
    assert "#brokerName\tbroker-a" in out and "#SyncStateSetNums\t2" in out
    assert f"#MasterAddr\t{live.a.address}" in out
    code, out, _ = run(capsys, "get-sync-state-set", "-a", ctl(live), "-c", "cli-cluster", "-n", ns(live), "--json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["broker-a"]
    assert sorted(r["broker_id"] for r in data["broker-a"]["in_sync_replicas"]) == [1, 2]
    code, _, err = run(capsys, "get-sync-state-set", "-a", ctl(live), "-c", "cli-cluster")
    assert code == 2 and "-n" in err


def test_get_broker_epoch_by_address_and_group(live, capsys):
    code, out, _ = run(capsys, "get-broker-epoch", "-b", live.a.address)
    assert code == 0
    assert "#brokerName\tbroker-a" in out and "#Epoch: EpochEntry{epoch=1, startOffset=0" in out
    code, out, _ = run(capsys, "getBrokerEpoch", "-b", "broker-a", "-n", ns(live), "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data) == {live.a.address, live.b.address}
    assert data[live.a.address]["epochList"][0]["epoch"] == 1
    # The slave's epoch map fills as it replicates (nothing sent yet).
    assert data[live.b.address]["brokerId"] == live.b.broker_id()


def test_send_consume_and_ha_status(live, capsys):
    code, out, _ = run(capsys, "update-topic", "-n", ns(live), "-t", TOPIC, "-r", "2", "--admin-token", TOKEN)
    assert code == 0, out
    assert "broker-a" in out and "OK" in out
    live.wait_for(lambda: live.route(TOPIC), what="the topic's route")

    code, out, _ = run(capsys, "send", "-n", ns(live), "-t", TOPIC, "hello", "world")
    assert code == 0
    assert out.splitlines()[0].split()[:2] == ["#Status", "#MsgId"]
    assert out.count("SEND_OK") == 2
    code, out, _ = run(capsys, "produce", "-n", ns(live), "-t", TOPIC, "--json", "third")
    assert code == 0
    (sent,) = json.loads(out)
    assert sent["status"] == "SEND_OK" and sent["brokerName"] == "broker-a"
    # offsetMsgId = store host (the broker's advertised ip:port, not a default) + offset.
    assert sent["offsetMsgId"][:8] == "7F000001"
    assert int(sent["offsetMsgId"][8:16], 16) == live.a.config["listen_port"]

    code, out, _ = run(capsys, "consume", "-n", ns(live), "-t", TOPIC, "-g", "cli-g1", "--count", "3",
                       "--idle-s", "5")
    assert code == 0
    bodies = sorted(line.split()[-1] for line in out.splitlines()[1:])
    assert bodies == ["hello", "third", "world"]
    code, out, _ = run(capsys, "consume", "-n", ns(live), "-t", TOPIC, "-g", "cli-g2", "--count", "3",
                       "--idle-s", "5", "--json")
    assert code == 0
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["hello", "third", "world"]

    # Every message is acked by the slave (in sync): lag 0, status OK.
    status = live.broker_status(live.a)
    live.wait_for(lambda: all(s["lag_bytes"] == 0 for s in live.broker_status(live.a)["ha"]["slaves"]),
                  what="the slave to catch up")
    code, out, _ = run(capsys, "ha-status", "-b", live.a.address)
    assert code == 0
    assert "#Role\tmaster" in out and "#SlaveNum\t1" in out and "#InSyncSlaveNum\t1" in out
    allocated = next(line for line in out.splitlines() if line.startswith("#StoreDiskAllocated(bytes)"))
    assert int(allocated.split("\t")[1]) > 0
    header = next(line for line in out.splitlines() if line.startswith("#SlaveId"))
    assert header.split() == ["#SlaveId", "#SlaveAddr", "#SlaveAckOffset", "#Diff(bytes)", "#Lag(ms)",
                              "#Status", "#State", "#TransferFromWhere"]
    row = out.splitlines()[out.splitlines().index(header) + 1].split()
    assert row[0] == "2" and row[3] == "0" and row[5] == "OK"
    assert status["maxOffset"] > 0
    code, out, _ = run(capsys, "haStatus", "-b", "broker-a", "-n", ns(live), "--json")
    assert code == 0
    data = json.loads(out)
    assert data[live.a.address]["role"] == "master" and data[live.b.address]["role"] == "slave"
    (slave,) = data[live.a.address]["ha"]["slaves"]
    assert slave["in_sync"] is True and slave["lag_bytes"] == 0 and slave["ack_offset"] == status["maxOffset"]


def test_ha_status_watch_through_a_pipe_and_as_json_lines(live, capsys):
    argv = [sys.executable, "-m", "rmqha", "ha-status", "-b", "broker-a", "-n", ns(live),
            "--watch", "--count", "3", "--interval", "0.1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\x1b" not in out and "\r" not in out  # a pipe: appended rounds, never redrawn
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("#Round")] == [
        ["#Round", "1"], ["#Round", "2"], ["#Round", "3"]]
    assert out.count(f"#BrokerAddr\t{live.a.address}") == 3 and out.count(f"#BrokerAddr\t{live.b.address}") == 3
    rows = [line.split() for line in out.splitlines() if line.startswith("2 ")]
    assert len(rows) == 3 and all(r[5] == "OK" for r in rows)  # the in-sync slave, each round
    assert "#CatchUp" not in out  # nobody is catching up

    proc = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rounds = [json.loads(line) for line in proc.stdout.splitlines()]
    code, out, _ = run(capsys, "ha-status", "-b", "broker-a", "-n", ns(live), "--json")
    once = json.loads(out)
    # Each JSON line is what one `ha-status --json` prints.
    assert len(rounds) == 3 and all(set(r) == set(once) == {live.a.address, live.b.address} for r in rounds)
    assert all(set(r[a]) == set(once[a]) for r in rounds for a in once)

    code, _, err = run(capsys, "ha-status", "-b", live.a.address, "--count", "2")
    assert code == 2 and "--watch" in err


def test_cluster_list_and_topic_list(live, capsys):
    code, out, _ = run(capsys, "cluster-list", "-n", ns(live))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["#Cluster", "Name"]
    master = next(line for line in lines if live.a.address in line)
    assert master.split()[:5] == ["cli-cluster", "broker-a", "0", live.a.address, "master"]
    code, out, _ = run(capsys, "clusterList", "-n", ns(live), "--json")
    assert code == 0
    roles = {b["address"]: (b["brokerId"], b["role"]) for b in json.loads(out)["brokers"]}
    assert roles == {live.a.address: (0, "master"), live.b.address: (2, "slave")}

    live.wait_for(lambda: TOPIC in json.loads(main_json(capsys, "topic-list", "-n", ns(live)))["topicList"],
                  what="the topic in the name server's list")
    code, out, _ = run(capsys, "topicList", "-n", ns(live))
    assert code == 0 and TOPIC in out.splitlines()
    code, out, _ = run(capsys, "topic-route", "-n", ns(live), "-t", TOPIC)
    assert code == 0 and "broker-a" in out


def main_json(capsys, *argv: str) -> str:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return out


def test_controller_config_get_and_update(live, capsys):
    code, out, _ = run(capsys, "get-controller-config", "-a", ctl(live))
    assert code == 0
    assert f"============{ctl(live)}============" in out
    assert any(line.startswith("enableElectUncleanMaster") for line in out.splitlines())
    assert TOKEN not in out  # secrets are masked
    # Admin writes need the token.
    code, _, err = run(capsys, "update-controller-config", "-a", ctl(live), "-k", "scanInactiveMasterInterval",
                       "-v", "400")
    assert code == 1 and "admin token" in err
    code, out, _ = run(capsys, "update-controller-config", "-a", ctl(live), "-k", "scanInactiveMasterInterval",
                       "-v", "400", "--admin-token", TOKEN)
    assert code == 0 and "update controller config success!" in out
    data = json.loads(main_json(capsys, "get-controller-config", "-a", ctl(live)))
    assert data[ctl(live)]["scanInactiveMasterInterval"] == "400"


def test_topic_writes_need_the_admin_token(live, capsys):
    code, out, _ = run(capsys, "update-topic", "-n", ns(live), "-t", "NoToken")
    assert code == 1 and "FAILED" in out and "admin token" in out
    code, out, _ = run(capsys, "delete-topic", "-n", ns(live), "-t", TOPIC, "--json")
    assert code == 1
    data = json.loads(out)
    assert not any(c["ok"] for c in data["changes"])
    assert all(v.startswith("FAILED") for v in data["namesrv"].values())


def test_unreachable_addresses_fail_fast_without_traceback():
    dead = f"127.0.0.1:{free_port()}"
    for argv, flag in ((["get-controller-metadata", "-a", dead], "-a/--controller-address"),
                       (["get-sync-state-set", "-a", dead, "-b", "x"], "-a/--controller-address"),
                       (["topic-list", "-n", dead], "-n/--namesrv-addr"),
                       (["cluster-list", "-n", dead, "--json"], "-n/--namesrv-addr"),
                       (["ha-status", "-b", dead], "-b"),
                       (["send", "-n", dead, "-t", "T", "--retry-deadline-s", "1", "x"], "-n/--namesrv-addr")):
        proc = subprocess.run([sys.executable, "-m", "rmqha", *argv], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert dead in proc.stderr and flag in proc.stderr, proc.stderr


def test_delete_topic(live, capsys):
    code, out, _ = run(capsys, "delete-topic", "-n", ns(live), "-t", TOPIC, "--admin-token", TOKEN)
    assert code == 0, out
    assert "broker-a" in out and "OK" in out
    live.wait_for(lambda: live.route(TOPIC) is None, what="the topic to leave the routes")


def test_clean_broker_metadata(live, capsys):
    gone = live.start_broker("broker-b", admin_token=TOKEN)
    live.wait_role(gone, "master")
    gone.kill()
    live.wait_for(lambda: not any(r["alive"] for r in live.sync_state_data("broker-b").get("inSyncReplicas", [])),
                  what="broker-b to be seen dead")
    code, _, err = run(capsys, "clean-broker-metadata", "-a", ctl(live), "-bn", "broker-b")
    assert code == 2 and "clusterName option can not be empty" in err
    code, _, err = run(capsys, "clean-broker-metadata", "-a", ctl(live), "-bn", "broker-b", "-c", "cli-cluster")
    assert code == 1 and "admin token" in err
    code, out, _ = run(capsys, "cleanBrokerMetadata", "-a", ctl(live), "-bn", "broker-b", "-c", "cli-cluster",
                       "--admin-token", TOKEN)
    assert code == 0 and "clear broker broker-b metadata from controller success!" in out
    code, out, _ = run(capsys, "get-sync-state-set", "-a", ctl(live), "-b", "broker-b")
    assert "broker set broker-b is not known to the controller" in out


def test_elect_master_moves_the_master(live, capsys):
    b_id = live.b.broker_id()
    code, _, err = run(capsys, "elect-master", "-a", ctl(live), "-c", "cli-cluster", "-bn", "broker-a",
                       "-b", str(b_id))
    assert code == 1 and "admin token" in err
    code, out, _ = run(capsys, "electMaster", "-a", ctl(live), "-c", "cli-cluster", "-bn", "broker-a",
                       "-b", str(b_id), "--admin-token", TOKEN)
    assert code == 0
    assert f"#BrokerMasterAddr\t{live.b.address}" in out and "#MasterEpoch\t2" in out
    live.wait_role(live.b, "master")
    data = json.loads(main_json(capsys, "get-sync-state-set", "-a", ctl(live), "-b", "broker-a"))
    assert data["broker-a"]["master_broker_id"] == b_id and data["broker-a"]["master_epoch"] == 2
