"""The broker's Prometheus series (served on ``metrics_port`` when it is > 0).

Read at scrape time from the live broker (no bookkeeping on the hot path):

- ``rmqha_broker_role`` (0 fenced, 1 slave, 2 master), ``rmqha_broker_master_epoch``,
  ``rmqha_broker_last_epoch``, ``rmqha_broker_max_offset_bytes``,
  ``rmqha_broker_confirm_offset_bytes``, ``rmqha_broker_flushed_offset_bytes``,
  ``rmqha_broker_sync_state_set_size``, ``rmqha_broker_store_allocated_bytes`` and
  ``rmqha_broker_store_logical_bytes`` (the store directory's disk blocks and file sizes),
  ``rmqha_ha_slave_disk_full`` (1 while this broker's HA slave finds its disk full);
- per slave, from the HA master's status (labels ``slave_id``, ``slave_address``):
  ``rmqha_ha_slave_ack_offset_bytes``, ``rmqha_ha_slave_ack_lag_bytes``,
  ``rmqha_ha_slave_ack_lag_seconds``, ``rmqha_ha_slave_in_sync`` (1/0);
  (a slave's own view of its lag is only the master's confirm offset, in
  ``rmqha_broker_confirm_offset_bytes``: the master's per-slave series are the authority).

Counted as things happen: ``rmqha_broker_flush_latency_seconds`` (histogram: append to
fsync-durable, one probe outstanding at a time, see :class:`FlushProbe`),
``rmqha_messaging_served_bytes_total`` (pull response bytes; the messaging layer counts
messages and bytes in and messages out in its own ``rmqha_messaging_*`` series).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rmqha.broker.replicas_manager import Role
from rmqha.metrics import MetricsRegistry
from rmqha.store.disk_usage import directory_usage



class ObservedBroker(Protocol):
    """What the series read from a broker (:class:`rmqha.broker.broker.Broker` is one).

    A protocol rather than an import: the broker imports this module, not the reverse.
    """

    replicas: Any
    replication: Any
    commitlog: Any
    epoch_map: Any
    ha_master: Any
    ha_slave: Any
    store_dir: Any

    @property
    def role(self) -> Role: ...


ROLE_VALUE = {Role.FENCED: 0, Role.SLAVE: 1, Role.MASTER: 2}

#: Flush latencies: from a fraction of a millisecond (sync, page cache) to the async
#: flush interval and beyond.
FLUSH_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                    0.25, 0.5, 1.0, 2.5, 5.0)


class HACollector(Collector):
    """Per-slave ack offsets and lag, read from ``HAMaster.status()`` on each scrape."""

    def __init__(self, broker: ObservedBroker) -> None:
        self._broker = broker

    def describe(self) -> list[Any]:
        # Label values change with membership: let prometheus_client call collect() instead.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["slave_id", "slave_address"]
        ack = GaugeMetricFamily("rmqha_ha_slave_ack_offset_bytes", "Slave's acknowledged offset", labels=labels)
        lag = GaugeMetricFamily("rmqha_ha_slave_ack_lag_bytes", "Master max offset minus slave ack offset",
                                labels=labels)
        lag_s = GaugeMetricFamily("rmqha_ha_slave_ack_lag_seconds",
                                  "Time since the slave was last caught up (0 when caught up)", labels=labels)
        in_sync = GaugeMetricFamily("rmqha_ha_slave_in_sync", "1 if the slave is in the SyncStateSet",
                                    labels=labels)
        status = self._status()
        for s in status.get("slaves") or []:
            values = [str(s.get("broker_id")), str(s.get("address") or "")]
            ack.add_metric(values, float(s.get("ack_offset") or 0))
            lag.add_metric(values, float(s.get("lag_bytes") or 0))
            lag_ms = s.get("lag_ms")
            lag_s.add_metric(values, float(lag_ms) / 1000.0 if lag_ms is not None else float("nan"))
            in_sync.add_metric(values, 1.0 if s.get("in_sync") else 0.0)
        yield from (ack, lag, lag_s, in_sync)

    def _status(self) -> dict[str, Any]:
        side = self._broker.ha_master
        if side is None:
            return {}
        # Scrapes run on the HTTP server's thread while the loop mutates the HA state; a
        # membership change mid-read only costs this scrape its HA series.
        for _ in range(3):
            try:
                return dict(side.status())
            except RuntimeError:
                continue
        return {}


class FlushProbe:
    """Measures append-to-durable latency without touching the append path's cost much.

    The commitlog calls :meth:`on_append` after every append (writer thread).  When no
    probe is outstanding it asks ``flush_future(new_max_offset)`` and observes the time
    until that future is done (on the flusher thread).  One probe at a time keeps the
    overhead at one future per flush interval.
    """

    def __init__(self, commitlog: Any, histogram: Any) -> None:
        self._log = commitlog
        self._hist = histogram
        self._busy = False
        self._lock = threading.Lock()

    def on_append(self, new_max_offset: int) -> None:
        with self._lock:
            if self._busy:
                return
            self._busy = True
        started = time.perf_counter()
        fut = self._log.flush_future(new_max_offset)
        fut.add_done_callback(lambda f: self._done(f, started))

    def _done(self, fut: Any, started: float) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self._hist.observe(time.perf_counter() - started)
        with self._lock:
            self._busy = False


def slave_disk_full(broker: ObservedBroker) -> float:
    """1.0 while the broker's HA slave finds its disk full (it retries with backoff)."""
    slave = getattr(broker, "ha_slave", None)
    return 1.0 if slave is not None and slave.disk_full else 0.0


