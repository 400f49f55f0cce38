"""The controller protocol's header classes on a real socket: a broker's controller client
builds each request with them and an in-process controller (one Raft peer, its RPC port on
loopback) parses them, from id application to an alter of the SyncStateSet.

Negative control: the same request with a field the header class cannot parse is answered
CONTROLLER_INVALID_REQUEST naming the field, and nothing is registered by it.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rmqha.controller.client import ControllerClient
from rmqha.controller.config import ControllerConfig
from rmqha.controller.server import ControllerServer
from rmqha.errors import RemoteCommandError, RemotingError
from rmqha.net.client import RemotingClient
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.control_headers import GetReplicaInfoHeader, RegisterBrokerToControllerHeader
from rmqha.testing.local_cluster import free_port


async def _leader_ready(client: ControllerClient, deadline_s: float) -> int:
    deadline = asyncio.get_running_loop().time() + deadline_s
    while True:
        try:
            return await client.get_next_broker_id("c", "g")
        except (RemotingError, RemoteCommandError, OSError, asyncio.TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


def test_a_broker_and_a_controller_speak_through_the_header_classes(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        port = free_port()
        server = ControllerServer(ControllerConfig(
            controller_peers=f"n0-127.0.0.1:{port}", controller_self_id="n0",
            controller_store_path=tmp_path / "c", allow_insecure=True))
        await server.start()
        client = ControllerClient(f"127.0.0.1:{port}", request_timeout=20)
        try:
            first = await _leader_ready(client, 90)
            await client.apply_broker_id("c", "g", first, "127.0.0.1:1;check")
            registered = await client.register_broker("c", "g", first, "127.0.0.1:1")
            await client.heartbeat_to(client.addresses[0], "c", "g", first, "127.0.0.1:1", epoch=0, max_offset=0)
            elected = await client.elect_master("c", "g", first, designate=True)
            replica = await client.get_replica_info("g")
            async with RemotingClient(f"127.0.0.1:{port}") as raw:
                bad = await raw.request(RemotingCommand.request(RequestCode.CONTROLLER_REGISTER_BROKER, {
                    **RegisterBrokerToControllerHeader(cluster_name="c", broker_name="g2",
                                                       broker_address="127.0.0.1:2").build(),
                    "brokerId": "two"}))
                unknown = await raw.request(RemotingCommand.request(
                    RequestCode.CONTROLLER_GET_REPLICA_INFO, GetReplicaInfoHeader(broker_name="g2").build()))
            return dict(first=first, registered=registered, elected=elected, replica=replica, bad=bad,
                        unknown=unknown)
        finally:
            await client.close()
            await server.stop()

    r = asyncio.run(asyncio.wait_for(main(), 180))
    assert r["first"] == 1 and r["registered"].broker_name == "g"
    assert r["elected"].master_broker_id == 1 and r["replica"].master_broker_id == 1
    assert r["replica"].master_address == "127.0.0.1:1"
    assert r["bad"].code == ResponseCode.CONTROLLER_INVALID_REQUEST and "brokerId" in (r["bad"].remark or "")
    assert r["unknown"].code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
