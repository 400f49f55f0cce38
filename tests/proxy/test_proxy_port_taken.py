"""A proxy whose gRPC port is taken refuses to start, naming the port, instead of sharing it.

grpc turns SO_REUSEPORT on for every listener on Linux, so two grpc servers on one port
both bind and split the connections between them: a proxy started on a port another
proxy (or any grpc server) holds would serve some clients and not others, silently.  The
proxy's server turns it off (``rmqha.proxy.server.SERVER_OPTIONS``).  Negative control: a
grpc server with grpc's default options binds the same taken port.
"""
from __future__ import annotations

import asyncio

import grpc
import pytest

from rmqha.errors import ConfigError
from rmqha.proxy.config import load_proxy_config
from rmqha.proxy.server import run_proxy


async def _start_proxy_on_a_taken_port() -> tuple[str, int]:
    holder = grpc.aio.server()   # grpc's defaults: SO_REUSEPORT on
    port = holder.add_insecure_port("127.0.0.1:0")
    await holder.start()
    try:
        # Negative control: grpc's defaults share the taken port.
        control = grpc.aio.server()
        assert control.add_insecure_port(f"127.0.0.1:{port}") == port
        cfg = load_proxy_config(None, namesrv_addr="127.0.0.1:1", grpc_server_port=port)
        with pytest.raises(ConfigError) as refused:
            await asyncio.wait_for(run_proxy(cfg, asyncio.Event()), 30)
        return str(refused.value), port
    finally:
        await holder.stop(0)


def test_a_taken_grpc_port_is_refused_naming_it() -> None:
    message, port = asyncio.run(_start_proxy_on_a_taken_port())
    assert f"cannot bind 127.0.0.1:{port}" in message and "taken" in message, message
