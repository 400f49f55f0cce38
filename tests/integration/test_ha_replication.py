"""HA replication on real sockets: catch-up, live streaming, dialects, epochs, handshake checks.

Master and slave run on one asyncio loop in this process over 127.0.0.1 with real
commitlogs in temporary directories; failover and kill tests are in test_ha_failover.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from rmqha.ha import HAConfig, HAMaster, HASlave, SlaveState
from rmqha.testing.ha import (SyncStateAuthority, assert_same_log, fast_config, fill, ha_master, ha_slave,
                              master_running, replica_stores, slave_running, wait_until_async)

SEG = 4 << 20

CFG = fast_config(ha_housekeeping_interval_ms=1500, ha_reconnect_max_ms=300, check_sync_state_set_period_ms=100)


def _master(cl, em, config: HAConfig = CFG, **kw) -> HAMaster:
    return ha_master(cl, em, config, known=(2, 3, 4), **kw)


def _slave(cl, em, port: int, config: HAConfig = CFG, **kw) -> HASlave:
    return ha_slave(cl, em, port, config, **kw)


#: The master's two ways of sending large blocks (sendmsg of mmap views; sendfile).
SEND_MODES = pytest.mark.parametrize("sendfile", [False, True], ids=["sendmsg", "sendfile"])
#: Links authenticated with the test cluster secret (the helpers' default), or run without
#: a secret on both sides (the mode of a broker configured without one).
SECRET_MODES = pytest.mark.parametrize("auth", [{}, {"auth": None}], ids=["authenticated", "no-secret"])


@SEND_MODES
def test_slave_catches_up_large_log_byte_identical(tmp_path, sendfile: bool) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 24 << 20)  # six segments, blank-padded ends included
        confirms: list[int] = []

        async def run() -> None:
            m = _master(mcl, mem, config=dataclasses.replace(CFG, ha_transfer_sendfile=sendfile))
            async with master_running(m) as port, \
                    slave_running(_slave(scl, sem, port, on_confirm=confirms.append)) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 60, "catch-up")
                await wait_until_async(lambda: s.state is SlaveState.SUSPEND, 5, "slave suspended")
                # The slave's last ack is on its way to the master when the slave is done.
                await wait_until_async(lambda: m.status()["slaves"][0]["ack_offset"] == mcl.max_offset,
                                       10, "the master has the last ack")
                st = m.status()
                assert st["slaves"][0]["lag_bytes"] == 0
                assert s.confirm_offset == mcl.max_offset  # lone-member set: confirm == max
                assert (s.sessions, s.last_error) == (1, "")  # one clean link, no retry

        asyncio.run(run())
        assert_same_log(mcl, scl)
        assert len(scl.segment_files()) == 7  # 24 MiB of records + blank padding over 4 MiB segments
        assert sem.pairs() == mem.pairs() == [(1, 0)]
        assert confirms and confirms[-1] == mcl.max_offset
        assert confirms == sorted(confirms)
        # The slave's records decode: the copy is a log, not just bytes.
        assert sum(1 for _ in scl.iter_messages()) == sum(1 for _ in mcl.iter_messages())


@SECRET_MODES
def test_slave_started_mid_stream_catches_up(tmp_path, auth: dict) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(3, 0)
        fill(mcl, 3 << 20)
        stop = threading.Event()
        written = threading.Event()

        def producer() -> None:
            # Appends from another thread: the append listener must hop onto the loop.
            body = b"x" * 700
            while not stop.is_set():
                mcl.append_batch("live", [body] * 32)
                written.set()

        async def run() -> None:
            async with master_running(_master(mcl, mem, **auth)) as port:
                t = threading.Thread(target=producer)
                t.start()
                try:
                    await asyncio.get_running_loop().run_in_executor(None, written.wait, 10)
                    async with slave_running(_slave(scl, sem, port, **auth)) as s:
                        await wait_until_async(lambda: scl.max_offset > 5 << 20, 30, "slave received live data")
                        stop.set()
                        await asyncio.get_running_loop().run_in_executor(None, t.join)
                        await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "final catch-up")
                        assert (s.sessions, s.last_error) == (1, "")
                finally:
                    stop.set()
                    t.join()

        asyncio.run(run())
        assert_same_log(mcl, scl)
        assert sem.pairs() == [(3, 0)]


@SEND_MODES
def test_rocketmq_dialect_slave_replicates_from_framed_master(tmp_path, sendfile: bool) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 5 << 20)
        mcl.cut_to_last_whole_record()
        mem.append(2, mcl.max_offset)
        fill(mcl, 3 << 20, seed=7)

        async def run() -> None:
            m = _master(mcl, mem, config=dataclasses.replace(CFG, ha_transfer_sendfile=sendfile))
            async with master_running(m) as port, slave_running(_slave(scl, sem, port, protocol="rocketmq")) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "rocketmq catch-up")
                assert m.status()["slaves"][0]["protocol"] == "rocketmq"
                # Live data keeps flowing in that dialect too, under a third epoch.
                m.on_new_epoch(4, mcl.max_offset)
                fill(mcl, 1 << 20, seed=9)
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "live rocketmq data")
                # The slave writes epoch entries off the transfer path: wait for epoch 4's.
                await wait_until_async(lambda: len(sem.pairs()) >= 3, 5, "epoch 4 entry on disk")
                assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(run())
        assert_same_log(mcl, scl)
        assert sem.pairs() == mem.pairs()
        assert [e for e, _ in sem.pairs()] == [1, 2, 4]


def test_new_epoch_reaches_connected_slave(tmp_path) -> None:
    """#9689: an epoch appended while a slave is connected labels the next blocks at once."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(5, 0)
        fill(mcl, 1 << 20)

        async def run() -> None:
            m = _master(mcl, mem)
            async with master_running(m) as port, slave_running(_slave(scl, sem, port)):
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "catch-up")
                start6 = mcl.max_offset
                mem.append(6, start6)  # what the broker does before telling the HA layer
                m.on_new_epoch(6, start6)
                fill(mcl, 100_000, seed=1)
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "epoch 6 data")
                # The slave writes epoch entries off the transfer path (acks wait for them).
                await wait_until_async(lambda: len(sem.pairs()) >= 2, 5, "epoch 6 entry on disk")
                assert sem.pairs() == [(5, 0), (6, start6)]
                # An epoch with no data (no write before the next one) never reaches the slave...
                m.on_new_epoch(7, mcl.max_offset)
                start8 = mcl.max_offset
                m.on_new_epoch(8, start8)  # ...and is replaced by the next one at the same start
                fill(mcl, 50_000, seed=2)
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "epoch 8 data")
                await wait_until_async(lambda: len(sem.pairs()) >= 3, 5, "epoch 8 entry on disk")
                assert sem.pairs() == [(5, 0), (6, start6), (8, start8)] == mem.pairs()

        asyncio.run(run())
        assert_same_log(mcl, scl)


