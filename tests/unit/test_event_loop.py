"""rmqha.net.loop: which loop the servers and blocking clients run on."""
from __future__ import annotations

import asyncio

import pytest
from needs import unavailable

from rmqha.net import loop as event_loop
from rmqha.errors import ConfigError
from rmqha.net.loop import LoopKind


def test_uvloop_is_the_default_when_installed(monkeypatch):
    monkeypatch.delenv(event_loop.ENV, raising=False)
    expected = LoopKind.UVLOOP if event_loop._uvloop is not None else LoopKind.ASYNCIO
    assert event_loop.chosen() is expected


@pytest.mark.parametrize("kind", list(LoopKind))
def test_the_chosen_loop_runs_coroutines(monkeypatch, kind):
    if kind is LoopKind.UVLOOP and event_loop._uvloop is None:
        unavailable("uvloop (a dependency on this platform) is not installed")
    monkeypatch.setenv(event_loop.ENV, kind.value)

    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    module = event_loop.run(main())
    assert module.startswith("uvloop") == (kind is LoopKind.UVLOOP)
    loop = event_loop.new_event_loop()
    try:
        assert type(loop).__module__.startswith("uvloop") == (kind is LoopKind.UVLOOP)
    finally:
        loop.close()


def test_a_bad_setting_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(event_loop.ENV, "tokio")
    with pytest.raises(ConfigError, match="RMQHA_EVENT_LOOP='tokio'.*'uvloop' or 'asyncio'"):
        event_loop.chosen()


def test_asking_for_a_missing_uvloop_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv(event_loop.ENV, "uvloop")
    monkeypatch.setattr(event_loop, "_uvloop", None)
    with pytest.raises(ConfigError, match="pip install uvloop"):
        event_loop.chosen()


def test_a_loop_run_call_by_call_is_the_stdlib_one(monkeypatch):
    monkeypatch.setenv(event_loop.ENV, "uvloop")
    loop = event_loop.new_call_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
        assert loop.run_until_complete(asyncio.sleep(0, "done")) == "done"
    finally:
        loop.close()
