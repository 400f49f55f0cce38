"""A master that speaks RocketMQ 5's AutoSwitch HA protocol and labels its transfer batches
the way RocketMQ's master does, for testing rmqha's slave against it.

Written from the behaviour of RocketMQ's ``AutoSwitchHAConnection`` (no code of it): the
layouts are spelled out with ``struct`` here, independent of :mod:`rmqha.ha.frames`.  What
matters is the labelling:

* the connection keeps a *current transfer epoch* and its end offset (open-ended for the
  newest epoch), set from the epoch holding the first offset it sends;
* a batch that would pass the current epoch's end is cut there, the connection switches
  to the next epoch, and only then is the header built: so the last chunk of epoch N is
  labelled with epoch N+1 and N+1's start offset (and a batch that ended exactly at N's
  end is followed by an empty chunk labelled N+1);
* a batch never passes the end of a commitlog file (RocketMQ reads one mapped file);
* becoming master again (:meth:`RocketMQStyleMaster.change_to_master`) closes every
  connection and appends the new epoch at the log's max offset, as ``changeToMaster`` does.

The store is rmqha's CommitLog + EpochMap (so the epoch file can be compared byte for
byte with the slave's); only the protocol and the labelling are RocketMQ's.
"""
from __future__ import annotations

import asyncio
import struct
from typing import Any

HANDSHAKE, TRANSFER = 1, 2
_SLAVE_HANDSHAKE = struct.Struct(">ihhq")  # state, isSyncFromLastFile, isAsyncLearner, brokerId
_SLAVE_REPORT = struct.Struct(">iq")  # state, maxPhyOffset
_MASTER_HANDSHAKE = struct.Struct(">iiqi")  # state, bodySize, maxOffset, lastEpoch
_EPOCH_ENTRY = struct.Struct(">iq")  # epoch, startOffset
_TRANSFER = struct.Struct(">iiqiqq")  # state, bodySize, offset, epoch, epochStartOffset, confirm


class RocketMQStyleMaster:
    """Serves one commitlog + epoch map to slaves over real sockets on 127.0.0.1."""

    def __init__(self, commitlog: Any, epoch_map: Any, *, batch_bytes: int = 32 * 1024,
                 heartbeat_s: float = 0.1, mislabel: bool = False) -> None:
        self.cl = commitlog
        self.em = epoch_map
        self.batch_bytes = batch_bytes
        self.heartbeat_s = heartbeat_s
        #: Testing the slave's refusals: label the epoch-ending chunk with the next epoch
        #: but cut it 1 record short of the epoch's end (what RocketMQ never sends).
        self.mislabel = mislabel
        self.port = 0
        self.connections = 0
        #: (offset, size, epoch, epoch_start) of every chunk sent, for the test to inspect.
        self.sent: list[tuple[int, int, int, int]] = []
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop_connections()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def open_connections(self) -> int:
        return len(self._writers)

    def change_to_master(self, epoch: int) -> None:
        """RocketMQ's changeToMaster: close the connections, new epoch at the max offset."""
        self._drop_connections()
        self.em.append(epoch, self.cl.max_offset)

    def _drop_connections(self) -> None:
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    # --- the epoch cache as the connection sees it ---------------------------------------------

    def _entries(self) -> list[tuple[int, int, int]]:
        """(epoch, start, end) with end -1 for the newest (open-ended)."""
        pairs = list(self.em.pairs())
        return [(e, s, pairs[i + 1][1] if i + 1 < len(pairs) else -1) for i, (e, s) in enumerate(pairs)]

    def _entry_for_offset(self, offset: int) -> tuple[int, int, int] | None:
        for e, s, end in self._entries():
            if s <= offset and (end == -1 or offset < end):
                return e, s, end
        return None

    def _entry(self, epoch: int) -> tuple[int, int, int] | None:
        return next((x for x in self._entries() if x[0] == epoch), None)

    def _next_entry(self, epoch: int) -> tuple[int, int, int] | None:
        return next((x for x in self._entries() if x[0] > epoch), None)

    # --- one connection --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            state, _from_last, _learner, _broker_id = _SLAVE_HANDSHAKE.unpack(
                await reader.readexactly(_SLAVE_HANDSHAKE.size))
            assert state == HANDSHAKE, f"slave handshake state {state}"
            pairs = self.em.pairs()
            writer.write(_MASTER_HANDSHAKE.pack(HANDSHAKE, len(pairs) * _EPOCH_ENTRY.size,
                                                self.cl.max_offset, self.em.last_epoch())
                         + b"".join(_EPOCH_ENTRY.pack(e, s) for e, s in pairs))
            await writer.drain()
            state, requested = _SLAVE_REPORT.unpack(await reader.readexactly(_SLAVE_REPORT.size))
            assert state == TRANSFER, f"slave report state {state}"
            acked = [requested]
            reading = asyncio.ensure_future(self._read_acks(reader, acked))
            try:
                await self._transfer(writer, requested, acked, reading)
            finally:
                reading.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _read_acks(reader: asyncio.StreamReader, acked: list[int]) -> None:
        while True:
            _, offset = _SLAVE_REPORT.unpack(await reader.readexactly(_SLAVE_REPORT.size))
            acked[0] = offset

    async def _transfer(self, writer: asyncio.StreamWriter, requested: int, acked: list[int],
                        reading: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        nxt = requested if requested != 0 else self.cl.min_offset
        first = self._entry_for_offset(nxt)
        assert first is not None, f"no epoch holds offset {nxt}"
        cur_epoch, _, cur_end = first
        last_write = 0.0
        while not reading.done():
            size = self.cl.max_offset - nxt
            if size > 0:
                size = min(size, self.batch_bytes, self.cl.segment_end(nxt) - nxt)
                if cur_end != -1 and nxt + size > cur_end:
                    following = self._next_entry(cur_epoch)
                    assert following is not None
                    size = cur_end - nxt
                    cur_epoch, cur_end = following[0], following[2]
                    if self.mislabel and size > 0:
                        size -= 1
                offset, nxt = nxt, nxt + size
                await self._send(writer, offset, size, cur_epoch, acked)
                last_write = loop.time()
                continue
            if loop.time() - last_write >= self.heartbeat_s:
                await self._send(writer, nxt, 0, cur_epoch, acked)
                last_write = loop.time()
            await asyncio.sleep(0.01)

    async def _send(self, writer: asyncio.StreamWriter, offset: int, size: int, epoch: int,
                    acked: list[int]) -> None:
        entry = self._entry(epoch)
        assert entry is not None
        confirm = min(self.cl.max_offset, acked[0])
        data = bytes(self.cl.read(offset, size)) if size else b""
        writer.write(_TRANSFER.pack(TRANSFER, size, offset, epoch, entry[1], confirm) + data)
        self.sent.append((offset, size, epoch, entry[1]))
        await writer.drain()
