"""The HA slave's live path: blocks that arrive while the stream is paused are applied and
acknowledged by a reader callback in the loop turn that finds them, not by a task.

A scripted master (raw sockets on 127.0.0.1, real frames from rmqha.ha.frames, real records
from a reference store with the slave's history, the link authenticated and every frame
sealed as a real master's) drives a real HASlave.  Each test checks
which path applied the blocks (the slave's counters), what the master received, and the
store byte for byte:

- blocks sent one at a time are all applied and acked by the callback, and on_confirm
  hears of a confirm offset only once the ack that follows it is in the master's socket;
- a bad frame arriving in callback mode ends the session as on the task's path (same
  reason, same log line), stores nothing, and the slave reconnects;
- a large block arriving in callback mode is handed to the task and received straight into
  the log; a small block right behind it is acked without waiting for more data, and the
  callback takes the blocks after it;
- a block opening a new epoch: the task acks it, once the entry is on disk;
- an ack the socket cannot take: the task finishes it and the ack stream stays whole;
- heartbeat acks go out while no data arrives.
"""
from __future__ import annotations

import array
import asyncio
import dataclasses
import fcntl
import logging
import os
import socket
import struct
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from rmqha.ha import frames
from rmqha.ha.frames import Direction
from rmqha.ha import link as ha_link
from rmqha.ha.frame_mac import TAG
from rmqha.testing.ha import (auth_for, store_digest, EPOCH_FILE, assert_same_log, fast_config, fill, ha_master, ha_slave,
                              master_running, replica_stores, slave_running, wait_until_async)
from rmqha.testing.sealed_script import ScriptedAuth
from rmqha.store import CommitLog, EpochMap

import needs

SEG = 1 << 20
#: Heartbeats rare enough that none falls inside a test's traffic (each one briefly hands
#: the link back to the task, which could then read a block itself).
CFG = fast_config(ha_send_heartbeat_interval_ms=2000, ha_housekeeping_interval_ms=5000,
                  ha_reconnect_min_ms=50, max_frame_bytes=1 << 20, ha_slave_compiled_lane=False)
#: The tests that hold for both paths run with the compiled lane too (rmqha.ha.slave_lane);
#: the rest watch the Python path's own mechanics, so CFG keeps the lane off.
LANES = [pytest.param(False, id="python"),
         pytest.param(True, id="lane", marks=needs.compiled_lane())]


def _cfg(lane: bool, **changes: Any) -> Any:
    return dataclasses.replace(CFG, ha_slave_compiled_lane=lane, **changes)


def _live(s: Any) -> int:
    """Blocks the live path took: the reader callback's, or the compiled lane's."""
    return s.callback_blocks + s.lane_blocks
ACK_BYTES = 32 + TAG  # a framed TRANSFER_ACK (24-byte envelope + offset) and its tag
DEADLINE = 5.0


def _block(offset: int, data: bytes, epoch: int = 1, epoch_start: int = 0, confirm: int = 0) -> bytes:
    return frames.pack_transfer_header(offset, epoch_start, confirm, len(data), epoch) + data



