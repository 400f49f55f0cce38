"""Malformed and out-of-order frames close the HA link, with a reason, and write nothing.

Master side: a raw socket plays a broken slave against a real HAMaster.  Slave side: a
scripted master (real frames from rmqha.ha.frames over a real socket) feeds a real HASlave
one bad frame after a correct handshake.  Both check the store afterwards, byte for byte.
The links are authenticated (the scripted side holds the cluster secret, and its bad frames
carry good tags): what is checked is what lies behind the MAC.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import struct
import time
from collections.abc import Callable

import pytest

from rmqha.ha import frames
from rmqha.ha.frames import Direction
from rmqha.ha import HAConfig
from rmqha.testing.ha import (auth_for, store_digest, assert_same_log, fast_config, fill, ha_master, ha_slave,
                              master_running, read_frames, replica_stores, scripted_master, slave_running,
                              wait_until, wait_until_async)
from rmqha.testing.sealed_script import ScriptedAuth

import needs

SEG = 1 << 20
CFG = fast_config(ha_housekeeping_interval_ms=2000, ha_reconnect_min_ms=50, max_frame_bytes=1 << 20)



def _hello(broker_id: int = 2, seg: int = SEG, epoch: int = -1) -> bytes:
    return frames.framed.encode(frames.HandshakeSlave(broker_id, seg, "127.0.0.1:1", epoch=epoch))


def _hdr(length: int, ftype: int, epoch: int = 1) -> bytes:
    return struct.pack(">iiqq", length, ftype, 0, epoch)


def _authenticated(port: int) -> tuple[socket.socket, ScriptedAuth]:
    """A plain socket to the master, authenticated as slave 2."""
    sock = socket.create_connection(("127.0.0.1", port))
    script = ScriptedAuth(auth_for(2), CFG.max_frame_bytes)
    script.connect_sync(sock)
    return sock, script


def _recv_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the master sends until it closes; raises if it stays open."""
    sock.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    raise AssertionError("the master kept the link open")


MASTER_CASES = {
    # first four bytes are neither a framed length (>= 24) nor the rocketmq state 1
    "unknown-dialect": lambda port: [struct.pack(">i", 7) + b"\0" * 20],
    "over-max-frame": lambda port: [_hdr(CFG.max_frame_bytes + 1, 1)],
    "unknown-type": lambda port: [_hdr(24, 99)],
    "master-type-from-slave": lambda port: [_hdr(24 + 16, 2) + b"\0" * 16],
    "ack-before-handshake": lambda port: [frames.framed.encode(frames.TransferAck(0))],
    "ack-instead-of-query": lambda port: [_hello(), frames.framed.encode(frames.TransferAck(0))],
    "short-handshake-payload": lambda port: [_hdr(24 + 8, 1) + b"\0" * 8],
}


@pytest.mark.parametrize("secret", [True, False], ids=["authenticated", "no-secret"])
@pytest.mark.parametrize("case", sorted(MASTER_CASES))
def test_master_closes_on_bad_slave_frames_and_keeps_serving(tmp_path, case: str, secret: bool) -> None:
    """With a cluster secret the bad frames come sealed (good tags); without one, as they are."""
    auth = {} if secret else {"auth": None}
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 300_000)
        before = store_digest(mcl)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, **auth)
            async with master_running(m) as port:
                def bad_client() -> None:
                    if secret:
                        sock, script = _authenticated(port)
                        seal = script.seal
                    else:
                        sock, seal = socket.create_connection(("127.0.0.1", port)), bytes
                    with sock:
                        for chunk in MASTER_CASES[case](port):
                            sock.sendall(seal(chunk))
                        _recv_until_closed(sock, 5)

                await asyncio.get_running_loop().run_in_executor(None, bad_client)
                assert m.status()["slaves"] == []
                async with slave_running(ha_slave(scl, sem, port, CFG, **auth)):
                    await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 10, "good slave served")

        asyncio.run(run())
        assert store_digest(mcl) == before
        assert_same_log(mcl, scl)


