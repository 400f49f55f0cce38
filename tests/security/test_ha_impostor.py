"""A fake slave on the master's HA port, and frames altered on an authenticated HA link.

The attack (found by an outside tester): a client connects to the master's HA port claiming
an existing slave's id, in the framed or the rocketmq dialect (16 bytes suffice there).
The master streamed it the whole log and took its acks for copies it never kept.

Here a raw impostor (plain sockets and ``struct``; for the wrong-secret case the link_auth
building block of rmqha.security, nothing of rmqha.ha) claims slave 2's id while the real
slave 2 replicates, without the cluster secret and with a wrong one, in both dialects.  It
must get no byte of the log (it reads until the master closes), the master must log one
line naming it, keep the real slave's link, and acknowledge sends only once the real slave
holds them.  The negative control runs the same impostor against a master without a
secret: it gets the log, so the probe does detect a leak.

Then frames altered on an authenticated link: a scripted master that holds the secret
sends a block whose data, header or tag was altered, one it never sealed, or sealed blocks
replayed, dropped or reordered (small blocks through the receive buffer, a large one
straight into the log); the slave closes the link and stores nothing of it.  A scripted
slave that holds the secret alters an ack; the master closes the link and does not count
it.  The valid frames before them are taken (the controls).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import needs
import pytest

from rmqha.errors import AuthenticationError
from rmqha.ha import HAMaster, frames
from rmqha.ha.frames import Direction
from rmqha.security.identity import Identity
from rmqha.security.link_auth import Handshake
from rmqha.security.secret import ClusterSecret
from rmqha.store import CommitLog
from rmqha.testing.ha import (
    CLUSTER,
    GROUP,
    auth_for,
    fast_config,
    fill,
    ha_master,
    ha_slave,
    master_running,
    read_frames,
    replica_stores,
    scripted_master,
    slave_running,
    store_digest,
    wait_until_async,
)
from rmqha.testing.sealed_script import ScriptedAuth, recv_exactly

SEG = 1 << 20
CFG = fast_config(ha_housekeeping_interval_ms=2000, ha_reconnect_min_ms=50)
FIRST_BLOCK = CFG.ha_transfer_batch_bytes
MARK = b"IMPOSTOR-PROBE-BODY"
WRONG = ClusterSecret(b"not-the-cluster-secret-at-all-0123", "the impostor")
#: The authenticating slave's first bytes and the framing of the handshake messages, as
#: documented in rmqha.ha.auth (written out here, not imported: this is the wire).
PREFACE = b"\x80rHA"


# --- the impostor: plain sockets ---------------------------------------------------------------


def _framed(ftype: int, payload: bytes = b"") -> bytes:
    return struct.pack(">iiqq", 24 + len(payload), ftype, 0, -1) + payload


def _framed_claim(broker_id: int) -> bytes:
    """HANDSHAKE_SLAVE for ``broker_id``, QUERY_EPOCH and CONFIRM_TRUNCATE(0): an empty
    slave asking for the log from offset 0."""
    address = b"127.0.0.1:1"
    hello = _framed(1, struct.pack(">iqqi", 0, broker_id, SEG, len(address)) + address)
    return hello + _framed(3) + _framed(5, struct.pack(">q", 0))


def _rocketmq_claim(broker_id: int) -> bytes:
    """The 16-byte rocketmq handshake (state HANDSHAKE, not from the last file, not a
    learner, the id), then the first report: TRANSFER from offset 0."""
    return struct.pack(">ihhq", 1, 0, 0, broker_id) + struct.pack(">iq", 2, 0)


def _wrong_secret_preamble(sock: socket.socket) -> None:
    """Start the link handshake with a wrong secret; the master's answer cannot be checked,
    so the impostor forges its proof and carries on."""
    hs = Handshake.client(WRONG, Identity.broker(CLUSTER, GROUP, "2"), context="ha")
    hello = hs.start()
    assert hello is not None
    sock.sendall(PREFACE + struct.pack(">H", len(hello)) + hello)
    (n,) = struct.unpack(">H", recv_exactly(sock, 2))
    answer = recv_exactly(sock, n)
    with pytest.raises(AuthenticationError):
        hs.receive(answer)  # the master's proof is under the real secret
    forged = bytes([3]) + struct.pack(">H", 32) + os.urandom(32)
    sock.sendall(struct.pack(">H", len(forged)) + forged)


def _read_until_closed(sock: socket.socket, timeout: float, stop_at: int | None = None) -> bytes:
    """Everything that arrives until the peer closes (``stop_at``: or that many bytes
    came); AssertionError if the link stays open past ``timeout``."""
    sock.settimeout(0.2)
    got = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk
        if stop_at is not None and len(got) >= stop_at:
            return bytes(got)
    raise AssertionError(f"the master kept the impostor's link open ({len(got)} bytes read)")


def impostor(port: int, dialect: str, credential: str, *, stop_at: int | None = None) -> tuple[str, bytes]:
    """Claim slave 2's id at the HA port; returns the impostor's address and every byte it got."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        me = "%s:%d" % sock.getsockname()[:2]
        claim = _framed_claim(2) if dialect == "framed" else _rocketmq_claim(2)
        try:
            if credential == "wrong-secret":
                _wrong_secret_preamble(sock)
            sock.sendall(claim)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on the master's side already: read what came before
        return me, _read_until_closed(sock, 5, stop_at)