@pytest.mark.parametrize(
    "case, reason",
    [
        ("stranger", "IDENTITY_MISMATCH"),
        ("segment", "SEGMENT_SIZE_MISMATCH"),
        ("stale-master", "STALE_MASTER_EPOCH"),
        ("same-id", "SAME_BROKER_ID"),
    ],
)
def test_handshake_refusals_touch_nothing(tmp_path, case: str, reason: str) -> None:
    seg = SEG * 2 if case == "segment" else SEG
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)], replica_stores(tmp_path, seg, "s") as [(scl, sem)]:
        mem.append(2, 0)
        fill(mcl, 200_000)
        slave_id = {"stranger": 9, "same-id": 1}.get(case, 2)
        if case == "stale-master":
            sem.append(3, 0)  # the slave already followed a newer master
            fill(scl, 50_000, seed=3)
        before = (scl.max_offset, sem.pairs())

        async def run() -> None:
            m = _master(mcl, mem)
            async with master_running(m) as port, slave_running(_slave(scl, sem, port, broker_id=slave_id)) as s:
                await wait_until_async(lambda: s.sessions >= 2, 10, "a refused retry")
                assert reason in s.last_error
                assert s.state in (SlaveState.READY, SlaveState.HANDSHAKE)
                assert m.status()["slaves"] == []

        asyncio.run(run())
        assert (scl.max_offset, sem.pairs()) == before


