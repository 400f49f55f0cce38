"""Helpers for tests and benchmarks of the HA layer (real stores, real processes, no mocks).

* :func:`open_store` / :func:`fill`: a commitlog + epoch map in a directory, filled with
  real RocketMQ-format records; :func:`replica_stores` opens several and closes them all;
* :func:`segments_identical` / :func:`assert_same_log`: byte-for-byte comparison of two
  stores' segment files;
* :func:`fast_config`: HA timers short enough for tests;
* :data:`TEST_SECRET` / :func:`auth_for`: the cluster secret and identities the helpers
  authenticate HA links with (``auth=None`` runs a link without a secret);
* :func:`ha_master` / :func:`ha_slave`: HA objects of test group ``g`` on such stores,
  authenticated with :data:`TEST_SECRET` unless told ``auth=None``;
  :func:`master_running`, :func:`slave_running` and :func:`scripted_master` start one
  side of a link and always stop it (``async with``, slave before master);
* :func:`slave_receive` / :class:`OneReadLink`: a slave's receive path over one store with
  no HA slave around it, and a link that hands it one prepared read at a time;
* :class:`SyncStateAuthority`: the controller's SyncStateSet rules (master id and epoch
  fencing, set epochs) in memory, for testing the master's proposals without a controller;
* :class:`NodeProcess`: a ``python -m rmqha.testing.ha_node`` child process driven over stdio;
* :func:`wait_until` / :func:`wait_until_async`: polling with a deadline, never fixed sleeps.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqha.errors import AuthenticationError, ControllerError
from rmqha.ha.appender import BlockAppender
from rmqha.ha.auth import HAAuth, Proof
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import FramedSlave
from rmqha.ha.disk_full import DiskFullWatch
from rmqha.ha.frame_mac import FrameMac
from rmqha.ha.master import HAMaster
from rmqha.ha.receive import Receiver
from rmqha.ha.slave import HASlave
from rmqha.ha.slave_epochs import EpochWriter
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress
from rmqha.ha.truncation import Truncator
from rmqha.security.identity import Identity
from rmqha.security.secret import ENV_SECRET, ENV_SECRET_FILE, ClusterSecret, generate_secret_text
from rmqha.store import CommitLog, EpochMap
from rmqha.testing.sealed_script import ScriptedAuth, SealedReader, SealedWriter

EPOCH_FILE = "epochFileCheckpoint"
#: The broker group of every HA object these helpers build, and its cluster (the default
#: of ``python -m rmqha.testing.ha_node``).
GROUP = "g"
CLUSTER = "DefaultCluster"
#: The cluster secret of the HA objects and node processes these helpers start (fresh
#: per test process: nothing outside it knows it).
TEST_SECRET_TEXT = generate_secret_text()
TEST_SECRET = ClusterSecret(TEST_SECRET_TEXT.encode(), "the test helpers")


def open_store(directory: str, segment_bytes: int, **kwargs: Any) -> tuple[CommitLog, EpochMap]:
    """The commitlog (``directory/commitlog``) and epoch map of one replica."""
    os.makedirs(directory, exist_ok=True)
    cl = CommitLog(os.path.join(directory, "commitlog"), segment_bytes=segment_bytes, **kwargs)
    em = EpochMap.open(os.path.join(directory, EPOCH_FILE))
    return cl, em


@contextmanager
def replica_stores(base: str | Path, segment_bytes: int, *names: str,
                   **kwargs: Any) -> Iterator[list[tuple[CommitLog, EpochMap]]]:
    """One store per name (``base/name``); every commitlog is closed on leaving the block."""
    stores: list[tuple[CommitLog, EpochMap]] = []
    try:
        for name in names:
            stores.append(open_store(os.path.join(base, name), segment_bytes, **kwargs))
        yield stores
    finally:
        for cl, _ in stores:
            cl.close()


def fill(cl: CommitLog, nbytes: int, body_size: int = 1000, batch: int = 256, topic: str = "ha-test",
         seed: int = 0) -> int:
    """Append records until the log grew by at least ``nbytes``; returns the new max offset."""
    target = cl.max_offset + nbytes
    body = bytes((seed + i) & 0xFF for i in range(body_size))
    bodies = [body] * batch
    while cl.max_offset < target:
        cl.append_batch(topic, bodies)
    return cl.max_offset


def segments_identical(a: CommitLog, b: CommitLog) -> tuple[bool, str]:
    """(True, "") when both logs have the same max offset and byte-identical segment files."""
    a.flush()
    b.flush()
    if a.max_offset != b.max_offset:
        return False, f"max offsets differ: {a.max_offset} vs {b.max_offset}"
    if a.min_offset != b.min_offset:
        return False, f"min offsets differ: {a.min_offset} vs {b.min_offset}"
    fa = [os.path.basename(p) for p in a.segment_files()]
    fb = [os.path.basename(p) for p in b.segment_files()]
    if fa != fb:
        return False, f"segment names differ: {fa} vs {fb}"
    for pa, pb in zip(a.segment_files(), b.segment_files()):
        with open(pa, "rb") as x, open(pb, "rb") as y:
            pos = 0
            while True:
                ca = x.read(1 << 20)
                cb = y.read(1 << 20)
                if ca != cb:
                    for i, (u, v) in enumerate(zip(ca, cb)):
                        if u != v:
                            return False, f"{os.path.basename(pa)} differs at byte {pos + i}"
                    return False, f"{os.path.basename(pa)} lengths differ"
                if not ca:
                    break
                pos += len(ca)
    return True, ""


def assert_same_log(a: CommitLog, b: CommitLog, what: str = "") -> None:
    """Assert :func:`segments_identical`, with its explanation (prefixed by ``what``) on failure."""
    ok, why = segments_identical(a, b)
    assert ok, f"{what}: {why}" if what else why


# --- HA objects and their lifetimes -------------------------------------------------------------


def store_digest(cl: CommitLog) -> tuple[int, str]:
    """The log's max offset and a SHA-256 of its segment files, flushed first: equal
    digests before and after mean nothing was stored."""
    cl.flush()
    h = hashlib.sha256()
    for path in cl.segment_files():
        with open(path, "rb") as f:
            h.update(f.read())
    return cl.max_offset, h.hexdigest()


def fast_config(**overrides: Any) -> HAConfig:
    """HA timers short enough for tests (heartbeats every 100 ms, reconnects after 20-200 ms);
    ``overrides`` are further HAConfig fields."""
    return HAConfig(**{"ha_send_heartbeat_interval_ms": 100, "ha_reconnect_min_ms": 20,
                       "ha_reconnect_max_ms": 200, **overrides})


def auth_for(broker_id: int, secret: ClusterSecret = TEST_SECRET, *, cluster: str = CLUSTER,
              group: str = GROUP, allow_rocketmq: bool = True) -> HAAuth:
    """What broker ``broker_id`` of ``cluster``/``group`` authenticates its HA links with.
    The rocketmq dialect is let through unauthenticated (``allow_rocketmq``), so the tests
    of that dialect run beside authenticated framed links as a broker configured so would."""
    return HAAuth(secret, Identity.broker(cluster, group, str(broker_id)), allow_rocketmq)


def ha_master(cl: CommitLog, em: EpochMap, config: HAConfig, *, broker_id: int = 1,
              known: Iterable[int] | None = (2,), **kwargs: Any) -> HAMaster:
    """A master of group ``g``; ``known`` are the slave ids it accepts (None: no check).
    Its links authenticate with :data:`TEST_SECRET` unless ``auth`` is given (None: off)."""
    if known is not None:
        ids = frozenset(known)
        kwargs.setdefault("is_known_replica", lambda i: i in ids)
    kwargs.setdefault("auth", auth_for(broker_id))
    return HAMaster(cl, em, group=GROUP, broker_id=broker_id, config=config, **kwargs)


def ha_slave(cl: CommitLog, em: EpochMap, port: int, config: HAConfig, *, broker_id: int = 2,
             **kwargs: Any) -> HASlave:
    """A slave of group ``g`` following the master at ``127.0.0.1:port``, authenticated
    with :data:`TEST_SECRET` unless ``auth`` is given (None: off)."""
    kwargs.setdefault("auth", auth_for(broker_id))
    return HASlave(cl, em, group=GROUP, broker_id=broker_id, master_ha_address=f"127.0.0.1:{port}", config=config,
                   **kwargs)


@asynccontextmanager
async def master_running(master: HAMaster) -> AsyncIterator[int]:
    """Start ``master`` on a free port; yields the port; stops the master on leaving."""
    port = await master.start()
    try:
        yield port
    finally:
        await master.stop()


@asynccontextmanager
async def slave_running(slave: HASlave) -> AsyncIterator[HASlave]:
    """Start ``slave``; yields it; stops it on leaving."""
    await slave.start()
    try:
        yield slave
    finally:
        await slave.stop()


#: ``scripted_master(auth=...)`` default: authenticate as master 1 with :data:`TEST_SECRET`.
_MASTER_1: Any = object()


@asynccontextmanager
async def scripted_master(
    handler: Callable[[Any, Any], Awaitable[None]], *, auth: HAAuth | None = _MASTER_1,
) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 playing a master with ``handler``; yields its port.

    Each connection first authenticates as master ``auth`` (default broker 1 with
    :data:`TEST_SECRET`; None: the link runs unauthenticated); ``handler`` then reads and
    writes plain frames, sealed and checked underneath (:mod:`rmqha.testing.sealed_script`).
    A connection that does not complete the handshake is closed without calling it."""
    who = auth_for(1) if auth is _MASTER_1 else auth

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if who is None:
            await handler(reader, writer)
            return
        script = ScriptedAuth(who)

        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        try:
            await script.accept(reader.readexactly, send)
        except (asyncio.IncompleteReadError, ConnectionError, AuthenticationError):
            writer.close()  # a slave stopped mid-handshake, or refused this master
            return
        await handler(SealedReader(reader, script), SealedWriter(writer, script))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def read_frames(reader: Any, decoder: Any, got: list[Any], count: int) -> None:
    """Feed ``decoder`` from ``reader`` until ``got`` holds ``count`` frames.

    A slave that closes first raises ConnectionResetError: a read at end of stream returns
    at once, so looping on it would spin without ever yielding to the event loop (a slave
    that reconnects and is stopped before its handshake hung a test that way)."""
    while len(got) < count:
        data = await reader.read(1 << 16)
        if not data:
            raise ConnectionResetError("the slave closed the connection")
        got += decoder.feed(data)


