"""``rmqha demo`` end to end, as a user runs it: a subprocess, real processes, a real SIGKILL.

- a reduced run with ``--json`` exits 0, loses no acknowledged message, shows a failover
  to another broker at a higher master epoch and the old master back in sync, and leaves
  no process and no listening port behind; it runs secured (the default): certificates
  and accounts in its directory, every process's config enforcing mutual TLS, brokers
  with the ACL;
- with the replication links stalled before the kill (the default), secured and with
  ``--plaintext``, the old master cuts exactly the tail it alone had: from the new epoch's
  start to its own log end, a non-zero number of bytes, none of them acknowledged (over
  TLS the relay cannot read the links, and the demo still kills only once the slaves
  hold what crossed);
- the secured demo's broker port answers neither a plaintext request nor one over TLS
  without an account (the ACL refuses it); ``--plaintext`` answers the plaintext one;
- SIGINT while the brokers start or while messages flow makes it stop everything and
  exit 130, again leaving nothing behind;
- ``--grpc`` without RocketMQ 5's client (never in this venv) stops at once, naming
  ``make demo-grpc``;
- through a pipe the output has no escape codes and the progress bar is one final line
  (no redraws); on a terminal the bar is drawn live by rich and cleared at the end.
"""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from rich.console import Console as RichConsole

from rmqha.demo.options import APP_KEY, HA_ADVERTISED_KEY, TOPIC
from rmqha.demo.report import ProgressBar
from rmqha.net.client_security import client_context, current
from rmqha.security.acl import AclConfig, Perm
from rmqha.testing.local_cluster import live_processes_naming
from rmqha.testing.secure_setup import CLIENT, ask_status
from rmqha.testing.tls_keys import client_tls

SUMMARY_FIELDS = {
    "sent", "acked", "not_acked", "send_errors", "consumed", "duplicates", "lost",
    "failover_s", "produce_msgs_per_s", "consume_msgs_per_s", "failover", "rejoin",
    "leftover_processes", "leftover_ports", "total_s", "ok", "interrupted", "error",
}


def _demo(args: list[str], **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "rmqha", "demo", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kw)


def _processes_under(directory: Path) -> list[str]:
    """Command lines of running processes that name ``directory``."""
    return [cmdline for _, cmdline in live_processes_naming(directory)]


def _configured_ports(directory: Path) -> list[int]:
    """Every port in the generated configs (client, HA, RPC and Raft ports)."""
    ports: set[int] = set()
    for path in directory.rglob("*.toml"):
        cfg = tomllib.loads(path.read_text())
        for key in ("listen_port", "ha_listen_port", "metrics_port"):
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                ports.add(cfg[key])
        if "listen_port" in cfg and not cfg.get("ha_listen_port") and "broker_name" in cfg:
            ports.add(cfg["listen_port"] + 1)
        for key in ("controller_peers", "raft_peers"):
            for item in str(cfg.get(key, "")).split(";"):
                if item:
                    ports.add(int(item.rpartition(":")[2]))
        if cfg.get(HA_ADVERTISED_KEY):  # the demo's relay in front of the HA port
            ports.add(int(str(cfg[HA_ADVERTISED_KEY]).rpartition(":")[2]))
    return sorted(ports)


def _listeners(ports: list[int]) -> dict[int, list[int]]:
    """Port -> pids of the processes holding a listening socket on it (Linux /proc)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            port = int(cols[1].rpartition(":")[2], 16)
            if cols[3] == "0A" and port in ports:  # 0A: LISTEN
                inodes[f"socket:[{cols[9]}]"] = port
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue  # closed meanwhile
            if link in inodes:
                found.setdefault(inodes[link], []).append(int(entry.name))
    return found


def _ours(pid: int, directory: Path) -> bool:
    """A process the test started: the demo's (naming ``directory``) or below this one."""
    try:
        if str(directory).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return True
        while pid > 1:
            pid = int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1])
            if pid == os.getpid():
                return True
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
        pass
    return False