def test_rocketmq_stranger_is_refused(tmp_path) -> None:
    """The rocketmq dialect has no reason field: the master logs it and closes."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)

        async def run() -> None:
            async with master_running(_master(mcl, mem)) as port, \
                    slave_running(_slave(scl, sem, port, broker_id=42, protocol="rocketmq")) as s:
                await wait_until_async(lambda: s.sessions >= 2, 10, "refused retries")
                assert scl.max_offset == 0

        asyncio.run(run())


@SECRET_MODES
def test_confirm_offset_acks_and_frozen_member(tmp_path, auth: dict) -> None:
    """Confirm = min ack over the set; a member without a link freezes it (#6662)."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 300_000)
        confirms: list[int] = []

        async def run() -> None:
            m = _master(mcl, mem, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0,
                        on_confirm=confirms.append, **auth)
            async with master_running(m) as port:
                assert m.confirm_offset == 0  # member 2 never connected: frozen
                assert not await m.sync.wait_for_acks(mcl.max_offset, None, timeout=0.2)
                assert await m.sync.wait_for_acks(mcl.max_offset, 1, timeout=0.2)  # the master alone
                async with slave_running(_slave(scl, sem, port, **auth)) as s:
                    end = fill(mcl, 100_000, seed=1)
                    assert await m.sync.wait_for_acks(end, None, timeout=10)
                    assert await m.sync.wait_for_acks(end, 2, timeout=10)
                    assert m.confirm_offset == end
                    await wait_until_async(lambda: s.confirm_offset == end, 5, "slave learns the confirm offset")
                await wait_until_async(lambda: not m.status()["slaves"], 5, "link gone")
                end2 = fill(mcl, 10_000, seed=2)
                assert m.confirm_offset == end  # member 2 has no link: frozen, not advanced
                assert not await m.sync.wait_for_acks(end2, None, timeout=0.2)
                # The controller drops member 2: the lone master confirms its max again.
                m.set_sync_state_set([1], 2)
                assert m.confirm_offset == end2
                assert not m.set_sync_state_set([1, 2], 1)  # older set epoch: ignored
                assert m.sync_state_set == frozenset({1})

        asyncio.run(run())
        assert confirms == sorted(confirms)


def test_expand_then_async_learner_never_joins(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "m", "s2", "s3") as [(mcl, mem), s2, s3]:
        mem.append(1, 0)
        fill(mcl, 2 << 20)
        authority = SyncStateAuthority(master_id=1, registered={2, 3})

        async def run() -> None:
            m = _master(mcl, mem, sync_state_set=[1], sync_state_set_epoch=authority.set_epoch,
                        alter_sync_state_set=authority.callback(1, authority.master_epoch))
            async with master_running(m) as port, \
                    slave_running(_slave(*s3, port, broker_id=3, async_learner=True)), \
                    slave_running(_slave(*s2, port, broker_id=2)):
                await wait_until_async(lambda: m.sync_state_set == {1, 2}, 10, "expansion to {1,2}")
                await wait_until_async(lambda: s3[0].max_offset == mcl.max_offset, 10, "learner caught up")
                await asyncio.sleep(0.3)  # several set checks with the learner caught up
                assert m.sync_state_set == {1, 2}
                assert all(3 not in ids for ids, _ in authority.history)
                assert m.sync_state_set_epoch == authority.set_epoch
                st = {x["broker_id"]: x for x in m.status()["slaves"]}
                assert st[2]["in_sync"] and not st[3]["in_sync"] and st[3]["async_learner"]

        asyncio.run(run())
        for cl, _ in (s2, s3):
            assert_same_log(mcl, cl)


def test_slave_with_data_but_no_epochs_drops_its_log(tmp_path) -> None:
    """RocketMQ skipped truncation here; with nothing provably shared, drop it all."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 1 << 20)
        own = fill(scl, 300_000, seed=5)  # same sizes, different bytes, no epoch file
        truncated: list[int] = []

        async def run() -> None:
            async with master_running(_master(mcl, mem)) as port, \
                    slave_running(_slave(scl, sem, port, on_truncate=truncated.append)) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "catch-up after drop")
                assert s.bytes_dropped == own

        asyncio.run(run())
        assert truncated == [0]
        assert_same_log(mcl, scl)


@pytest.mark.parametrize("from_last_file", [False, True])
def test_empty_slave_starts_at_min_offset_or_last_segment(tmp_path, from_last_file: bool) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 3 * SEG + 100_000)
        mcl.delete_segments_before(SEG)  # the master's log now starts at SEG
        cfg = dataclasses.replace(CFG, sync_from_last_file=from_last_file)

        async def run() -> None:
            async with master_running(_master(mcl, mem)) as port, \
                    slave_running(_slave(scl, sem, port, config=cfg)):
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "catch-up")

        asyncio.run(run())
        expected = 3 * SEG if from_last_file else SEG
        assert scl.min_offset == expected
        for off in (expected, mcl.max_offset - 1000):
            assert bytes(scl.read(off, 1000)) == bytes(mcl.read(off, 1000))


def test_slave_behind_the_masters_min_offset_drops_its_log_and_restarts(tmp_path, caplog) -> None:
    """Retention on the master removed everything after the slave's end: the slave cannot
    continue its log, so it drops it (logging the bytes) and starts at the master's min."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 3 * SEG + 100_000)
        # The slave holds a consistent prefix: the master's first bytes, same epoch.
        size = mcl.read_message(0).size  # fill() writes records of one size
        own = size * ((1 << 20) // size)
        scl.append_data(0, mcl.read(0, own))
        sem.append(1, 0)
        assert scl.whole_offset == own
        mcl.delete_segments_before(2 * SEG)  # the master now starts at 2 * SEG
        truncated: list[int] = []

        async def run() -> None:
            async with master_running(_master(mcl, mem)) as port, \
                    slave_running(_slave(scl, sem, port, on_truncate=truncated.append)) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30, "restart at the master's min")
                assert s.bytes_dropped == own
                assert s.sessions == 1  # no retry loop: the first session restarts the log

        with caplog.at_level("WARNING", logger="rmqha.ha.slave"):
            asyncio.run(run())
        assert truncated == [0]
        assert any(f"dropping the whole log ({own} bytes" in r.getMessage() for r in caplog.records)
        assert scl.min_offset == 2 * SEG
        assert_same_log(mcl, scl)
        assert sem.pairs() == mem.pairs() == [(1, 0)]
        assert scl.queue_offsets() == mcl.queue_offsets()


def test_a_slave_reopened_before_a_half_record_takes_it_from_its_master(tmp_path) -> None:
    """A slave stopped mid-record, its file's zeros standing in for the rest of the
    record's properties (sizes and body CRC still pass), reopens before that record and,
    linked to its master, receives it whole: the logs end byte-identical."""
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        offs = [mcl.append("half", bytes([i]) * 700, 0, {"KEYS": f"k{i}", "TAGS": "paid"})[0]
                for i in range(8)]
        with replica_stores(tmp_path, SEG, "s") as [(scl, sem)]:
            sem.append(1, 0)
            scl.append_data(0, mcl.read(0, mcl.max_offset - 3))  # "id\x02" never came
            scl.flush()
        with replica_stores(tmp_path, SEG, "s") as [(scl, sem)]:
            assert scl.max_offset == offs[7]

            async def run() -> None:
                async with master_running(_master(mcl, mem)) as port, \
                        slave_running(_slave(scl, sem, port)):
                    await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 30,
                                           "the slave took the record again")

            asyncio.run(run())
            assert_same_log(mcl, scl)
            assert scl.read_message(offs[7]).properties == {"KEYS": "k7", "TAGS": "paid"}


