"""The ``rocketmq`` dialect byte for byte, as a RocketMQ 5 AutoSwitchHAClient would see it.

A raw socket speaks the RocketMQ layouts written out here with ``struct`` (independent of
rmqha.ha.frames) to a real HAMaster: 16-byte handshake, 20-byte master handshake with 12-byte
epoch entries, 12-byte reports, 36-byte transfer headers followed by the log bytes.
"""
from __future__ import annotations

import asyncio
import socket
import struct

from rmqha.ha import HAConfig
from rmqha.testing.ha import fill, ha_master, master_running, replica_stores

SEG = 1 << 20
CFG = HAConfig(ha_send_heartbeat_interval_ms=100, ha_housekeeping_interval_ms=2000,
               ha_transfer_batch_bytes=32768)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "master closed the link"
        out += chunk
    return out


def test_rocketmq_slave_bytes_against_master(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        fill(mcl, 50_000)
        e2 = mcl.max_offset
        mem.append(2, e2)
        fill(mcl, 40_000, seed=1)
        max_offset = mcl.max_offset

        async def run() -> None:
            async with master_running(ha_master(mcl, mem, CFG, known=(7,))) as port:
                def slave() -> list[tuple[int, int, int, int, int, int, bytes]]:
                    with socket.create_connection(("127.0.0.1", port)) as sock:
                        sock.settimeout(5)
                        # state=HANDSHAKE(1), isSyncFromLastFile=0, isAsyncLearner=0, brokerId=7
                        sock.sendall(struct.pack(">ihhq", 1, 0, 0, 7))
                        state, body, mmax, last = struct.unpack(">iiqi", _read_exact(sock, 20))
                        assert (state, body, mmax, last) == (1, 24, max_offset, 2)
                        entries = [struct.unpack(">iq", _read_exact(sock, 12)) for _ in range(body // 12)]
                        assert entries == [(1, 0), (2, e2)]
                        # first report: state=TRANSFER(2), maxPhyOffset=0 (an empty slave)
                        sock.sendall(struct.pack(">iq", 2, 0))
                        blocks = []
                        got = 0
                        while got < max_offset:
                            hdr = struct.unpack(">iiqiqq", _read_exact(sock, 36))
                            data = _read_exact(sock, hdr[1])
                            blocks.append((*hdr, data))
                            got += hdr[1]
                            sock.sendall(struct.pack(">iq", 2, got))
                        return blocks

                blocks = await asyncio.get_running_loop().run_in_executor(None, slave)
            offset = 0
            for state, size, off, epoch, estart, confirm, data in blocks:
                assert state == 2 and off == offset and size == len(data) <= 32768
                # Each block carries its own epoch (RocketMQ labelled an old epoch's last chunk
                # with the next epoch); none crosses the epoch boundary.
                assert (epoch, estart) == ((1, 0) if off < e2 else (2, e2))
                assert off >= e2 or off + size <= e2
                assert 0 <= confirm <= max_offset
                assert data == bytes(mcl.read(off, size))
                offset += size
            assert offset == max_offset

        asyncio.run(run())
