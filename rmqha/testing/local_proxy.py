"""An ``rmqha proxy`` process in front of a :class:`~rmqha.testing.local_cluster.Cluster`.

This module owns starting the gRPC access point for RocketMQ 5's clients beside a local
cluster: ``python -m rmqha proxy --config FILE`` with a generated TOML config naming the
cluster's name servers, on a free 127.0.0.1 port, tracked by the cluster like its other
processes (stopped, killed and checked for leftovers with them).  The proxy needs the
``proxy`` extra (grpcio, ``rocketmq-python-client``) in the Python the cluster starts
processes with.  Used by ``rmqha demo --grpc``, the proxy tests and the proxy benchmarks.
"""
from __future__ import annotations

from typing import Any

from rmqha.testing.local_cluster import DEFAULT_TIMEOUT, Cluster, PortChoice, Process, free_port


class ProxyProc(Process):
    """One proxy process; its gRPC endpoint is :attr:`address`."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.config['grpc_server_port']}"

    def ports(self) -> list[int]:
        return [int(self.config["grpc_server_port"]), *super().ports()]

    def picked_ports(self) -> set[int]:
        """The port :meth:`choose_ports` picks, as the config has it now."""
        return {int(self.config["grpc_server_port"])}

    def choose_ports(self) -> set[int]:
        """A fresh gRPC port, written into its config; the port chosen."""
        self.config["grpc_server_port"] = free_port()
        return self.picked_ports()


def start_proxy(cluster: Cluster, *, timeout: float = DEFAULT_TIMEOUT, python: str | None = None,
                **config: Any) -> ProxyProc:
    """Start a proxy for ``cluster`` (``config`` adds or overrides proxy keys) and wait
    until its gRPC port accepts connections.  A gRPC port it chose moves if another
    process takes it first (:class:`~rmqha.testing.local_cluster.PortChoice`).
    ``python``: the interpreter to run it with when the cluster's lacks the ``proxy`` extra
    (the interop tests run from ``.venv`` and start the proxy from ``.venv-rmq5``)."""
    chosen = "grpc_server_port" not in config
    full = {"namesrv_addr": ";".join(cluster.namesrv_addresses),
            "rocketmq_cluster_name": cluster.cluster_name,
            "grpc_server_port": free_port() if chosen else 0, **config}
    name = f"proxy{len(cluster.processes)}"
    proc = ProxyProc(cluster, name, "proxy", full, cluster.base_dir / name)
    proc.python = python
    if chosen:
        PortChoice([proc], proc.picked_ports(), proc.choose_ports)
    cluster.processes.append(proc)
    proc.start()
    cluster.wait_for(lambda: proc.listens(proc.address), timeout, what=f"{proc.name} listening",
                     process=proc)
    return proc