# --- the controller's SyncStateSet rules, in memory ----------------------------------------------



@dataclass
class SlaveReceive:
    """A slave's receive path (:class:`~rmqha.ha.receive.Receiver`) and the state it shares
    with its appender, as :func:`slave_receive` built them."""

    receiver: Receiver
    epochs: EpochWriter
    confirm: ConfirmTracker
    progress: SlaveProgress


def slave_receive(cl: CommitLog, em: EpochMap, config: HAConfig, *, mac: FrameMac | None = None,
                  link: Any = None, master: str = "m") -> SlaveReceive:
    """Broker 2's receive path of framed blocks into ``cl`` / ``em`` from master 1 (epoch 1
    from offset 0), frames checked with ``mac`` when given: what tests and benches of the
    receive path drive by hand, with no HA slave around it."""
    codec = FramedSlave(config.max_frame_bytes)
    if mac is not None:
        codec.authenticate(Proof(mac.peer, mac))
    progress, confirm, epochs = SlaveProgress(), ConfirmTracker(None), EpochWriter(em, 2)
    appender = BlockAppender(cl, epochs, Truncator(cl, em, 2, progress, confirm, None), progress, confirm,
                             DiskFullWatch(2), protocol="framed", master=master, master_pairs=[(1, 0)])
    receiver = Receiver(link, codec, appender, config=config, epochs=epochs, confirm=confirm,
                        progress=progress)
    return SlaveReceive(receiver, epochs, confirm, progress)


