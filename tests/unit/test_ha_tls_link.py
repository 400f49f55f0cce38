"""The TLS layer under an HA link (:class:`rmqha.ha.tls_link.TlsLink`) on a loopback connection.

Its less travelled corners: file ranges (read and encrypted, never sendfile-d past TLS),
plaintext decrypted but not read yet (a watch callback is called again for it, though the
socket signals nothing), a send larger than one call seals, and the end of the stream.
And the cluster secret's handshake over it: bound to the session, and no frame MAC after
it (the plaintext control keeps its MAC; an end that does not bind is refused).
"""
from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from rmqha.errors import AuthenticationError
from rmqha.ha.auth import admit, authenticate
from rmqha.ha.link import FileRange, Link, LinkClosed
from rmqha.ha.tls_link import HATls, TlsLink
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.testing.ha import auth_for
from rmqha.testing.tls_keys import server_tls

CLUSTER, GROUP = "c", "g"
A, B = Identity.broker(CLUSTER, GROUP, "a"), Identity.broker(CLUSTER, GROUP, "b")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    certs.dev_cluster(d, cluster=CLUSTER, controllers=0, groups={GROUP: 0}, namesrv=0)
    for ident in (A, B):
        certs.issue(d, ident)
    return d


def _ha(pki: Path, ident: Identity) -> HATls:
    tls = HATls.from_settings(server_tls(pki, ident), CLUSTER, GROUP)
    assert tls is not None
    return tls


async def _pair(pki: Path) -> tuple[TlsLink, TlsLink]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        right = socket.create_connection(listener.getsockname())
        left, _ = listener.accept()
    for s in (left, right):
        s.setblocking(False)
    server_side = asyncio.ensure_future(_ha(pki, A).accept(left, 5))
    client = _ha(pki, B).dial(right)
    await _ha(pki, B).secure(client, 5)
    server = await server_side
    assert (server.peer_identity, client.peer_identity) == (B, A)
    return server, client


def test_file_ranges_and_large_sends_arrive_encrypted_and_whole(pki: Path, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    path = tmp_path / "segment"
    path.write_bytes(data)

    async def run() -> bytes:
        server, client = await _pair(pki)
        fd = os.open(path, os.O_RDONLY)
        try:
            sending = asyncio.ensure_future(server.send_parts([b"head", FileRange(fd, 100, 1 << 20),
                                                              memoryview(data)[: 2 << 20]], 5))
            got = await client.recv_exactly(4 + (1 << 20) + (2 << 20), 5)
            assert await sending == len(got)
        finally:
            os.close(fd)
            server.close()
            client.close()
        return got

    got = asyncio.run(run())
    assert got == b"head" + data[100 : 100 + (1 << 20)] + data[: 2 << 20]


def test_plaintext_left_over_calls_the_watch_again(pki: Path) -> None:
    """The callback reads 10 bytes a call; the rest of the records is already decrypted
    and waits in the link, where the socket's readiness cannot tell of it."""

    async def run() -> bytes:
        server, client = await _pair(pki)
        got = bytearray()
        view = memoryview(bytearray(10))

        def on_readable() -> None:
            n = client.try_recv_into(view)
            got.extend(view[:n])

        end = client.watch(on_readable)
        await server.send([b"x" * 5000, b"y" * 5000], 5)
        deadline = asyncio.get_running_loop().time() + 5
        while len(got) < 10000 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        client.unwatch()
        server.close()
        client.close()
        end.cancel()
        return bytes(got)

    assert asyncio.run(run()) == b"x" * 5000 + b"y" * 5000


def test_the_peer_closing_ends_the_link(pki: Path) -> None:
    async def run() -> None:
        server, client = await _pair(pki)
        await server.send([b"last words"], 5)
        server.close()
        assert await client.recv_exactly(10, 5) == b"last words"
        with pytest.raises(LinkClosed):
            await client.recv(5)
        client.close()

    asyncio.run(run())


async def _plain_pair() -> tuple[Link, Link]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        right = socket.create_connection(listener.getsockname())
        left, _ = listener.accept()
    for s in (left, right):
        s.setblocking(False)
    return Link(left), Link(right)


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plaintext-control"])
def test_the_secrets_handshake_leaves_frame_macs_to_plaintext_links_only(pki: Path, tls: bool) -> None:
    async def run() -> None:
        master, slave = await (_pair(pki) if tls else _plain_pair())
        assert master.channel_binding() == slave.channel_binding() and bool(master.channel_binding()) is tls
        (master_proof, head), slave_proof = await asyncio.gather(
            admit(master, auth_for(1, cluster=CLUSTER, group=GROUP), 5),
            authenticate(slave, auth_for(2, cluster=CLUSTER, group=GROUP), 5))
        assert head == b"" and (str(master_proof.peer), str(slave_proof.peer)) == (
            f"rmqha:broker/{CLUSTER}/{GROUP}/2", f"rmqha:broker/{CLUSTER}/{GROUP}/1")
        assert (master_proof.mac is None, slave_proof.mac is None) == (tls, tls)
        master.close()
        slave.close()

    asyncio.run(run())


def test_an_end_that_does_not_bind_its_tls_session_is_refused(pki: Path) -> None:
    async def run() -> None:
        master, slave = await _pair(pki)
        slave.channel_binding = lambda: b""  # type: ignore[method-assign]

        async def slave_side() -> object:
            try:
                return await authenticate(slave, auth_for(2, cluster=CLUSTER, group=GROUP), 5)
            finally:
                slave.close()  # as its session does on a failure

        results = await asyncio.gather(admit(master, auth_for(1, cluster=CLUSTER, group=GROUP), 5),
                                       slave_side(), return_exceptions=True)
        master.close()
        assert isinstance(results[1], AuthenticationError) and "proof is wrong" in str(results[1])
        assert isinstance(results[0], (AuthenticationError, LinkClosed, ConnectionError)), results[0]

    asyncio.run(run())