def _assert_nothing_left(directory: Path, min_ports: int = 6) -> None:
    ports = _configured_ports(directory)
    assert len(ports) >= min_ports, f"expected the demo's configs under {directory}, found {ports}"
    assert _processes_under(directory) == []
    # The ports were free when the demo took them and are free for anyone once it is gone:
    # on a busy machine another test may already listen on one.  Only our own listeners
    # count as left behind.
    still = {port: pids for port, pids in _listeners(ports).items()
             if any(_ours(pid, directory) for pid in pids)}
    assert still == {}, f"ports still open by processes the demo started: {still}"


def _kill_leftovers(directory: Path) -> list[str]:
    """SIGKILL every process still running with ``directory`` on its command line (the
    demo's children, each in a process group of its own, outlive a killed demo); their
    command lines, for the failure message."""
    killed = []
    for pid, cmdline in live_processes_naming(directory):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(cmdline)
    return killed


def _json_run(work: Path, *extra: str, timeout: float = 120) -> dict:
    """One ``--json`` demo run; whatever happens, nothing it started outlives the test.

    Past ``timeout`` the demo gets SIGINT (it stops its processes and says where it was),
    then SIGKILL; what is still running under ``work`` is killed either way."""
    proc = _demo(["--messages", "3000", "--json", "--dir", str(work), *extra])
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail(f"the demo was still running after {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    finally:
        proc.kill()
        proc.wait()
        leftovers = _kill_leftovers(work)
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert leftovers == [], f"the demo left processes {leftovers} under {work}"
    return json.loads(out)  # nothing else on stdout


def _configs(directory: Path) -> dict[str, dict]:
    """Process name -> its generated config."""
    return {path.parent.name: tomllib.loads(path.read_text()) for path in directory.rglob("*.toml")}


def _assert_secured(work: Path, summary: dict) -> None:
    """The run made its certificates and accounts in its directory, and every process's
    config uses them: enforcing mutual TLS on its port, TLS with its own pair on its links,
    the ACL on the brokers; the demo's account holds its topic and group and nothing else."""
    assert summary["security"] == "mutual TLS + ACL"
    assert summary["certificates"] == str(work / "pki") and summary["acl_file"] == str(work / "plain_acl.yml")
    app = AclConfig.parse((work / "plain_acl.yml").read_text()).accounts[APP_KEY]
    assert not app.admin and app.default_topic_perm == app.default_group_perm == Perm.DENY
    retry = [r for r in app.perms if r != TOPIC]
    assert app.perms[TOPIC] == Perm.PUB | Perm.SUB and len(retry) == 1
    assert retry[0].startswith("%RETRY%demo-audit-") and app.perms[retry[0]] == Perm.SUB
    configs = _configs(work)
    assert len(configs) == 7, sorted(configs)
    for name, cfg in configs.items():
        assert cfg["tls_server_mode"] == "enforcing", name
        assert cfg["tls_server_need_client_auth"] == "require", name
        assert cfg["tls_enable"] is True, name
        assert cfg["tls_client_cert_path"] == cfg["tls_server_cert_path"], name
        assert Path(cfg["tls_server_cert_path"]).is_file() and Path(cfg["tls_server_key_path"]).is_file()
        assert cfg.get("acl_enable", False) is ("broker_name" in cfg), name


def _assert_plaintext(work: Path, summary: dict) -> None:
    assert summary["security"] == "cluster secret only" and summary["certificates"] is None
    assert not (work / "pki").exists() and not (work / "plain_acl.yml").exists()
    for name, cfg in _configs(work).items():
        assert "tls_server_mode" not in cfg and "acl_enable" not in cfg, name
        assert cfg["cluster_secret_file"] == str(work / "cluster.secret"), name


@pytest.mark.timeout(180)
def test_demo_json_run_loses_nothing_and_leaves_nothing(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    summary = _json_run(work, "--no-stall")
    assert SUMMARY_FIELDS <= set(summary), SUMMARY_FIELDS - set(summary)
    assert summary["ok"] is True and summary["error"] is None and not summary["interrupted"]
    assert summary["sent"] == 3000
    assert summary["lost"] == 0 and summary["lost_sample"] == []
    assert summary["acked"] > 0 and summary["consumed"] >= summary["acked"]
    f = summary["failover"]
    assert f["new_master_id"] not in (None, f["old_master_id"])
    assert f["new_epoch"] > f["old_epoch"] >= 1
    assert f["election_s"] is not None and f["election_s"] >= 0
    assert 0 < f["acked_at_kill"] < 3000
    r = summary["rejoin"]
    assert r["broker_id"] == f["old_master_id"] and r["role"] == "slave"
    assert r["master_id"] == f["new_master_id"]
    assert r["matches_master_epochs"] is True
    assert r["epoch_map"][-1]["epoch"] == f["new_epoch"]
    assert sorted(r["sync_state_set"]) == [1, 2, 3]
    assert summary["leftover_processes"] == [] and summary["leftover_ports"] == []
    assert summary["processes_started"] == 7
    assert summary["failover"]["stalled"] is False
    _assert_secured(work, summary)
    _assert_nothing_left(work)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("plaintext", [False, True], ids=["secured", "plaintext"])
def test_stalled_links_make_the_old_master_cut_exactly_its_unacknowledged_tail(tmp_path: Path,
                                                                               plaintext: bool) -> None:
    work = tmp_path / "demo"
    summary = _json_run(work, *(["--plaintext"] if plaintext else []))
    assert summary["ok"] is True and summary["error"] is None
    assert summary["lost"] == 0 and summary["lost_sample"] == []
    f, r = summary["failover"], summary["rejoin"]
    assert f["stalled"] is True
    # Nothing crossed the stalled links: no slave has more than the master had when they
    # stalled, and the master wrote beyond what the slaves have (sends never acknowledged).
    assert max(f["slave_max_at_kill"]) <= f["master_max_at_stall"] <= f["master_max_at_kill"]
    if plaintext:
        # Each slave had stored exactly the whole blocks that crossed its link (the kill
        # waited for that): what it holds when the master dies is what it will ever get.
        assert f["slave_max_at_kill"] == f["crossed_at_stall"]
        _assert_plaintext(work, summary)
    else:
        # Over mutual TLS the relay holds ciphertext it cannot read: it does not know what
        # crossed, and the kill waited until the slaves had settled instead (the checks on
        # the new epoch's start below show they held all they would get).
        assert f["crossed_at_stall"] == [None, None]
        _assert_secured(work, summary)
    assert f["tail_bytes"] == f["master_max_at_kill"] - max(f["slave_max_at_kill"]) > 0
    # The new master's epoch starts at its own log end, which is what it had at the kill
    # (the links to the dead master carried nothing more).
    new_start = next(e["startOffset"] for e in r["epoch_map"] if e["epoch"] == f["new_epoch"])
    assert r["new_epoch_start"] == new_start
    assert new_start in f["slave_max_at_kill"]
    assert r["matches_master_epochs"] is True
    # The old master (SIGKILL keeps its page cache) still ends where it last wrote ...
    assert r["log_end_before"] >= f["master_max_at_kill"]
    # ... and cuts from the new epoch's start to that end: exactly the tail it alone had.
    assert r["truncated_at"] == new_start
    assert r["truncated_bytes"] == r["log_end_before"] - new_start
    assert r["truncated_bytes"] >= f["tail_bytes"] > 0
    assert r["role"] == "slave" and sorted(r["sync_state_set"]) == [1, 2, 3]
    assert summary["leftover_processes"] == [] and summary["leftover_ports"] == []
    _assert_nothing_left(work)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("phase", ["name server      127.0.0.1", "[3/5]"], ids=["while-starting-brokers",
                                                                  "while-producing"])
def test_sigint_stops_everything(tmp_path: Path, phase: str) -> None:
    work = tmp_path / "demo"
    # Big enough that the run is still producing when the signal comes.
    proc = _demo(["--messages", "2000000", "--dir", str(work)])
    lines: list[str] = []
    reached = threading.Event()

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if phase in line:
                reached.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        assert reached.wait(60), f"never reached {phase}:\n{''.join(lines)}"
        if phase == "[3/5]":
            # Let messages flow (and every process be busy) before the interrupt.
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        proc.wait(40)
        stopped_in = time.monotonic() - started
        reader.join(10)
        err = proc.stderr.read() if proc.stderr is not None else ""
    finally:
        proc.kill()
        proc.wait()
        leftovers = _kill_leftovers(work)
    out = "".join(lines)
    assert proc.returncode == 130, f"stdout:\n{out}\nstderr:\n{err}"
    assert "[5/5]" not in out and "interrupted" in out
    # A pipe gets plain text: no colour, no cursor moves, no redrawn bar.
    assert "\x1b" not in out and "\x1b" not in err and "\r" not in err, err
    if phase == "[3/5]":
        bars = [line for line in err.splitlines() if line.startswith("produce ")]
        assert len(bars) == 1 and re.fullmatch(r"produce +\d+% [\d,]+/2,000,000( .*)?", bars[0]), err
    assert "ports still open: none" in out
    assert "Traceback" not in err and "Task was destroyed" not in err, err
    assert stopped_in < 20
    assert leftovers == [], f"the demo left processes {leftovers} under {work}"
    # Interrupted while brokers start: the controllers and the name server were up.
    _assert_nothing_left(work, min_ports=7 if "name server" in phase else 13)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plaintext", [False, True], ids=["secured", "plaintext"])
def test_secured_broker_port_refuses_plaintext_and_requests_without_an_account(tmp_path: Path,
                                                                              plaintext: bool) -> None:
    """Once the demo's brokers are up: GET_BROKER_HA_STATUS, unsigned, to a broker's port in
    plaintext and over TLS with the demo's client certificate but no account.  Secured,
    neither is answered but by the ACL's refusal; with --plaintext (the negative control)
    the plaintext request is answered."""
    work = tmp_path / "demo"
    proc = _demo(["--messages", "2000000", "--dir", str(work), *(["--plaintext"] if plaintext else [])])
    lines: list[str] = []
    up = threading.Event()

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "[2/5]" in line:
                up.set()

    threading.Thread(target=read_stdout, daemon=True).start()
    try:
        assert up.wait(60), f"the brokers never came up:\n{''.join(lines)}"
        brokers = re.findall(r"broker broker-a id \d+ (127\.0\.0\.1:\d+)", "".join(lines))
        assert len(brokers) == 3, lines
        plain = ask_status(brokers[0], None)
        tls = None if plaintext else ask_status(
            brokers[0], current(client_context(client_tls(work / "pki", CLIENT))))
        proc.send_signal(signal.SIGINT)
        proc.wait(40)
    finally:
        proc.kill()
        proc.wait()
        leftovers = _kill_leftovers(work)
    assert proc.returncode == 130 and leftovers == []
    if plaintext:
        assert plain is not None, "the plaintext demo's broker did not answer a plaintext request"
    else:
        assert plain is None, f"a plaintext request to the secured demo was answered: {plain}"
        assert tls is not None and "carries no AccessKey" in tls, tls


def test_progress_bar_in_a_pipe_writes_only_its_final_line() -> None:
    buf = io.StringIO()
    bar = ProgressBar("produce", 1000, console=RichConsole(file=buf))
    assert not bar.live
    for done in range(0, 1001, 50):
        bar.update(done, f"{done} msg/s")
    assert buf.getvalue() == ""
    bar.finish()
    assert buf.getvalue() == "produce    100% 1,000/1,000 1000 msg/s\n"


def test_progress_bar_on_a_terminal_is_live_then_leaves_one_line() -> None:
    buf = io.StringIO()
    console = RichConsole(file=buf, force_terminal=True, width=60, color_system="standard")
    bar = ProgressBar("consume", 200, console=console)
    assert bar.live
    bar.update(100, "5 msg/s")
    bar.finish()
    out = buf.getvalue()
    assert "\x1b[" in out  # drawn (and cleared) with cursor controls
    assert "100/200" in out and "━" in out  # the live bar showed the update
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert plain.rstrip("\n").splitlines()[-1] == "consume     50% 100/200 5 msg/s"


def test_grpc_flag_without_the_rocketmq5_client_names_make_demo_grpc(tmp_path: Path) -> None:
    # This venv has the dev extra's rocketmq 0.4.4, never the 5.x client (see the Makefile).
    proc = _demo(["--grpc", "--messages", "100", "--dir", str(tmp_path / "demo")])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, f"stdout:\n{out}\nstderr:\n{err}"
    assert "make demo-grpc" in err and "rocketmq-python-client" in err
    assert out == "" and not (tmp_path / "demo").exists()  # stopped before anything started