# --- the scene: a master, the real slave 2, a log whose bodies are recognisable -----------------


def _append_marked(cl: CommitLog, nbytes: int, start: int = 0) -> int:
    target = cl.max_offset + nbytes
    i = start
    while cl.max_offset < target:
        cl.append_batch("secrets", [MARK + b"-%08d-" % (i + k) + b"s" * 400 for k in range(64)])
        i += 64
    return cl.max_offset


def _scene(tmp_path, secret: bool, attack: Callable[[HAMaster, Any, int], Any]) -> None:
    """A master of the real slave 2 (both in the SyncStateSet), caught up; then ``attack``."""
    auth: dict[str, Any] = {} if secret else {"auth": None}
    master_auth = {"auth": auth_for(1, allow_rocketmq=False)} if secret else auth
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        _append_marked(mcl, 600_000)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0,
                          **master_auth)
            async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, CFG, **auth)) as s:
                await wait_until_async(lambda: m.confirm_offset == mcl.max_offset, 20, "the real slave caught up")
                await attack(m, (mcl, scl, s), port)

        asyncio.run(run())


@pytest.mark.parametrize("credential", ["no-secret", "wrong-secret"])
@pytest.mark.parametrize("dialect", ["framed", "rocketmq"])
def test_impostor_claiming_a_slave_id_gets_nothing_and_changes_nothing(tmp_path, caplog, dialect: str,
                                                                       credential: str) -> None:
    caplog.set_level(logging.INFO, logger="rmqha.ha.master")

    async def attack(m: HAMaster, stores: Any, port: int) -> None:
        mcl, scl, s = stores
        [real] = m.status()["slaves"]
        sessions, set_before = s.sessions, (m.sync_state_set, m.sync_state_set_epoch)
        loop = asyncio.get_running_loop()
        for round_ in range(3):
            refused_before = m.refused_links
            me, got = await loop.run_in_executor(None, impostor, port, dialect, credential)
            assert MARK not in got and len(got) < min(FIRST_BLOCK, 1024), (len(got), got[:64])
            assert m.refused_links == refused_before + 1
            # The first refusal of its kind is logged; the same kind again within the
            # period only counted (and reported with the next line of that kind).
            refusals = [r.getMessage() for r in caplog.records if me in r.getMessage()]
            assert len(refusals) == (1 if round_ == 0 else 0), refusals
            assert all("refusing HA link" in r for r in refusals), refusals
            # Sends go on being acknowledged, and only by the real slave's copies.
            end = _append_marked(mcl, 20_000, start=100_000 * (round_ + 1))
            assert await m.sync.wait_for_acks(end, None, timeout=5)
            # (The slave's compiled lane acks from its thread; the log's bookkeeping
            # follows at the loop's next wake-up: the bytes are in the mapping already.)
            await wait_until_async(lambda: scl.max_offset >= end, 5, f"the slave's log at {end}")
            [link] = m.status()["slaves"]
            assert (link["broker_id"], link["address"]) == (real["broker_id"], real["address"])
            assert link["identity"] == f"rmqha:broker/{CLUSTER}/{GROUP}/2"
            assert link["ack_offset"] == end
            assert (s.sessions, m.sync_state_set, m.sync_state_set_epoch) == (sessions, *set_before)

    _scene(tmp_path, True, attack)


