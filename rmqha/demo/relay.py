"""The demo's replication links: a relay in the demo's process in front of each broker's HA
port (each broker advertises it, ``ha_advertised_address``), so the demo can stall the
master's bytes to the slaves just before it kills the master and the killed master holds a
tail no slave has. Freezing the slaves (SIGSTOP) would not do: the master's bytes would
wait in the kernel's socket buffers, outlive the kill, and be read once the slaves resume.

A stall is capped at a quarter of the shortest timer it could trip (:func:`stall_cap_s`),
so it cannot change the story (a link dropped, a member shrunk out, a send timed out).
"""
from __future__ import annotations

import asyncio
import struct
from typing import Any

from rmqha.demo.report import warn
from rmqha.errors import ProtocolError, RmqhaError
from rmqha.ha import frames
from rmqha.ha.auth import PREFACE
from rmqha.ha.frame_mac import TAG as FRAME_TAG_BYTES
from rmqha.net.loop import EventLoopThread

#: The first byte of a TLS connection (a handshake record); no HA dialect starts so: a
#: frame's length, an offset or the authenticated link's preface come first.
_TLS_HANDSHAKE = b"\x16"
#: A stall lasts at most this fraction of the shortest timer it could trip (see
#: :func:`check_stall_timing`).
_STALL_MARGIN = 4




def stall_cap_s(broker: dict[str, Any], controller: dict[str, Any]) -> float:
    """The longest stall that trips no timer and so cannot change the story: a side that
    hears nothing for ha_housekeeping_interval_ms drops the link, a member not caught up for
    ha_max_time_slave_not_catchup_ms is shrunk out of the SyncStateSet, a send waits
    slave_timeout_ms for its acks.  Heartbeats to the controller do not cross the relay,
    but its timeouts are kept clear as well, so no election can pick another node."""
    timers = _stall_timers(broker, controller)
    return min(timers.values()) / 1000 / _STALL_MARGIN


def check_stall_timing(stall_s: float, broker: dict[str, Any], controller: dict[str, Any]) -> None:
    """Refuse a stall longer than :func:`stall_cap_s` allows, naming the timer."""
    for name, ms in _stall_timers(broker, controller).items():
        if stall_s * 1000 * _STALL_MARGIN > ms:
            raise RmqhaError(f"a {stall_s:.2f} s stall is too long for {name} = {ms} ms "
                             f"(at most 1/{_STALL_MARGIN} of it)")


def _stall_timers(broker: dict[str, Any], controller: dict[str, Any]) -> dict[str, int]:
    timers = {
        "ha_housekeeping_interval_ms": broker.get("ha_housekeeping_interval_ms"),
        "ha_max_time_slave_not_catchup_ms": broker.get("ha_max_time_slave_not_catchup_ms"),
        "slave_timeout_ms": broker.get("slave_timeout_ms"),
        "controller_heartbeat_timeout_ms": broker.get("controller_heartbeat_timeout_ms"),
        "broker_heartbeat_timeout": controller.get("broker_heartbeat_timeout"),
    }
    return {name: ms for name, ms in timers.items() if isinstance(ms, int)}



# --- the replication links -----------------------------------------------------------------


