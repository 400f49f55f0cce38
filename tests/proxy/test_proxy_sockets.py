"""The proxy's listening sockets (issue 37, point 4), with a real ``rmqha proxy`` process:
it listens only on 127.0.0.1 (its ``grpc_server_host``), and a connection that never
starts its HTTP/2 handshake is closed within the 10 s handshake deadline.  Negative
control: a gRPC server with gRPC's defaults (120 s), in this process, still holds such a
connection then.
"""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from peer_socket import peer_closed
from proxy_harness import start_cluster, start_proxy

from rmqha.proxy.server import HANDSHAKE_TIMEOUT_MS
from rmqha.testing.local_cluster import listening_sockets


@pytest.mark.timeout(180)
def test_the_proxy_listens_on_loopback_and_drops_silent_peers(tmp_path: Path) -> None:
    default_server = grpc.server(ThreadPoolExecutor(max_workers=1))
    default_port = default_server.add_insecure_port("127.0.0.1:0")
    default_server.start()
    with start_cluster(tmp_path, replicas=1) as cluster:
        proxy = start_proxy(cluster)
        assert proxy.pid is not None
        port = int(proxy.config["grpc_server_port"])
        sockets = cluster.wait_for(lambda: listening_sockets(proxy.pid or 0) or None,
                                   what="the proxy's sockets", process=proxy)
        assert port in {s.port for s in sockets}, sockets
        assert not [s for s in sockets if s.wildcard], f"the proxy listens on wildcards: {sockets}"
        silent = socket.create_connection(("127.0.0.1", port), timeout=2)
        control = socket.create_connection(("127.0.0.1", default_port), timeout=2)
        started = time.monotonic()
        try:
            deadline_s = HANDSHAKE_TIMEOUT_MS / 1000
            cluster.wait_for(lambda: peer_closed(silent), deadline_s + 10, what="the silent peer dropped",
                             interval=0.5, process=proxy)
            took = time.monotonic() - started
            assert took >= deadline_s - 1, f"dropped after {took:.1f} s, before the deadline"
            assert not peer_closed(control), "gRPC's defaults dropped the silent peer too: the control shows nothing"
        finally:
            silent.close()
            control.close()
            default_server.stop(0)
