"""Failover at the replication layer: kill a master mid-transfer, promote, truncate, converge.

The broker normally drives these steps on a controller's orders; here the test plays the
controller (new epochs, who follows whom) and runs real HAMaster/HASlave objects on real
stores, with the first master in its own process so it can be SIGKILLed mid-transfer.
"""
from __future__ import annotations

import asyncio

from rmqha.testing.ha import (NodeProcess, assert_same_log, fast_config, fill, ha_master, ha_slave,
                              master_running, open_store, read_frames, replica_stores,
                              scripted_master, slave_running, wait_until_async)

SEG = 4 << 20
CFG = fast_config(ha_housekeeping_interval_ms=1500)


def test_kill_master_mid_transfer_old_master_truncates_exactly(tmp_path) -> None:
    a_dir, b_dir = str(tmp_path / "a"), str(tmp_path / "b")
    acl, aem = open_store(a_dir, SEG)
    aem.append(1, 0)
    x = fill(acl, 24 << 20)
    acl.close()
    # Small blocks and a small send window keep the transfer long enough to interrupt.
    a = NodeProcess(["--dir", a_dir, "--role", "master", "--broker-id", "1", "--segment-bytes", str(SEG),
                     "--batch-bytes", "8192", "--window-bytes", "65536", "--known", "2"],
                    log_path=str(tmp_path / "a.log"))
    bcl, bem = open_store(b_dir, SEG)
    acl = None
    truncated: list[int] = []
    try:
        async def phase1() -> None:
            async with slave_running(ha_slave(bcl, bem, a.port, CFG)):
                await wait_until_async(lambda: bcl.max_offset > 2 << 20, 30, "part of the log", interval=0.001)
                a.kill()

        asyncio.run(phase1())
        y = bcl.max_offset
        assert 0 < y < x, f"the kill should land mid-transfer (slave {y}, master {x})"
        # B is elected: cut its torn tail, open epoch 2 there, take writes.
        y_whole = bcl.cut_to_last_whole_record()
        assert y_whole <= y
        bem.append(2, y_whole)
        z = fill(bcl, 2 << 20, seed=11)

        acl, aem = open_store(a_dir, SEG)
        assert acl.max_offset == x  # SIGKILL lost nothing already in the page cache

        async def phase2() -> None:
            async with master_running(ha_master(bcl, bem, CFG, broker_id=2, known=(1,))) as port, \
                    slave_running(ha_slave(acl, aem, port, CFG, broker_id=1, on_truncate=truncated.append)) as s:
                await wait_until_async(lambda: acl.max_offset == z and truncated, 30, "old master converged")
                assert s.bytes_dropped == x - y_whole
                assert (s.sessions, s.last_error) == (1, "")

        asyncio.run(phase2())
        assert truncated == [y_whole]
        assert_same_log(bcl, acl)
        assert aem.pairs() == bem.pairs() == [(1, 0), (2, y_whole)]
    finally:
        a.stop()
        bcl.close()
        if acl is not None:
            acl.close()


def test_three_failovers_with_divergent_tails_converge(tmp_path) -> None:
    ids = (1, 2, 3)
    stores = {i: open_store(str(tmp_path / f"n{i}"), SEG) for i in ids}
    truncations: dict[int, list[int]] = {i: [] for i in ids}

    async def run() -> None:
        master_id, epoch = 1, 1
        stores[1][1].append(epoch, 0)
        fill(stores[1][0], 3 << 20)
        for rnd in range(4):
            cl, em = stores[master_id]
            m = ha_master(cl, em, CFG, broker_id=master_id, known=[i for i in ids if i != master_id])
            port = await m.start()
            slaves = [
                ha_slave(*stores[i], port, CFG, broker_id=i, on_truncate=truncations[i].append)
                for i in ids if i != master_id
            ]
            for s in slaves:
                await s.start()
            fill(cl, 1 << 20, seed=rnd)
            await wait_until_async(
                lambda: all(stores[s.broker_id][0].max_offset == cl.max_offset for s in slaves), 30,
                f"round {rnd}: slaves caught up")
            for s in slaves:
                assert (s.sessions, s.last_error) == (1, ""), (rnd, s.broker_id, s.last_error)
                await s.stop()
            if rnd == 3:
                await m.stop()
                return
            # Partitioned master keeps writing a tail nobody else gets, then dies.
            fill(cl, 200_000 + 50_000 * rnd, seed=100 + rnd)
            await m.stop()
            old, master_id = master_id, ids[(ids.index(master_id) + 1) % 3]
            epoch += 1
            ncl, nem = stores[master_id]
            start = ncl.cut_to_last_whole_record()
            nem.append(epoch, start)
            # The old master will truncate exactly to the new epoch's start.
            expected_cut = start
            before = len(truncations[old])
            # (checked after the next round's catch-up)
            stores_cut[old].append((before, expected_cut))

    stores_cut: dict[int, list[tuple[int, int]]] = {i: [] for i in ids}
    try:
        asyncio.run(run())
        ref_cl, ref_em = stores[1]
        for i in (2, 3):
            assert_same_log(ref_cl, stores[i][0], f"node {i}")
            assert stores[i][1].pairs() == ref_em.pairs()
        assert [e for e, _ in ref_em.pairs()] == [1, 2, 3, 4]
        for i in ids:
            for before, cut in stores_cut[i]:
                assert truncations[i][before] == cut, (i, truncations[i], cut)
        assert sum(len(v) for v in stores_cut.values()) == 3
    finally:
        for cl, _ in stores.values():
            cl.close()