def _queued(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue."""
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return buf[0]


@contextmanager
def _replica(tmp_path: Any) -> Iterator[tuple[CommitLog, EpochMap, CommitLog]]:
    """The slave's store (epoch 1 from 0) and a reference log with the same history, whose
    further records are the valid continuation the scripted master sends."""
    with replica_stores(tmp_path, SEG, "s", "ref") as [(scl, sem), (rcl, _)]:
        sem.append(1, 0)
        fill(scl, 100_000)
        fill(rcl, 100_000)
        assert scl.max_offset == rcl.max_offset
        yield scl, sem, rcl


def _records(rcl: CommitLog, count: int, body: int = 300) -> list[tuple[int, bytes]]:
    """``count`` single records appended to the reference log: (offset, bytes) each."""
    out = []
    for i in range(count):
        start = rcl.max_offset
        rcl.append_batch("live", [bytes([i & 0xFF]) * body])
        out.append((start, bytes(rcl.read(start, rcl.max_offset - start))))
    return out


class ScriptedMaster:
    """A framed master played over raw sockets: the handshake (epoch 1 from 0, max offset
    ``end``), then whatever the test sends; every ack the slave sends is recorded.  While
    ``reading`` is clear, acks stay in the kernel's buffers (no stream reads ahead)."""

    def __init__(self, end: int, rcvbuf: int | None = None) -> None:
        self.end = end
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # Before listen: accepted sockets inherit it, and their window is sized by it.
            self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(4)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.conn: socket.socket | None = None
        self.sessions = 0
        self.transferring = False
        self.truncated_at: list[int] = []
        self.acks: list[int] = []
        #: What the slave sent once the transfer started, tags checked and removed, and
        #: those bytes decoded: they must re-encode to exactly the same bytes.
        self.ack_bytes = bytearray()
        self.ack_frames: list[Any] = []
        self.reading = asyncio.Event()
        self.reading.set()
        self._task: asyncio.Task[None] | None = None
        #: The authenticated link's sealing and checking, per session.
        self.script = ScriptedAuth(auth_for(1), CFG.max_frame_bytes)

    async def __aenter__(self) -> ScriptedMaster:
        self._task = asyncio.ensure_future(self._serve())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        failed = self._task.done() and not self._task.cancelled() and self._task.exception()
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, ConnectionError):
            pass
        if self.conn is not None:
            self.conn.close()
        self.server.close()
        if failed:
            raise failed

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.server)
            if self.conn is not None:
                self.conn.close()
            self.conn = conn
            self.sessions += 1
            self.transferring = False
            try:
                await self._session(loop, conn)
            except ConnectionError:
                pass  # the slave closed this link; it comes back on a new one

    async def _session(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        dec = frames.FramedDecoder(Direction.SLAVE_TO_MASTER, 1 << 20)
        got: list[Any] = []
        script = self.script = ScriptedAuth(auth_for(1), CFG.max_frame_bytes)

        async def recv_exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = await loop.sock_recv(conn, n - len(data))
                if not chunk:
                    raise ConnectionResetError("the slave closed the link")
                data += chunk
            return data

        async def until(count: int) -> None:
            while len(got) < count:
                data = await loop.sock_recv(conn, 1 << 16)
                if not data:
                    raise ConnectionResetError("the slave closed the link")
                got.extend(dec.feed(script.unseal(data)))

        await script.accept(recv_exactly, lambda data: loop.sock_sendall(conn, data))
        await until(1)
        await self.send(frames.framed.encode(frames.HandshakeMaster(0, self.end, 1)))
        await until(2)
        await self.send(frames.framed.encode(frames.ReturnEpoch(((1, 0, self.end),))))
        await until(3)
        assert isinstance(got[2], frames.ConfirmTruncate)
        self.truncated_at.append(got[2].offset)
        # The slave acks its log end right after confirming: it may share that read.
        for f in got[3:]:
            assert isinstance(f, frames.TransferAck), f
            self.acks.append(f.slave_max_offset)
        self.transferring = True
        while True:
            await self.reading.wait()
            data = await loop.sock_recv(conn, 1 << 16)
            if not data:
                raise ConnectionResetError("the slave closed the link")
            plain = script.unseal(data)
            self.ack_bytes += plain
            for f in dec.feed(plain):
                assert isinstance(f, frames.TransferAck), f
                self.acks.append(f.slave_max_offset)
                self.ack_frames.append(f)

    def alive(self) -> bool:
        """True while the script runs (a failed step of it fails the waiting test at once)."""
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise AssertionError("the scripted master failed") from task.exception()
        return True

    async def send(self, data: bytes) -> None:
        """Frames (or pieces of them) to the slave; each frame's tag follows its last byte."""
        assert self.conn is not None
        await asyncio.get_running_loop().sock_sendall(self.conn, self.script.seal(data))

    async def acked(self, offset: int, timeout: float = DEADLINE) -> None:
        await wait_until_async(lambda: self.alive() and bool(self.acks) and self.acks[-1] >= offset, timeout,
                               f"ack of {offset} (acks so far: {self.acks[-3:]})")

    async def send_acked(self, offset: int, data: bytes, **kwargs: int) -> None:
        """One block, then its ack (what a one-at-a-time producer waits for)."""
        await self.send(_block(offset, data, **kwargs))
        await self.acked(offset + len(data))

    async def ready(self, sessions: int = 1) -> None:
        await wait_until_async(lambda: self.alive() and self.sessions == sessions and self.transferring, DEADLINE,
                               f"handshake of session {sessions}")


@pytest.mark.parametrize("lane", LANES)
def test_live_blocks_are_applied_and_acked_by_the_callback(tmp_path, lane: bool) -> None:
    with _replica(tmp_path) as (scl, sem, rcl):
        start = scl.max_offset
        recs = _records(rcl, 40)
        end = rcl.max_offset
        told: list[tuple[int, int]] = []  # (confirm offset, ack bytes in the master's socket)

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                def on_confirm(offset: int) -> None:
                    assert m.conn is not None
                    told.append((offset, _queued(m.conn)))

                async with slave_running(ha_slave(scl, sem, m.port, _cfg(lane), on_confirm=on_confirm)) as s:
                    await m.ready()
                    for offset, data in recs:
                        await m.send_acked(offset, data, confirm=offset + len(data))
                    assert (_live(s), s.task_blocks, s.handbacks) == (len(recs), 0, 0)
                    assert (s.lane_blocks == len(recs)) == lane
                    assert s.confirm_offset == end
                    assert (s.sessions, s.last_error) == (1, "")
                # The acks on the wire are exactly what the codec encodes (either path), and
                # every tag checked (unseal): the lane's HMAC is the Python one's.
                assert bytes(m.ack_bytes) == b"".join(frames.framed.encode(f) for f in m.ack_frames)
                assert {f.epoch for f in m.ack_frames} == {1}
                # (Led by the log end the slave reports as it starts following, unless the
                # first block came before it paused.)
                acks = m.acks[1:] if m.acks[:1] == [start] else m.acks
                assert acks == [offset + len(data) for offset, data in recs]

        asyncio.run(run())
        assert bytes(scl.read(start, end - start)) == bytes(rcl.read(start, end - start))
        # The queue-offset table too (the lane's appends are caught up into it from the log).
        assert scl.queue_offsets() == rcl.queue_offsets() and scl.queue_offset("live", 0) > 0
        assert [c for c, _ in told] == [offset + len(data) for offset, data in recs]
        if not lane:
            # The callback tells on_confirm in the turn that sent the ack: still queued then.
            # (The lane's thread sends the ack before it wakes the loop, which then tells
            # on_confirm: by then the master's reader may have taken the ack already.)
            assert {q for _, q in told} == {ACK_BYTES}


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("protocol", ["framed", "rocketmq"])
def test_live_traffic_from_a_real_master_goes_through_the_callback(tmp_path, protocol: str, lane: bool) -> None:
    """Both dialects: once caught up, every appended record reaches the slave as one block,
    applied and acked by the callback."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 300_000)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG)
            async with master_running(m) as port, \
                    slave_running(ha_slave(scl, sem, port, _cfg(lane), protocol=protocol)) as s:
                def acked() -> int:
                    slaves = m.status()["slaves"]
                    return slaves[0]["ack_offset"] if slaves else -1

                async def append_acked() -> None:
                    mcl.append_batch("live", [b"x" * 1000])
                    end = mcl.max_offset
                    await wait_until_async(lambda: acked() == end, DEADLINE, f"ack of {end}", interval=0.0005)

                await wait_until_async(lambda: acked() == mcl.max_offset, DEADLINE, "catch-up")
                await append_acked()
                blocks = (_live(s), s.task_blocks)
                for _ in range(50):
                    await append_acked()
                assert (_live(s), s.task_blocks) == (blocks[0] + 50, blocks[1])
                # The lane serves plaintext framed links only (the rocketmq dialect: Python).
                assert (s.lane_blocks > 0) == (lane and protocol == "framed")
                assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(run())
        assert_same_log(mcl, scl)


def _hdr(length: int, ftype: int) -> bytes:
    return struct.pack(">iiqq", length, ftype, 0, 1)


BAD_FRAMES: dict[str, tuple[Callable[[int, bytes], bytes | None], str, int]] = {
    # what the master sends after live blocks, the reason the slave gives, its log level
    "wrong-offset": (lambda off, data: _block(off + 10, data), "does not start at", logging.WARNING),
    "older-epoch": (lambda off, data: _block(off, data, epoch=0), "older than", logging.WARNING),
    "epoch-start-after-block": (lambda off, data: _block(off, data, epoch=2, epoch_start=off + 1),
                                "starts later", logging.WARNING),
    "unknown-type": (lambda off, data: _hdr(24, 42), "frame type 42", logging.WARNING),
    "slave-type-from-master": (lambda off, data: frames.framed.encode(frames.TransferAck(1)), "frame type 7",
                               logging.WARNING),
    "over-max-frame": (lambda off, data: _hdr(CFG.max_frame_bytes + 1, 6), "max_frame_bytes", logging.WARNING),
    "corrupt-records": (lambda off, data: _block(off, bytes(b ^ 0x5A for b in data)), "invalid record",
                        logging.WARNING),
    "good-block-then-bad-type": (lambda off, data: _block(off, data) + _hdr(24, 42), "frame type 42",
                                 logging.WARNING),
    "master-closes": (lambda off, data: None, "closed the link", logging.INFO),
}


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frame_in_callback_mode_ends_the_session_as_before(tmp_path, caplog, case: str, lane: bool) -> None:
    make, reason, level = BAD_FRAMES[case]
    with _replica(tmp_path) as (scl, sem, rcl):
        good = _records(rcl, 3)
        offset, data = _records(rcl, 1)[0]
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, _cfg(lane))) as s:
                    await m.ready()
                    for off, d in good:
                        await m.send_acked(off, d)
                    assert _live(s) == len(good)
                    before = (store_digest(scl), sem.pairs())
                    frame = make(offset, data)
                    if frame is None:
                        assert m.conn is not None
                        m.conn.shutdown(socket.SHUT_WR)
                    else:
                        await m.send(frame)
                    await wait_until_async(lambda: reason in s.last_error, DEADLINE, f"reason {reason!r}")
                    # The slave reconnects and starts again where it was: nothing was stored.
                    await m.ready(sessions=2)
                    assert m.truncated_at == [good[0][0], offset]
                    assert (store_digest(scl), sem.pairs()) == before
                    # The callback raised; the task ended the session (nothing handed back).
                    assert (_live(s), s.task_blocks, s.handbacks) == (len(good), 0, 0)
                    return s.last_error

        with caplog.at_level(logging.INFO, logger="rmqha.ha.slave"):
            last_error = asyncio.run(run())
        lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "rmqha.ha.slave"]
        assert [entry for entry in lines if "closed:" in entry[1]] == [
            (level, f"HA link to 127.0.0.1:{_port_of(lines)} closed: {last_error}")]


def _port_of(lines: list[tuple[int, str]]) -> int:
    """The scripted master's port, from the slave's 'following' log line."""
    for _, text in lines:
        if "following 127.0.0.1:" in text:
            return int(text.split("following 127.0.0.1:")[1].split()[0])
    raise AssertionError(f"no 'following' line in {lines}")


def test_large_block_in_callback_mode_is_received_by_the_task_straight_into_the_log(tmp_path) -> None:
    with _replica(tmp_path) as (scl, sem, rcl):
        start = scl.max_offset
        before = _records(rcl, 3)
        big_at = rcl.max_offset
        fill(rcl, 100_000, seed=7)
        big = bytes(rcl.read(big_at, rcl.max_offset - big_at))
        small_at, small = _records(rcl, 1)[0]
        after = _records(rcl, 3)
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, CFG)) as s:
                    await m.ready()
                    for off, d in before:
                        await m.send_acked(off, d)
                    frame = _block(big_at, big)
                    # The header and a little: the callback hands the block to the task,
                    # which receives the rest straight into the commitlog's mapping.
                    await m.send(frame[:1000])
                    await wait_until_async(lambda: s.direct_receives == 1, DEADLINE, "direct receive")
                    assert s.handbacks == 1
                    # The rest, with a small block right behind it in the same write: it
                    # lands in the receive buffer and is acked without more data coming.
                    await m.send(frame[1000:] + _block(small_at, small))
                    await m.acked(small_at + len(small))
                    assert (s.callback_blocks, s.task_blocks) == (len(before), 2)
                    for off, d in after:
                        await m.send_acked(off, d)
                    assert (s.callback_blocks, s.task_blocks, s.handbacks) == (len(before) + len(after), 2, 1)
                    assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(run())
        assert bytes(scl.read(start, end - start)) == bytes(rcl.read(start, end - start))


@pytest.mark.parametrize("lane", LANES)
def test_new_epoch_in_callback_mode_is_acked_once_its_entry_is_on_disk(tmp_path, lane: bool) -> None:
    """The callback hands the block back (its ack awaits the entry); the lane hands it to
    the task (an epoch change is the Python path's), and takes the next block again."""
    # (callback or lane blocks, task blocks, callback hand-backs) after the 3rd and 4th block
    third, fourth = ((2, 1, 0), (3, 1, 0)) if lane else ((3, 0, 1), (4, 0, 1))
    with _replica(tmp_path) as (scl, sem, rcl):
        start = scl.max_offset
        recs = _records(rcl, 4)
        end = rcl.max_offset
        epoch2_at = recs[2][0]
        on_disk: list[list[tuple[int, int]]] = []

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, _cfg(lane))) as s:
                    await m.ready()
                    for offset, data in recs[:2]:
                        await m.send_acked(offset, data)
                    offset, data = recs[2]
                    await m.send_acked(offset, data, epoch=2, epoch_start=epoch2_at)
                    # What a crash right after this ack would find.
                    on_disk.append(EpochMap.open(os.path.join(tmp_path, "s", EPOCH_FILE)).pairs())
                    assert (_live(s), s.task_blocks, s.handbacks) == third
                    offset, data = recs[3]
                    await m.send_acked(offset, data, epoch=2, epoch_start=epoch2_at)
                    assert (_live(s), s.task_blocks, s.handbacks) == fourth

        asyncio.run(run())
        assert on_disk == [[(1, 0), (2, epoch2_at)]]
        assert sem.pairs() == [(1, 0), (2, epoch2_at)]
        assert bytes(scl.read(start, end - start)) == bytes(rcl.read(start, end - start))


