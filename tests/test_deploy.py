"""``deploy/``: the Dockerfile, the compose file and the Kubernetes manifests.

No container runtime runs on the machines this suite runs on (the Docker client is there,
its engine is not), so images are not built here.  What can be checked is checked:

- every file parses, and every path, command, flag and config file the files use exists
  in this repository and in the ``rmqha`` command;
- every config file (``deploy/conf`` and the Kubernetes ConfigMap) loads with rmqha's own
  loader, with the environment the containers set;
- the configs start for real: three controllers, a name server and a group of three
  brokers run from them on loopback (addresses and ports rewritten, as a container
  network would give them), with the cluster secret and broker IPs from the environment as
  compose and Kubernetes pass them;
- a broker rescheduled with a new IP (127.0.0.2, another loopback address) keeps its
  broker id from its volume and re-registers at its new address, which is what the
  StatefulSet's persistent volumes are for.
"""
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

from cluster import QUICK_BROKER, QUICK_CONTROLLER, QUICK_NAMESRV, Cluster  # noqa: E402

from rmqha.broker.config import BrokerConfig  # noqa: E402
from rmqha.cli import build_parser  # noqa: E402
from rmqha.config import load_config  # noqa: E402
from rmqha.controller.config import ControllerConfig  # noqa: E402
from rmqha.namesrv.config import NamesrvConfig  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CONF = DEPLOY / "conf"
#: Where the image puts deploy/conf (the Dockerfile's COPY) and the pods mount the ConfigMap.
ETC = "/etc/rmqha/"
CONFIG_CLASSES: dict[str, type] = {
    "controller.toml": ControllerConfig, "namesrv.toml": NamesrvConfig, "broker.toml": BrokerConfig,
}


def _load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _check_command(argv: list[str]) -> None:
    """``argv`` (after ``rmqha``) parses with the real CLI, its config paths mapped to deploy/conf."""
    local = [str(CONF / a[len(ETC):]) if a.startswith(ETC) else a for a in argv]
    for a in local:
        if a.startswith(str(CONF)):
            assert Path(a).is_file(), f"{argv} names {a}, which deploy/conf does not have"
    args = build_parser().parse_args(local)
    assert callable(getattr(args, "func", None)), f"{argv} is not an rmqha command"