def test_master_closes_on_acks_out_of_order(tmp_path) -> None:
    """An ack beyond what was sent, or going backwards, is a bad frame."""
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)
        max_offset = mcl.max_offset

        async def run() -> None:
            async with master_running(ha_master(mcl, mem, CFG)) as port:
                def client(acks: list[int]) -> None:
                    sock, script = _authenticated(port)
                    with sock:
                        dec = frames.FramedDecoder(Direction.MASTER_TO_SLAVE, 1 << 22)
                        sock.sendall(script.seal(_hello() + frames.framed.encode(frames.QueryEpoch())))
                        sock.sendall(script.seal(frames.framed.encode(frames.ConfirmTruncate(0))))
                        for a in acks:
                            sock.sendall(script.seal(frames.framed.encode(frames.TransferAck(a))))
                        data = _recv_until_closed(sock, 5)
                        got = dec.feed(script.unseal(data))
                        assert isinstance(got[0], frames.HandshakeMaster) and got[0].check_result == 0

                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, client, [max_offset + 1])
                await loop.run_in_executor(None, client, [50_000, 40_000])

        asyncio.run(run())
        assert mcl.max_offset == max_offset


def test_master_takes_a_read_of_acks_in_one_call_and_refuses_a_bad_tag(tmp_path, monkeypatch, caplog) -> None:
    """Acks that make sense, read together, are taken by one scan_transfer_acks call (their
    tags checked); an ack with a bad tag is refused as before: the link closes."""
    from rmqha.ha import connection

    results: list[tuple[int, int]] = []
    real = connection._scan_acks

    def spy(*args: object) -> tuple[int, int]:
        out = real(*args)  # type: ignore[arg-type]
        results.append(out)
        return out

    monkeypatch.setattr(connection, "_scan_acks", spy)
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG)
            async with master_running(m) as port:
                def client() -> None:
                    sock, script = _authenticated(port)
                    with sock:
                        dec = frames.FramedDecoder(Direction.MASTER_TO_SLAVE, 1 << 22)
                        got: list[object] = []
                        sock.sendall(script.seal(_hello() + frames.framed.encode(frames.QueryEpoch())))
                        while len(got) < 2:
                            got.extend(dec.feed(script.unseal(sock.recv(1 << 16))))
                        sock.sendall(script.seal(frames.framed.encode(frames.ConfirmTruncate(0))))
                        while len(got) < 3:  # the transfer started: acks now come to read_acks
                            got.extend(dec.feed(script.unseal(sock.recv(1 << 16))))
                        sock.sendall(script.seal(b"".join(frames.pack_transfer_ack(0, 0, 1) for _ in range(3))))
                        wait_until(lambda: sum(n for n, _ in results if n > 0) == 3, 5, "three acks taken")
                        bad = bytearray(script.seal(frames.pack_transfer_ack(0, 0, 1)))
                        bad[-1] ^= 1
                        sock.sendall(bytes(bad))
                        _recv_until_closed(sock, 5)

                await asyncio.get_running_loop().run_in_executor(None, client)
                await wait_until_async(lambda: m.status()["slaves"] == [], 5, "the link dropped")

        with caplog.at_level(logging.INFO, logger="rmqha.ha.master"):
            asyncio.run(run())
    dropped = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(dropped) == 1 and "failed authentication" in dropped[0], dropped
    assert -1 not in {n for n, _ in results}
    assert results[-1] == (1, 0)  # the last ack was plain: its tag decided


# --- slave side -------------------------------------------------------------------------------


def _block(offset: int, data: bytes, epoch: int = 1, epoch_start: int = 0, confirm: int = 0) -> bytes:
    return frames.pack_transfer_header(offset, epoch_start, confirm, len(data), epoch) + data