def test_ack_the_socket_cannot_take_is_finished_by_the_task(tmp_path, monkeypatch) -> None:
    """With the master not reading and small socket buffers, the callback's acks soon find
    no room: the task takes the link back, sends the rest once the master reads again, and
    the master gets a whole, ordered ack stream."""
    tune = ha_link.tune_socket

    def small_send_buffer(sock: socket.socket) -> None:
        tune(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    monkeypatch.setattr(ha_link, "tune_socket", small_send_buffer)
    with _replica(tmp_path) as (scl, sem, rcl):
        start = scl.max_offset
        recs = _records(rcl, 1500, body=50)  # ~300 fill the buffers here
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end, rcvbuf=4096) as m:
                async with slave_running(ha_slave(scl, sem, m.port, CFG)) as s:
                    await m.ready()
                    m.reading.clear()
                    sent = 0
                    for offset, data in recs:
                        await m.send(_block(offset, data))
                        sent += 1
                        await wait_until_async(lambda: scl.max_offset == offset + len(data) or s.handbacks,
                                               DEADLINE, "block applied", interval=0.0005)
                        if s.handbacks:
                            break
                    assert s.handbacks == 1, "the acks never filled the socket"
                    held = recs[sent - 1][0] + len(recs[sent - 1][1])  # the ack that found no room
                    m.reading.set()
                    await m.send(b"".join(_block(offset, data) for offset, data in recs[sent:]))
                    await m.acked(end)
                    assert (s.sessions, s.last_error) == (1, "")
                    assert s.callback_blocks + s.task_blocks == len(recs)

                acks = m.acks
                assert acks == sorted(acks) and acks[-1] == end
                assert held in acks
                assert set(acks) <= {start} | {offset + len(data) for offset, data in recs}

        asyncio.run(run())
        assert bytes(scl.read(start, end - start)) == bytes(rcl.read(start, end - start))


