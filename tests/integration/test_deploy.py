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
  StatefulSet's persistent volumes are for;
- secure by default: a config that listens beyond loopback serves TLS only to holders of
  a cluster certificate (brokers also check ACL signatures), credentials come from the
  environment and Secrets (none is written in a file here), certificates are the ones
  ``rmqha certs`` makes (compose's ``certs`` service, ``make-secrets.sh`` run with a stub
  kubectl), and the Kubernetes NetworkPolicies let only the cluster's own pods reach the
  internal ports.  Each checker is shown to fire on a config that breaks its rule.  The
  cluster above runs with the deploy files' TLS and ACL settings.
"""
from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import needs
import pytest

yaml = needs.module("yaml", "PyYAML (dev extra)", module_level=True)

from cluster import QUICK_BROKER, QUICK_CONTROLLER, QUICK_NAMESRV, Cluster  # noqa: E402

from rmqha.broker.config import BrokerConfig  # noqa: E402
from rmqha.cli import build_parser  # noqa: E402
from rmqha.config import load_config  # noqa: E402
from rmqha.controller.config import ControllerConfig  # noqa: E402
from rmqha.namesrv.config import NamesrvConfig  # noqa: E402
from rmqha.net.client_security import ClientSecurity, Credentials, client_context  # noqa: E402
from rmqha.security import certs  # noqa: E402
from rmqha.security.tls import ClientAuth, TlsMode, TlsSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONF = DEPLOY / "conf"
#: Where the image puts deploy/conf (the Dockerfile's COPY) and the pods mount the ConfigMap.
ETC = "/etc/rmqha/"
#: Where the containers find their certificates (a volume or Secret) and plain_acl.yml.
TLS_DIR = "/etc/rmqha-tls/"
ACL_DIR = "/etc/rmqha-acl/"
#: The per-process certificate keys the environment sets.
CERT_ENV = ("RMQHA_TLS_SERVER_CERT_PATH", "RMQHA_TLS_SERVER_KEY_PATH",
            "RMQHA_TLS_CLIENT_CERT_PATH", "RMQHA_TLS_CLIENT_KEY_PATH")
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


def _certs_commands(script: str) -> list[list[str]]:
    """The ``rmqha ...`` commands of a shell script (one per line or ``&&`` step)."""
    steps = [p.strip() for line in script.splitlines() for p in line.split("&&")]
    return [shlex.split(p)[1:] for p in steps if p.startswith("rmqha ")]


def test_compose_file_runs_three_controllers_a_namesrv_and_a_group_of_three(tmp_path):
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = dict(doc["services"])
    # The one-shot `certs` service makes the certificates every other service reads.
    certs_service = services.pop("certs")
    assert certs_service["entrypoint"] == ["sh", "-c"]
    made = _certs_commands(certs_service["command"][0])
    assert [m[:2] for m in made] == [["certs", "dev-cluster"]]
    for argv in made:
        _check_command(argv)
    pki = tmp_path / "pki"
    argv = list(made[0])
    argv[argv.index("--dir") + 1] = str(pki)  # the `ca` volume, here
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    kinds: dict[str, list[str]] = {}
    for name, svc in services.items():
        command = svc["command"]
        _check_command(command)
        env = svc.get("environment", {})
        for var in CERT_ENV:  # each process its own pair, one `certs` made
            assert env[var].startswith(TLS_DIR) and (pki / env[var][len(TLS_DIR):]).is_file(), (name, var)
        assert svc["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
        kinds.setdefault(command[0], []).append(name)
        for vol in svc.get("volumes", []):
            assert vol.split(":")[0] in doc["volumes"], f"{name}: volume {vol} is not declared"
        assert f"tls:{TLS_DIR.rstrip('/')}:ro" in svc["volumes"], name
        # The CA key stays in the `ca` volume, which only `certs` mounts.
        assert not any(v.startswith("ca:") for v in svc["volumes"]), name
        # Published ports only on loopback.
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    assert len(kinds["controller"]) == 3 and len(kinds["namesrv"]) == 1 and len(kinds["broker"]) == 3
    # Each controller its own Raft id, each broker its own volume and advertised address.
    ids = {services[n]["command"][services[n]["command"].index("--self-id") + 1] for n in kinds["controller"]}
    assert ids == {"n0", "n1", "n2"}
    assert len({services[n]["volumes"][0] for n in kinds["broker"]}) == 3
    assert len({services[n]["environment"]["RMQHA_BROKER_IP"] for n in kinds["broker"]}) == 3
    # Every server gets the cluster secret, and compose refuses to start without it.
    for name in kinds["controller"] + kinds["namesrv"] + kinds["broker"]:
        assert "${RMQHA_CLUSTER_SECRET:?" in services[name]["environment"]["RMQHA_CLUSTER_SECRET"], name
    # The brokers' ACL file is a compose secret, not a file of the image.
    acl_target = tomllib.loads((CONF / "broker.toml").read_text())["acl_file"]
    for n in kinds["broker"]:
        assert {"source": "plain_acl", "target": acl_target} in services[n]["secrets"], n
    assert doc["secrets"]["plain_acl"]["file"] == "./plain_acl.yml"
    assert "deploy/plain_acl.yml" in (ROOT / ".gitignore").read_text()
    # The peers the controller config names are the compose services.
    ctrl = load_config(ControllerConfig, CONF / "controller.toml", env={})
    assert {p.rpc_address.split(":")[0] for p in ctrl.peers()} == set(kinds["controller"])
    broker = load_config(BrokerConfig, CONF / "broker.toml", env={})
    assert {a.split(":")[0] for a in broker.controller_addr} == set(kinds["controller"])
    assert [a.split(":")[0] for a in broker.namesrv_addr] == kinds["namesrv"]


@pytest.mark.parametrize("name", sorted(CONFIG_CLASSES))
def test_deploy_configs_load_with_the_container_environment(name):
    env = {"RMQHA_CLUSTER_SECRET": "s3cret-of-sixteen-bytes", "RMQHA_BROKER_IP": "10.1.2.3",
           "RMQHA_CONTROLLER_SELF_ID": "n2"}
    cfg = load_config(CONFIG_CLASSES[name], CONF / name, env=env)
    assert cfg.secret() == "s3cret-of-sixteen-bytes" == cfg.check_security()
    if name == "broker.toml":
        # A group of three keeps two copies of every acknowledged message (issue 13.3).
        assert cfg.min_in_sync_replicas == 2 and cfg.all_ack_in_sync_state_set
        assert cfg.broker_address == "10.1.2.3:10911"
    if name == "controller.toml":
        assert cfg.raft_secret() == "s3cret-of-sixteen-bytes" and cfg.self_peer().id == "n2"


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


# --- secure by default ------------------------------------------------------------------------


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _exposure_problems(cfg: Any, name: str) -> list[str]:
    """What ``cfg`` would serve beyond loopback without credentials ([]: nothing)."""
    problems = []
    for host_key, port_key in (("metrics_host", "metrics_port"), ("status_host", "status_port")):
        if getattr(cfg, port_key, 0) and getattr(cfg, host_key) not in _LOOPBACK and not cfg.https_enable:
            problems.append(f"{name}: {port_key} on {getattr(cfg, host_key)} without https_enable")
    if cfg.listen_host in _LOOPBACK:
        return problems
    tls = TlsSettings.from_config(cfg, name)
    where = f"{name}: listens on {cfg.listen_host}"
    if tls.server_mode is not TlsMode.ENFORCING:
        problems.append(f"{where} with tls_server_mode={tls.server_mode.value}")
    if tls.server_need_client_auth is not ClientAuth.REQUIRE or not tls.server_trust_cert_path:
        problems.append(f"{where} without requiring client certificates of a trusted CA")
    if not (tls.client_enable and tls.client_auth_server and tls.client_trust_cert_path):
        problems.append(f"{name}: its own links would not be TLS checked against the CA")
    if isinstance(cfg, BrokerConfig) and not cfg.acl_enable:
        problems.append(f"{where} without acl_enable")
    if isinstance(cfg, ControllerConfig) and cfg.raft_password:
        problems.append(f"{name}: the Raft password is written in the file (use RMQHA_CLUSTER_SECRET)")
    if getattr(cfg, "cluster_secret", ""):
        problems.append(f"{name}: the cluster secret is written in the file (use RMQHA_CLUSTER_SECRET)")
    return problems


def _config_map_files(tmp_path: Path) -> dict[str, Path]:
    docs = _load_yaml_docs(DEPLOY / "kubernetes" / "rmqha.yaml")
    data = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    out = {}
    for name, text in data.items():
        out[f"ConfigMap {name}"] = tmp_path / name
        out[f"ConfigMap {name}"].write_text(text)
    return out


def test_configs_reachable_beyond_loopback_need_credentials(tmp_path):
    files = {f"deploy/conf/{n}": CONF / n for n in CONFIG_CLASSES}
    files.update(_config_map_files(tmp_path))
    for label, path in files.items():
        cfg = load_config(CONFIG_CLASSES[path.name], path, env={"RMQHA_CONTROLLER_SELF_ID": "n1"})
        assert cfg.listen_host not in _LOOPBACK, label  # the check below is not vacuous
        assert _exposure_problems(cfg, label) == [], label
        # Nothing secret is written in a deploy file (they come from the environment).
        text = path.read_text().lower()
        assert not re.search(r"(password|secret|token)\s*=", text), label


@pytest.mark.parametrize("change, problem", [
    ({"tls_server_mode": "permissive"}, "with tls_server_mode=permissive"),
    ({"tls_server_need_client_auth": "optional"}, "without requiring client certificates"),
    ({"tls_enable": False}, "its own links would not be TLS"),
    ({"acl_enable": False}, "without acl_enable"),
    ({"metrics_port": 9100, "metrics_host": "0.0.0.0"}, "metrics_port on 0.0.0.0 without https_enable"),
])
def test_negative_control_exposure_checker_fires(change, problem):
    cfg = load_config(BrokerConfig, CONF / "broker.toml", env={}, overrides=change)
    assert any(problem in p for p in _exposure_problems(cfg, "broker")), change
    loopback = load_config(BrokerConfig, CONF / "broker.toml", env={},
                           overrides={"listen_host": "127.0.0.1", "tls_server_mode": "disabled",
                                      "acl_enable": False})
    assert _exposure_problems(loopback, "broker") == []  # loopback alone needs none of it
    controller = load_config(ControllerConfig, CONF / "controller.toml", env={},
                             overrides={"raft_password": "in-the-file"})
    assert any("Raft password is written" in p for p in _exposure_problems(controller, "c"))


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("StatefulSet", "Deployment")}


#: The ports only the cluster's own pods may reach, per workload.
INTERNAL_PORTS: dict[str, set[int]] = {"rmqha-controller": {9878, 10878}, "rmqha-broker-a": {10912}}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _our_pods_only(source: Mapping[str, Any], pod_labels: Mapping[str, Any]) -> bool:
    """Whether a NetworkPolicy ``from`` entry names only this cluster's pods: a pod selector
    alone (same namespace), on ``part-of: rmqha`` or one of the workloads' names."""
    labels = (source.get("podSelector") or {}).get("matchLabels") or {}
    return set(source) == {"podSelector"} and (labels.get("app.kubernetes.io/part-of") == "rmqha"
                                               or labels.get("app.kubernetes.io/name") in pod_labels)


