"""SyncService.defer_push: the appends of a caller that pushes in the same loop turn
queue no wake (a cancelled one would still cost the loop a turn); others' appends do."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from rmqha.ha.sync_service import SyncService
from rmqha.testing.ha import fast_config


class _Log:
    """The commitlog as the service reads it: a max offset and one append listener."""

    def __init__(self) -> None:
        self.max_offset = 0
        self.listener: Any = None

    def add_append_listener(self, cb: Any) -> None:
        self.listener = cb

    def remove_append_listener(self, cb: Any) -> None:
        self.listener = None

    def append(self, size: int) -> None:
        self.max_offset += size
        self.listener(self.max_offset)


class _Epochs:
    def last_entry(self) -> tuple[int, int, int]:
        return (1, 0, -1)


def _service(log: _Log) -> tuple[SyncService, list[int]]:
    svc = SyncService(log, _Epochs(), fast_config(), 1, alter=None, on_confirm=None,
                      sync_state_set=(1,), sync_state_set_epoch=1, confirm_offset=0)
    wakes: list[int] = []
    real = svc.wake_all

    def counted() -> None:
        wakes.append(log.max_offset)
        real()

    svc.wake_all = counted  # type: ignore[method-assign]
    return svc, wakes


def _run(body: Any) -> None:
    async def main() -> None:
        log = _Log()
        svc, wakes = _service(log)
        svc.start()
        try:
            await body(svc, log, wakes)
        finally:
            for task in svc.stop():
                task.cancel()

    asyncio.run(main())


def test_a_deferred_append_queues_nothing_and_push_now_sends_it() -> None:
    async def body(svc: SyncService, log: _Log, wakes: list[int]) -> None:
        svc.defer_push()
        log.append(100)
        log.append(50)
        assert svc._wake_handle is None and wakes == []
        svc.push_now()
        assert wakes == [150]
        await asyncio.sleep(0)
        assert wakes == [150]  # nothing left queued to run again

    _run(body)


def test_without_defer_an_append_queues_a_wake() -> None:
    """Negative control: an append nobody promised to push wakes the writers next turn."""
    async def body(svc: SyncService, log: _Log, wakes: list[int]) -> None:
        log.append(100)
        assert svc._wake_handle is not None and wakes == []
        await asyncio.sleep(0)
        assert wakes == [100]

    _run(body)


def test_push_now_ends_the_deferral() -> None:
    async def body(svc: SyncService, log: _Log, wakes: list[int]) -> None:
        svc.defer_push()
        svc.push_now()
        assert wakes == []  # nothing appended: nothing to send
        log.append(10)  # no promise now: queued as ever
        await asyncio.sleep(0)
        assert wakes == [10]

    _run(body)


def test_another_threads_append_queues_its_wake_while_deferred() -> None:
    async def body(svc: SyncService, log: _Log, wakes: list[int]) -> None:
        svc.defer_push()
        t = threading.Thread(target=log.append, args=(7,))
        t.start()
        t.join()
        svc._push_promised = False  # the promise's owner never pushes: the thread's wake stands
        deadline = asyncio.get_running_loop().time() + 5
        while not wakes and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        assert wakes == [7]

    _run(body)
