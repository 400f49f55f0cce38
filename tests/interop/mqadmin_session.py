"""One mqadmin JVM per test module, run against the shared interop cluster (``interop_cluster``).

:class:`MqAdmin` is one JVM of ``io.rmqha.interop.admin.AdminSession`` (mqadmin's own
``MQAdminStartup.main0`` per command): loading mqadmin's classes costs 15-20 s of wall time
on two busy cores, paid once per module instead of once per command.  It is configured as
an operator configures mqadmin: in ``tls-acl`` mode the operator's (admin) certificate
through RocketMQ's TLS system properties and the admin account in
``$ROCKETMQ_HOME/conf/tools.yml``; ``with_account=False`` leaves tools.yml empty (the
negative control: unsigned requests).
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interop_cluster import InteropCluster
from interop_support import classpath, java

from rmqha.testing.secure_setup import ADMIN

#: What one mqadmin command may take on two busy cores (the first loads mqadmin's classes: up
#: to a minute at a load of 35 on two cores).
COMMAND_TIMEOUT_S = 120.0
#: How often a command whose request timed out in the client is tried.
ATTEMPTS = 4
CLIENT_TIMEOUTS = ("RemotingTimeoutException", "RemotingConnectException", "RemotingTooMuchRequestException")


def java_props(target: InteropCluster) -> list[str]:
    """RocketMQ's client TLS settings (``TlsSystemConfig``, read once at class load) with the
    operator's certificate, and where the client writes its log."""
    props = {"rocketmq.client.logRoot": str(target.base_dir / "java-logs"),
             "rocketmq.client.logLevel": "WARN"}
    if target.security is not None:
        tls = target.security.client_tls(ADMIN)
        props.update({
            "tls.enable": "true", "tls.test.mode.enable": "false", "tls.client.authServer": "true",
            "tls.client.trustCertPath": str(tls.client_trust_cert_path),
            "tls.client.certPath": str(tls.client_cert_path),
            "tls.client.keyPath": str(tls.client_key_path),
            "tls.config.file": str(target.base_dir / "no-tls.properties"),
        })
    return [f"-D{key}={value}" for key, value in props.items()]


def rocketmq_home(target: InteropCluster, name: str, *, with_account: bool) -> Path:
    """A ``ROCKETMQ_HOME`` whose ``conf/tools.yml`` holds the admin account (tls-acl)."""
    home = target.base_dir / name
    (home / "conf").mkdir(parents=True, exist_ok=True)
    text = ""
    if target.security is not None and with_account:
        text = f"accessKey: {target.security.admin.access_key}\nsecretKey: {target.security.admin.secret_key}\n"
    (home / "conf" / "tools.yml").write_text(text)
    return home


@dataclass(frozen=True)
class AdminResult:
    """What one mqadmin command printed."""

    argv: list[str]
    out: str
    err: str
    ms: int

    @property
    def text(self) -> str:
        return self.out + self.err

    def rows(self) -> list[list[str]]:
        """The output's lines split on whitespace (mqadmin's tables are padded columns)."""
        return [line.split() for line in self.out.splitlines() if line.strip()]

    def __str__(self) -> str:
        return f"mqadmin {' '.join(self.argv)} ({self.ms} ms)\nout:\n{self.out}\nerr:\n{self.err[-3000:]}"


class MqAdmin:
    """One mqadmin JVM for a test module: :meth:`run` sends a command, returns its output."""

    def __init__(self, target: InteropCluster, *, with_account: bool = True) -> None:
        self.target = target
        name = "rocketmq-home" if with_account else "rocketmq-home-no-account"
        env = {**os.environ, "ROCKETMQ_HOME": str(rocketmq_home(target, name, with_account=with_account)),
               "HOME": str(target.base_dir)}  # the client's own log files stay in the test dir
        cmd = [java(), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               *java_props(target), "-cp", classpath(), "io.rmqha.interop.admin.AdminSession"]
        self.stderr = (target.base_dir / f"mqadmin-session-{name}.log").open("a")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, bufsize=1, env=env)

    def run(self, *argv: str, timeout: float = COMMAND_TIMEOUT_S) -> AdminResult:
        """Run one command; one whose request timed out in the client (mqadmin waits 3 s, a
        cold JVM on two busy cores can miss that) is run again, up to :data:`ATTEMPTS` times
        (every command of these tests is idempotent)."""
        for _ in range(ATTEMPTS - 1):
            result = self._run_once(argv, timeout)
            if not any(e in result.err for e in CLIENT_TIMEOUTS):
                return result
        return self._run_once(argv, timeout)

    def _run_once(self, argv: tuple[str, ...], timeout: float) -> AdminResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(list(argv)) + "\n")
        self.proc.stdin.flush()
        line = _read_line(self.proc, timeout)
        data: dict[str, Any] = json.loads(line)
        return AdminResult(data["argv"], data["out"], data["err"], int(data["ms"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The session's next line, or an AssertionError once ``timeout`` passes (the JVM is
    killed then: a hung command must not hang the suite)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise AssertionError(f"mqadmin gave no answer within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the mqadmin session ended (exit {proc.wait()})")
    return line
