"""The HA master's per-message work, in process: one-at-a-time sends, and the ack path alone.

* ``one-at-a-time``: a master and two slaves in this process (one event loop, real sockets
  on loopback, authenticated links, every SyncStateSet member waited for): each round
  appends one 1 KiB message, pushes it (``push_now``), waits for its copies with the
  broker's callback (``when_copies``) and records the latency.  Per step, the master's
  CPU per message (timing wrappers around its push, its ack read and parse, ``on_ack`` and
  ``when_copies``; the slaves' own work is in the same process but not in these steps)
  goes to ``extra_info``, beside p50/p99 and the process CPU per message, for each twin of
  the waiter table (``cython``/``python``) and the heap waiters before it (``heaps``,
  below), their rounds alternating in one run.
* ``ack-path``: no socket: per message, a waiter added and the two members' acks settled,
  as ``SyncService.on_ack`` does it (member acks, waiters, confirm offset), with the
  compiled table, the pure one, and ``heaps``: the code before the table (one heap per
  need, a timer and a callback object per send, the rule asked offset by offset), kept
  here as the baseline.
* ``tls``: the one-at-a-time sends with plaintext and TLS links (both with the cluster
  secret) in alternating rounds, the compiled table only: p50/p99, process CPU per
  message, and per step the CPU of the TLS layer on each side (``master``/``slave``:
  encrypting parts into records, handing ciphertext to the socket, reading and decrypting)
  and of the frame MACs (on plaintext links only, when TLS is on they are dropped), per
  message.  All four processes' work (master, two slaves) runs in this process.
* ``catch-up``: an in-process master and slave (one loop, loopback) moving a pre-written
  log (64 MiB; 16 MiB quick), plaintext and TLS, both with the secret: MB/s.

The machine is usually shared: compare within one run.  Speed is reported, never asserted.
Run: ``RMQHA_BENCH_QUICK=1 .venv/bin/python -m pytest benches/bench_master_push.py --benchmark-only -s``.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from benches.conftest import QUICK, describe
from rmqha._core import load_twin
from rmqha.ha import confirm as hconfirm
from rmqha.ha import connection, dialects, frame_mac, sync_service, tls_link, waiters
from rmqha.ha import offsets as hao
from rmqha.ha.link import Link
from rmqha.ha.sync_state import SyncStateSet
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.testing.ha import (
    CLUSTER,
    GROUP,
    fast_config,
    fill,
    ha_master,
    ha_slave,
    master_running,
    replica_stores,
    slave_running,
    wait_until_async,
)
from rmqha.testing.tls_keys import server_tls

BODY = b"x" * 1024
SENDS = 300 if QUICK else 2000
ROUNDS = 3 if QUICK else 6
ACK_ROUNDS = 2000 if QUICK else 20000

# --- one-at-a-time sends through a master and two slaves --------------------------------------

#: (class, method, step) timed per message on the master.
_STEPS = [
    (connection.SlaveConnection, "push", "push (per slave: blocks, header, MAC, sendmsg)"),
    (dialects.FramedMaster, "block_header", "push: header"),
    (Link, "try_send", "push: sendmsg (and the slaves' ack sends)"),
    (connection.SlaveConnection, "plain_acks", "ack parse + MAC check"),
    (sync_service.SyncService, "on_ack", "on_ack (waiters, confirm offset)"),
]


class _Steps:
    """Timing wrappers around the master's steps (ns per step, summed)."""

    def __init__(self) -> None:
        self.ns: collections.Counter[str] = collections.Counter()
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        for cls, name, step in _STEPS:
            self._saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, self._wrap(cls.__dict__[name], step))

    def remove(self) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)

    def _wrap(self, fn: Callable[..., Any], step: str) -> Callable[..., Any]:
        ns = self.ns
        clock = time.perf_counter_ns

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[step] += clock() - t

        return timed


class _Trio:
    """A master and two slaves of one in-process group, all links up."""

    def __init__(self, tmp: str, tls: dict[int, tls_link.HATls] | None = None) -> None:
        self.tmp = tmp
        self.tls = tls or {}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[tuple[Any, Any]]:
        """Yields the master and its commitlog."""
        cfg = fast_config(all_ack_in_sync_state_set=True, ha_send_heartbeat_interval_ms=1000)
        tls = self.tls
        with replica_stores(self.tmp, 64 << 20, "m", "s2", "s3") as [(mcl, mem), (s2cl, s2em), (s3cl, s3em)]:
            mem.append(1, 0)
            m = ha_master(mcl, mem, cfg, known=(2, 3), sync_state_set=(1, 2, 3), sync_state_set_epoch=1,
                          tls=tls.get(1))
            async with master_running(m) as port, \
                    slave_running(ha_slave(s2cl, s2em, port, cfg, broker_id=2, tls=tls.get(2))), \
                    slave_running(ha_slave(s3cl, s3em, port, cfg, broker_id=3, tls=tls.get(3))):
                await wait_until_async(lambda: len(m.sync.links) == 2, 10, "two slave links")
                yield m, mcl


