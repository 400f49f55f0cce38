"""RocketMQ's own rmq-proxy.json starts an rmqha proxy: the keys of RocketMQ's ProxyConfig
rmqha does not use are accepted and named once at start; a key neither knows (a typo) and
a value rmqha cannot honour (``proxyMode: LOCAL``) are refused, naming them."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from rmqha.errors import ConfigError
from rmqha.proxy.config import load_proxy_config
from rmqha.proxy.rocketmq_keys import ROCKETMQ_PROXY_KEYS
from rmqha.proxy.server import run_proxy
from rmqha.testing.local_cluster import free_port

#: The distribution's conf/rmq-proxy.json plus keys operators commonly add.
RMQ_PROXY_JSON = {
    "rocketMQClusterName": "DefaultCluster",
    "namesrvAddr": "127.0.0.1:9876",
    "proxyMode": "cluster",
    "grpcServerPort": 8081,
    "remotingListenPort": 8080,
    "renewThreadPoolNums": 20,
    "lockTimeoutMsInHandleGroup": 3000,
    "grpcThreadPoolNums": 16,
    "grpcThreadPoolQueueCapacity": 100000,
    "traceOn": True,
    "metricsExporterType": "DISABLE",
    "enableGrpcEpoll": False,
    "maxMessageSize": 4194304,
}
IGNORED = ["remotingListenPort", "renewThreadPoolNums", "lockTimeoutMsInHandleGroup",
           "grpcThreadPoolNums", "grpcThreadPoolQueueCapacity", "traceOn",
           "metricsExporterType", "enableGrpcEpoll"]


def write(tmp_path: Path, values: dict[str, object]) -> Path:
    path = tmp_path / "rmq-proxy.json"
    path.write_text(json.dumps(values))
    return path


def test_rocketmq_config_loads_and_names_what_it_ignores(tmp_path: Path) -> None:
    cfg = load_proxy_config(write(tmp_path, RMQ_PROXY_JSON))
    assert cfg.ignored_keys == IGNORED
    assert (cfg.grpc_server_port, cfg.max_message_size, cfg.proxy_mode) == (8081, 4194304, "cluster")
    assert set(IGNORED) <= ROCKETMQ_PROXY_KEYS


def test_a_typo_is_refused_naming_it(tmp_path: Path) -> None:
    # A key RocketMQ's ProxyConfig does not have either: refused, not ignored.
    with pytest.raises(ConfigError, match="unknown configuration key 'renewThreadPoolNum'"):
        load_proxy_config(write(tmp_path, {**RMQ_PROXY_JSON, "renewThreadPoolNum": 20}))
    # Negative control: the same file with RocketMQ's spelling loads.
    assert "renewThreadPoolNums" in load_proxy_config(write(tmp_path, RMQ_PROXY_JSON)).ignored_keys


def test_a_typo_in_toml_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('namesrvAddr = "127.0.0.1:9876"\nrenewThreadPoolNums = 20\n')
    assert load_proxy_config(path).ignored_keys == ["renewThreadPoolNums"]
    path.write_text('namesrvAddr = "127.0.0.1:9876"\ngrpcServerPrt = 8081\n')
    with pytest.raises(ConfigError, match="'grpcServerPrt'"):
        load_proxy_config(path)


@pytest.mark.parametrize("mode", ["LOCAL", "local"])
def test_local_mode_is_refused_saying_what_rmqha_supports(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ConfigError, match=f"proxyMode '{mode}' is not supported: rmqha supports proxyMode CLUSTER"):
        load_proxy_config(write(tmp_path, {**RMQ_PROXY_JSON, "proxyMode": mode}))
    assert load_proxy_config(write(tmp_path, {**RMQ_PROXY_JSON, "proxyMode": "CLUSTER"})).proxy_mode == "CLUSTER"


def test_ignored_keys_are_logged_once_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_proxy_config(write(tmp_path, {**RMQ_PROXY_JSON, "grpcServerPort": free_port()}))
    caplog.set_level(logging.INFO, logger="rmqha.proxy.server")
    asyncio.run(_start_and_stop(cfg, caplog))
    lines = [r.getMessage() for r in caplog.records if "not used by rmqha" in r.getMessage()]
    assert lines == ["config keys of RocketMQ's proxy not used by rmqha: " + ", ".join(IGNORED)]


async def _start_and_stop(cfg: object, caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    serving = asyncio.create_task(run_proxy(cfg, stop))  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not any("proxy serving" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline and not serving.done(), "the proxy did not start"
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(serving, 10)
