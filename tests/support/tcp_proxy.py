"""A loopback TCP proxy that tests put between two peers to cut and restore their link.

It runs its own asyncio loop on a daemon thread, so both plain and asyncio tests can drive
it.  ``cut()`` severs the link in one of two ways:

* ``"close"``: every proxied connection is reset and new ones are accepted then closed
  at once, as when a peer's host goes away and the kernel answers;
* ``"blackhole"``: connections stay open but bytes in both directions are dropped, as in a
  network partition where nobody sees a FIN, so only timeouts can notice.

``cut_clients(client, mode)`` cuts only the links whose client (host, port) ``client``
picks, now and later, in either mode: one process among several that share the proxy.

``restore()`` lets new connections through again (blackholed ones stay dead: bytes dropped
mid-stream can never be replayed, so they are closed on restore).

With ``record=True`` it keeps every byte it forwards: :attr:`TcpProxy.streams` holds one
buffer per direction of each connection (what an eavesdropper on the link sees).
"""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Literal

CutMode = Literal["close", "blackhole"]


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; cut() and restore() control the link."""

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0, *,
                 record: bool = False) -> None:
        self.target = (target_host, target_port)
        self._record = record
        #: With ``record``: what was forwarded, one buffer per direction of each connection.
        self.streams: list[bytearray] = []
        self._listen_port = listen_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._mode: CutMode | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._holed: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        #: cut_clients: which clients' links are cut, and how.
        self._client_cut: tuple[Callable[[tuple[str, int]], bool], CutMode] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Connections accepted so far (tests wait on reconnects with it).
        self.accepted = 0

    # --- control (any thread) --------------------------------------------------------------

    def start(self) -> int:
        self._thread.start()
        self.port = self._call(self._start())
        return self.port

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def cut(self, mode: CutMode = "close") -> None:
        self._call(self._cut(mode))

    def restore(self) -> None:
        self._call(self._restore())

    def blackhole_clients(self, client: Callable[[tuple[str, int]], bool]) -> None:
        """Silently drop both directions of every link, now and later, whose client's
        address (host, port) satisfies ``client``; see :meth:`cut_clients`."""
        self.cut_clients(client, "blackhole")

    def cut_clients(self, client: Callable[[tuple[str, int]], bool], mode: CutMode = "close") -> None:
        """Cut every link, now and later, whose client's address (host, port) satisfies
        ``client`` (one client among several, told apart by the socket it connects from,
        which works whatever it says, TLS included); the others flow.  ``"blackhole"``: its
        bytes are dropped and its new links accepted but silent; ``"close"``: its links
        are reset and new ones closed at once.  :meth:`restore` ends it."""
        self._call(self._cut_clients(client, mode))

    @property
    def is_cut(self) -> bool:
        return self._mode is not None or self._client_cut is not None or bool(self._holed)

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro):  # type: ignore[no-untyped-def]
        fut: Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout=10)

    # --- loop side ---------------------------------------------------------------------------

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port)
        return self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _cut(self, mode: CutMode) -> None:
        self._mode = mode
        if mode == "close":
            self._reset_all()

    async def _restore(self) -> None:
        if self._mode == "blackhole":
            self._reset_all()
        self._mode = None
        self._client_cut = None
        for a, b in list(self._holed):
            _reset(a)
            _reset(b)
            self._links.discard((a, b))
        self._holed.clear()

    async def _cut_clients(self, client: Callable[[tuple[str, int]], bool], mode: CutMode) -> None:
        self._client_cut = (client, mode)
        for link in list(self._links):
            if client(link[0].get_extra_info("peername")[:2]):
                self._cut_link(link, mode)

    def _cut_link(self, link: tuple[asyncio.StreamWriter, asyncio.StreamWriter], mode: CutMode) -> None:
        if mode == "blackhole":
            self._holed.add(link)
        else:
            _reset(link[0])
            _reset(link[1])
            self._links.discard(link)

    def _reset_all(self) -> None:
        for a, b in list(self._links):
            _reset(a)
            _reset(b)
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        cut = self._client_cut
        client_mode = cut[1] if cut is not None and cut[0](writer.get_extra_info("peername")[:2]) else None
        if self._mode is not None or client_mode == "close":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        link = (writer, up_writer)
        self._links.add(link)
        if client_mode == "blackhole":
            self._holed.add(link)
        t1 = asyncio.ensure_future(self._pump(reader, up_writer, link))
        t2 = asyncio.ensure_future(self._pump(up_reader, writer, link))
        for t in (t1, t2):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        seen = bytearray()
        if self._record:
            self.streams.append(seen)
        try:
            while True:
                data = await src.read(1 << 16)
                if not data:
                    break
                if self._mode == "blackhole" or link in self._holed:
                    continue  # dropped on the floor, nobody is told
                if link not in self._links:
                    break
                if self._record:
                    seen += data
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if link in self._links:
                self._links.discard(link)
                for w in link:
                    w.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0) so the peer sees the link die at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.close()