async def _one(m: Any, mcl: Any, steps: _Steps, lat: list[int]) -> None:
    """One message appended, pushed and waited for with its three copies."""
    fut = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter_ns()
    mcl.append_batch("bench", [BODY])
    m.sync.push_now()
    t1 = time.perf_counter_ns()
    m.sync.when_copies(mcl.max_offset, 3.0, fut.set_result)
    steps.ns["when_copies"] += time.perf_counter_ns() - t1
    assert await fut
    lat.append(time.perf_counter_ns() - t0)


async def _round(m: Any, mcl: Any, steps: _Steps, row: dict[str, float]) -> None:
    """SENDS messages one at a time; their figures added to ``row`` (over ROUNDS)."""
    lat: list[int] = []
    steps.ns.clear()
    cpu = time.process_time()
    for _ in range(SENDS):
        await _one(m, mcl, steps, lat)
    cpu = time.process_time() - cpu
    row["p50_us"] += statistics.median(lat) / 1e3 / ROUNDS
    row["p99_us"] += statistics.quantiles(lat, n=100)[98] / 1e3 / ROUNDS
    row["cpu_us_per_msg"] += cpu * 1e6 / SENDS / ROUNDS
    for step, ns in steps.ns.items():
        row[step] += ns / 1e3 / SENDS / ROUNDS


async def _sends(tmp: str, twins: list[str], steps: _Steps) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    async with _Trio(tmp).running() as (m, mcl):
        svc = m.sync
        loop = asyncio.get_running_loop()
        for _ in range(200):
            await _one(m, mcl, steps, [])
        for r in range(ROUNDS):
            for twin in twins if r % 2 == 0 else twins[::-1]:
                svc.waiters = (_HeapAdapter(loop, svc.rule) if twin == "heaps"
                               else waiters.AckWaiters(load_twin("ack_table", twin)))
                await _round(m, mcl, steps, out.setdefault(twin, collections.defaultdict(float)))
        # The master's stop fails what still waits: the heap baseline has no fail_all.
        svc.waiters = waiters.AckWaiters()
    return out


@pytest.mark.benchmark(group="master-push-one-at-a-time")
def test_one_at_a_time_sends(benchmark: Any) -> None:
    """Per-message latency and master CPU per step, the waiter table's twins alternating
    round by round in one run (the benchmark's time is the whole run; the figures are in
    ``extra_info``, ``<twin>.<figure>``)."""
    steps = _Steps()
    results: dict[str, dict[str, float]] = {}

    def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            results.update(asyncio.run(_sends(tmp, ["cython", "python", "heaps"], steps)))

    steps.install()
    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        steps.remove()
    describe(benchmark, "cython+python+heaps", message_bytes=len(BODY), batch=1, replicas=3, authenticated=True)
    for twin, row in results.items():
        for k, v in row.items():
            benchmark.extra_info[f"{twin}.{k}"] = round(v, 2)
        print(f"\n{twin}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(row.items())))


# --- over TLS ----------------------------------------------------------------------------------

#: (class, method, step) timed per message over TLS, per side (the stream's server side is
#: the master): the TLS layer's own work, and the frame MACs.
_TLS_STEPS = [
    (tls_link._TlsStream, "_seal", "tls seal (encrypt parts into records)"),
    (tls_link._TlsStream, "flush", "tls flush (ciphertext to the socket)"),
    (tls_link._TlsStream, "recv_into", "tls recv_into (socket read, decrypt, settle)"),
    (tls_link._TlsStream, "recvmsg_into", "tls recvmsg_into (socket read, decrypt, settle)"),
    (tls_link._TlsStream, "recv", "tls recv (socket read, decrypt, settle)"),
    (frame_mac.FrameMac, "block_tag", "mac: block tag (master)"),
    (frame_mac.FrameMac, "check_frames", "mac: ack checks (master)"),
    (frame_mac.FrameMac, "check_run", "mac: block checks (slave)"),
    (frame_mac.FrameMac, "seal", "mac: ack seal (slave)"),
]


class _SideSteps(_Steps):
    """:class:`_Steps` for :data:`_TLS_STEPS`, a TLS stream's steps named by its side."""

    def install(self) -> None:
        for cls, name, step in _TLS_STEPS:
            self._saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, self._wrap(cls.__dict__[name], step))

    def _wrap(self, fn: Callable[..., Any], step: str) -> Callable[..., Any]:
        ns = self.ns
        clock = time.perf_counter_ns

        @functools.wraps(fn)
        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            name = step
            if isinstance(obj, tls_link._TlsStream):
                name = f"{'master' if obj.tls.server_side else 'slave'}: {step}"
            t = clock()
            try:
                return fn(obj, *args, **kwargs)
            finally:
                ns[name] += clock() - t

        return timed