def _policy_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Who could reach an internal port from outside the cluster's own pods ([]: no one)."""
    pod_labels = {name: w["spec"]["template"]["metadata"]["labels"] for name, w in _workloads(docs).items()}
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    problems = []
    for name, ports in INTERNAL_PORTS.items():
        mine = [p for p in policies if _selects(p["spec"]["podSelector"], pod_labels[name])
                and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
        if not mine:
            problems.append(f"no NetworkPolicy limits ingress to {name}")
        for policy in mine:
            for rule in policy["spec"].get("ingress") or []:
                rule_ports = {p["port"] for p in rule.get("ports") or []} or ports  # none: all
                if not rule_ports & ports:
                    continue
                sources = rule.get("from") or []
                if not sources:
                    problems.append(f"{policy['metadata']['name']}: {sorted(rule_ports & ports)} open to all")
                for src in sources:
                    if not _our_pods_only(src, pod_labels):
                        problems.append(f"{policy['metadata']['name']}: {sorted(rule_ports & ports)} "
                                        f"reachable from {src}")
    return problems


def test_network_policies_keep_internal_ports_to_the_clusters_own_pods():
    docs = _load_yaml_docs(DEPLOY / "kubernetes" / "rmqha.yaml")
    assert _policy_problems(docs) == []
    for name, w in _workloads(docs).items():
        assert w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rmqha", name


@pytest.mark.parametrize("breakage", ["no from", "ip block", "namespace", "other pods", "no policy"])
def test_negative_control_policy_checker_fires(breakage):
    docs = _load_yaml_docs(DEPLOY / "kubernetes" / "rmqha.yaml")
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy"
                  and d["metadata"]["name"] == "rmqha-controller")
    rule = policy["spec"]["ingress"][0]
    if breakage == "no from":
        del rule["from"]
    elif breakage == "ip block":
        rule["from"].append({"ipBlock": {"cidr": "0.0.0.0/0"}})
    elif breakage == "namespace":
        rule["from"] = [{"namespaceSelector": {}}]
    elif breakage == "other pods":
        rule["from"] = [{"podSelector": {"matchLabels": {"app": "anything"}}}]
    else:
        docs.remove(policy)
    assert _policy_problems(docs), breakage