def register_broker_metrics(broker: ObservedBroker, registry: MetricsRegistry) -> None:
    """Add the broker's series to ``registry``; gauges read the broker when scraped."""

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
        ("rmqha_broker_flushed_offset_bytes", "commitlog offset known durable (fsynced)",
         lambda: float(broker.commitlog.flushed_offset) if broker.commitlog is not None else 0.0),
        ("rmqha_broker_confirm_offset_bytes", "confirm offset (replicated to the SyncStateSet)",
         lambda: float(broker.replication.confirm_offset()) if broker.commitlog is not None else 0.0),
        ("rmqha_broker_sync_state_set_size", "SyncStateSet size as the master counts it",
         lambda: float(broker.replication.sync_state_set_size())),
        ("rmqha_broker_accepting_writes", "1 if master with a live lease from the controller",
         lambda: 1.0 if broker.replicas is not None and broker.replicas.accepts_writes else 0.0),
        ("rmqha_broker_master_lease_fenced", "1 if master by role but its lease expired (refusing writes)",
         lambda: 1.0 if broker.replicas is not None and broker.replicas.lease_fenced else 0.0),
        ("rmqha_broker_master_lease_remaining_seconds", "master lease time left at the epoch held",
         lambda: (broker.replicas.lease.remaining_s(broker.replicas.master_epoch)
                  if broker.replicas is not None else 0.0)),
        ("rmqha_broker_master_lease_expiries", "times the master found its lease expired",
         lambda: float(broker.replicas.lease_expiries) if broker.replicas is not None else 0.0),
        # Segments are sparse: blocks held on disk and the files' logical sizes differ.
        ("rmqha_broker_store_allocated_bytes", "disk blocks held by the store directory (st_blocks*512)",
         lambda: float(directory_usage(broker.store_dir).allocated_bytes)),
        ("rmqha_broker_store_logical_bytes", "logical size of the store directory's files",
         lambda: float(directory_usage(broker.store_dir).logical_bytes)),
        ("rmqha_ha_slave_disk_full", "1 while this slave's disk is full (replication paused, retried with backoff)",
         lambda: slave_disk_full(broker)),
    )
    for name, doc, fn in gauges:
        registry.gauge(name, doc).set_function(fn)
    registry.registry.register(HACollector(broker))


def flush_latency_histogram(registry: MetricsRegistry) -> Any:
    return registry.histogram("rmqha_broker_flush_latency_seconds",
                              "Append to fsync-durable, sampled one probe at a time",
                              buckets=FLUSH_BUCKETS)


def served_bytes_counter(registry: MetricsRegistry) -> Any:
    return registry.counter("rmqha_messaging_served_bytes", "Pull response body bytes sent to consumers")
