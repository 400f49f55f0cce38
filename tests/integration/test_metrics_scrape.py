"""Prometheus metrics of every process, scraped with a real HTTP GET and parsed with
prometheus_client's text parser: the named series exist and move.

One cluster: a controller, a name server and broker group ``broker-a`` of two, each with
its own ``metrics_port``.
"""
from __future__ import annotations

import math
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster import Cluster, free_port
from rmqha.client import BlockingConsumer, BlockingProducer

TOPIC = "MetricsTopic"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("metrics"), cluster_name="m-cluster") as c:
        c.start_controllers(1, metrics_port=free_port())
        c.start_namesrv(metrics_port=free_port())
        a = c.start_broker("broker-a", metrics_port=free_port(), flush="sync")
        c.wait_role(a, "master")
        b = c.start_broker("broker-a", metrics_port=free_port(), flush="sync")
        c.wait_role(b, "slave")
        c.wait_for(lambda: (info := c.replica_info("broker-a")) is not None and len(info.sync_state_set) == 2,
                   what="the slave in the SyncStateSet")
        c.a, c.b = a, b
        yield c


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page: (name, sorted labels) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` whose labels include ``labels`` (summed if several match)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    return sum(found) if found else None


def test_broker_series_move_with_traffic(live):
    port = live.a.config["metrics_port"]
    before = scrape(port)
    assert value(before, "rmqha_broker_role") == 2.0
    assert value(before, "rmqha_broker_master_epoch") == 1.0
    assert value(before, "rmqha_broker_sync_state_set_size") == 2.0
    stored0 = value(before, "rmqha_messaging_messages_stored_total") or 0.0
    bytes0 = value(before, "rmqha_messaging_stored_bytes_total") or 0.0

    with BlockingProducer(live.namesrv_addresses) as p:
        for i in range(20):
            assert p.send(TOPIC, f"m{i}".encode()).ok
    with BlockingConsumer(live.namesrv_addresses, "metrics-g", TOPIC) as c:
        seen: list = []
        live.wait_for(lambda: len(seen.extend(c.poll(0.5)) or seen) >= 20, what="20 messages consumed")
        c.commit()

    after = scrape(port)
    assert value(after, "rmqha_messaging_messages_stored_total") - stored0 >= 20
    assert value(after, "rmqha_messaging_stored_bytes_total") > bytes0
    assert value(after, "rmqha_messaging_messages_served_total") >= 20
    assert value(after, "rmqha_messaging_served_bytes_total") > 0
    assert value(after, "rmqha_broker_max_offset_bytes") > value(before, "rmqha_broker_max_offset_bytes")
    # flush=sync: every send waited for a flush, so the probe saw some.
    assert value(after, "rmqha_broker_flush_latency_seconds_count") >= 1
    assert value(after, "rmqha_broker_flush_latency_seconds_sum") >= 0
    slave_id = str(live.b.broker_id())
    live.wait_for(lambda: value(scrape(port), "rmqha_ha_slave_ack_lag_bytes", slave_id=slave_id) == 0.0,
                  what="the slave's ack lag to reach 0")
    final = scrape(port)
    assert value(final, "rmqha_ha_slave_ack_offset_bytes", slave_id=slave_id) == \
        value(final, "rmqha_broker_max_offset_bytes")
    assert value(final, "rmqha_ha_slave_in_sync", slave_id=slave_id) == 1.0
    assert value(final, "rmqha_ha_slave_ack_lag_seconds", slave_id=slave_id) == 0.0


def test_slave_series(live):
    port = live.b.config["metrics_port"]
    samples = scrape(port)
    assert value(samples, "rmqha_broker_role") == 1.0
    assert value(samples, "rmqha_broker_master_epoch") == 1.0
    assert value(samples, "rmqha_broker_sync_state_set_size") == 1.0  # only a master counts its set
    assert value(samples, "rmqha_ha_slave_ack_lag_bytes") is None  # per-slave series are the master's
    assert value(samples, "rmqha_ha_slave_disk_full") == 0.0
    master_max = value(scrape(live.a.config["metrics_port"]), "rmqha_broker_max_offset_bytes")
    live.wait_for(lambda: value(scrape(port), "rmqha_broker_max_offset_bytes") == master_max,
                  what="the slave's max offset to reach the master's")


def test_controller_series(live):
    port = live.controllers[0].config["metrics_port"]
    def leader_samples():
        s = scrape(port)
        return s if value(s, "rmqha_controller_raft_role") == 3.0 else None

    samples = live.wait_for(leader_samples, what="the controller's raft role gauge to say leader")
    assert value(samples, "rmqha_controller_raft_term") >= 1
    assert value(samples, "rmqha_controller_elections_total", result="new_master_elected",
                 broker_set="broker-a") >= 1
    assert value(samples, "rmqha_controller_commit_latency_seconds_count") >= 1
    beats = value(samples, "rmqha_controller_requests_total", request_type="BROKER_HEARTBEAT", result="success")
    assert beats and beats >= 1
    live.wait_for(lambda: value(scrape(port), "rmqha_controller_requests_total",
                                request_type="BROKER_HEARTBEAT", result="success") > beats,
                  what="heartbeats to be counted")
    live.wait_for(lambda: value(scrape(port), "rmqha_controller_active_brokers") == 2.0,
                  what="2 active brokers")


def test_namesrv_series(live):
    port = live.namesrvs[0].config["metrics_port"]
    samples = scrape(port)
    assert value(samples, "rmqha_namesrv_brokers") == 2.0
    assert value(samples, "rmqha_namesrv_broker_groups") == 1.0
    regs = value(samples, "rmqha_namesrv_requests_total", request_type="REGISTER_BROKER", result="success")
    assert regs and regs >= 2
    live.wait_for(lambda: value(scrape(port), "rmqha_namesrv_requests_total",
                                request_type="REGISTER_BROKER", result="success") > regs,
                  what="periodic registrations to be counted")
    assert not math.isnan(value(samples, "rmqha_namesrv_topics"))


def test_namesrv_hosting_a_controller_serves_both_series(live):
    port = free_port()
    live.start_namesrv_with_controller(metrics_port=port)

    def both():
        s = scrape(port)
        return s if value(s, "rmqha_controller_raft_role") == 3.0 else None

    samples = live.wait_for(both, what="the embedded controller's series on the name server's port")
    assert value(samples, "rmqha_namesrv_brokers") is not None
    assert value(samples, "rmqha_controller_raft_term") >= 1
