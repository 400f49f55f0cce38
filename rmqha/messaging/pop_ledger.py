"""What the pop pieces (pop_path, pop_acks, pop_revive) share on a master.

- **readiness**: a new master's log may end in state records no replica confirmed yet
  (the previous master's last pops and acks); they are folded only as the confirm offset
  passes them.  Pop requests and the reviver wait until the index passed the log end the
  broker had when it became master, so every decision sees the whole inherited state and
  the master's own records apply in log order after it;
- the **receipt-handle key**, one per broker group: a 32-byte random key the first master
  makes, logs as a ``pop_key`` state record (so every replica has it and a new master
  accepts the handles of the old one) and keeps in ``<store>/messaging/pop_receipt.key``
  (mode 0600).  The state topic is never served to clients (see pull_path, queue_queries);
- **records**: a pop record is appended to the state log first and applied after, so a
  failed append changes nothing;
- **group settings**: the subscription group a pop names, RocketMQ's defaults for one
  nobody created (``auto_create_subscription_group``);
- **waiters**: pops held for data, woken by topic when the index grows or a FIFO queue
  unblocks.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rmqha.messaging.context import MessagingContext
from rmqha.messaging.pop_state import PopState, key_record
from rmqha.messaging.state import pop_record
from rmqha.messaging.state_replication import StateReplication
from rmqha.protocol.groups import SubscriptionGroupConfig

log = logging.getLogger(__name__)

KEY_FILE = "pop_receipt.key"
KEY_BYTES = 32


class PopLedger:
    """Readiness, the handle key, record writing, group settings and waiters for pops."""

    def __init__(self, ctx: MessagingContext, state_log: StateReplication, *,
                 clock: Callable[[], float] = time.time,
                 epoch: Callable[[], int] = lambda: 0) -> None:
        self.ctx = ctx
        self.state_log = state_log
        self.clock = clock
        self._epoch = epoch
        #: The log end when this broker became master: ready once the index passed it.
        self._barrier: int | None = None
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        #: The key last known to be in the key file (no file read per request).
        self._saved_key: bytes | None = None

    @property
    def pop(self) -> PopState:
        return self.ctx.state.pop

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def epoch(self) -> int:
        try:
            return int(self._epoch())
        except (TypeError, ValueError, AttributeError):
            return 0

    # --- readiness ---------------------------------------------------------------------

    def on_master(self) -> None:
        self._barrier = self.ctx.whole_offset()

    def ready(self) -> bool:
        """Master, and the index has passed everything the log held when it became one."""
        ctx = self.ctx
        return (ctx.role == "master" and self._barrier is not None
                and ctx.index.indexed_offset >= self._barrier)

    def behind(self) -> str:
        return (f"broker {self.ctx.broker_name} became master and is still folding the "
                f"replicated pop state up to {self._barrier} (indexed "
                f"{self.ctx.index.indexed_offset}); retry shortly")

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait (polling the index, which the confirm offset drives) until ready."""
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.ctx.role != "master" or time.monotonic() >= deadline or self.ctx.closed:
                return False
            await asyncio.sleep(0.02)
        return True

    # --- the handle key ----------------------------------------------------------------

    def key(self) -> bytes:
        """The group's handle key; a master that has none yet logs one (ready only)."""
        key = self.pop.key
        if key is not None:
            self._save_key(key)
            return key
        key = self._load_key() or secrets.token_bytes(KEY_BYTES)
        self.write(key_record(key))
        self._save_key(key)
        return key

    @property
    def _key_path(self) -> Path:
        return Path(self.ctx.dir) / KEY_FILE

    def _load_key(self) -> bytes | None:
        try:
            data = self._key_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("pop receipt key file %s unreadable (%s): a new key is made",
                        self._key_path, exc)
            return None
        return data if len(data) == KEY_BYTES else None

    def _save_key(self, key: bytes) -> None:
        if key == self._saved_key:
            return
        path = self._key_path
        try:
            if path.exists() and path.read_bytes() == key:
                self._saved_key = key
                return
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._saved_key = key
        except OSError as exc:
            # The log holds the key; the file is the local copy.
            log.warning("could not write the pop receipt key file %s: %s", path, exc)

    # --- records -----------------------------------------------------------------------

    def write(self, data: dict[str, Any]) -> tuple[int, int]:
        """Append a pop record, then apply it; StoreError leaves the state unchanged.  No
        fsync here (with flush = sync): acks and changes await their durability, a pop
        needs none (lost, it is delivered again)."""
        placed = self.state_log.write_state(pop_record(data), wait_flush=False)
        self.pop.apply(str(data["op"]), data)
        return placed

    # --- group settings ----------------------------------------------------------------

    def group(self, name: str) -> SubscriptionGroupConfig | None:
        cfg = self.ctx.state.groups.get(name)
        if cfg is None and self.ctx.config.auto_create_subscription_group:
            return SubscriptionGroupConfig(name)
        return cfg

    def retry_max(self, name: str) -> int:
        cfg = self.ctx.state.groups.get(name)
        return SubscriptionGroupConfig(name).retry_max_times if cfg is None else cfg.retry_max_times

    # --- waiters -----------------------------------------------------------------------

    def waiter(self, topics: Iterable[str]) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for topic in topics:
            self._waiters.setdefault(topic, []).append(fut)
        return fut

    def forget(self, fut: asyncio.Future[None], topics: Iterable[str]) -> None:
        for topic in topics:
            waiters = self._waiters.get(topic)
            if waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[topic]

    def holding(self) -> bool:
        """Whether any pop waits for a topic to grow."""
        return bool(self._waiters)

    def wake(self, topics: Iterable[str]) -> None:
        for topic in topics:
            for fut in self._waiters.pop(topic, ()):
                if not fut.done():
                    fut.set_result(None)

    def close(self) -> None:
        self.wake(list(self._waiters))