class _Link:
    """One relayed HA connection (slave <-> master); what the master sends once the link
    is stalled is counted, never forwarded (a stalled link is not resumed: its master dies).

    The relay reads the frames it forwards (framed dialect) when it can: the slave's broker
    id from its handshake, and the log end of the last whole block that went to it, which is
    what the slave will have stored once it has read everything it was sent.  Over TLS (the
    secured demo: the brokers' HA links are mutual TLS) it sees ciphertext only: it forwards
    and holds the bytes all the same, but knows neither (:attr:`opaque`)."""

    def __init__(self, slave_writer: asyncio.StreamWriter, master_writer: asyncio.StreamWriter) -> None:
        self.slave_writer = slave_writer
        self.master_writer = master_writer
        self.stalled = False
        self.held_bytes = 0
        #: The link is TLS: the relay cannot read its frames.
        self.opaque = False
        self.slave_id: int | None = None
        #: Log end of the last whole TRANSFER_DATA block forwarded (None: not known, e.g.
        #: the slave speaks the rocketmq dialect).
        self.forwarded_end: int | None = 0
        # Any block a broker may send (its own limit is configurable): the relay only counts.
        self._to_slave_frames = frames.framed.decoder(frames.Direction.MASTER_TO_SLAVE, max_frame_bytes=1 << 30)
        self._to_master_frames: Any = frames.framed.decoder(frames.Direction.SLAVE_TO_MASTER)
        # An authenticated link (the cluster secret) wraps the frames: the relay has no keys,
        # so it reads past the handshake and the tags (the two ends check them).
        self._from_slave = _SealedView(messages=2)
        self._to_slave: _SealedView | None = None

    def saw_from_slave(self, data: bytes) -> None:
        if self._to_master_frames is None:
            return
        if self._from_slave.sealed is None and data[:1] == _TLS_HANDSHAKE:
            self.opaque = True  # a ClientHello: no frame of this link is readable here
            self._to_master_frames, self.forwarded_end = None, None
            return
        try:
            for frame in self._to_master_frames.feed(self._from_slave.feed(data)):
                if isinstance(frame, frames.HandshakeSlave):
                    self.slave_id = frame.broker_id
                    self._to_master_frames = None  # all it was read for
                    return
        except ProtocolError:
            self._to_master_frames = None
            self.forwarded_end = None

    def forwarded_to_slave(self, data: bytes) -> None:
        if self.forwarded_end is None:
            return
        if self._to_slave is None:
            self._to_slave = _SealedView(messages=1, sealed=self._from_slave.sealed)
        try:
            for frame in self._to_slave_frames.feed(self._to_slave.feed(data)):
                if type(frame) is frames.TransferData and len(frame.data):
                    self.forwarded_end = max(self.forwarded_end,
                                             frame.block_start_offset + len(frame.data))
        except ProtocolError:
            self.forwarded_end = None


class _SealedView:
    """The framed-dialect bytes of one direction of an HA link, as a relay without the keys
    sees them: an authenticated link (it opens with :data:`rmqha.ha.auth.PREFACE`) carries
    length-prefixed handshake messages, then every frame followed by its MAC tag; the view
    drops those and passes the frames on.  A link that does not open with the preface is
    passed through as it is."""

    def __init__(self, messages: int, sealed: bool | None = None) -> None:
        self.sealed = sealed
        self._messages = messages
        self._buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        if self.sealed is None:
            if len(buf) < len(PREFACE):
                return b""
            self.sealed = bytes(buf[:len(PREFACE)]) == PREFACE
            if self.sealed:
                del buf[:len(PREFACE)]
        if not self.sealed:
            out = bytes(buf)
            buf.clear()
            return out
        return self._frames(buf)

    def _frames(self, buf: bytearray) -> bytes:
        out = bytearray()
        while self._messages and len(buf) >= 2:
            (n,) = struct.unpack_from(">H", buf, 0)
            if len(buf) < 2 + n:
                return bytes(out)
            del buf[:2 + n]
            self._messages -= 1
        while not self._messages and len(buf) >= 4:
            (n,) = struct.unpack_from(">i", buf, 0)
            if n < 4:
                raise ProtocolError(f"an authenticated HA frame of {n} bytes")
            if len(buf) < n + FRAME_TAG_BYTES:
                break
            out += buf[:n]
            del buf[:n + FRAME_TAG_BYTES]
        return bytes(out)