@pytest.mark.parametrize("lane", LANES)
def test_a_caught_up_slave_acks_its_log_end_as_soon_as_it_follows(tmp_path, lane: bool) -> None:
    """No data and no heartbeat due: the slave still tells a new master where its log ends
    right after the handshake, so the master can add it to the SyncStateSet at once (a
    new master with min_in_sync_replicas = 2 acknowledges nothing until then; waiting for
    the first heartbeat ack held a failover's first acknowledgement ~0.3 s)."""
    cfg = _cfg(lane, ha_send_heartbeat_interval_ms=30_000, ha_housekeeping_interval_ms=60_000,
               ha_max_time_slave_not_catchup_ms=90_000)
    with _replica(tmp_path) as (scl, sem, rcl):
        end = scl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, cfg)):
                    await m.ready()
                    await m.acked(end)  # within DEADLINE, far below the 30 s heartbeat
                    assert m.acks[0] == end

        asyncio.run(run())


@pytest.mark.parametrize("lane", LANES)
def test_heartbeat_acks_go_out_while_no_data_arrives(tmp_path, lane: bool) -> None:
    cfg = _cfg(lane, ha_send_heartbeat_interval_ms=100, ha_housekeeping_interval_ms=2000)
    with _replica(tmp_path) as (scl, sem, rcl):
        first, second = _records(rcl, 2)
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, cfg)) as s:
                    await m.ready()
                    await m.send_acked(*first)
                    acked = first[0] + len(first[1])
                    t0 = time.monotonic()
                    seen = len(m.acks)
                    # The master is silent: the slave still reports every heartbeat interval.
                    await wait_until_async(lambda: len(m.acks) >= seen + 3, DEADLINE, "three heartbeat acks")
                    assert time.monotonic() - t0 >= 0.25  # one per interval, not a burst
                    assert m.acks[seen:] == [acked] * (len(m.acks) - seen)
                    # And the callback still takes the next block.
                    blocks = _live(s)
                    await m.send_acked(*second)
                    assert _live(s) == blocks + 1
                    assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(run())