def test_kubernetes_credentials_come_from_secrets():
    docs = _load_yaml_docs(DEPLOY / "kubernetes" / "rmqha.yaml")
    assert not [d for d in docs if d["kind"] == "Secret"], "no Secret is written in the manifest"
    for name, w in _workloads(docs).items():
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        container = pod["containers"][0]
        mounts = {m["mountPath"].rstrip("/") + "/": m for m in container["volumeMounts"]}
        tls_mount = mounts[TLS_DIR]
        assert volumes[tls_mount["name"]]["secret"]["secretName"] == "rmqha-tls" and tls_mount["readOnly"]
        env = {e["name"]: e for e in container["env"]}
        for var in CERT_ENV:
            assert env[var]["value"].startswith(TLS_DIR), (name, var)
        for e in container["env"]:
            if re.search(r"PASSWORD|SECRET|TOKEN", e["name"]):
                assert "secretKeyRef" in e["valueFrom"], (name, e["name"])
        if name.startswith("rmqha-broker"):
            assert volumes[mounts[ACL_DIR]["name"]]["secret"]["secretName"] == "rmqha-acl"


def _pod_cert_names(docs: list[dict[str, Any]]) -> set[str]:
    """The certificate files the pods read: StatefulSet pods by their name ($(POD_NAME))."""
    names = set()
    for name, w in _workloads(docs).items():
        env = {e["name"]: e.get("value", "") for e in w["spec"]["template"]["spec"]["containers"][0]["env"]}
        pods = ([f"{name}-{i}" for i in range(w["spec"]["replicas"])] if w["kind"] == "StatefulSet"
                else [""])
        for pod in pods:
            names |= {env[v][len(TLS_DIR):].replace("$(POD_NAME)", pod) for v in CERT_ENV}
    return names


