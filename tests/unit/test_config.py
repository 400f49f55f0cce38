"""The generic configuration loader: TOML, RocketMQ key=value files, env, errors."""
from __future__ import annotations

import enum
import socket
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rmqha.config import (
    camel_to_snake,
    check_port_free,
    load_config,
    snake_to_camel,
    to_dict,
)
from rmqha.errors import ConfigError


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


@dataclass
class Sample:
    listen_port: int = 9876
    enable_controller_mode: bool = False
    ratio: float = 0.5
    broker_name: str = "broker-a"
    controller_addr: list[str] = field(default_factory=list)
    store_path: Path = Path("/tmp/x")
    mode: Mode = Mode.SAFE
    admin_token: str | None = None
    peers: str = field(default="", metadata={"aliases": ("controllerDLegerPeers",)})


def test_names():
    assert camel_to_snake("enableElectUncleanMaster") == "enable_elect_unclean_master"
    assert camel_to_snake("already_snake") == "already_snake"
    assert snake_to_camel("all_ack_in_sync_state_set") == "allAckInSyncStateSet"


def test_defaults_without_file():
    cfg = load_config(Sample, env={})
    assert cfg == Sample()


def test_properties_file_camel_case(tmp_path: Path):
    p = tmp_path / "broker.conf"
    p.write_text(
        "# RocketMQ style\n! also a comment\n\nlistenPort = 30911\nenableControllerMode=true\n"
        "controllerAddr=127.0.0.1:9878;127.0.0.1:9868\nratio=0.25\nmode=FAST\n"
        "controllerDLegerPeers=n0-127.0.0.1:9878\nstorePath=~/store\nadminToken=\n"
    )
    cfg = load_config(Sample, p, env={})
    assert cfg.listen_port == 30911 and cfg.enable_controller_mode is True
    assert cfg.controller_addr == ["127.0.0.1:9878", "127.0.0.1:9868"]
    assert cfg.ratio == 0.25 and cfg.mode is Mode.FAST
    assert cfg.peers == "n0-127.0.0.1:9878"
    assert cfg.store_path == Path.home() / "store"
    assert cfg.admin_token is None


def test_toml_file_both_spellings(tmp_path: Path):
    p = tmp_path / "c.toml"
    p.write_text('listen_port = 1\nenableControllerMode = true\ncontroller_addr = ["a:1", "b:2"]\n'
                 'admin_token = "s3cret"\n')
    cfg = load_config(Sample, p, env={})
    assert (cfg.listen_port, cfg.enable_controller_mode, cfg.controller_addr, cfg.admin_token) == (
        1, True, ["a:1", "b:2"], "s3cret")


def test_env_overrides_file_and_overrides_win(tmp_path: Path):
    p = tmp_path / "c.conf"
    p.write_text("listenPort=1\nratio=2\n")
    env = {"RMQHA_LISTEN_PORT": "2", "RMQHA_NO_EXTENSIONS": "1", "RMQHA_BROKER_NAME": "env-b"}
    cfg = load_config(Sample, p, env=env, overrides={"listen_port": 3, "ratio": None})
    assert (cfg.listen_port, cfg.ratio, cfg.broker_name) == (3, 2.0, "env-b")


@pytest.mark.parametrize(
    "text, key",
    [
        ("listenPort=abc\n", "listenPort"),
        ("enableControllerMode=maybe\n", "enableControllerMode"),
        ("mode=turbo\n", "mode"),
        ("noSuchKey=1\n", "noSuchKey"),
    ],
)
def test_bad_key_or_value_names_key_and_file(tmp_path: Path, text: str, key: str):
    p = tmp_path / "bad.conf"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(Sample, p, env={})
    assert key in str(info.value) and str(p) in str(info.value)


def test_bad_env_value_names_variable():
    with pytest.raises(ConfigError, match="RMQHA_LISTEN_PORT"):
        load_config(Sample, env={"RMQHA_LISTEN_PORT": "x"})


def test_bad_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Sample, tmp_path / "missing.toml", env={})
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("listen_port = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(Sample, bad_toml, env={})
    bad_props = tmp_path / "bad.conf"
    bad_props.write_text("just words\n")
    with pytest.raises(ConfigError, match="bad.conf:1"):
        load_config(Sample, bad_props, env={})
    wrong_type = tmp_path / "t.toml"
    wrong_type.write_text("listen_port = true\n")
    with pytest.raises(ConfigError, match="listen_port"):
        load_config(Sample, wrong_type, env={})


def test_to_dict_camel():
    d = to_dict(Sample())
    assert d["listenPort"] == 9876 and d["mode"] == "safe" and d["storePath"] == "/tmp/x"


def test_check_port_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match="listenPort"):
            check_port_free("127.0.0.1", port, "listenPort")
    check_port_free("127.0.0.1", port, "listenPort")
    with pytest.raises(ConfigError, match="out of range"):
        check_port_free("127.0.0.1", 70000, "haPort")
