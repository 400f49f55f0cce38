"""The messaging service's background jobs: one asyncio task each, owned by its piece.

A job starts only on a running event loop, so a piece built alone in a test (no loop)
spawns nothing; stopping cancels it; a job whose coroutine returns (the broker stopped
being master, the service closed) can be started again by the next role change.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundJob:
    """A restartable asyncio task running ``body()``; ``may_start`` gates every start."""

    def __init__(self, body: Callable[[], Coroutine[Any, Any, None]],
                 may_start: Callable[[], bool] = lambda: True) -> None:
        self._body = body
        self._may_start = may_start
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> bool:
        """Start the job unless it runs already, may not start, or no loop is running."""
        if self.running or not self._may_start():
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._task = loop.create_task(self._body())
        return True

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
