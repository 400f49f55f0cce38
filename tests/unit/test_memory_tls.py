"""MemoryTls, the blocking link's TLS in memory, against a server ``SSLObject`` (no socket):
the handshake's flights, an answer behind TLS 1.3's session tickets read in one call, a
record split across reads, and what a broken or closed stream raises."""
from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqha.errors import RemotingError
from rmqha.net.client_security import client_context, current
from rmqha.net.memory_tls import MemoryTls
from rmqha.security import certs
from rmqha.security.identity import Identity, Role
from rmqha.security.tls import server_context
from rmqha.testing.tls_keys import client_tls, server_tls


class _Server:
    def __init__(self, context: ssl.SSLContext) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        #: What the server wrote after its handshake (TLS 1.3's session tickets).
        self.after = b""

    def step(self, data: bytes) -> bytes:
        self.incoming.write(data)
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        return self.outgoing.read()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    pki = tmp_path_factory.mktemp("pki")
    certs.dev_cluster(Path(pki), cluster="C", controllers=1, groups={"g": 1})
    broker = next(i for i in certs.dev_cluster_identities(
        cluster="C", controllers=1, groups={"g": 1}, namesrv=1) if i.role is Role.BROKER)
    client = current(client_context(client_tls(pki, Identity.client("client"))))
    assert client is not None
    yield client, server_context(server_tls(pki, broker))


def _connected(pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[MemoryTls, _Server]:
    client, server = MemoryTls(pair[0], "127.0.0.1"), _Server(pair[1])
    flights = 0
    while not client.handshake():
        client.feed(server.step(client.records()))
        flights += 1
    server.after = server.step(client.records())  # our last flight: the server is done too
    assert flights >= 1 and client.version is not None
    return client, server


def test_an_answer_behind_session_tickets_is_read_in_one_call(pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    client, server = _connected(pair)
    server.incoming.write(client.seal(b"request"))
    assert server.tls.read(100) == b"request"
    server.tls.write(b"answer")
    cipher = server.after + server.outgoing.read()  # the tickets, then the answer's record
    assert server.after  # (TLS 1.3: else this test would not show what it is about)
    assert client.open(cipher) == b"answer"


def test_a_record_split_across_reads(pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    client, server = _connected(pair)
    server.tls.write(b"x" * 40_000)  # three records
    cipher = server.after + server.outgoing.read()
    got = [client.open(cipher[i:i + 1000]) for i in range(0, len(cipher), 1000)]
    assert b"".join(got) == b"x" * 40_000
    assert b"" in got  # reads that ended no record gave nothing (not an error)


def test_a_frame_is_sealed_into_records_sent_at_once(pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    client, server = _connected(pair)
    server.incoming.write(client.seal(b"y" * 50_000))
    got = b""
    while len(got) < 50_000:
        got += server.tls.read(1 << 16)
    assert got == b"y" * 50_000


def test_a_broken_record_and_a_closed_stream_raise(pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    client, server = _connected(pair)
    assert client.open(server.after) == b""
    server.tls.write(b"answer")
    cipher = bytearray(server.outgoing.read())
    cipher[-3] ^= 1
    with pytest.raises(ssl.SSLError):
        client.open(bytes(cipher))
    client, server = _connected(pair)
    try:
        server.tls.unwrap()
    except ssl.SSLWantReadError:
        pass
    with pytest.raises(RemotingError, match="closed its TLS"):
        client.open(server.after + server.outgoing.read())