def test_plain_blocks_take_one_compiled_call_per_read_and_a_bad_tag_is_refused(tmp_path, monkeypatch) -> None:
    """Blocks that continue the log are applied by one scan_transfer_run per read (one at a
    time, and three sent together); a heartbeat leaves its read to the general path; a
    plain block whose tag does not check ends the session, with nothing of it stored."""
    from rmqha.ha import receive

    results: list[tuple[int, int]] = []  # (stop, blocks) per call
    real = receive._scan_run

    def spy(*args: Any) -> Any:
        out = real(*args)
        results.append((out[0], len(out[1]) // 3))
        return out

    monkeypatch.setattr(receive, "_scan_run", spy)
    with _replica(tmp_path) as (scl, sem, rcl):
        one = _records(rcl, 10)
        three = _records(rcl, 3)
        offset, data = _records(rcl, 1)[0]
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, CFG)) as s:
                    await m.ready()
                    for off, d in one:
                        await m.send_acked(off, d)
                    assert results == [(frames.RUN_END, 1)] * len(one)
                    await m.send(b"".join(_block(off, d) for off, d in three))
                    await m.acked(three[-1][0] + len(three[-1][1]))
                    assert sum(n for _, n in results) == len(one) + len(three)
                    assert frames.RUN_OTHER not in {stop for stop, _ in results}
                    await m.send(_block(scl.max_offset, b""))  # a heartbeat: the general path
                    await wait_until_async(lambda: results[-1][0] == frames.RUN_OTHER, DEADLINE, "heartbeat")
                    before = store_digest(scl)
                    assert m.conn is not None
                    sealed = bytearray(m.script.seal(_block(offset, data)))
                    sealed[-1] ^= 1  # the tag of a block that is otherwise plain
                    await asyncio.get_running_loop().sock_sendall(m.conn, bytes(sealed))
                    await wait_until_async(lambda: "failed authentication" in s.last_error, DEADLINE,
                                           "the bad tag refused")
                    assert results[-1] == (frames.RUN_END, 1)  # it was plain: the tag decided
                    await m.ready(sessions=2)
                    assert store_digest(scl) == before
                    assert scl.max_offset == offset

        asyncio.run(run())
        assert bytes(scl.read(one[0][0], offset - one[0][0])) == bytes(rcl.read(one[0][0], offset - one[0][0]))