class ReplicationLinks:
    """The HA links of the demo's brokers, relayed through this process.

    One relay listens in front of each broker's HA port; the broker advertises the relay's
    address, so every slave reaches its master through it.  :meth:`stall` stops the
    master-to-slave bytes of the links open at that moment (acks still flow, so the
    producer goes on sending and the master on appending).  When the master dies, a
    stalled link drops what it held and resets the slave's side: those bytes never reach
    a slave, as when a host dies with its links stuck.  A later link (to the new master)
    is never stalled.  The relay forwards bytes: over TLS it holds ciphertext it cannot
    read, and the stall is the same.  Runs on its own event loop thread.
    """

    def __init__(self) -> None:
        self._loop = EventLoopThread("demo-links")
        self._servers: list[asyncio.Server] = []
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.ports: list[int] = []
        #: Bytes held by stalled links when their master side ended (never delivered).
        self.dropped_bytes = 0

    def front(self, target: str) -> str:
        """Start a relay to ``target`` (host:port); the address slaves should dial."""
        host, _, port = target.rpartition(":")
        server = self._loop.run(asyncio.start_server(
            lambda r, w: self._accept(r, w, host, int(port)), "127.0.0.1", 0), 10)
        self._servers.append(server)
        relay_port = int(server.sockets[0].getsockname()[1])
        self.ports.append(relay_port)
        return f"127.0.0.1:{relay_port}"

    def stall(self) -> int:
        """Stall every open link; how many were stalled."""
        async def stall() -> int:
            for link in self._links:
                link.stalled = True
            return len(self._links)
        return int(self._loop.run(stall(), 5))

    def forwarded_ends(self) -> dict[int, int | None]:
        """Slave broker id -> log end of the last whole block its stalled link forwarded
        (None when the relay could not follow the stream)."""
        async def ends() -> dict[int, int | None]:
            return {link.slave_id: link.forwarded_end for link in self._links
                    if link.stalled and link.slave_id is not None}
        return dict(self._loop.run(ends(), 5))

    def opaque(self) -> bool:
        """Whether a stalled link is one the relay cannot read (TLS)."""
        async def any_opaque() -> bool:
            return any(link.stalled and link.opaque for link in self._links)
        return bool(self._loop.run(any_opaque(), 5))

    def flushed(self) -> bool:
        """Whether every stalled link has handed the kernel all it forwarded to its slave
        (on loopback the bytes are then in the slave's socket)."""
        async def flushed() -> bool:
            return all(link.slave_writer.transport.get_write_buffer_size() == 0
                       for link in self._links if link.stalled)
        return bool(self._loop.run(flushed(), 5))

    def close(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
            for link in list(self._links):
                link.slave_writer.transport.abort()
                link.master_writer.transport.abort()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5)
            for server in self._servers:
                await server.wait_closed()
        try:
            self._loop.run(close(), 10)
        except (TimeoutError, RuntimeError, OSError) as exc:
            warn(f"the replication links did not close cleanly: {exc!r}")
        self._loop.stop()

    async def _accept(self, slave_reader: asyncio.StreamReader, slave_writer: asyncio.StreamWriter,
                      host: str, port: int) -> None:
        try:
            master_reader, master_writer = await asyncio.open_connection(host, port)
        except OSError:
            slave_writer.transport.abort()  # as if the master's port refused: the slave retries
            return
        link = _Link(slave_writer, master_writer)
        self._links.add(link)
        tasks = [asyncio.ensure_future(self._to_master(link, slave_reader)),
                 asyncio.ensure_future(self._to_slave(link, master_reader))]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)
            self._links.discard(link)

    async def _to_master(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(1 << 20):
                link.saw_from_slave(data)
                link.master_writer.write(data)
                await link.master_writer.drain()
        except (OSError, ConnectionError):
            pass  # the slave's side broke: same as its end
        link.master_writer.close()

    async def _to_slave(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(1 << 20):
                if link.stalled:
                    link.held_bytes += len(data)
                    continue
                link.forwarded_to_slave(data)
                link.slave_writer.write(data)
                await link.slave_writer.drain()
        except (OSError, ConnectionError):
            pass  # the master's side broke: same as its end
        if link.stalled:
            # The master is gone: a stalled link's bytes die with it; the slave sees a reset.
            self.dropped_bytes += link.held_bytes
            link.slave_writer.transport.abort()
        else:
            link.slave_writer.close()