def test_truncation_is_durable_before_transfer_resumes(tmp_path) -> None:
    """#10666: after the slave cuts its log, the on-disk state (what a crash leaves) must
    already be cut; RocketMQ only moved in-memory positions and the tail came back."""
    import shutil

    from rmqha.ha import frames
    from rmqha.ha.frames import Direction

    sdir = str(tmp_path / "s")
    scl, sem = open_store(sdir, SEG)
    sem.append(1, 0)
    p = fill(scl, 300_000)
    sem.append(2, p)
    x = fill(scl, 200_000, seed=4)  # epoch 2: a term the new master never had
    truncated: list[int] = []

    async def run() -> None:
        done = asyncio.Event()

        async def new_master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            dec = frames.FramedDecoder(Direction.SLAVE_TO_MASTER, 1 << 20)
            got: list = []
            try:
                await read_frames(reader, dec, got, 1)
                writer.write(frames.framed.encode(frames.HandshakeMaster(0, p + 5000, 3)))
                await read_frames(reader, dec, got, 2)
                writer.write(frames.framed.encode(frames.ReturnEpoch(((1, 0, p), (3, p, p + 5000)))))
                await read_frames(reader, dec, got, 3)
            except ConnectionError:  # a reconnect the stopping slave closed: not the crash point
                writer.close()
                return
            assert got[2].offset == p
            # Crash point: copy the slave's files now, while its store is still open.
            shutil.copytree(sdir, str(tmp_path / "crash"))
            done.set()
            writer.close()

        async with scripted_master(new_master) as port, \
                slave_running(ha_slave(scl, sem, port, CFG, on_truncate=truncated.append)):
            await asyncio.wait_for(done.wait(), 10)

    try:
        asyncio.run(run())
        assert truncated == [p] and x > p
        assert scl.max_offset == p
    finally:
        scl.close()
    crashed, cem = open_store(str(tmp_path / "crash"), SEG)
    try:
        assert crashed.max_offset == p  # the dropped tail did not come back
        assert cem.pairs() == [(1, 0)]
        assert sum(m.size for m in crashed.iter_messages()) == p
    finally:
        crashed.close()


def test_empty_epoch_at_the_cut_is_dropped_or_kept_without_cutting_data(tmp_path) -> None:
    """A slave that was elected (epoch 2 at P) but wrote nothing, then follows a master of
    epoch 3 from P: its empty epoch 2 goes, epoch 3 comes in, no byte is truncated."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        p = fill(mcl, 400_000)
        sem.append(1, 0)
        scl.append_data(0, mcl.read(0, p))  # a replica of epoch 1, up to P
        truncated: list[int] = []

        async def run() -> None:
            async with master_running(ha_master(mcl, mem, CFG)) as port, \
                    slave_running(ha_slave(scl, sem, port, CFG, on_truncate=truncated.append)) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset and s.sessions, 10, "caught up")

        sem.append(2, p)  # elected, wrote nothing
        mcl.cut_to_last_whole_record()
        mem.append(3, p)
        fill(mcl, 100_000, seed=8)
        asyncio.run(run())
        assert truncated == []
        assert sem.pairs() == mem.pairs() == [(1, 0), (3, p)]
        assert_same_log(mcl, scl)


def test_slave_follows_a_new_master_address_without_restart(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "a", "b", "s") as [(a_cl, a_em), (b_cl, b_em), (s_cl, s_em)]:
        a_em.append(1, 0)
        fill(a_cl, 500_000)

        async def run() -> None:
            ma = ha_master(a_cl, a_em, CFG, known=None)
            mb = ha_master(b_cl, b_em, CFG, broker_id=2, known=None)
            pa = await ma.start()
            pb = None
            sb = ha_slave(b_cl, b_em, pa, CFG)
            ss = ha_slave(s_cl, s_em, pa, CFG, broker_id=3)
            await sb.start()
            await ss.start()
            try:
                await wait_until_async(lambda: b_cl.max_offset == s_cl.max_offset == a_cl.max_offset, 20,
                                       "both follow A")
                await sb.stop()
                await ma.stop()
                start = b_cl.cut_to_last_whole_record()
                b_em.append(2, start)  # B is elected with epoch 2
                pb = await mb.start()
                ss.set_master_address(f"127.0.0.1:{pb}")
                fill(b_cl, 200_000, seed=3)
                await wait_until_async(lambda: s_cl.max_offset == b_cl.max_offset, 20, "slave follows B")
                assert ss.master_ha_address.endswith(str(pb))
                # The slave writes epoch entries off the transfer path (acks wait for them).
                await wait_until_async(lambda: len(s_em.pairs()) >= 2, 5, "epoch 2 entry on disk")
                assert s_em.pairs() == [(1, 0), (2, start)]
            finally:
                await ss.stop()
                await mb.stop()
                await ma.stop()

        asyncio.run(run())
        assert_same_log(b_cl, s_cl)
