"""Transaction check-backs through the proxy (RocketMQ's ``ClusterTransactionService``).

A broker checks an open transaction back with CHECK_TRANSACTION_STATE to a producer of the
half message's producer group, which it knows from HEART_BEATs.  gRPC producers have no
group: the proxy sends their half messages with the topic as producer group
(:mod:`rmqha.proxy.sends`) and announces, as one remoting client, every topic a connected
producer publishes to every master of its cluster: at once when a producer's Settings
name a new topic, and every ``transaction_heartbeat_period_second`` (so a new master
learns them after a failover).  A check-back arriving on one of those connections is
handed to one connected producer of that topic as a RecoverOrphanedTransactionCommand
over its Telemetry stream, the half message converted and its transaction id composed
as for a send (:mod:`rmqha.proxy.handles`); the producer answers with EndTransaction.  A
check-back no producer can take is dropped: the broker checks again later.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from rocketmq.grpc_protocol import service_pb2 as spb

from rmqha.errors import ProtocolError, RemotingError
from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.message import decode_record
from rmqha.proxy.clients import ClientRegistry
from rmqha.proxy.cluster import ClusterAccess
from rmqha.proxy.deliveries import check_back_message
from rmqha.proxy.handles import compose_transaction_id

log = logging.getLogger(__name__)


def proxy_client_id(port: int) -> str:
    """The remoting client id the proxy announces itself with (one per process)."""
    return f"{socket.gethostname()}@rmqha-proxy-{port}@{os.getpid()}"


def heartbeat_body(client_id: str, groups: set[str]) -> dict[str, Any]:
    return {"clientID": client_id, "consumerDataSet": [],
            "producerDataSet": [{"groupName": g} for g in sorted(groups)]}


class TransactionRelay:
    """Announces producer groups to the masters and relays their check-backs."""

    def __init__(self, cluster: ClusterAccess, clients: ClientRegistry, client_id: str,
                 period_s: float) -> None:
        self.cluster = cluster
        self.clients = clients
        self.client_id = client_id
        self.period_s = period_s
        self.relayed = 0
        self._wake = asyncio.Event()
        cluster.session.on_check_transaction = self.on_check

    def announce_soon(self) -> None:
        """The published topics changed: tell the masters now rather than next period."""
        self._wake.set()

    async def announce(self) -> int:
        """One HEART_BEAT with every producer group to every master; how many took it."""
        groups = self.clients.producer_groups()
        body = heartbeat_body(self.client_id, groups)
        sent = 0
        for name, addr in (await self.cluster.cluster_masters()).items():
            try:
                resp = await self.cluster.request(addr, RemotingCommand.request(
                    RequestCode.HEART_BEAT, None, body), self.cluster.rpc_timeout_s)
            except RemotingError as exc:
                log.info("producer groups to %s (%s) not announced: %s", name, addr, exc)
                continue
            sent += resp.code == 0
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            await self.announce()
            try:
                await asyncio.wait_for(self._wake.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass

    async def on_check(self, cmd: RemotingCommand, conn: RequestPeer) -> None:
        """A broker's CHECK_TRANSACTION_STATE: to a producer of the half message's topic."""
        ext = cmd.ext_fields
        try:
            msg, _ = decode_record(cmd.body)
            commit_offset = int(ext["commitLogOffset"])
        except (ProtocolError, KeyError, ValueError) as exc:
            log.warning("a check-back that does not decode was dropped: %s", exc)
            return
        message = check_back_message(msg)
        topic = message.topic.name
        stream = self.clients.producer_stream(topic)
        if stream is None:
            log.info("check-back of %s: no producer of %s connected", ext.get("transactionId"), topic)
            return
        txn = compose_transaction_id(commit_offset, ext.get("brokerName", ""),
                                     ext.get("transactionId") or message.system_properties.message_id)
        command = spb.TelemetryCommand()
        command.recover_orphaned_transaction_command.message.CopyFrom(message)
        command.recover_orphaned_transaction_command.transaction_id = txn
        stream.put_nowait(command)
        self.relayed += 1