def group_tls(pki: Path) -> dict[int, tls_link.HATls]:
    """Brokers 1-3's HA TLS from ``pki`` (made with :func:`make_pki`)."""
    out = {}
    for i in (1, 2, 3):
        tls = tls_link.HATls.from_settings(server_tls(pki, Identity.broker(CLUSTER, GROUP, f"b{i}")), CLUSTER, GROUP)
        assert tls is not None
        out[i] = tls
    return out


def make_pki(directory: Path) -> Path:
    """A CA and the certificates of brokers b1-b3 of group ``g``."""
    certs.dev_cluster(directory, cluster=CLUSTER, controllers=0, groups={GROUP: 0}, namesrv=0)
    for i in (1, 2, 3):
        certs.issue(directory, Identity.broker(CLUSTER, GROUP, f"b{i}"))
    return directory


async def _tls_sends(tmp: Path, steps: _Steps) -> dict[str, dict[str, float]]:
    """Plaintext and TLS trios, rounds alternating between them."""
    out: dict[str, dict[str, float]] = {}
    tls = group_tls(make_pki(tmp / "pki"))
    async with _Trio(str(tmp / "plain")).running() as plain, \
            _Trio(str(tmp / "tls"), tls).running() as secured:
        trios = {"plaintext": plain, "tls": secured}
        for m, mcl in trios.values():
            for _ in range(200):
                await _one(m, mcl, steps, [])
        for r in range(ROUNDS):
            for name in ("plaintext", "tls") if r % 2 == 0 else ("tls", "plaintext"):
                m, mcl = trios[name]
                await _round(m, mcl, steps, out.setdefault(name, collections.defaultdict(float)))
    return out


@pytest.mark.benchmark(group="master-push-tls")
def test_one_at_a_time_sends_plaintext_vs_tls(benchmark: Any) -> None:
    """Per-message latency and CPU per step, plaintext and TLS links (figures in
    ``extra_info``, ``<plaintext|tls>.<figure>``)."""
    steps = _SideSteps()
    results: dict[str, dict[str, float]] = {}

    def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            results.update(asyncio.run(_tls_sends(Path(tmp), steps)))

    steps.install()
    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        steps.remove()
    describe(benchmark, "plaintext+tls", message_bytes=len(BODY), batch=1, replicas=3, authenticated=True)
    report(benchmark, results)


def report(benchmark: Any, results: dict[str, dict[str, float]]) -> None:
    for name, row in results.items():
        for k, v in row.items():
            benchmark.extra_info[f"{name}.{k}"] = round(v, 2)
        print(f"\n{name}:\n  " + "\n  ".join(f"{k}: {v:.1f}" for k, v in sorted(row.items())))


CATCHUP_BYTES = (16 if QUICK else 64) << 20


async def _catch_up(tmp: Path, tls: dict[int, tls_link.HATls] | None) -> float:
    """Seconds an empty slave takes to copy the master's CATCHUP_BYTES, in this process."""
    cfg = fast_config(ha_send_heartbeat_interval_ms=1000)
    tls = tls or {}
    with replica_stores(tmp, 64 << 20, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, CATCHUP_BYTES, body_size=1000, batch=1024)
        m = ha_master(mcl, mem, cfg, sync_state_set=(1, 2), sync_state_set_epoch=1, tls=tls.get(1))
        async with master_running(m) as port:
            t0 = time.perf_counter()
            async with slave_running(ha_slave(scl, sem, port, cfg, tls=tls.get(2))):
                await wait_until_async(lambda: scl.max_offset >= mcl.max_offset, 120, "catch-up", interval=0.002)
                return time.perf_counter() - t0


@pytest.mark.benchmark(group="replication-catchup-in-process")
@pytest.mark.parametrize("secured", [False, True], ids=["plaintext", "tls"])
def test_catch_up_in_process(benchmark: Any, tmp_path: Path, secured: bool) -> None:
    """One catch-up of CATCHUP_BYTES, master and slave on one loop (MB/s in extra_info)."""
    tls = group_tls(make_pki(tmp_path / "pki")) if secured else None
    runs = iter(range(1000))

    def one() -> float:
        return asyncio.run(_catch_up(tmp_path / f"run{next(runs)}", tls))

    seconds = benchmark.pedantic(one, rounds=2, iterations=1)
    describe(benchmark, "tls" if secured else "plaintext", message_bytes=1024, batch=1, replicas=2,
             authenticated=True, mb_per_s=round(CATCHUP_BYTES / seconds / 1e6, 1))
    print(f"\ncatch-up in process ({'tls' if secured else 'plaintext'}): {seconds:.3f} s, "
          f"{CATCHUP_BYTES / seconds / 1e6:.0f} MB/s")