@pytest.mark.parametrize("dialect", ["framed", "rocketmq"])
def test_negative_control_the_same_impostor_reads_the_log_of_a_master_without_a_secret(tmp_path,
                                                                                      dialect: str) -> None:
    async def attack(m: HAMaster, stores: Any, port: int) -> None:
        loop = asyncio.get_running_loop()
        _, got = await loop.run_in_executor(None, lambda: impostor(port, dialect, "no-secret", stop_at=FIRST_BLOCK))
        assert MARK in got and len(got) >= FIRST_BLOCK

    _scene(tmp_path, False, attack)


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged-control"])
def test_a_plaintext_link_authenticated_then_sending_frames_without_tags_gets_nothing(tmp_path, caplog,
                                                                                    tagged: bool) -> None:
    """Only TLS links drop the tags: in plaintext, a slave holding the secret whose frames
    after the handshake come bare is closed before its hello is answered."""
    caplog.set_level(logging.INFO, logger="rmqha.ha.master")

    def claim(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            script = ScriptedAuth(auth_for(2))
            script.connect_sync(sock)
            sock.sendall(script.seal(_framed_claim(2)) if tagged else _framed_claim(2))
            return _read_until_closed(sock, 5, stop_at=FIRST_BLOCK)

    async def attack(m: HAMaster, stores: Any, port: int) -> None:
        got = await asyncio.get_running_loop().run_in_executor(None, claim, port)
        if tagged:
            assert MARK in got and len(got) >= FIRST_BLOCK
        else:
            assert got == b""
            closing = [r.getMessage() for r in caplog.records if "closing HA link" in r.getMessage()]
            assert len(closing) == 1 and "failed authentication" in closing[0], closing

    _scene(tmp_path, True, attack)


# --- frames altered on an authenticated link: master -> slave -----------------------------------


def _block(offset: int, data: bytes, epoch: int = 1) -> bytes:
    return frames.pack_transfer_header(offset, 0, 0, len(data), epoch) + data


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


#: What the scripted master does after a valid block A at the slave's log end: returns the
#: raw bytes to send (in pieces) given seal(), A's sealed bytes and the frames of the next
#: two blocks B and C.
Tamper = Callable[[Callable[[bytes], bytes], bytes, bytes, bytes], tuple[bytes, ...]]
TAMPER: dict[str, Tamper] = {
    "altered-data": lambda seal, a, b, c: (_flip(seal(b), 100),),
    "altered-header": lambda seal, a, b, c: (_flip(seal(b), 30),),  # the confirm offset
    "altered-tag": lambda seal, a, b, c: (_flip(seal(b), len(b) + 3),),
    "injected": lambda seal, a, b, c: (b + os.urandom(16),),  # never sealed by the master
    "replayed": lambda seal, a, b, c: (a,),
    "dropped": lambda seal, a, b, c: (seal(b), seal(c))[1:],  # B's sealing is never sent
    "reordered": lambda seal, a, b, c: tuple(reversed((seal(b), seal(c)))),
    "altered-large-direct": lambda seal, a, b, c: _pieces(_flip(seal(b), 90_000)),
}
LARGE = {"altered-large-direct"}


def _pieces(frame: bytes) -> tuple[bytes, ...]:
    """A frame in three writes, so the slave receives the block straight into its log."""
    return frame[:1000], frame[1000:60_000], frame[60_000:]


@pytest.mark.parametrize("lane", [pytest.param(False, id="python"),
                                  pytest.param(True, id="lane", marks=needs.compiled_lane())])
@pytest.mark.parametrize("case", sorted(TAMPER))
def test_a_tampered_frame_from_the_master_closes_the_link_and_stores_nothing(tmp_path, caplog, case: str,
                                                                            lane: bool) -> None:
    """Either receive path (the compiled lane checks the tags in C and takes a large block
    in its buffer, so no direct receive there)."""
    cfg = dataclasses.replace(CFG, ha_slave_compiled_lane=lane)
    with replica_stores(tmp_path, SEG, "s", "ref") as [(scl, sem), (ref, _)]:
        sem.append(1, 0)
        fill(scl, 200_000)
        fill(ref, 400_000)  # the same records and more: a valid continuation
        mx = scl.max_offset
        a_data = bytes(ref.read(mx, 3000))
        b_size = 100_000 if case in LARGE else 3000
        b_data = bytes(ref.read(mx + 3000, b_size))
        c_data = bytes(ref.read(mx + 3000 + b_size, 3000))
        outcome: dict[str, Any] = {}

        async def master_script(reader: Any, writer: Any) -> None:
            if outcome.get("done"):
                # The slave reconnecting after the close: hold the link, say nothing.
                while await reader.read(1 << 16):
                    pass
                return
            dec = frames.FramedDecoder(Direction.SLAVE_TO_MASTER, 1 << 20)
            got: list[Any] = []
            await read_frames(reader, dec, got, 1)
            writer.write(frames.framed.encode(frames.HandshakeMaster(0, mx + 200_000, 1)))
            await read_frames(reader, dec, got, 2)
            writer.write(frames.framed.encode(frames.ReturnEpoch(((1, 0, mx + 200_000),))))
            await read_frames(reader, dec, got, 3)
            seal = writer.script.seal
            a = seal(_block(mx, a_data))  # the control: a valid block is taken
            writer.write_raw(a)
            await writer.drain()
            await wait_until_async(lambda: scl.max_offset == mx + len(a_data), 5, "block A applied")
            outcome["after_a"] = store_digest(scl)
            b = _block(mx + len(a_data), b_data)
            c = _block(mx + len(a_data) + len(b_data), c_data)
            for part in TAMPER[case](seal, a, b, c):
                writer.write_raw(part)
                await writer.drain()
                await asyncio.sleep(0.05)  # the slave sees the frame in pieces
            outcome["done"] = True
            try:
                while await reader.read(1 << 16):
                    pass
            except ConnectionError:
                pass
            writer.close()

        def refused() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "rmqha.ha.slave" and "failed authentication" in r.getMessage()]

        async def run() -> None:
            async with scripted_master(master_script) as port, slave_running(ha_slave(scl, sem, port, cfg)) as s:
                await wait_until_async(lambda: bool(refused()), 10, "the slave refusing the frame")
                if case in LARGE and not lane:
                    assert s.direct_receives >= 1
                assert (s.lane_blocks > 0) == lane  # block A: which path took it

        caplog.set_level(logging.INFO, logger="rmqha.ha.slave")
        asyncio.run(run())
        assert len(refused()) == 1, refused()
        assert store_digest(scl) == outcome["after_a"]  # nothing of the altered frame
        assert scl.max_offset == mx + len(a_data)


