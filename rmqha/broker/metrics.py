"""The broker's Prometheus series (served on ``metrics_port`` when it is >= 0).

Read at scrape time from the live broker (no bookkeeping on the hot path):
``rmqha_broker_role`` (0 fenced, 1 slave, 2 master), ``rmqha_broker_master_epoch``,
``rmqha_broker_last_epoch``, ``rmqha_broker_max_offset_bytes``,
``rmqha_broker_confirm_offset_bytes``, ``rmqha_broker_sync_state_set_size``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rmqha.broker.replicas_manager import Role
from rmqha.metrics import MetricsRegistry

if TYPE_CHECKING:
    from rmqha.broker.broker import Broker

ROLE_VALUE = {Role.FENCED: 0, Role.SLAVE: 1, Role.MASTER: 2}


def register_broker_metrics(broker: Broker, registry: MetricsRegistry) -> None:
    """Add the broker's gauges to ``registry``; each reads the broker when scraped."""

    def status(key: str) -> float:
        st = broker.replicas.status if broker.replicas is not None else None
        return float(getattr(st, key)) if st is not None else 0.0

    gauges = (
        ("rmqha_broker_role", "0 fenced, 1 slave, 2 master", lambda: float(ROLE_VALUE[broker.role])),
        ("rmqha_broker_master_epoch", "master epoch this broker holds", lambda: status("master_epoch")),
        ("rmqha_broker_last_epoch", "newest epoch in the epoch map",
         lambda: float(broker.epoch_map.last_epoch()) if broker.epoch_map is not None else -1.0),
        ("rmqha_broker_max_offset_bytes", "commitlog max offset",
         lambda: float(broker.commitlog.max_offset) if broker.commitlog is not None else 0.0),
        ("rmqha_broker_confirm_offset_bytes", "confirm offset (replicated to the SyncStateSet)",
         lambda: float(broker.replication.confirm_offset()) if broker.commitlog is not None else 0.0),
        ("rmqha_broker_sync_state_set_size", "SyncStateSet size as the master counts it",
         lambda: float(broker.replication.sync_state_set_size())),
    )
    for name, doc, fn in gauges:
        registry.gauge(name, doc).set_function(fn)