class OneReadLink:
    """A link for a slave's reader callback driven by hand: each read hands over what
    ``feed`` holds (then nothing until it is set again); each send is taken whole and kept
    in ``sent``."""

    recv_bytes = 1 << 20

    def __init__(self) -> None:
        self.feed = b""
        self.sent: list[bytes] = []

    def try_recv_into(self, view: memoryview) -> int:
        n = len(self.feed)
        view[:n] = self.feed
        self.feed = b""
        return n

    def try_send(self, buffers: Any) -> list[memoryview]:
        self.sent.append(b"".join(bytes(b) for b in buffers))
        return []

@dataclass
class SyncStateAuthority:
    """What the controller decides for AlterSyncStateSet, for one broker group.

    Fencing as in RocketMQ's ``alterSyncStateSet``: the proposer must be the current master
    with the current master epoch; the new set must contain the master and only registered,
    alive ids; each applied change bumps the set epoch.
    """

    master_id: int
    master_epoch: int = 1
    sync_state_set: set[int] = field(default_factory=set)
    set_epoch: int = 1
    registered: set[int] = field(default_factory=set)
    alive: set[int] | None = None
    history: list[tuple[frozenset[int], int]] = field(default_factory=list)
    #: When set, the next proposal waits for this event (tests hold a change in flight).
    gate: asyncio.Event | None = None

    def __post_init__(self) -> None:
        self.sync_state_set = set(self.sync_state_set) | {self.master_id}
        self.registered = set(self.registered) | self.sync_state_set

    def elect(self, new_master: int) -> tuple[int, int]:
        """A new master: epoch+1, set = {new master}; returns (master epoch, set epoch)."""
        self.master_id = new_master
        self.master_epoch += 1
        self.sync_state_set = {new_master}
        self.set_epoch += 1
        self.registered.add(new_master)
        return self.master_epoch, self.set_epoch

    async def alter(self, master_id: int, master_epoch: int, new_ids: Iterable[int]) -> tuple[list[int], int]:
        if self.gate is not None:
            await self.gate.wait()
        new = set(int(i) for i in new_ids)
        if master_id != self.master_id:
            raise ControllerError(f"2002 invalid master {master_id} (master is {self.master_id})")
        if master_epoch != self.master_epoch:
            raise ControllerError(f"2000 fenced master epoch {master_epoch} (now {self.master_epoch})")
        if new == self.sync_state_set:
            raise ControllerError("2013 the new SyncStateSet equals the old one")
        if master_id not in new:
            raise ControllerError("2013 the new SyncStateSet lacks the master")
        for i in new:
            if i not in self.registered:
                raise ControllerError(f"2003 replica {i} is not registered")
            if self.alive is not None and i not in self.alive:
                raise ControllerError(f"2006 replica {i} is not alive")
        self.sync_state_set = new
        self.set_epoch += 1
        self.history.append((frozenset(new), self.set_epoch))
        return sorted(new), self.set_epoch

    def callback(self, master_id: int, master_epoch: int) -> Callable[[list[int]], Any]:
        """The ``alter_sync_state_set`` callback a broker would give its HAMaster."""

        async def alter_sync_state_set(new_ids: list[int]) -> tuple[list[int], int]:
            return await self.alter(master_id, master_epoch, new_ids)

        return alter_sync_state_set


