"""SyncStateSet shrink and expand around a slave isolated by a TCP proxy, and #5663's union.

The controller's AlterSyncStateSet rules are played by :class:`SyncStateAuthority` (epoch
fencing, set epochs); everything else is real: sockets, proxy, stores, HA objects.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rmqha.ha import HAMaster
from rmqha.testing.ha import (SyncStateAuthority, assert_same_log, fast_config, fill, ha_master, ha_slave,
                              master_running, replica_stores, slave_running, wait_until_async)
from tcp_proxy import TcpProxy

SEG = 4 << 20
MAX_LAG_MS = 1000
CFG = fast_config(ha_housekeeping_interval_ms=600, ha_max_time_slave_not_catchup_ms=MAX_LAG_MS,
                  check_sync_state_set_period_ms=50)


def _master_with_authority(cl, em, authority: SyncStateAuthority) -> HAMaster:
    """Master 1 whose SyncStateSet changes go through ``authority`` (the controller's rules)."""
    return ha_master(cl, em, CFG, alter_sync_state_set=authority.callback(1, authority.master_epoch),
                     sync_state_set=[1], sync_state_set_epoch=authority.set_epoch)


@contextmanager
def _proxy(port: int) -> Iterator[TcpProxy]:
    """A TCP proxy in front of 127.0.0.1:port, stopped on leaving."""
    proxy = TcpProxy("127.0.0.1", port)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_isolated_slave_is_shrunk_after_timeout_and_expanded_after_catch_up(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 1 << 20)
        authority = SyncStateAuthority(master_id=1, registered={2})

        async def run() -> None:
            m = _master_with_authority(mcl, mem, authority)
            async with master_running(m) as port:
                with _proxy(port) as proxy:
                    async with slave_running(ha_slave(scl, sem, proxy.port, CFG)):
                        await wait_until_async(lambda: m.sync_state_set == {1, 2}, 10, "expansion")
                        end = fill(mcl, 200_000, seed=1)
                        assert await m.sync.wait_for_acks(end, None, timeout=10)
                        assert m.confirm_offset == end

                        proxy.cut("blackhole")  # a partition: nobody sees a FIN
                        cut_at = time.monotonic()
                        end2 = fill(mcl, 300_000, seed=2)
                        await asyncio.sleep(0.1)
                        assert m.confirm_offset == end  # member 2 lags: not confirmed
                        assert not await m.sync.wait_for_acks(end2, None, timeout=0.2)
                        await wait_until_async(lambda: m.sync_state_set == {1}, 10, "shrink")
                        shrunk_after = time.monotonic() - cut_at
                        assert shrunk_after >= MAX_LAG_MS / 1000 * 0.9, shrunk_after
                        assert m.confirm_offset == mcl.max_offset  # a set of one confirms its max
                        assert scl.max_offset < end2

                        proxy.restore()
                        await wait_until_async(lambda: m.sync_state_set == {1, 2}, 15, "expansion after catch-up")
                        # (A compiled lane's acks lead the log's bookkeeping by one loop wake-up.)
                        await wait_until_async(lambda: scl.max_offset >= end2, 5, "the slave's log")
                        assert [sorted(ids) for ids, _ in authority.history] == [[1, 2], [1], [1, 2]]
                        assert m.sync_state_set_epoch == authority.set_epoch == 4

        asyncio.run(run())
        assert_same_log(mcl, scl)


def test_union_of_old_and_new_set_counts_while_proposal_in_flight(tmp_path) -> None:
    """#5663: the controller may have applied {1,2} already; until its answer arrives the
    master must wait for member 2 too, or a failover to 2 could lose acknowledged data."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 500_000)
        authority = SyncStateAuthority(master_id=1, registered={2})

        async def run() -> None:
            authority.gate = asyncio.Event()  # hold the AlterSyncStateSet answer
            m = _master_with_authority(mcl, mem, authority)
            async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, CFG)) as s:
                try:
                    await wait_until_async(lambda: m.status()["proposed_sync_state_set"] == [1, 2], 10, "proposal")
                    assert m.sync_state_set == {1}
                    assert m.sync.sync_state.replica_count() == 2
                    end = fill(mcl, 100_000, seed=1)
                    assert await m.sync.wait_for_acks(end, None, timeout=10)  # slave 2 acks: fine
                    await s.stop()
                    await wait_until_async(lambda: not m.status()["slaves"], 5, "link gone")
                    confirm = m.confirm_offset
                    end2 = fill(mcl, 100_000, seed=2)
                    # The applied set is only {1}, but {1,2} may be live on the controller.
                    assert not await m.sync.wait_for_acks(end2, None, timeout=0.3)
                    assert m.confirm_offset == confirm < end2
                    authority.gate.set()
                    await wait_until_async(lambda: m.sync_state_set == {1, 2}, 5, "answer applied")
                    assert m.status()["proposed_sync_state_set"] is None
                    assert m.confirm_offset == confirm  # member 2 still has no link
                finally:
                    authority.gate.set()  # before the stops: nothing may wait on the held answer

        asyncio.run(run())


def test_link_reset_by_proxy_reconnects_and_resumes_without_rewriting(tmp_path) -> None:
    """A reset link (proxy "close" mode) makes the slave reconnect with backoff while the
    link is down, then resume from its max offset: no truncation, no duplicate bytes."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 1 << 20)
        truncated: list[int] = []

        async def run() -> None:
            async with master_running(ha_master(mcl, mem, CFG)) as port:
                with _proxy(port) as proxy:
                    async with slave_running(ha_slave(scl, sem, proxy.port, CFG, on_truncate=truncated.append)) as s:
                        await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 10, "first catch-up")
                        proxy.cut("close")
                        fill(mcl, 500_000, seed=1)
                        accepted = proxy.accepted
                        await wait_until_async(lambda: proxy.accepted >= accepted + 2, 10, "refused reconnects")
                        assert scl.max_offset < mcl.max_offset
                        proxy.restore()
                        await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 10, "resumed")
                        assert s.sessions >= 2

        asyncio.run(run())
        assert truncated == []
        assert_same_log(mcl, scl)
