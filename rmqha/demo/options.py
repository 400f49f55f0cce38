"""What ``rmqha demo`` is asked to do (:class:`DemoOptions`, the command line's flags) and
the names its cluster is built with: the topic, the broker group, the accounts, and the
broker settings that make its point (every send acknowledged only once all SyncStateSet
members hold it, never with fewer than two copies).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TOPIC = "DemoTopic"
GROUP = "broker-a"
CLUSTER_NAME = "rmqha-demo"
#: The accounts of the secured demo's ``plain_acl.yml``: its clients', and an admin's.
APP_KEY = "demo-app"
ADMIN_KEY = "demo-admin"
QUEUES = 8
#: The broker settings that make the point of the demo: a send is acknowledged only once
#: every replica in the SyncStateSet holds it (RocketMQ's allAckInSyncStateSet), and never
#: with fewer than two copies, even while a new master's set is still itself alone.
ALL_ACK = {"all_ack_in_sync_state_set": True, "min_in_sync_replicas": 2, "slave_timeout_ms": 3000}

#: The broker key that makes a broker tell slaves another HA address than the one it
#: listens on (the demo's relay in front of it).
HA_ADVERTISED_KEY = "ha_advertised_address"


@dataclass
class DemoOptions:
    messages: int = 100_000
    body_bytes: int = 256
    batch: int = 32
    in_flight: int = 4
    #: The master is killed once this fraction of the messages is acknowledged.
    kill_at: float = 0.4
    directory: Path | None = None
    keep: bool = False
    json: bool = False
    #: Longest wait for any one step (a new master, a rejoin, the last message).
    step_timeout_s: float = 60.0
    #: Stall the replication links just before the kill, so the master holds a tail.
    stall: bool = True
    #: How long the links stall at least before the kill (the producer keeps sending
    #: meanwhile); longer, up to stall_cap_s, until the master holds writes no slave has.
    stall_s: float = 0.3
    #: The load goes through an ``rmqha proxy`` with RocketMQ 5's official client
    #: (:mod:`rmqha.demo.grpc_load`) instead of rmqha's own over remoting.
    grpc: bool = False
    #: No TLS and no ACL: the cluster secret only (for comparison).
    plaintext: bool = False