def test_slave_catches_up_100mb(tmp_path) -> None:
    with replica_stores(tmp_path, 32 << 20, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 100 << 20, body_size=1024)

        async def run() -> None:
            async with master_running(_master(mcl, mem)) as port, slave_running(_slave(scl, sem, port)) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 120, "100 MB catch-up")
                assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(run())
        assert_same_log(mcl, scl)


def test_config_rejects_bad_values() -> None:
    from rmqha.errors import ConfigError

    with pytest.raises(ConfigError, match="ha_protocol"):
        HAConfig(ha_protocol="carrier-pigeon")
    with pytest.raises(ConfigError, match="max_frame_bytes"):
        HAConfig(ha_transfer_batch_bytes=1 << 20, max_frame_bytes=1 << 20)
    with pytest.raises(ConfigError, match="ha_transfer_sendfile"):
        HAConfig(ha_transfer_sendfile="yes")
    with pytest.raises(ConfigError, match="ha_housekeeping_interval_ms"):
        HAConfig(ha_send_heartbeat_interval_ms=1000, ha_housekeeping_interval_ms=500)
    cfg = HAConfig.from_object({"ha_transfer_batch_bytes": 65536, "unrelated": 1})
    assert cfg.ha_transfer_batch_bytes == 65536


@pytest.mark.parametrize("flush_before_ack", [False, True], ids=["rocketmq-default", "flush-first"])
def test_slave_flush_before_ack_setting(tmp_path, flush_before_ack: bool) -> None:
    """RocketMQ's slave acks what is in its page cache (off, the default); with
    ``ha_slave_flush_before_ack`` no ack the master sees is ever beyond what the slave
    fsynced.  The slaves' commitlogs flush on a long timer, so only the setting can make
    the flushed offset keep up."""
    assert HAConfig().ha_slave_flush_before_ack is False
    cfg = dataclasses.replace(CFG, ha_slave_flush_before_ack=flush_before_ack)
    with replica_stores(tmp_path, SEG, "m", "s", flush_interval_ms=60_000) as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        seen: list[tuple[int, int]] = []

        async def run() -> None:
            m = _master(mcl, mem)
            async with master_running(m) as port, slave_running(_slave(scl, sem, port, config=cfg)):
                for _ in range(20):
                    mcl.append_batch("flushy", [b"f" * 500] * 8)
                    end = mcl.max_offset
                    await wait_until_async(lambda: m.status()["slaves"] and
                                           m.status()["slaves"][0]["ack_offset"] >= end, 10, "ack")
                    seen.append((m.status()["slaves"][0]["ack_offset"], scl.flushed_offset))

        asyncio.run(run())
        if flush_before_ack:
            assert all(flushed >= ack for ack, flushed in seen), seen
        else:
            assert any(flushed < ack for ack, flushed in seen), seen


