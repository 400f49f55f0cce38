"""The demo's HA relay (``rmqha.demo.relay._Link``): it reads a plaintext link's frames
(the slave's broker id from its hello) and takes a link that opens with a TLS ClientHello
for one it cannot read, without feeding ciphertext to its frame decoders."""
from __future__ import annotations

import ssl
from typing import Any

from rmqha.demo.relay import _Link
from rmqha.ha import frames


def _link() -> _Link:
    # The relay's writers are not touched by what is tested here.
    nobody: Any = None
    return _Link(nobody, nobody)


def _client_hello() -> bytes:
    """The first bytes a TLS client sends."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass  # waiting for the server's answer: the hello is written
    return outgoing.read()


def test_a_tls_link_is_opaque_to_the_relay() -> None:
    link = _link()
    link.saw_from_slave(_client_hello())
    assert link.opaque
    assert link.slave_id is None and link.forwarded_end is None
    link.forwarded_to_slave(b"\x16\x03\x03\x00\x7a" + bytes(122))  # a ServerHello's record
    assert link.forwarded_end is None


def test_a_plaintext_hello_names_the_slave() -> None:
    hello = frames.HandshakeSlave(broker_id=3, segment_bytes=1 << 20, address="127.0.0.1:1")
    link = _link()
    link.saw_from_slave(frames.framed.encode(hello))
    assert not link.opaque
    assert link.slave_id == 3 and link.forwarded_end == 0