# --- waiting ----------------------------------------------------------------------------------


def wait_until(pred: Callable[[], bool], timeout: float, what: str = "condition", interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(pred: Callable[[], bool], timeout: float, what: str = "condition",
                           interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


# --- node processes ---------------------------------------------------------------------------


class NodeProcess:
    """One ``python -m rmqha.testing.ha_node`` child; ``args`` are its command-line flags.  Its HA
    links authenticate with ``secret`` (default :data:`TEST_SECRET_TEXT`; None: without)."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, log_path: str | None = None,
                 secret: str | None = TEST_SECRET_TEXT) -> None:
        self.args = args
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        full_env = {**os.environ, **(env or {})}
        full_env.pop(ENV_SECRET, None)
        full_env.pop(ENV_SECRET_FILE, None)
        if secret is not None:
            full_env[ENV_SECRET] = secret
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rmqha.testing.ha_node", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            env=full_env,
        )
        self.ready = self._read_line(timeout=30)
        if self.ready.get("event") != "ready":
            raise RuntimeError(f"node did not start: {self.ready}")
        self.port: int = self.ready["port"]

    def _read_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise TimeoutError(f"node {self.args} said nothing for {timeout}s")
        finally:
            sel.close()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"node exited with {self.proc.wait()}")
        return json.loads(line)

    def command(self, text: str, timeout: float = 30) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        return self._read_line(timeout)

    def status(self) -> dict[str, Any]:
        return self.command("status")

    def write(self, count: int, body_bytes: int) -> dict[str, Any]:
        return self.command(f"write {count} {body_bytes}")

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye (what a crash looks like)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        if self._log is not subprocess.DEVNULL:
            self._log.close()