def _lane_threads() -> list[Any]:
    import threading

    return [t for t in threading.enumerate() if t.name == "ha-slave-lane"]


@pytest.mark.parametrize("lane", [pytest.param(True, id="lane", marks=needs.compiled_lane())])
def test_stopping_the_slave_joins_the_lane_and_keeps_every_acked_byte(tmp_path, lane: bool) -> None:
    """The fence of a role change: while the lane runs, the log's tail is the lane's (any
    other write is refused: the negative control); HASlave.stop() returns only once the
    lane's thread has ended, every byte it acked is the log's, and the log takes writes
    again (a new master's appends, a truncation)."""
    from rmqha.errors import StoreError

    with _replica(tmp_path) as (scl, sem, rcl):
        start = scl.max_offset
        recs = _records(rcl, 60)
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                s = ha_slave(scl, sem, m.port, _cfg(lane))
                await s.start()
                try:
                    await m.ready()
                    for offset, data in recs[:10]:
                        await m.send_acked(offset, data)
                    assert s.lane_blocks == 10 and len(_lane_threads()) == 1
                    with pytest.raises(StoreError, match="compiled lane holds"):
                        scl.append_batch("intruder", [b"x"])
                    # A burst the slave is still taking when it is told to stop.
                    await m.send(b"".join(_block(off, d) for off, d in recs[10:]))
                    await wait_until_async(lambda: scl.max_offset > recs[10][0], DEADLINE, "the burst arriving")
                finally:
                    await s.stop()
                assert _lane_threads() == []
                acked = max(m.acks)
                assert scl.max_offset >= acked, (scl.max_offset, acked)

        asyncio.run(run())
        mx = scl.max_offset
        assert bytes(scl.read(start, mx - start)) == bytes(rcl.read(start, mx - start))
        scl.truncate(recs[5][0])  # the tail is the log's writers' again
        assert scl.max_offset == recs[5][0]


