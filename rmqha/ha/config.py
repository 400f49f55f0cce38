"""HA replication settings (:class:`HAConfig`): batch sizes, timers, ack policy, dialect.

The broker builds one from its own configuration (:meth:`HAConfig.from_object` picks the
fields by name) and hands it to :class:`rmqha.ha.HAMaster` or :class:`rmqha.ha.HASlave`.
Defaults follow RocketMQ 5's ``MessageStoreConfig`` where it has the same knob.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rmqha.errors import ConfigError

#: Wire dialects a slave may speak (the master serves both on one port).
PROTOCOLS: tuple[str, ...] = ("framed", "rocketmq")

#: Largest header either dialect puts in front of a transfer block.
MAX_TRANSFER_HEADER = 48


@dataclass
class HAConfig:
    """Knobs of the HA link (times in milliseconds, sizes in bytes)."""

    #: Largest block body in one TRANSFER frame (RocketMQ's haTransferBatchSize is 32 KiB;
    #: per-frame costs in Python make 256 KiB the better default on loopback: a slave caught
    #: up twice as fast, benches/bench_replication.py, docs/benchmarks.md).
    ha_transfer_batch_bytes: int = 256 << 10
    #: Bytes of frames the master hands to one sendmsg call: batching syscalls, not frames.
    ha_send_window_bytes: int = 1 << 20
    #: Send blocks of 64 KiB or more with sendfile: no copy on the master, but the slave
    #: then copies from cache-cold page-cache pages; measured slower catch-up on a 2-core
    #: loopback (benches/bench_replication.py), so only for masters short of CPU.
    ha_transfer_sendfile: bool = False
    #: An idle side sends a heartbeat (master: empty block, slave: ack) this often.
    ha_send_heartbeat_interval_ms: int = 5000
    #: A side that heard nothing for this long closes the link (the slave then reconnects).
    ha_housekeeping_interval_ms: int = 20000
    #: A SyncStateSet member not caught up for this long is proposed for removal.
    ha_max_time_slave_not_catchup_ms: int = 15000
    #: How often the master checks the SyncStateSet for members to shrink.
    check_sync_state_set_period_ms: int = 1000
    #: Wait for every SyncStateSet member (True) or ``in_sync_replicas`` copies.
    all_ack_in_sync_state_set: bool = False
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    #: A slave fsyncs what it received before acknowledging it.  Off by default, as in
    #: RocketMQ (AutoSwitchHAClient appends to its commitlog's page cache and reports its
    #: max offset at once; its own flush service flushes later): an ack then means "in
    #: the slave's memory", and surviving the loss of every machine at once is what
    #: ``flush = sync`` on the master is for.
    ha_slave_flush_before_ack: bool = False
    #: A slave takes live traffic on plaintext framed links in its compiled lane (a native
    #: thread without the GIL: receive, check, append, ack; rmqha.ha.slave_lane); false
    #: keeps every block on the Python path.  Without the extension it is the Python path anyway.
    ha_slave_compiled_lane: bool = True
    #: An empty slave starts at the start of the master's last segment, not its min offset.
    sync_from_last_file: bool = False
    #: The dialect a slave speaks: "framed" (default) or "rocketmq" (RocketMQ 5 AutoSwitch HA).
    ha_protocol: str = "framed"
    #: No frame longer than this is accepted (bounds every allocation from the wire).
    max_frame_bytes: int = 64 << 20
    #: Slave reconnect backoff: first wait and cap.
    ha_reconnect_min_ms: int = 100
    ha_reconnect_max_ms: int = 5000
    #: Connect timeout of the slave.
    ha_connect_timeout_ms: int = 3000
    #: Connections one peer host may hold open on the HA port (rmqha.net.peer_limit).
    max_connections_per_peer: int = 512

    def __post_init__(self) -> None:
        positive = (
            "ha_transfer_batch_bytes",
            "ha_send_window_bytes",
            "ha_send_heartbeat_interval_ms",
            "ha_housekeeping_interval_ms",
            "ha_max_time_slave_not_catchup_ms",
            "check_sync_state_set_period_ms",
            "max_frame_bytes",
            "ha_reconnect_min_ms",
            "ha_reconnect_max_ms",
            "ha_connect_timeout_ms",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("in_sync_replicas", "min_in_sync_replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(self.ha_slave_compiled_lane, bool):
            raise ConfigError(f"ha_slave_compiled_lane must be true or false, got {self.ha_slave_compiled_lane!r}")
        if not isinstance(self.ha_transfer_sendfile, bool):
            raise ConfigError(f"ha_transfer_sendfile must be true or false, got {self.ha_transfer_sendfile!r}")
        if self.ha_protocol not in PROTOCOLS:
            raise ConfigError(
                f"ha_protocol must be one of {', '.join(PROTOCOLS)}, got {self.ha_protocol!r}"
            )
        if self.ha_transfer_batch_bytes > (1 << 30):
            raise ConfigError(
                f"ha_transfer_batch_bytes {self.ha_transfer_batch_bytes} is over 1 GiB"
            )
        if self.max_frame_bytes < self.ha_transfer_batch_bytes + MAX_TRANSFER_HEADER:
            raise ConfigError(
                f"max_frame_bytes {self.max_frame_bytes} cannot hold a block of "
                f"ha_transfer_batch_bytes {self.ha_transfer_batch_bytes} plus its header"
            )
        if self.ha_housekeeping_interval_ms <= self.ha_send_heartbeat_interval_ms:
            raise ConfigError(
                f"ha_housekeeping_interval_ms {self.ha_housekeeping_interval_ms} must exceed "
                f"ha_send_heartbeat_interval_ms {self.ha_send_heartbeat_interval_ms}, or idle "
                "links would be closed between heartbeats"
            )
        if self.ha_max_time_slave_not_catchup_ms <= self.ha_send_heartbeat_interval_ms:
            raise ConfigError(
                f"ha_max_time_slave_not_catchup_ms {self.ha_max_time_slave_not_catchup_ms} must "
                f"exceed ha_send_heartbeat_interval_ms {self.ha_send_heartbeat_interval_ms}: an idle "
                "slave proves it is caught up only with its heartbeat acks"
            )
        if self.ha_reconnect_max_ms < self.ha_reconnect_min_ms:
            raise ConfigError(
                f"ha_reconnect_max_ms {self.ha_reconnect_max_ms} is below "
                f"ha_reconnect_min_ms {self.ha_reconnect_min_ms}"
            )

    @classmethod
    def from_object(cls, source: Any, **overrides: Any) -> HAConfig:
        """An HAConfig from any object or mapping that has some of these field names."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if isinstance(source, dict):
                if f.name in source:
                    values[f.name] = source[f.name]
            elif hasattr(source, f.name):
                values[f.name] = getattr(source, f.name)
        values.update(overrides)
        return cls(**values)