SLAVE_CASES = {
    # (what the scripted master sends after a correct handshake, expected text in the reason)
    "wrong-offset": (lambda mx, ref: _block(mx + 10, ref[:100]), "does not start at"),
    "older-epoch": (lambda mx, ref: _block(mx, ref[:100], epoch=0), "older than"),
    "epoch-start-after-block": (lambda mx, ref: _block(mx, ref[:100], epoch=2, epoch_start=mx + 1), "starts later"),
    "crosses-segment": (lambda mx, ref: _block(mx, b"\0" * (SEG - mx % SEG + 10)), "segment end"),
    "over-max-frame": (lambda mx, ref: _hdr(CFG.max_frame_bytes + 1, 6), "max_frame_bytes"),
    "unknown-type": (lambda mx, ref: _hdr(24, 42), "frame type 42"),
    "slave-type-from-master": (lambda mx, ref: frames.framed.encode(frames.TransferAck(1)), "frame type 7"),
    "corrupt-records": (lambda mx, ref: _block(mx, bytes(b ^ 0x5A for b in ref[:4096])), "invalid record"),
    "corrupt-records-new-epoch": (
        lambda mx, ref: _block(mx, bytes(b ^ 0x5A for b in ref[:4096]), epoch=2, epoch_start=mx), "invalid record"),
    "half-a-frame-then-silence": (lambda mx, ref: _block(mx, ref[:4096])[:2000], "silent"),
    # Large blocks arriving in pieces go straight into the commitlog's mapping: the same
    # refusals, and what was received is zeroed again.
    "direct-corrupt-records": (
        lambda mx, ref: _split(_block(mx, ref[:90_000] + bytes(b ^ 0x5A for b in ref[90_000:100_000]))),
        "invalid record"),
    "direct-wrong-offset": (lambda mx, ref: _split(_block(mx + 10, ref[:100_000])), "does not start at"),
    "direct-half-then-silence": (lambda mx, ref: _split(_block(mx, ref[:100_000]))[:2], "silent"),
}
#: The cases whose large block must have been received straight into the log.
DIRECT_CASES = {"direct-corrupt-records", "direct-half-then-silence"}


def _split(frame: bytes) -> tuple[bytes, ...]:
    """A frame in three writes (header and a little, most of the body, the rest)."""
    return frame[:1000], frame[1000:60_000], frame[60_000:]


@pytest.mark.parametrize("lane", [pytest.param(False, id="python"),
                                  pytest.param(True, id="lane", marks=needs.compiled_lane())])
@pytest.mark.parametrize("case", sorted(SLAVE_CASES))
def test_slave_closes_on_bad_master_frames_and_writes_nothing(tmp_path, case: str, lane: bool) -> None:
    """Both receive paths refuse the same frames for the same reasons, storing nothing;
    the compiled lane (which takes a large block in its buffer: no direct receive) too."""
    cfg = dataclasses.replace(CFG, ha_slave_compiled_lane=lane)
    with replica_stores(tmp_path, SEG, "s") as [(scl, sem)]:
        sem.append(1, 0)
        fill(scl, 200_000)
        mx = scl.max_offset
        with replica_stores(tmp_path, SEG, "ref") as [(ref_cl, _)]:
            fill(ref_cl, 300_000)  # the same records the slave holds, and more: valid continuation bytes
            reference = bytes(ref_cl.read(mx, 100_000))
        before = (store_digest(scl), sem.pairs())
        make, reason = SLAVE_CASES[case]

        async def run() -> None:
            closed = asyncio.Event()

            async def master_script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                dec = frames.FramedDecoder(Direction.SLAVE_TO_MASTER, 1 << 20)
                got: list = []
                try:
                    await read_frames(reader, dec, got, 1)
                    writer.write(frames.framed.encode(frames.HandshakeMaster(0, mx + 8192, 1)))
                    await read_frames(reader, dec, got, 2)
                    writer.write(frames.framed.encode(frames.ReturnEpoch(((1, 0, mx + 8192),))))
                    await read_frames(reader, dec, got, 3)
                    assert isinstance(got[2], frames.ConfirmTruncate) and got[2].offset == mx
                    out = make(mx, reference)
                    for part in out if isinstance(out, tuple) else (out,):
                        writer.write(part)
                        await writer.drain()
                        await asyncio.sleep(0.05)  # let the slave see the frame in pieces
                    while await reader.read(1 << 16):
                        pass
                    closed.set()
                except ConnectionError:
                    closed.set()
                finally:
                    writer.close()

            async with scripted_master(master_script) as port, slave_running(ha_slave(scl, sem, port, cfg)) as s:
                await asyncio.wait_for(closed.wait(), 10)
                await wait_until_async(lambda: reason in s.last_error, 5, f"reason {reason!r} logged")
                if case in DIRECT_CASES and not lane:
                    assert s.direct_receives >= 1

        asyncio.run(run())
        assert (store_digest(scl), sem.pairs()) == before


