"""BrokerConfig and NamesrvConfig: RocketMQ keys, defaults, derived ports, refusals."""
from __future__ import annotations

import pytest

from rmqha.broker.config import BrokerConfig, load_broker_config
from rmqha.errors import ConfigError
from rmqha.ha.config import HAConfig
from rmqha.namesrv.config import load_namesrv_config


def test_defaults_follow_rocketmq():
    cfg = load_broker_config(None, controller_addr="127.0.0.1:9878")
    assert (cfg.cluster, cfg.broker_name, cfg.listen_port) == ("DefaultCluster", "broker-a", 10911)
    assert cfg.ha_port == 10912 and cfg.ha_address == "127.0.0.1:10912"
    assert cfg.broker_address == "127.0.0.1:10911"
    assert cfg.broker_heartbeat_interval_ms == 1000
    assert cfg.sync_broker_metadata_period_ms == 5000 and cfg.check_sync_state_set_period_ms == 5000
    assert cfg.controller_heartbeat_timeout_ms == 10000
    assert cfg.register_name_server_period_ms == 30000 and cfg.namesrv_broker_timeout_ms == 120000
    assert cfg.segment_bytes == 1 << 30 and cfg.flush == "async"
    assert cfg.broker_election_priority == 2**31 - 1
    assert (cfg.in_sync_replicas, cfg.min_in_sync_replicas, cfg.all_ack_in_sync_state_set) == (1, 1, False)


def test_rocketmq_broker_conf_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("RMQHA_LISTEN_PORT", raising=False)
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# controller-mode broker as in RocketMQ's quick start\n"
        "brokerClusterName=DefaultCluster\n"
        "brokerName=broker-b\n"
        "brokerId=-1\n"
        "brokerRole=SLAVE\n"
        "listenPort=30911\n"
        "haListenPort=30999\n"
        "storePathRootDir=" + str(tmp_path / "store") + "\n"
        "enableControllerMode=true\n"
        "controllerAddr=127.0.0.1:9878;127.0.0.1:9868\n"
        "namesrvAddr=127.0.0.1:9876\n"
        "flushDiskType=SYNC_FLUSH\n"
        "mappedFileSizeCommitLog=1048576\n"
        "allAckInSyncStateSet=true\n"
        "haMaxTimeSlaveNotCatchup=2000\n"
        "haSendHeartbeatInterval=500\n"
        "haHousekeepingInterval=3000\n"
        "brokerElectionPriority=3\n"
        "syncBrokerMetadataPeriod=300\n"
    )
    cfg = load_broker_config(conf)
    assert cfg.broker_name == "broker-b" and cfg.listen_port == 30911 and cfg.ha_port == 30999
    assert cfg.controller_addr == ["127.0.0.1:9878", "127.0.0.1:9868"]
    assert cfg.namesrv_addr == ["127.0.0.1:9876"]
    assert cfg.flush == "sync" and cfg.segment_bytes == 1 << 20 and cfg.all_ack_in_sync_state_set
    assert cfg.store_dir == tmp_path / "store"
    assert cfg.broker_election_priority == 3 and cfg.sync_broker_metadata_period_ms == 300
    # The HA layer takes its knobs from the broker config by name.
    ha = HAConfig.from_object(cfg)
    assert ha.ha_max_time_slave_not_catchup_ms == 2000 and ha.all_ack_in_sync_state_set


def test_toml_and_environment_override(tmp_path, monkeypatch):
    conf = tmp_path / "broker.toml"
    conf.write_text('broker_name = "g1"\ncontroller_addr = ["127.0.0.1:1"]\nlisten_port = 5000\n')
    monkeypatch.setenv("RMQHA_LISTEN_PORT", "6000")
    cfg = load_broker_config(conf)
    assert cfg.listen_port == 6000 and cfg.ha_port == 6001
    assert load_broker_config(conf, listen_port=7000).listen_port == 7000


@pytest.mark.parametrize("values, key", [
    ({"brokerNmae": "x"}, "brokerNmae"),
    ({"listen_port": "eleven"}, "listen_port"),
    ({"flush": "sometimes"}, "flush"),
    ({"ha_protocol": "carrier-pigeon"}, "ha_protocol"),
    ({"broker_name": "a#b"}, "broker_name"),
    ({"controller_addr": ""}, "controller_addr"),
    ({"sync_broker_metadata_period_ms": 0}, "sync_broker_metadata_period_ms"),
    ({"ha_max_time_slave_not_catchup_ms": 1000}, "ha_max_time_slave_not_catchup_ms"),
])
def test_bad_keys_and_values_are_named(values, key, monkeypatch):
    monkeypatch.delenv("RMQHA_LISTEN_PORT", raising=False)
    overrides = {"controller_addr": "127.0.0.1:1", **values}
    with pytest.raises(ConfigError) as info:
        load_broker_config(None, **overrides)
    assert key in str(info.value)


def test_namesrv_config(tmp_path, monkeypatch):
    monkeypatch.delenv("RMQHA_LISTEN_PORT", raising=False)
    cfg = load_namesrv_config(None)
    assert cfg.listen_port == 9876 and cfg.broker_expire_ms == 120_000 and not cfg.enable_controller_in_namesrv
    conf = tmp_path / "ns.toml"
    conf.write_text('listen_port = 9000\nenable_controller_in_namesrv = true\n\n[controller]\n'
                    'controller_peers = "n0-127.0.0.1:9878"\n')
    cfg = load_namesrv_config(conf)
    assert cfg.enable_controller_in_namesrv and cfg.controller == {"controller_peers": "n0-127.0.0.1:9878"}
    conf.write_text('[controller]\ncontroller_peers = "n0-127.0.0.1:9878"\n')
    with pytest.raises(ConfigError, match="enable_controller_in_namesrv"):
        load_namesrv_config(conf)


def test_zero_client_port_means_any_and_no_derived_ha_port():
    cfg = BrokerConfig(listen_port=0, controller_addr=["127.0.0.1:1"])
    cfg.validate()
    assert cfg.ha_port == 0
