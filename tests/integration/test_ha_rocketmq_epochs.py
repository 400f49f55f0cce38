"""rmqha's slave (``rocketmq`` dialect) following a master that labels its batches the way
RocketMQ's AutoSwitchHAConnection does (tests/support/rocketmq_ha_master.py): the chunk that ends
an epoch arrives labelled with the next epoch and its start offset."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rmqha.testing.ha import (
    EPOCH_FILE,
    assert_same_log,
    fast_config,
    fill,
    ha_slave,
    replica_stores,
    slave_running,
    wait_until_async,
)
from rocketmq_ha_master import RocketMQStyleMaster

SEG = 1 << 20
CFG = fast_config(ha_protocol="rocketmq", ha_housekeeping_interval_ms=3000)


def _epoch_file(base: Path, name: str) -> bytes:
    return (base / name / EPOCH_FILE).read_bytes()


def test_slave_follows_rocketmq_labels_across_two_epoch_changes(tmp_path: Path) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 50_000)
        e2 = mcl.max_offset
        mem.append(2, e2)
        fill(mcl, 40_000, seed=1)

        async def caught_up() -> None:
            await wait_until_async(lambda: scl.max_offset == mcl.max_offset
                                   and sem.pairs() == mem.pairs(), 20, "slave caught up")

        async def run() -> None:
            master = RocketMQStyleMaster(mcl, mem, batch_bytes=32 * 1024)
            port = await master.start()
            try:
                slave = ha_slave(scl, sem, port, CFG)
                async with slave_running(slave):
                    # Epoch 1 -> 2 within one session: the chunk ending epoch 1 comes
                    # labelled (2, e2) and starts before e2.
                    await caught_up()
                    early = [c for c in master.sent if c[1] and c[0] < c[3]]
                    assert early and early[0][0] + early[0][1] == e2 and early[0][2:] == (2, e2)
                    assert slave.sessions == 1, slave.last_error
                    # Live traffic in epoch 2, then the master is elected again twice: a
                    # short epoch 3 (under one batch) and epoch 4.
                    fill(mcl, 20_000, seed=2)
                    await caught_up()
                await wait_until_async(lambda: master.open_connections == 0, 10,
                                       "the first session to end on the master")
                master.change_to_master(3)
                e3 = mcl.max_offset
                fill(mcl, 3_000, batch=2, seed=3)
                master.change_to_master(4)
                e4 = mcl.max_offset
                fill(mcl, 30_000, seed=4)
                master.sent.clear()
                # A new session starting at e3: epoch 3 fits one chunk, which RocketMQ labels
                # (4, e4): the slave takes epoch 3's entry from the handshake.
                slave = ha_slave(scl, sem, port, CFG)
                async with slave_running(slave):
                    await caught_up()
                    assert master.sent[0][:4] == (e3, e4 - e3, 4, e4)
                    assert slave.sessions == 1, slave.last_error
                assert sem.pairs() == mem.pairs() == [(1, 0), (2, e2), (3, e3), (4, e4)]
            finally:
                await master.stop()

        asyncio.run(asyncio.wait_for(run(), 60))
        assert_same_log(mcl, scl, "slave vs RocketMQ-style master")
    assert _epoch_file(tmp_path, "s") == _epoch_file(tmp_path, "m")


def test_slave_refuses_a_later_epoch_label_that_does_not_end_the_epoch(tmp_path: Path) -> None:
    """Only the chunk that ends exactly at the labelled epoch's start is accepted."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 50_000)
        e2 = mcl.max_offset
        mem.append(2, e2)
        fill(mcl, 10_000, seed=1)

        async def run() -> None:
            master = RocketMQStyleMaster(mcl, mem, batch_bytes=32 * 1024, mislabel=True)
            port = await master.start()
            try:
                slave = ha_slave(scl, sem, port, CFG)
                async with slave_running(slave):
                    await wait_until_async(lambda: "starts later" in slave.last_error, 20,
                                           "the mislabelled chunk refused")
                    # Nothing of the refused chunk (or after it) was stored.
                    assert scl.max_offset < e2
                    assert [p for p in sem.pairs() if p[0] == 2] == []
            finally:
                await master.stop()

        asyncio.run(asyncio.wait_for(run(), 60))
    assert os.path.exists(tmp_path / "s")


def test_slave_records_an_epoch_from_an_empty_rocketmq_chunk(tmp_path: Path) -> None:
    """A batch ending exactly at an epoch's end: RocketMQ's master then sends an empty
    chunk labelled with the next epoch at that offset, before the next epoch's data."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 50_000)
        e2 = mcl.max_offset
        mem.append(2, e2)
        fill(mcl, 20_000, seed=1)

        async def run() -> None:
            # One batch covers epoch 1 exactly.
            master = RocketMQStyleMaster(mcl, mem, batch_bytes=e2)
            port = await master.start()
            try:
                slave = ha_slave(scl, sem, port, CFG)
                async with slave_running(slave):
                    await wait_until_async(lambda: scl.max_offset == mcl.max_offset
                                           and sem.pairs() == mem.pairs(), 20, "slave caught up")
                    assert slave.sessions == 1, slave.last_error
                assert master.sent[0] == (0, e2, 1, 0)
                assert master.sent[1] == (e2, 0, 2, e2)  # the empty chunk opening epoch 2
            finally:
                await master.stop()

        asyncio.run(asyncio.wait_for(run(), 60))
        assert_same_log(mcl, scl, "slave vs RocketMQ-style master")
    assert _epoch_file(tmp_path, "s") == _epoch_file(tmp_path, "m")