def _assert_slave_refuses(tmp_path, log_bytes: int, replies: Callable[[int], list[bytes]], expect: str) -> None:
    """A slave holding ``log_bytes`` of epoch 1 gets ``replies(its max offset)``, one per
    frame it sends; it must close with ``expect`` in its reason and leave its store as it was."""
    with replica_stores(tmp_path, SEG, "s") as [(scl, sem)]:
        sem.append(1, 0)
        fill(scl, log_bytes)
        before = (store_digest(scl), sem.pairs())
        answers = replies(scl.max_offset)

        async def master_script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for answer in answers:
                await reader.read(1 << 16)
                writer.write(answer)
                await writer.drain()
            await reader.read(1 << 16)
            writer.close()

        async def run() -> None:
            async with scripted_master(master_script) as port, slave_running(ha_slave(scl, sem, port, CFG)) as s:
                await wait_until_async(lambda: expect in s.last_error, 10, f"{expect!r}")

        asyncio.run(run())
        assert (store_digest(scl), sem.pairs()) == before


def test_slave_refuses_unordered_epoch_entries(tmp_path) -> None:
    _assert_slave_refuses(tmp_path, 50_000, lambda mx: [
        frames.framed.encode(frames.HandshakeMaster(0, 100, 3)),
        frames.framed.encode(frames.ReturnEpoch(((3, 50, 100), (1, 0, 50)))),
    ], "not ordered")


def test_master_drops_a_silent_slave_after_housekeeping(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        fill(mcl, 20_000)
        cfg = HAConfig(ha_send_heartbeat_interval_ms=50, ha_housekeeping_interval_ms=300)

        async def run() -> None:
            m = ha_master(mcl, mem, cfg)
            async with master_running(m) as port:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                script = ScriptedAuth(auth_for(2))

                async def send(data: bytes) -> None:
                    writer.write(data)

                await script.connect(reader.readexactly, send)
                writer.write(script.seal(_hello() + frames.framed.encode(frames.QueryEpoch()) +
                                         frames.framed.encode(frames.ConfirmTruncate(0))))
                await wait_until_async(lambda: len(m.status()["slaves"]) == 1, 5, "slave registered")
                t0 = time.monotonic()
                # Never ack: the master must give up after ha_housekeeping_interval_ms.
                await wait_until_async(lambda: not m.status()["slaves"], 5, "silent slave dropped")
                assert 0.2 <= time.monotonic() - t0 < 2
                while await reader.read(1 << 16):
                    pass  # blocks and heartbeats until the master closes
                writer.close()

        asyncio.run(run())


@pytest.mark.parametrize("first", ["block-before-handshake", "epochs-before-handshake", "refusal-code"])
def test_slave_closes_on_out_of_order_handshake(tmp_path, first: str) -> None:
    reply = {
        "block-before-handshake": lambda mx: _block(mx, b"\0" * 64),
        "epochs-before-handshake": lambda mx: frames.framed.encode(frames.ReturnEpoch(((1, 0, mx),))),
        "refusal-code": lambda mx: frames.framed.encode(frames.HandshakeMaster(99, mx, 1)),
    }[first]
    expect = {"block-before-handshake": "expected the master handshake",
              "epochs-before-handshake": "expected the master handshake",
              "refusal-code": "code 99"}[first]
    _assert_slave_refuses(tmp_path, 30_000, lambda mx: [reply(mx)], expect)