@pytest.mark.parametrize("lane", [pytest.param(True, id="lane", marks=needs.compiled_lane())])
def test_the_lane_refuses_a_bad_tag_and_stores_nothing_of_it(tmp_path, lane: bool) -> None:
    """The frame MAC in C: a plain block whose tag does not check ends the session with
    the Python path's reason, nothing of it stored (the good blocks before it, checked by
    the same C code, were taken: the negative control is this one flipped bit)."""
    with _replica(tmp_path) as (scl, sem, rcl):
        good = _records(rcl, 5)
        offset, data = _records(rcl, 1)[0]
        end = rcl.max_offset

        async def run() -> None:
            async with ScriptedMaster(end) as m:
                async with slave_running(ha_slave(scl, sem, m.port, _cfg(lane))) as s:
                    await m.ready()
                    for off, d in good:
                        await m.send_acked(off, d)
                    assert s.lane_blocks == len(good)
                    before = store_digest(scl)
                    assert m.conn is not None
                    sealed = bytearray(m.script.seal(_block(offset, data)))
                    sealed[-1] ^= 1
                    await asyncio.get_running_loop().sock_sendall(m.conn, bytes(sealed))
                    await wait_until_async(lambda: "failed authentication" in s.last_error, DEADLINE,
                                           "the bad tag refused")
                    await m.ready(sessions=2)
                    assert store_digest(scl) == before
                    assert scl.max_offset == offset

        asyncio.run(run())


@pytest.mark.parametrize("lane", LANES)
def test_live_traffic_across_a_segment_end(tmp_path, lane: bool) -> None:
    """Live blocks run into the segment's end (the master pads it with a blank) and go on
    in the next segment: the lane hands the block it has no room for to the task, which
    opens the next segment, and takes the traffic again at the next pause."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, SEG - 40_000, batch=8)
        assert mcl.max_offset < SEG - 20_000

        async def run() -> None:
            m = ha_master(mcl, mem, CFG)
            async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, _cfg(lane))) as s:
                def acked() -> int:
                    slaves = m.status()["slaves"]
                    return slaves[0]["ack_offset"] if slaves else -1

                await wait_until_async(lambda: acked() == mcl.max_offset, DEADLINE, "catch-up")
                for _ in range(80):
                    mcl.append_batch("live", [b"y" * 1000])
                    end = mcl.max_offset
                    await wait_until_async(lambda: acked() == end, DEADLINE, f"ack of {end}", interval=0.0005)
                assert mcl.max_offset > SEG  # the traffic crossed into the second segment
                assert (s.lane_blocks > 0) == lane
                # The lane handed back (at least) at the segment end, and took over again.
                assert (s.status()["lane_runs"] >= 1) == lane
                lane_blocks = s.lane_blocks
                mcl.append_batch("live", [b"z" * 1000])
                end = mcl.max_offset
                await wait_until_async(lambda: acked() == end, DEADLINE, f"ack of {end}")
                assert (s.lane_blocks > lane_blocks) == lane
                assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(run())
        assert_same_log(mcl, scl)
        assert scl.queue_offsets() == mcl.queue_offsets()
