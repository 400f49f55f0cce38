"""HA replication on loopback: catch-up throughput against raw TCP, and replication lag.

* ``tcp-raw``: one Python process ``sendall``s 1 MiB chunks to this one, which
  ``recv_into``s a reusable buffer: the ceiling for any Python replication on this machine.
* ``catch-up``: an empty HASlave in this process replicates a pre-written log of 1 KiB
  records (1 GiB; 128 MiB with ``RMQHA_BENCH_QUICK=1``) from an HAMaster in its own
  process (``python -m rmqha.testing.ha_node``), until byte-for-byte caught up, with the HA
  settings a broker really runs (``HAConfig.from_object(BrokerConfig())``: its
  ``ha_transfer_batch_bytes``) and, beside it, with 256 KiB blocks.
  ``extra_info["ratio_vs_tcp_raw"]`` compares it with the raw figure of the same run
  (target: at least 0.5).
* ``lag``: the master process appends single 1 KiB messages at a steady rate, each body
  stamped with ``time.monotonic_ns()``; the slave here notes when each record's end
  arrived (commitlog append listener).  p50/p99/max in ms go to ``extra_info``.
* ``slave-apply-read``: the slave's CPU for one read of live blocks in this process, no
  socket (tags, checks, appends, the sealed ack): the compiled one-call run of each twin
  against the general path every block took before it, 1 and 32 blocks a read.
* ``slave-live-step``: the whole reader callback for a lone block (live traffic, one block
  a read) in this process, its socket a stand-in: the read, the run of one, the ack sent.

With ``RMQHA_BENCH_HA_SECRET=1`` both sides hold a cluster secret: the links authenticate
and every frame carries a MAC (``extra_info["authenticated"]``); otherwise they run without.

Speed is reported, never asserted.  Run: ``RMQHA_BENCH_QUICK=1 .venv/bin/python -m pytest
benches/bench_replication.py --benchmark-only -s``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import bisect
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from benches.conftest import QUICK, describe
from rmqha import core_implementation
from rmqha.broker.config import BrokerConfig
from rmqha.ha import HAConfig, HASlave
from rmqha.testing.ha import TEST_SECRET_TEXT, NodeProcess, auth_for, fill, open_store, wait_until_async

LOG_BYTES = (128 if QUICK else 1024) << 20
SEG = (64 if QUICK else 256) << 20
ROUNDS = 3
LAG_RATE = 2000 if QUICK else 5000  # messages per second
LAG_SECONDS = 2.0 if QUICK else 10.0
MESSAGE_BYTES = 1024
#: What a broker runs (its config's HA fields, not HAConfig's own defaults).
CFG = HAConfig.from_object(BrokerConfig())
#: Master block sizes the catch-up runs with: the broker's and 256 KiB.
CATCHUP_BATCHES = sorted({CFG.ha_transfer_batch_bytes, 256 << 10})
#: Authenticated links (the master node gets the secret, the slave here its identity).
AUTH = os.environ.get("RMQHA_BENCH_HA_SECRET", "") not in ("", "0")
NODE_SECRET = TEST_SECRET_TEXT if AUTH else None
SLAVE_AUTH = auth_for(2) if AUTH else None

_results: dict[str, float] = {}

_SENDER = r"""
import socket, sys
port, total = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
s.recv(1)  # wait for "go" so process start-up is not timed
buf = memoryview(bytes(1 << 20))
left = total
while left:
    n = min(left, len(buf))
    s.sendall(buf[:n])
    left -= n
