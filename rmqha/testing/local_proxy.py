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

from rmqha.testing.local_cluster import DEFAULT_TIMEOUT, Cluster, Process, free_port, port_open


class ProxyProc(Process):
    """One proxy process; its gRPC endpoint is :attr:`address`."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.config['grpc_server_port']}"

    def ports(self) -> list[int]:
        return [int(self.config["grpc_server_port"]), *super().ports()]


def start_proxy(cluster: Cluster, *, timeout: float = DEFAULT_TIMEOUT, **config: Any) -> ProxyProc:
    """Start a proxy for ``cluster`` (``config`` adds or overrides proxy keys) and wait
    until its gRPC port accepts connections."""
    full = {"namesrv_addr": ";".join(cluster.namesrv_addresses),
            "rocketmq_cluster_name": cluster.cluster_name,
            "grpc_server_port": free_port(), **config}
    name = f"proxy{len(cluster.processes)}"
    proc = ProxyProc(cluster, name, "proxy", full, cluster.base_dir / name)
    cluster.processes.append(proc)
    proc.start()
    cluster.wait_for(lambda: port_open(proc.address), timeout, what=f"{proc.name} listening",
                     process=proc)
    return proc