# --- the ack path alone -----------------------------------------------------------------------


class _HeapWaiters:
    """The waiters before the table (the baseline): one heap per need, a timer and a
    callback object per send, the rule asked offset by offset."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heaps: dict[int | None, list[Any]] = {}
        self._seq = 0

    def call_when(self, offset: int, need: int | None, done: Callable[[bool], None], timeout: float) -> None:
        waiter = _Callback(done)
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(need, []), (offset, self._seq, waiter))
        waiter.timer = self._loop.call_later(timeout, waiter.set_result, False)

    def check(self, reached: Callable[[int, int | None], bool]) -> None:
        for need, heap in self._heaps.items():
            while heap:
                offset, _, waiter = heap[0]
                if waiter.fired:
                    heapq.heappop(heap)
                    continue
                if not reached(offset, need):
                    break
                heapq.heappop(heap)
                waiter.set_result(True)


class _Callback:
    __slots__ = ("done", "fired", "timer")

    def __init__(self, done: Callable[[bool], None]) -> None:
        self.done = done
        self.fired = False
        self.timer: asyncio.TimerHandle | None = None

    def set_result(self, ok: bool) -> None:
        if not self.fired:
            self.fired = True
            if self.timer is not None:
                self.timer.cancel()
            self.done(ok)


class _Conn:
    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.ack = 0


class _HeapAdapter(_HeapWaiters):
    """The baseline behind SyncService's calls (its waiters' interface)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rule: hconfirm.ConfirmRule) -> None:
        super().__init__(loop)
        self._rule = rule

    def call_when(self, loop: Any, offset: int, need: int | None,  # type: ignore[override]
                  done: Callable[[bool], None], timeout: float) -> None:
        super().call_when(offset, need, done, timeout)

    def settle(self, acks: Any, floor: int, max_offset: int) -> int:
        rule = self._rule
        members = rule._set.members
        self.check(lambda o, need: _heap_reached(rule, rule._acks, members, o, need, max_offset))
        return 0


def _heap_reached(rule: hconfirm.ConfirmRule, acks: Any, members: Any, offset: int, need: int | None,
                  max_offset: int) -> bool:
    """ConfirmRule.reached as it was (a walk of the members per offset asked)."""
    if offset > max_offset:
        return False
    count = 1 + sum(1 for m in members() if m != 1 and acks.ack_of(m) >= offset)
    if need is not None:
        return count >= max(need, rule.floor)
    return all(acks.ack_of(m) >= offset for m in members() if m != 1) and (rule.floor <= 1 or count >= rule.floor)


@pytest.mark.benchmark(group="master-ack-path")
@pytest.mark.parametrize("impl", ["cython", "python", "heaps"])
def test_ack_path(benchmark: Any, impl: str) -> None:
    """One message's waiter and the two acks that release it, as on_ack settles them."""
    from rmqha.ha.link_table import LinkTable

    describe(benchmark, impl, message_bytes=len(BODY), batch=1, replicas=3)
    loop = asyncio.new_event_loop()
    table: LinkTable[Any] = LinkTable()
    conns = [_Conn(2), _Conn(3)]
    for c in conns:
        table.claim(c)
    state = SyncStateSet(1, [1, 2, 3], epoch=1, now_ms=0)
    rule = hconfirm.ConfirmRule(1, state, table, 1)
    answered = [0]

    def done(ok: bool) -> None:
        answered[0] += ok

    offset = [0]
    if impl == "heaps":
        heaps = _HeapWaiters(loop)

        def message() -> None:
            offset[0] += 1000
            end = offset[0]
            heaps.call_when(end, None, done, 3.0)
            for c in conns:
                c.ack = end
                heaps.check(lambda o, need: _heap_reached(rule, table, state.members, o, need, end))
                hao.confirm_offset(end, [table.ack_of(m) for m in state.members() if m != 1], 0)
    else:
        w = waiters.AckWaiters(load_twin("ack_table", impl))

        def message() -> None:
            offset[0] += 1000
            end = offset[0]
            w.call_when(loop, end, None, done, 3.0)
            for c in conns:
                c.ack = end
                acks = rule.member_acks()
                w.settle(acks, rule.floor, end)
                rule.next_confirm(end, 0, acks)

    try:
        benchmark.pedantic(message, rounds=ACK_ROUNDS, iterations=1, warmup_rounds=100)
    finally:
        loop.close()
    assert answered[0] == offset[0] // 1000