s.close()
"""


@pytest.fixture(scope="module", params=CATCHUP_BATCHES, ids=lambda b: f"block-{b >> 10}KiB")
def master_node(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    batch = request.param
    d = str(tmp_path_factory.mktemp("ha-bench-master"))
    cl, em = open_store(d, SEG)
    em.append(1, 0)
    fill(cl, LOG_BYTES, body_size=MESSAGE_BYTES - 100, batch=1024)  # ~1 KiB records
    max_offset = cl.max_offset
    cl.close()
    node = NodeProcess(["--dir", d, "--role", "master", "--broker-id", "1", "--segment-bytes", str(SEG),
                        "--known", "2", "--batch-bytes", str(batch)], secret=NODE_SECRET)
    try:
        yield node, max_offset, batch
    finally:
        node.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.benchmark(group="replication-catchup")
def test_raw_loopback_tcp(benchmark: Any) -> None:
    total = LOG_BYTES
    procs: list[subprocess.Popen[bytes]] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        proc = subprocess.Popen([sys.executable, "-c", _SENDER, str(lsock.getsockname()[1]), str(total)])
        procs.append(proc)
        conn, _ = lsock.accept()
        lsock.close()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        return (conn,), {}

    buf = bytearray(1 << 20)
    view = memoryview(buf)

    def receive(conn: socket.socket) -> int:
        conn.sendall(b"g")
        got = 0
        while got < total:
            n = conn.recv_into(view)
            if not n:
                break
            got += n
        conn.close()
        return got

    try:
        got = benchmark.pedantic(receive, setup=setup, rounds=ROUNDS, iterations=1)
    finally:
        for p in procs:
            p.wait(timeout=30)
    assert got == total
    mbps = total / benchmark.stats.stats.min / 1e6
    _results["tcp_raw_mb_s"] = mbps
    describe(benchmark, "tcp-raw", message_bytes=MESSAGE_BYTES, batch=1 << 20, replicas=2,
             bytes=total, mb_per_s=round(mbps, 1))
    print(f"\nraw loopback TCP: {mbps:.0f} MB/s (best of {ROUNDS})")


@pytest.mark.benchmark(group="replication-catchup")
def test_slave_catch_up(benchmark: Any, master_node: Any) -> None:
    node, max_offset, batch = master_node
    cfg = dataclasses.replace(CFG, ha_transfer_batch_bytes=batch)
    dirs: list[str] = []
    stores: list[Any] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        while stores:
            stores.pop().close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        d = tempfile.mkdtemp(prefix="ha-bench-slave-")
        dirs.append(d)
        cl, em = open_store(d, SEG)
        cl.wait_prefaulted(30)
        stores.append(cl)
        return (cl, em), {}

    def catch_up(cl: Any, em: Any) -> int:
        async def run() -> None:
            s = HASlave(cl, em, group="g", broker_id=2, master_ha_address=f"127.0.0.1:{node.port}", config=cfg,
                        auth=SLAVE_AUTH)
            await s.start()
            try:
                await wait_until_async(lambda: cl.max_offset >= max_offset, 600, "catch-up", interval=0.002)
            finally:
                await s.stop()

        asyncio.run(run())
        return cl.max_offset

    try:
        got = benchmark.pedantic(catch_up, setup=setup, rounds=ROUNDS, iterations=1)
    finally:
        while stores:
            stores.pop().close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert got == max_offset
    mbps = max_offset / benchmark.stats.stats.min / 1e6
    raw = _results.get("tcp_raw_mb_s")
    ratio = mbps / raw if raw else None
    describe(benchmark, core_implementation(), message_bytes=MESSAGE_BYTES, batch=batch,
             replicas=2, bytes=max_offset, mb_per_s=round(mbps, 1),
             broker_default=batch == CFG.ha_transfer_batch_bytes, authenticated=AUTH,
             ratio_vs_tcp_raw=round(ratio, 3) if ratio else None)
    print(f"\ncatch-up with {batch >> 10} KiB blocks{' (authenticated)' if AUTH else ''}: {mbps:.0f} MB/s "
          f"(best of {ROUNDS})"
          + (f", {ratio:.0%} of raw loopback TCP ({raw:.0f} MB/s)" if ratio else ""))


@pytest.mark.benchmark(group="replication-lag")
def test_replication_lag_under_steady_load(benchmark: Any, tmp_path: Any) -> None:
    mdir, sdir = str(tmp_path / "m"), str(tmp_path / "s")
    cl, em = open_store(mdir, SEG)
    em.append(1, 0)
    cl.close()
    node = NodeProcess(["--dir", mdir, "--role", "master", "--broker-id", "1", "--segment-bytes", str(SEG),
                        "--known", "2"], secret=NODE_SECRET)
    scl, sem = open_store(sdir, SEG)
    arrivals: list[tuple[int, int]] = []  # (max offset, monotonic ns) as blocks land
    scl.add_append_listener(lambda mx: arrivals.append((mx, time.monotonic_ns())))

    def run_load() -> int:
        async def run() -> int:
            s = HASlave(scl, sem, group="g", broker_id=2, master_ha_address=f"127.0.0.1:{node.port}", config=CFG,
                        auth=SLAVE_AUTH)
            await s.start()
            try:
                loop = asyncio.get_running_loop()
                st = await loop.run_in_executor(None, lambda: node.command(
                    f"produce {LAG_RATE} {LAG_SECONDS} {MESSAGE_BYTES}", timeout=LAG_SECONDS * 5 + 30))
                await wait_until_async(lambda: scl.max_offset >= st["max_offset"], 30, "slave drained")
                return int(st["max_offset"])
            finally:
                await s.stop()

        return asyncio.run(run())

    try:
        end = benchmark.pedantic(run_load, rounds=1, iterations=1)
        ends = [a for a, _ in arrivals]
        lags_ms: list[float] = []
        for msg in scl.iter_messages(0):
            (sent_ns,) = struct.unpack_from(">q", msg.body, 0)
            i = bisect.bisect_left(ends, msg.physical_offset + msg.size)
            lags_ms.append((arrivals[i][1] - sent_ns) / 1e6)
    finally:
        node.stop()
        scl.close()
    assert scl.max_offset == end and len(lags_ms) == int(LAG_RATE * LAG_SECONDS)
    q = statistics.quantiles(lags_ms, n=100)
    p50, p99 = q[49], q[98]
    describe(benchmark, core_implementation(), message_bytes=MESSAGE_BYTES, batch=1, replicas=2,
             rate_per_s=LAG_RATE, seconds=LAG_SECONDS, authenticated=AUTH, lag_p50_ms=round(p50, 3),
             lag_p99_ms=round(p99, 3), lag_max_ms=round(max(lags_ms), 3))
    print(f"\nreplication lag at {LAG_RATE} x {MESSAGE_BYTES} B/s: p50 {p50:.3f} ms, p99 {p99:.3f} ms, "
          f"max {max(lags_ms):.3f} ms over {len(lags_ms)} messages")


# --- the slave's CPU per read of live blocks ---------------------------------------------------

#: Reads the per-read benchmark applies (each of APPLY_BLOCKS blocks of one 1 KiB record).
APPLY_ROUNDS = 50 if QUICK else 300


def _link_macs() -> tuple[Any, Any]:
    """A master's and a slave's FrameMac of one link, keyed as a handshake would leave them
    (fresh keys; the sealer of each direction matches the other side's opener)."""
    from rmqha.ha.frame_mac import FrameMac
    from rmqha.security.identity import Identity
    from rmqha.security.link_auth import FrameOpener, FrameSealer, LinkSession

    m2s, s2m, blocks_m2s, blocks_s2m = (os.urandom(32) for _ in range(4))
    peer = Identity.broker("DefaultCluster", "g", "1")
    master = FrameMac(LinkSession(peer, FrameSealer(m2s, b"M"), FrameOpener(s2m, b"S")), blocks_m2s, blocks_s2m)
    slave = FrameMac(LinkSession(peer, FrameSealer(s2m, b"S"), FrameOpener(m2s, b"M")), blocks_s2m, blocks_m2s)
    return master, slave


@pytest.mark.benchmark(group="replication-slave-apply-read")
@pytest.mark.parametrize("authenticated", [True, False], ids=["mac", "no-mac"])
@pytest.mark.parametrize("blocks", [1, 32], ids=lambda n: f"{n}-blocks")
@pytest.mark.parametrize("path", ["cython", "python", "general"])
def test_slave_apply_read(benchmark: Any, tmp_path: Any, monkeypatch: Any, path: str, blocks: int,
                          authenticated: bool) -> None:
    """The slave's work for one read of live blocks, in process (no socket): the blocks'
    tags, their checks and appends, and the ack frame (sealed).  ``cython``/``python``: the
    one-call run of that twin (``frames.scan_transfer_run``); ``general``: the path every
    frame took before it (one Block and one check per block).  Per-block CPU is the time
    over ``extra_info["blocks_per_read"]``."""
    from rmqha._core import load_twin
    from rmqha.ha import receive
    from rmqha.ha.link import RecvBuffer
    from rmqha.testing.ha import replica_stores, slave_receive

    describe(benchmark, path, message_bytes=MESSAGE_BYTES, batch=blocks, replicas=2)
    benchmark.extra_info["blocks_per_read"] = blocks
    benchmark.extra_info["authenticated"] = authenticated
    if path != "general":
        monkeypatch.setattr(receive, "_scan_run", load_twin("frames", path).scan_transfer_run)
    with replica_stores(tmp_path, 64 << 20, "s", "ref") as [(scl, sem), (rcl, _)]:
        sem.append(1, 0)
        records = []
        for i in range(APPLY_ROUNDS * blocks + 1):
            start = rcl.max_offset
            rcl.append_batch("bench", [bytes([i & 0xFF]) * MESSAGE_BYTES])
            records.append((start, rcl.max_offset - start))
        master_mac, slave_mac = _link_macs() if authenticated else (None, None)
        slave = slave_receive(scl, sem, CFG, mac=slave_mac, master="bench")
        receiver, epochs = slave.receiver, slave.epochs
        if path == "general":
            monkeypatch.setattr(receiver, "_apply_run", lambda rb: None)
        rb = RecvBuffer(1 << 20)
        taken = iter(range(0, APPLY_ROUNDS * blocks, blocks))

        def a_read() -> tuple[tuple[Any, ...], dict[str, Any]]:
            first = next(taken)
            pos = rb.start = rb.end = 0
            for offset, size in records[first : first + blocks]:
                data = rcl.read(offset, size)
                header = load_twin("frames", "python").pack_transfer_header(offset, 0, offset, size, 1)
                tag = master_mac.block_tag(header, data) if master_mac is not None else b""
                for part in (header, data, tag):
                    rb.buf[pos : pos + len(part)] = part
                    pos += len(part)
            rb.end = pos
            return (), {}

        reads = [0]

        def apply_and_ack() -> bytes:
            reads[0] += 1
            applied, partial = receiver._apply_buffered(rb)
            assert (applied, partial, rb.pending) == (blocks, 0, 0)
            return receiver._ack_frame(scl.max_offset)

        benchmark.pedantic(apply_and_ack, setup=a_read, rounds=APPLY_ROUNDS, iterations=1, warmup_rounds=0)
        assert scl.max_offset == records[reads[0] * blocks][0]
        epochs.close()


@pytest.mark.benchmark(group="replication-slave-live-step")
@pytest.mark.parametrize("authenticated", [True, False], ids=["mac", "no-mac"])
@pytest.mark.parametrize("path", ["cython", "python", "general"])
def test_slave_live_step(benchmark: Any, tmp_path: Any, monkeypatch: Any, path: str, authenticated: bool) -> None:
    """The slave's reader callback (``Receiver._live_step``) for one lone block a call: the
    read, the block's tag, check and append, the ack built, sealed and sent.  ``general``:
    the path every frame took before the run (a Block and a check each); ``no-mac`` is what
    a TLS link's slave does above its TLS layer (frames bare)."""
    from rmqha._core import load_twin
    from rmqha.ha import receive
    from rmqha.ha.link import RecvBuffer
    from rmqha.testing.ha import OneReadLink, replica_stores, slave_receive

    describe(benchmark, path, message_bytes=MESSAGE_BYTES, batch=1, replicas=2)
    benchmark.extra_info["authenticated"] = authenticated
    if path != "general":
        monkeypatch.setattr(receive, "_scan_run", load_twin("frames", path).scan_transfer_run)
    with replica_stores(tmp_path, 64 << 20, "s", "ref") as [(scl, sem), (rcl, _)]:
        sem.append(1, 0)
        master_mac, slave_mac = _link_macs() if authenticated else (None, None)
        pack = load_twin("frames", "python").pack_transfer_header
        frames, starts = [], []
        for i in range(APPLY_ROUNDS + 1):
            start = rcl.max_offset
            starts.append(start)
            rcl.append_batch("bench", [bytes([i & 0xFF]) * MESSAGE_BYTES])
            data = rcl.read(start, rcl.max_offset - start)
            header = pack(start, 0, start, len(data), 1)
            frames.append(header + data + (master_mac.block_tag(header, data) if master_mac is not None else b""))
        link = OneReadLink()
        slave = slave_receive(scl, sem, CFG, mac=slave_mac, link=link, master="bench")
        receiver, epochs = slave.receiver, slave.epochs
        receiver._unsent_ack = []
        if path == "general":
            monkeypatch.setattr(receiver, "_apply_run", lambda rb: None)
        rb = RecvBuffer(1 << 20)
        step = receiver._live_step
        taken = iter(frames)

        def a_read() -> tuple[tuple[Any, ...], dict[str, Any]]:
            link.feed = next(taken)
            return (), {}

        benchmark.pedantic(lambda: step(rb), setup=a_read, rounds=APPLY_ROUNDS, iterations=1, warmup_rounds=0)
        assert len(link.sent) == APPLY_ROUNDS and scl.max_offset == starts[APPLY_ROUNDS]
        epochs.close()