# --- frames altered on an authenticated link: slave -> master -----------------------------------


def test_a_tampered_ack_closes_the_link_and_is_not_counted(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="rmqha.ha.master")
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        end = _append_marked(mcl, 100_000)
        half = end // 2

        def replicate(port: int) -> tuple[socket.socket, ScriptedAuth]:
            """Slave 2 with the secret: the handshake, the whole log, the control ack."""
            sock = socket.create_connection(("127.0.0.1", port))
            script = ScriptedAuth(auth_for(2))
            script.connect_sync(sock)
            sock.sendall(script.seal(_framed_claim(2)))
            dec = frames.FramedDecoder(Direction.MASTER_TO_SLAVE, 1 << 22)
            got: list[Any] = []
            while sum(len(f.data) for f in got if isinstance(f, frames.TransferData)) < end:
                got += dec.feed(script.unseal(sock.recv(1 << 16)))
            sock.sendall(script.seal(_framed(7, struct.pack(">q", half))))
            return sock, script

        def tamper(sock: socket.socket, script: ScriptedAuth) -> bytes:
            ack = script.seal(_framed(7, struct.pack(">q", half + 1)))
            sock.sendall(ack[:24] + struct.pack(">q", end) + ack[32:])  # the offset altered
            return _read_until_closed(sock, 5)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0)
            async with master_running(m) as port:
                loop = asyncio.get_running_loop()
                sock, script = await loop.run_in_executor(None, replicate, port)
                with sock:
                    await wait_until_async(lambda: m.status()["slaves"][0]["ack_offset"] == half, 5,
                                           "the control ack counted")
                    await loop.run_in_executor(None, tamper, sock, script)
                await wait_until_async(lambda: not m.status()["slaves"], 5, "the link dropped")
                assert not await m.sync.wait_for_acks(end, None, timeout=0.3)
                assert m.confirm_offset == half

        asyncio.run(run())
    closing = [r.getMessage() for r in caplog.records if "closing HA link" in r.getMessage()]
    assert len(closing) == 1 and "failed authentication" in closing[0], closing