# --- the Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_builds_in_one_stage_and_runs_the_wheel_in_a_slim_second():
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert len(froms) == 2, froms
    (build_image, build_name), (run_image, _) = froms
    assert run_image.endswith("-slim") and build_name, froms
    runtime = text.split(f"AS {froms[1][1]}" if froms[1][1] else froms[1][0], 1)[1]
    assert f"--from={build_name}" in runtime
    assert "gcc" not in runtime, "the runtime stage must not carry a compiler"
    # Every COPY source from the build context exists in this repository.
    for line in re.findall(r"^COPY\s+(?!--from)(.+)$", text, re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"
    entry = re.search(r'^ENTRYPOINT\s+\["([^"]+)"\]', text, re.M)
    assert entry is not None
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry.group(1) in scripts, f"ENTRYPOINT {entry.group(1)} is not a console script"
    assert (ROOT / ".dockerignore").is_file()


# --- compose ----------------------------------------------------------------------------------


def test_compose_file_runs_three_controllers_a_namesrv_and_a_group_of_three():
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = doc["services"]
    kinds: dict[str, list[str]] = {}
    for name, svc in services.items():
        command = svc["command"]
        _check_command(command)
        kinds.setdefault(command[0], []).append(name)
        for vol in svc.get("volumes", []):
            assert vol.split(":")[0] in doc["volumes"], f"{name}: volume {vol} is not declared"
    assert len(kinds["controller"]) == 3 and len(kinds["namesrv"]) == 1 and len(kinds["broker"]) == 3
    # Each controller its own Raft id, each broker its own volume and advertised address.
    ids = {services[n]["command"][services[n]["command"].index("--self-id") + 1] for n in kinds["controller"]}
    assert ids == {"n0", "n1", "n2"}
    assert len({services[n]["volumes"][0] for n in kinds["broker"]}) == 3
    assert len({services[n]["environment"]["RMQHA_BROKER_IP"] for n in kinds["broker"]}) == 3
    # Every process gets the cluster secret, and compose refuses to start without it.
    for name, svc in services.items():
        assert "${RMQHA_CLUSTER_SECRET:?" in svc["environment"]["RMQHA_CLUSTER_SECRET"], name
    # The peers the controller config names are the compose services.
    ctrl = load_config(ControllerConfig, CONF / "controller.toml", env={})
    assert {p.rpc_address.split(":")[0] for p in ctrl.peers()} == set(kinds["controller"])
    broker = load_config(BrokerConfig, CONF / "broker.toml", env={})
    assert {a.split(":")[0] for a in broker.controller_addr} == set(kinds["controller"])
    assert [a.split(":")[0] for a in broker.namesrv_addr] == kinds["namesrv"]


@pytest.mark.parametrize("name", sorted(CONFIG_CLASSES))
def test_deploy_configs_load_with_the_container_environment(name):
    env = {"RMQHA_CLUSTER_SECRET": "s3cret", "RMQHA_BROKER_IP": "10.1.2.3", "RMQHA_CONTROLLER_SELF_ID": "n2"}
    cfg = load_config(CONFIG_CLASSES[name], CONF / name, env=env)
    assert cfg.secret() == "s3cret" and cfg.check_security() == "s3cret"
    if name == "broker.toml":
        # A group of three keeps two copies of every acknowledged message (issue 13.3).
        assert cfg.min_in_sync_replicas == 2 and cfg.all_ack_in_sync_state_set
        assert cfg.broker_address == "10.1.2.3:10911"
    if name == "controller.toml":
        assert cfg.raft_secret() == "s3cret" and cfg.self_peer().id == "n2"


# --- Kubernetes -------------------------------------------------------------------------------


def test_kubernetes_manifests_give_each_broker_a_volume_and_its_pod_ip():
    docs = _load_yaml_docs(DEPLOY / "kubernetes" / "rmqha.yaml")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
        by_kind.setdefault(d["kind"], []).append(d)
    config_map = by_kind["ConfigMap"][0]["data"]
    for name, text in config_map.items():
        path = DEPLOY / "kubernetes" / f".check-{name}"
        try:
            path.write_text(text)
            load_config(CONFIG_CLASSES[name], path, env={"RMQHA_CONTROLLER_SELF_ID": "n1",
                                                           "RMQHA_BROKER_IP": "10.0.0.7"})
        finally:
            path.unlink(missing_ok=True)
    sets = {s["metadata"]["name"]: s for s in by_kind["StatefulSet"]}
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    broker = sets["rmqha-broker-a"]
    assert broker["spec"]["replicas"] == 3 and broker["spec"]["serviceName"] in services
    pod = broker["spec"]["template"]["spec"]
    container = pod["containers"][0]
    _check_command(container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["RMQHA_BROKER_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # The store (and .broker.meta in it) is on the pod's own persistent volume.
    store_dir = tomllib.loads(config_map["broker.toml"])["store_dir"]
    claims = {c["metadata"]["name"] for c in broker["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert any(store_dir.startswith(mounts[c]) for c in claims if c in mounts), (store_dir, mounts)
    controller = sets["rmqha-controller"]
    assert controller["spec"]["replicas"] == 3 and controller["spec"]["volumeClaimTemplates"]
    assert services[controller["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    # The controller's shell wrapper derives its Raft id from the pod ordinal.
    command = controller["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"]
    argv = shlex.split(command[2].replace("${HOSTNAME##*-}", "1"))
    assert argv[:2] == ["exec", "rmqha"]
    _check_command(argv[2:])
    namesrv = by_kind["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    _check_command(namesrv["args"])
    # Every process takes the cluster secret from the Secret.
    for pod_container in (controller["spec"]["template"]["spec"]["containers"][0], namesrv, container):
        assert any(e["name"] == "RMQHA_CLUSTER_SECRET" and "secretKeyRef" in e["valueFrom"]
                   for e in pod_container["env"]), pod_container["name"]


# --- the configs, started ---------------------------------------------------------------------


def _deploy_toml(name: str, *drop: str) -> dict[str, Any]:
    values = tomllib.loads((CONF / name).read_text())
    return {k: v for k, v in values.items() if k not in drop}


def test_deploy_configs_start_a_cluster_and_a_rescheduled_broker_keeps_its_id(tmp_path):
    """The deploy configs on loopback; the master comes back at a new IP with its id."""
    loopback = {"listen_host": "127.0.0.1"}
    # Addresses, ports and paths are what a container network and its volumes give; every
    # other setting is the deploy file's.
    broker = _deploy_toml("broker.toml", "store_dir", "listen_port", "controller_addr", "namesrv_addr")
    controller = _deploy_toml("controller.toml", "controller_peers", "controller_self_id",
                              "controller_store_path")
    namesrv = _deploy_toml("namesrv.toml", "listen_port")
    secret = "deploy-test-secret"
    # Controllers and brokers take the secret only from RMQHA_CLUSTER_SECRET, as compose and
    # the Secret pass it (not from the harness's file, which holds the same one).
    with Cluster(tmp_path, broker_defaults={**broker, **QUICK_BROKER, **loopback},
                 namesrv_defaults={**namesrv, **QUICK_NAMESRV, **loopback},
                 controller_defaults={**controller, **QUICK_CONTROLLER, **loopback},
                 cluster_secret=secret) as c:
        ctrls = c.add_controllers(3, cluster_secret_file="")
        for proc in ctrls:
            proc.env["RMQHA_CLUSTER_SECRET"] = secret
            proc.start()
        c.wait_for(lambda: c.controller_leader() is not None, what="a controller leader")
        c.start_namesrv()  # the same secret, from the harness's file
        brokers = []
        for _ in range(3):
            b = c.add_broker("broker-a", cluster_secret_file="")
            b.env["RMQHA_CLUSTER_SECRET"] = secret
            b.env["RMQHA_BROKER_IP"] = "127.0.0.1"  # the pod IP of this scheduling
            b.start()
            c.wait_broker_up(b)
            brokers.append(b)
        c.wait_role(brokers[0], "master")
        ids = sorted(b.broker_id() or 0 for b in brokers)
        c.wait_for(lambda: (i := c.replica_info("broker-a")) is not None and i.sync_state_set == ids,
                   30.0, what="all three brokers in sync")

        old = brokers[0]
        old_id = old.broker_id()
        old.kill()
        new_master = c.wait_for(lambda: (m := c.master_of("broker-a")) is not None and m is not old and m,
                                30.0, what="a new master")
        # Rescheduled: same volume (store dir), a new pod IP.
        old.env["RMQHA_BROKER_IP"] = "127.0.0.2"
        old.start(listen_host="127.0.0.2")
        c.wait_broker_up(old)
        c.wait_role(old, "slave", 30.0)
        assert old.broker_id() == old_id
        status = c.broker_status(old)
        assert status["address"] == old.address and old.address.startswith("127.0.0.2:")
        assert status["controllerBrokerId"] == old_id and status["masterAddress"] == new_master.address
        # The controller maps the id to the new address, and the broker catches up into the set.
        c.wait_for(lambda: (i := c.replica_info("broker-a")) is not None and old_id in i.sync_state_set,
                   30.0, what="the rescheduled broker back in the SyncStateSet")
        c.wait_for(lambda: old.address in str(c.sync_state_data("broker-a")), 10.0,
                   what="the controller to know the new address")
