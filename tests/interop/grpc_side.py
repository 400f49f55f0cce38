"""The gRPC Java client's tests' side: ``rmqha proxy`` in front of an interop cluster, and
its drivers run on the shaded client jar.

The proxy needs the ``proxy`` extra, which cannot share ``.venv`` with the dev extra's
``rocketmq`` 0.4.4: the tests run from ``.venv`` and start the proxy with ``.venv-rmq5``'s
Python (``make test-interop`` builds it).  In ``tls-acl`` mode the proxy is a process of the
secured cluster as ``make demo-grpc`` runs it (:func:`rmqha.demo.grpc_load.proxy_keys`): its
own certificate on its links to the name server and brokers (mutual TLS), ``enforcing`` TLS
on its gRPC port without asking for a client certificate (RocketMQ's gRPC clients have no
setting for one), every call's signature checked against the brokers' ``plain_acl.yml``,
and its own broker requests signed as the application account.  The Java client goes over
TLS (``enableSsl``) and signs with ``StaticSessionCredentialsProvider`` as that account.

The driver JVMs run ``io.rmqha.interop.grpc.*`` on the drivers' classes and the shaded client
jar alone (:func:`grpc_classpath`).
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from interop_cluster import InteropCluster
from interop_support import CLASSES, CLASSPATH_FILE, java

from rmqha.demo.grpc_load import proxy_keys
from rmqha.testing.local_proxy import ProxyProc, start_proxy

ROOT = Path(__file__).resolve().parents[2]
PROXY_PYTHON = ROOT / ".venv-rmq5" / "bin" / "python"
PACKAGE = "io.rmqha.interop.grpc"
#: Receives may ask for a 1 s invisible time (the failover test's redeliveries come soon),
#: routes are re-read every 3 s.
PROXY_SETTINGS = {"min_invisible_time_mills_for_recv": 1000, "route_ttl_ms": 3000}


def grpc_classpath() -> str:
    """The drivers and the shaded client jar alone: its ``apache.rocketmq.v2`` classes are
    built on its shaded gRPC, and the remoting client's ``rocketmq-proto`` (the same class
    names on plain gRPC) must not come first on the class path."""
    jars = [j for j in CLASSPATH_FILE.read_text().strip().split(os.pathsep) if "rocketmq-client-java" in j]
    assert jars, f"rocketmq-client-java is not on {CLASSPATH_FILE}"
    return os.pathsep.join([str(CLASSES), *jars])


@dataclass
class Proxied:
    """An interop cluster with a proxy in front, and how a gRPC driver reaches it."""

    ic: InteropCluster
    proxy: ProxyProc

    def env(self, *, signed: bool = True) -> dict[str, str]:
        """A driver's environment: the proxy, TLS and the application's account (tls-acl;
        ``signed=False`` leaves the account out: the negative control)."""
        env = {"INTEROP_PROXY": self.proxy.address, "HOME": str(self.ic.base_dir)}
        if self.ic.security is not None:
            env["INTEROP_SSL"] = "true"
            if signed:
                env.update(INTEROP_ACCESS_KEY=self.ic.security.app.access_key,
                           INTEROP_SECRET_KEY=self.ic.security.app.secret_key)
        return env

    def command(self, main_class: str, *args: str) -> list[str]:
        return [java(), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Drocketmq.log.root={self.ic.base_dir / 'java-logs'}", "-cp", grpc_classpath(),
                f"{PACKAGE}.{main_class}", *args]

    def run(self, main_class: str, *args: str, timeout: float = 180.0, check: bool = True,
            signed: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a driver to its end (AssertionError with its output when it fails and ``check``)."""
        proc = subprocess.run(self.command(main_class, *args), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env(signed=signed)})
        if check and proc.returncode != 0:
            raise AssertionError(f"{main_class} {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
        return proc

    def start(self, main_class: str, *args: str) -> subprocess.Popen[str]:
        """Start a driver in the background, stdout a pipe, stderr in the cluster's logs."""
        log = self.ic.cluster.log_dir / f"java-{main_class}.log"
        with log.open("a") as err:
            return subprocess.Popen(self.command(main_class, *args), stdout=subprocess.PIPE, stderr=err,
                                    text=True, bufsize=1, env={**os.environ, **self.env()})


def start_proxied(ic: InteropCluster) -> Proxied:
    """A proxy for ``ic``, secured as the cluster is (see the module docstring)."""
    if not PROXY_PYTHON.exists():
        raise AssertionError(f"{PROXY_PYTHON} is missing: `make test-interop` builds .venv-rmq5 first")
    keys = proxy_keys(ic.security) if ic.security is not None else {}
    proxy = start_proxy(ic.cluster, timeout=90, python=str(PROXY_PYTHON), **PROXY_SETTINGS, **keys)
    return Proxied(ic, proxy)
