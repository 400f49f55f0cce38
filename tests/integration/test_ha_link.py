"""rmqha.ha.link: the non-blocking sends and callback reads the live path relies on.

Real TCP sockets on loopback with small send buffers, so a send really stops part-way."""
from __future__ import annotations

import asyncio
import os
import socket

import pytest

from rmqha.ha.link import Link, LinkClosed


def _pair() -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair on loopback (the listener is bound and used at once)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    for s in (a, b):
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A small send buffer (the receive side keeps its default: a tiny window would
        # leave the sender to TCP's persist timer).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return a, b


def test_try_send_returns_what_the_socket_did_not_take_and_send_finishes_it():
    async def main() -> None:
        a, b = _pair()
        sender, receiver = Link(a), Link(b)
        payload = os.urandom(1 << 20)
        parts = [payload[:100], memoryview(payload)[100:]]
        left = sender.try_send(parts)
        assert left, "1 MiB cannot fit a 4 KiB send buffer and a default receive window"
        assert sum(v.nbytes for v in left) < len(payload)
        got = bytearray()

        async def drain() -> None:
            while len(got) < len(payload):
                got.extend(await receiver.recv(5.0))

        reader = asyncio.ensure_future(drain())
        await sender.send(left, 5.0)
        await asyncio.wait_for(reader, 5.0)
        assert bytes(got) == payload  # nothing lost or repeated at the cut
        sender.close()
        receiver.close()

    asyncio.run(main())


def test_watch_calls_back_per_readable_turn_and_reports_the_close():
    async def main() -> None:
        a, b = _pair()
        writer, reader = Link(a), Link(b)
        seen: list[bytes] = []
        arrived = asyncio.Event()

        def on_readable() -> None:
            data = reader.try_recv()
            if data:
                seen.append(data)
                arrived.set()

        ended = reader.watch(on_readable)
        assert writer.try_send([b"ack-1"]) == []
        await asyncio.wait_for(arrived.wait(), 5.0)
        assert b"".join(seen) == b"ack-1"
        # Waiting receives and a watch do not mix on one link.
        with pytest.raises(RuntimeError):
            await reader.recv(0.1)
        reader.close()
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(ended, 5.0)
        writer.close()

    asyncio.run(main())


def test_a_link_read_between_waits_keeps_its_registration_and_still_times_out():
    async def main() -> None:
        a, b = _pair()
        writer, reader = Link(a), Link(b)
        for i in range(3):
            assert writer.try_send([b"x%d" % i]) == []
            assert await reader.recv(5.0) == b"x%d" % i
        from rmqha.ha.link import LinkTimeout
        with pytest.raises(LinkTimeout):
            await reader.recv(0.05)
        writer.close()
        with pytest.raises(LinkClosed):
            await reader.recv(5.0)  # EOF after the peer closed
        reader.close()

    asyncio.run(main())