def test_make_secrets_script_makes_every_certificate_the_pods_read(tmp_path):
    """make-secrets.sh with a stub kubectl that records what it is asked to store."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "kubectl.log"
    (bin_dir / "kubectl").write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {record}
case "$*" in *" get secret "*) exit 1;; *" apply "*) cat >/dev/null;; esac
""")
    (bin_dir / "rmqha").write_text(f'#!/bin/sh\nexec {shlex.quote(__import__("sys").executable)} -m rmqha "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    acl = tmp_path / "plain_acl.yml"
    acl.write_text((DEPLOY / "plain_acl.example.yml").read_text())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    pki = tmp_path / "pki"
    out = subprocess.run(["sh", str(DEPLOY / "kubernetes" / "make-secrets.sh"), str(pki), str(acl), "rmqha"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    calls = record.read_text().splitlines()
    stored: dict[str, Path] = {}
    for call in calls:
        if " create secret generic rmqha-tls " in f" {call} ":
            for flag in call.split():
                if flag.startswith("--from-file="):
                    key, _, path = flag[len("--from-file="):].partition("=")
                    stored[key] = Path(path)
    docs = _load_yaml_docs(DEPLOY / "kubernetes" / "rmqha.yaml")
    assert set(stored) == _pod_cert_names(docs) | {"ca.crt"}
    assert all(p.is_file() for p in stored.values()) and certs.CA_KEY not in {p.name for p in stored.values()}
    broker_toml = tomllib.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["broker.toml"])
    ident = certs.cert_identity(certs.read_cert(stored["rmqha-broker-a-1.crt"]))
    assert (ident.cluster, ident.group, ident.name) == (broker_toml["cluster"], broker_toml["broker_name"],
                                                         "rmqha-broker-a-1")
    assert stat.S_IMODE(stored["rmqha-broker-a-1.key"].stat().st_mode) == 0o600
    assert any("create secret generic rmqha-acl --from-file=plain_acl.yml=" in c for c in calls)
    assert any("create secret generic rmqha-secrets --from-literal=cluster-secret=" in c for c in calls)


# --- the configs, started ---------------------------------------------------------------------


#: The deploy's volume paths, and where this test puts what they would hold.
_MOUNTS: dict[str, str] = {}


def _local(value: Any) -> Any:
    """A deploy path under a mount (certificates, ACL) mapped to this test's files."""
    for mount, local in _MOUNTS.items():
        if isinstance(value, str) and value.startswith(mount):
            return local + value[len(mount):]
    return value


def _deploy_toml(name: str, *drop: str) -> dict[str, Any]:
    values = tomllib.loads((CONF / name).read_text())
    return {k: _local(v) for k, v in values.items() if k not in drop}


def _compose_certs(service: str) -> dict[str, str]:
    """The certificate paths compose gives ``service``, mapped to this test's files."""
    env = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"][service]["environment"]
    return {var: _local(env[var]) for var in CERT_ENV}


_TEST_ACL = """\
accounts:
  - accessKey: deploy-admin
    secretKey: deploy-admin-secret
    admin: true
"""


def test_deploy_configs_start_a_cluster_and_a_rescheduled_broker_keeps_its_id(tmp_path, monkeypatch):
    """The deploy configs on loopback; the master comes back at a new IP with its id.

    TLS and ACL are the deploy files' own: certificates made as compose's `certs` service
    makes them, each process given its pair as compose gives it, the ACL file where the
    brokers' config expects it; this test's own requests carry an admin certificate and
    an admin account's signature."""
    pki, acl_dir = tmp_path / "pki", tmp_path / "acl"
    certs.dev_cluster(pki, cluster="rmqha", controllers=3, groups={"broker-a": 3}, namesrv=1)
    acl_dir.mkdir()
    (acl_dir / "plain_acl.yml").write_text(_TEST_ACL)
    monkeypatch.setitem(_MOUNTS, TLS_DIR, f"{pki}/")
    monkeypatch.setitem(_MOUNTS, ACL_DIR, f"{acl_dir}/")
    loopback = {"listen_host": "127.0.0.1"}
    # Addresses, ports and paths are what a container network and its volumes give; every
    # other setting is the deploy file's.
    broker = _deploy_toml("broker.toml", "store_dir", "listen_port", "controller_addr", "namesrv_addr")
    controller = _deploy_toml("controller.toml", "controller_peers", "controller_self_id",
                              "controller_store_path")
    namesrv = _deploy_toml("namesrv.toml", "listen_port")
    assert broker["acl_enable"] and broker["tls_server_mode"] == "enforcing"
    admin = TlsSettings(client_enable=True, client_cert_path=str(pki / "admin-admin.crt"),
                        client_key_path=str(pki / "admin-admin.key"),
                        client_trust_cert_path=str(pki / certs.CA_CERT))
    secret = "deploy-test-secret"
    # Controllers and brokers take the secret only from RMQHA_CLUSTER_SECRET, as compose and
    # the Secret pass it (not from the harness's file, which holds the same one).
    with Cluster(tmp_path, broker_defaults={**broker, **QUICK_BROKER, **loopback},
                 namesrv_defaults={**namesrv, **QUICK_NAMESRV, **loopback},
                 controller_defaults={**controller, **QUICK_CONTROLLER, **loopback},
                 cluster_secret=secret) as c:
        c.client_security = ClientSecurity(client_context(admin),
                                           Credentials("deploy-admin", "deploy-admin-secret").sign)
        ctrls = c.add_controllers(3, cluster_secret_file="")
        for i, proc in enumerate(ctrls):
            proc.env["RMQHA_CLUSTER_SECRET"] = secret
            proc.env.update(_compose_certs(f"controller-{i}"))
            proc.start()
        c.wait_controllers(ctrls)
        c.start_namesrv(**{var[len("RMQHA_"):].lower(): path
                           for var, path in _compose_certs("namesrv").items()})
        brokers = []
        for i in range(3):
            b = c.add_broker("broker-a", cluster_secret_file="")
            b.env["RMQHA_CLUSTER_SECRET"] = secret
            b.env["RMQHA_BROKER_IP"] = "127.0.0.1"  # the pod IP of this scheduling
            b.env.update(_compose_certs(f"broker-a-{i}"))
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