@pytest.mark.parametrize("flush_before_ack", [False, True], ids=["rocketmq-default", "flush-first"])
def test_sync_flush_slave_acks_before_its_fsync_unless_told_otherwise(
        tmp_path, flush_before_ack: bool) -> None:
    """A slave with ``flush = sync`` used to fsync every received block before acking it,
    whatever ``ha_slave_flush_before_ack`` said.  Its fsyncs are held back here (a gate on
    its flusher): with the default, every ack arrives with no fsync done, and the blocks
    are still flushed once the gate opens; with the setting, none arrives before its fsync."""
    cfg = dataclasses.replace(CFG, ha_slave_flush_before_ack=flush_before_ack)
    with replica_stores(tmp_path, SEG, "m", "s", flush="sync", flush_interval_ms=60_000) \
            as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        gate = threading.Event()
        if flush_before_ack:
            gate.set()
        flusher = scl._flusher
        real_flush = flusher.flush_now

        def gated_flush(force_checkpoint: bool = False) -> None:
            gate.wait(10)  # bounded: without the fix the loop thread blocks in here
            real_flush(force_checkpoint)

        flusher.flush_now = gated_flush  # type: ignore[method-assign]
        seen: list[tuple[int, int, int]] = []

        async def run() -> None:
            m = _master(mcl, mem)
            async with master_running(m) as port, slave_running(_slave(scl, sem, port, config=cfg)):
                for i in range(10):
                    # Small blocks (append_data) and one past the direct-receive size.
                    mcl.append_batch("flushy", [b"f" * 500] * (8 if i % 5 else 400),
                                     wait_flush=False)
                    end = mcl.max_offset
                    await wait_until_async(lambda: m.status()["slaves"] and
                                           m.status()["slaves"][0]["ack_offset"] >= end, 20, "ack")
                    seen.append((m.status()["slaves"][0]["ack_offset"], scl.flush_count,
                                 scl.flushed_offset))
                gate.set()
                await wait_until_async(lambda: scl.flushed_offset == scl.max_offset == end, 20,
                                       "the slave flushed what it acked")

        asyncio.run(run())
        if flush_before_ack:
            assert all(flushed >= ack for ack, _, flushed in seen), seen
        else:
            assert [count for _, count, _ in seen] == [0] * len(seen), seen
