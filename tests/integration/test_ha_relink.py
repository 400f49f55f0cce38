"""A slave id that connects again while an older link of the same id is open or handshaking.

The HA master keeps one link per slave id, and everything it counts for that id (the ack
offset, the waiters' copies, the caught-up time of the SyncStateSet) must follow the newest
link only: a new link for an id closes the older one, and a link that ends removes itself,
never a newer link of its id.  The scenario that broke it: slave 2 is replicating; an
earlier connection attempt of the same slave (its handshake delayed on the way) introduces
itself, which drops the live link; the slave reconnects; then the delayed attempt finishes
its handshake and leaves.  The master then held the dead link for id 2 (and, once that
one was gone, no link at all), and no send was acknowledged until the slave's live link
happened to fail.

Everything is real: sockets on 127.0.0.1, a real HASlave, stores in temporary directories;
the delayed attempt is a raw socket speaking the framed dialect, authenticated as slave 2
(it is the slave's own attempt: it holds the cluster secret).
"""
from __future__ import annotations

import asyncio

import pytest

from rmqha.ha import HAMaster, SlaveState
from rmqha.ha.dialects import EpochList, MasterHello, RefuseReason, slave_codec
from rmqha.ha.link_table import LinkTable
from rmqha.testing.ha import (
    auth_for,
    fast_config,
    fill,
    ha_master,
    ha_slave,
    master_running,
    read_frames,
    replica_stores,
    slave_running,
    wait_until_async,
)
from rmqha.testing.sealed_script import ScriptedAuth, SealedReader, SealedWriter

SEG = 1 << 20
#: The broker's default wait for a send's copies (SyncService.wait_for_acks).
ACK_TIMEOUT_S = 3.0
CFG = fast_config(ha_housekeeping_interval_ms=2000)


class DelayedAttempt:
    """One framed-dialect connection of slave 2, driven a step at a time (hello, then the
    rest of the handshake), as a connection attempt the network delayed would arrive."""

    def __init__(self, port: int, epoch: int) -> None:
        self.port = port
        self.epoch = epoch
        self.codec = slave_codec("framed", CFG.max_frame_bytes)
        self.reader: SealedReader | None = None
        self.writer: SealedWriter | None = None
        self.master_max = -1

    async def hello(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        script = ScriptedAuth(auth_for(2))

        async def send(data: bytes) -> None:
            writer.write(data)

        await script.connect(reader.readexactly, send)
        self.reader, self.writer = SealedReader(reader, script), SealedWriter(writer, script)
        self.writer.write(self.codec.hello(2, SEG, "127.0.0.1:1", False, False, self.epoch))
        got: list[object] = []
        await read_frames(self.reader, self.codec, got, 1)
        hello = got[0]
        assert isinstance(hello, MasterHello) and hello.result == RefuseReason.ACCEPTED
        self.master_max = hello.max_offset

    async def finish(self) -> bool:
        """The epoch query and the truncation confirm, reporting the master's max offset as
        an honest caught-up slave would; False when the master closed this link."""
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(self.codec.query_epoch(self.epoch))
            got: list[object] = []
            await read_frames(self.reader, self.codec, got, 1)
            assert isinstance(got[0], EpochList)
            self.writer.write(self.codec.confirm(self.master_max, self.epoch))
            await self.writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return False
        # A closed link may still take the writes above: make sure the master saw them.
        return await self._still_open()

    async def _still_open(self) -> bool:
        assert self.reader is not None
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), 0.3)
        except asyncio.TimeoutError:
            return True
        except ConnectionError:
            return False
        return bool(data)

    def leave(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _acked(m: HAMaster, mcl, seed: int) -> bool:
    """Append a little and wait for every SyncStateSet member's copy, as a send does."""
    end = fill(mcl, 20_000, seed=seed)
    return await m.sync.wait_for_acks(end, None, timeout=ACK_TIMEOUT_S)


async def _delayed_attempt_scenario(tmp_path, check) -> None:
    """Slave 2 replicating; an older attempt of it says hello, the slave reconnects, the
    older attempt finishes its handshake and leaves; then ``check(m, mcl, s, attempt_open)``."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)
        m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0)
        async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, CFG)) as s:
            assert await _acked(m, mcl, seed=1)
            attempt = DelayedAttempt(port, mem.last_epoch())
            await attempt.hello()
            sessions = s.sessions
            # The slave's live link may have been dropped by that hello: wait for it to be
            # back and replicating (or for it never to have left).
            await wait_until_async(lambda: s.state in (SlaveState.TRANSFER, SlaveState.SUSPEND)
                                   and scl.max_offset == mcl.max_offset, 10, "slave replicating again")
            await wait_until_async(lambda: _live_slaves(m) >= 1, 10, "master serving slave 2")
            attempt_open = await attempt.finish()
            attempt.leave()
            await check(m, mcl, s, attempt_open, sessions)


def _live_slaves(m: HAMaster) -> int:
    return sum(1 for x in m.status()["slaves"] if x["state"] in ("TRANSFER", "SUSPEND"))


def test_overlapping_reconnects_of_one_slave_never_stop_writes(tmp_path) -> None:
    async def check(m: HAMaster, mcl, s, attempt_open: bool, sessions: int) -> None:
        # The slave's reconnect closed the older attempt before it could finish.
        assert not attempt_open
        for seed in range(2, 7):
            assert await _acked(m, mcl, seed), f"send {seed} not acknowledged within {ACK_TIMEOUT_S}s"
        await wait_until_async(lambda: len(m.status()["slaves"]) == 1, 5, "the attempt's link gone")
        only = m.status()["slaves"][0]
        assert only["broker_id"] == 2 and only["ack_offset"] == mcl.max_offset

    asyncio.run(_delayed_attempt_scenario(tmp_path, check))


def test_negative_control_without_the_fix_writes_stall(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same scenario with the master's old bookkeeping (a new link for an id overwrites
    the entry without closing the link it replaces, and any link's acks are taken): the
    check above must fail."""
    def overwrite(self, sl) -> None:
        self._by_id[sl.broker_id] = sl

    monkeypatch.setattr(LinkTable, "claim", overwrite)
    monkeypatch.setattr(LinkTable, "holds", lambda self, sl: True)

    async def check(m: HAMaster, mcl, s, attempt_open: bool, sessions: int) -> None:
        assert attempt_open  # nothing closed the older attempt
        assert not await _acked(m, mcl, seed=2)  # and the master counts a dead link

    asyncio.run(_delayed_attempt_scenario(tmp_path, check))


def test_impostor_that_leaves_after_the_slave_reregistered_does_not_stop_writes(tmp_path) -> None:
    """The same id from a second, never replicating client: the slave re-registers, the
    other client finishes its handshake just after and leaves; sends keep being acked."""

    async def scenario() -> None:
        with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
            mem.append(1, 0)
            fill(mcl, 100_000)
            m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0)
            async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, CFG)) as s:
                assert await _acked(m, mcl, seed=1)
                for round_ in range(3):
                    other = DelayedAttempt(port, mem.last_epoch())
                    await other.hello()
                    await wait_until_async(lambda: _live_slaves(m) >= 1, 10, "slave re-registered")
                    await other.finish()
                    other.leave()
                    assert await _acked(m, mcl, seed=10 + round_), f"round {round_}: writes stalled"
                assert s.last_error == "" or "closed" in s.last_error

    asyncio.run(scenario())

