"""Which asyncio event loop rmqha's servers and blocking clients run on.

uvloop (libuv, compiled) when it is installed, which it is with rmqha on Linux and macOS;
the standard library's loop when it is not, or when ``RMQHA_EVENT_LOOP=asyncio`` asks for
it (to rule the loop out when chasing a bug).  A send that travels alone crosses the
loops of the client, the master and every slave several times, and what each crossing
costs is mostly the loop's own bookkeeping: on this project's one-at-a-time benchmark
uvloop cuts the brokers' CPU per message by about a tenth and the latency with it.

Everything rmqha runs on a loop goes through :func:`new_event_loop` or :func:`run`, so
the servers (broker, name server, controller) and the blocking clients' loop threads
agree; a loop run one call at a time comes from :func:`new_call_loop`, and a loop on a
private thread for blocking callers is an :class:`EventLoopThread`.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future as ConcurrentFuture
from enum import Enum
from typing import Any, TypeVar

from rmqha.errors import ConfigError

try:
    import uvloop as _uvloop
except ImportError:  # an install without it (Windows, or pip --no-deps): the stdlib loop
    _uvloop = None  # type: ignore[assignment]  # checked before every use

ENV = "RMQHA_EVENT_LOOP"

T = TypeVar("T")


class LoopKind(str, Enum):
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def chosen() -> LoopKind:
    """The loop ``RMQHA_EVENT_LOOP`` asks for (default: uvloop when it is installed)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if not raw:
        return LoopKind.UVLOOP if _uvloop is not None else LoopKind.ASYNCIO
    try:
        kind = LoopKind(raw)
    except ValueError:
        raise ConfigError(f"{ENV}={raw!r}: expected 'uvloop' or 'asyncio'") from None
    if kind is LoopKind.UVLOOP and _uvloop is None:
        raise ConfigError(f"{ENV}=uvloop, but uvloop is not installed (pip install uvloop)")
    return kind


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind (not set as the thread's current loop)."""
    if chosen() is LoopKind.UVLOOP:
        assert _uvloop is not None
        return _uvloop.new_event_loop()
    return asyncio.new_event_loop()


def new_call_loop() -> asyncio.AbstractEventLoop:
    """A loop driven one call at a time with ``run_until_complete`` (BlockingProducer's
    per-thread loops): always the standard library's.  uvloop sets up and tears down its
    signal wake-up socket pair on every run in the main thread (a socketpair, two closes,
    six epoll_ctl: 26 us a run here against 10 us), more than a call's few turns save."""
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a loop of the chosen kind."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


class EventLoopThread:
    """A private asyncio loop on a daemon thread, for blocking callers (CLI, tests)."""

    def __init__(self, name: str = "rmqha-loop") -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        # run_coroutine_threadsafe takes a coroutine; some callers type theirs as Awaitable.
        fut: ConcurrentFuture[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return fut.result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
