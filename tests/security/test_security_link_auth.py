"""Shared-secret link authentication (sans-I/O) and the cluster secret it rests on."""
from __future__ import annotations

import asyncio
import logging
import os
import struct
from pathlib import Path

import pytest

from rmqha.errors import AuthenticationError, ConfigError, PeerIdentityError
from rmqha.security.identity import Identity, Role, authorize
from rmqha.security.link_auth import TAG_BYTES, Handshake, LinkSession
from rmqha.security.secret import (
    ClusterSecret,
    constant_time_equals,
    generate_secret_text,
    load_cluster_secret,
    write_secret_file,
)

SECRET = ClusterSecret(b"0123456789abcdef-cluster-secret", "test")
OTHER = ClusterSecret(b"fedcba9876543210-other-cluster", "test")
SLAVE = Identity.broker("C1", "g1", "g1-1")
MASTER = Identity.broker("C1", "g1", "g1-0")


def _pair(client_secret: ClusterSecret = SECRET, server_secret: ClusterSecret = SECRET,
          context: str = "ha") -> tuple[Handshake, Handshake]:
    return (Handshake.client(client_secret, SLAVE, context=context),
            Handshake.server(server_secret, MASTER, context=context))


def _run(client: Handshake, server: Handshake) -> tuple[LinkSession, LinkSession]:
    m1 = client.start()
    assert m1 is not None and server.start() is None
    m2 = server.receive(m1)
    assert m2 is not None
    m3 = client.receive(m2)
    assert m3 is not None and client.complete and not server.complete
    assert server.receive(m3) is None and server.complete
    return client.session(), server.session()


def test_handshake_authenticates_both_sides_and_names_the_peers() -> None:
    c, s = _run(*_pair())
    assert c.peer == MASTER and s.peer == SLAVE
    for payload in (b"", b"x", os.urandom(70000)):
        assert s.open(c.seal(payload)) == payload
        assert c.open(s.seal(payload)) == payload
    assert len(c.seal(b"abc")) == 3 + TAG_BYTES


@pytest.mark.parametrize("client_secret, server_secret", [(SECRET, OTHER), (OTHER, SECRET)])
def test_wrong_secret_on_either_side_fails(client_secret: ClusterSecret,
                                          server_secret: ClusterSecret) -> None:
    client, server = _pair(client_secret, server_secret)
    m2 = server.receive(client.start() or b"")
    # The client checks the server's proof first, whichever side has the wrong secret.
    with pytest.raises(AuthenticationError, match="server's proof is wrong"):
        client.receive(m2 or b"")
    assert not client.complete
    with pytest.raises(AuthenticationError):
        client.session()


def test_wrong_client_proof_fails_on_the_server() -> None:
    # A client that skips checking the server (or forges a proof) is caught by the server.
    client, server = _pair()
    m2 = server.receive(client.start() or b"")
    m3 = bytearray(client.receive(m2 or b"") or b"")
    m3[-1] ^= 1
    with pytest.raises(AuthenticationError, match="client's proof is wrong"):
        server.receive(bytes(m3))
    assert not server.complete


def test_context_mismatch_fails() -> None:
    client = Handshake.client(SECRET, SLAVE, context="ha")
    server = Handshake.server(SECRET, MASTER, context="controller")
    with pytest.raises(AuthenticationError, match="link context"):
        server.receive(client.start() or b"")


def test_replayed_transcript_fails() -> None:
    """An eavesdropper who recorded a whole good handshake cannot replay it to a server
    (fresh server nonce) or to a client (fresh client nonce)."""
    client, server = _pair()
    m1 = client.start() or b""
    m2 = server.receive(m1) or b""
    m3 = client.receive(m2) or b""
    server.receive(m3)

    replay_server = Handshake.server(SECRET, MASTER, context="ha")
    replay_server.receive(m1)  # a replayed hello is answered with a new nonce ...
    with pytest.raises(AuthenticationError, match="client's proof is wrong"):
        replay_server.receive(m3)  # ... which the old proof does not cover

    replay_client = Handshake.client(SECRET, SLAVE, context="ha")
    replay_client.start()
    with pytest.raises(AuthenticationError, match="server's proof is wrong"):
        replay_client.receive(m2)


def test_reflected_proof_fails() -> None:
    """A man in the middle cannot hand a side its own proof back: proofs name the prover."""
    client, server = _pair()
    m1 = client.start() or b""
    m2 = server.receive(m1) or b""
    # Turn the server's own SERVER_AUTH proof into a CLIENT_AUTH message for the server.
    server_proof = m2[-32:]
    reflected = bytes([3]) + struct.pack(">H", 32) + server_proof
    with pytest.raises(AuthenticationError, match="client's proof is wrong"):
        server.receive(reflected)


def test_messages_out_of_turn_and_malformed_fail() -> None:
    client, server = _pair()
    with pytest.raises(AuthenticationError, match="no handshake message is expected"):
        client.receive(b"\x02\x00")
    m1 = client.start() or b""
    with pytest.raises(AuthenticationError, match="expected handshake message HELLO"):
        server.receive(b"\x03" + m1[1:])
    for bad in (m1[:-5], m1 + b"extra", b"\x01\x09" + m1[2:]):
        with pytest.raises(AuthenticationError):
            Handshake.server(SECRET, MASTER, context="ha").receive(bad)
    bad_identity = Handshake.client(SECRET, SLAVE, context="ha").start() or b""
    forged = bad_identity.replace(b"rmqha:broker/", b"rmqha:wizard/")  # same length
    with pytest.raises(AuthenticationError, match="bad identity"):
        Handshake.server(SECRET, MASTER, context="ha").receive(forged)
    with pytest.raises(AuthenticationError, match="already called"):
        client.start()


def test_failed_handshake_stays_dead() -> None:
    client, server = _pair(client_secret=OTHER)
    m1 = client.start() or b""
    m2 = server.receive(m1) or b""
    with pytest.raises(AuthenticationError):
        client.receive(m2)
    with pytest.raises(AuthenticationError, match="no handshake message is expected"):
        client.receive(m2)


# --- frames after the handshake ----------------------------------------------------------


def test_tampered_frame_fails_and_the_link_stays_failed() -> None:
    c, s = _run(*_pair())
    sealed = bytearray(c.seal(b"replicate 4096 bytes at offset 0"))
    sealed[3] ^= 0x20
    with pytest.raises(AuthenticationError, match="frame #0 failed authentication"):
        s.open(bytes(sealed))
    with pytest.raises(AuthenticationError, match="earlier frame"):
        s.open(c.seal(b"a good frame after"))


def test_reordered_dropped_and_replayed_frames_fail() -> None:
    c, s = _run(*_pair())
    c.seal(b"one")
    second = c.seal(b"two")
    with pytest.raises(AuthenticationError):
        s.open(second)  # reordered (or "first" dropped)

    c, s = _run(*_pair())
    first = c.seal(b"one")
    assert s.open(first) == b"one"
    with pytest.raises(AuthenticationError):
        s.open(first)  # replayed

    c, s = _run(*_pair())
    with pytest.raises(AuthenticationError, match="shorter than its tag"):
        s.open(b"short")


def test_frames_of_one_direction_or_session_do_not_open_in_another() -> None:
    c, _ = _run(*_pair())
    with pytest.raises(AuthenticationError):
        c.open(c.seal(b"reflected back to its sender"))
    _, s2 = _run(*_pair())
    with pytest.raises(AuthenticationError):
        s2.open(c.seal(b"from another session"))


def test_tag_and_verify_for_writers_that_send_the_tag_apart() -> None:
    c, s = _run(*_pair())
    frame = memoryview(b"header+block")
    s.opener.verify(frame, c.sealer.tag(frame))
    assert s.opener.seq == 1 and c.sealer.seq == 1


@pytest.mark.parametrize("key_bytes", [16, 32, 64, 65, 100])
def test_tags_are_the_documented_hmac_sha256(key_bytes: int) -> None:
    """The tag is the first 16 bytes of HMAC-SHA256(key, direction || sequence number ||
    frame), as Python's hmac computes it, whether the frame comes whole or in two parts
    (keys shorter than, as long as, and longer than SHA-256's block)."""
    import hashlib
    import hmac

    from rmqha.security.link_auth import FrameOpener, FrameSealer

    key = bytes(range(7, 7 + key_bytes))
    sealer, opener = FrameSealer(key, b"M"), FrameOpener(key, b"M")
    for seq, (head, more) in enumerate([(b"", None), (b"frame", None), (b"head" * 12, b"gmac" * 4),
                                        (b"x" * 200, b"")]):
        whole = head + (more or b"")
        expected = hmac.new(key, b"M" + seq.to_bytes(8, "big") + whole, hashlib.sha256).digest()[:16]
        tag = sealer.tag(memoryview(head), more) if more is not None else sealer.tag(head)
        assert tag == expected
        opener.verify(head, bytearray(tag), more)
    with pytest.raises(AuthenticationError):  # negative control: one bit off
        opener.verify(b"next", bytes([tag[0] ^ 1]) + tag[1:])


def test_handshake_over_a_real_connection() -> None:
    """The sans-I/O pieces over asyncio streams with a 4-byte length prefix."""

    async def send(w: asyncio.StreamWriter, data: bytes) -> None:
        w.write(struct.pack(">I", len(data)) + data)
        await w.drain()

    async def recv(r: asyncio.StreamReader) -> bytes:
        (n,) = struct.unpack(">I", await r.readexactly(4))
        return await r.readexactly(n)

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hs = Handshake.server(SECRET, MASTER, context="ha")
        while not hs.complete:
            reply = hs.receive(await recv(r))
            if reply is not None:
                await send(w, reply)
        link = hs.session()
        await send(w, link.seal(b"hello " + str(link.peer).encode()))
        w.close()

    async def main() -> tuple[Identity | None, bytes]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", port)
        hs = Handshake.client(SECRET, SLAVE, context="ha")
        await send(w, hs.start() or b"")
        while not hs.complete:
            reply = hs.receive(await recv(r))
            if reply is not None:
                await send(w, reply)
        text = hs.session().open(await recv(r))
        w.close()
        server.close()
        await server.wait_closed()
        return hs.peer, text

    peer, text = asyncio.run(asyncio.wait_for(main(), 10))
    assert peer == MASTER and text == f"hello {SLAVE}".encode()


# --- identities --------------------------------------------------------------------------


def test_identities_format_parse_and_authorize() -> None:
    assert str(SLAVE) == "rmqha:broker/C1/g1/g1-1"
    for ident in (SLAVE, Identity.controller("n0"), Identity.namesrv("ns0"),
                  Identity.client("app-1"), Identity.admin("ops")):
        assert Identity.parse(str(ident)) == ident
    assert Identity.parse("rmqha:controller/n2").role is Role.CONTROLLER
    for bad in ("broker/C/g/n", "rmqha:broker/C/g", "rmqha:wizard/x", "rmqha:client/a/b",
                "rmqha:client/", "rmqha:client/-x", "rmqha:client/a b"):
        with pytest.raises(ConfigError):
            Identity.parse(bad)
    assert authorize(SLAVE, roles={Role.BROKER}, cluster="C1", group="g1") == SLAVE
    with pytest.raises(PeerIdentityError, match="not a broker of group g2"):
        authorize(SLAVE, group="g2")
    with pytest.raises(PeerIdentityError, match="only controller may connect"):
        authorize(SLAVE, roles={Role.CONTROLLER})
    with pytest.raises(PeerIdentityError, match="expected rmqha:broker/C1/g1/g1-0"):
        authorize(SLAVE, expected=MASTER)


# --- the cluster secret ------------------------------------------------------------------


def test_secret_sources_in_order_and_never_printed(tmp_path: Path) -> None:
    path = write_secret_file(tmp_path / "cluster.secret", generate_secret_text())
    assert path.stat().st_mode & 0o777 == 0o600
    from_file = load_cluster_secret(file=path, env={})
    assert from_file is not None and len(from_file.reveal()) >= 32
    text = path.read_text().strip()
    assert text not in repr(from_file) and text not in str(from_file)
    from_env = load_cluster_secret(env={"RMQHA_CLUSTER_SECRET": "e" * 20, "RMQHA_CLUSTER_SECRET_FILE": str(path)})
    assert from_env is not None and from_env.reveal() == b"e" * 20
    from_value = load_cluster_secret(value="v" * 16, env={"RMQHA_CLUSTER_SECRET": "e" * 20})
    assert from_value is not None and from_value.reveal() == b"v" * 16
    env_file = load_cluster_secret(env={"RMQHA_CLUSTER_SECRET_FILE": str(path)})
    assert env_file == from_file
    assert load_cluster_secret(env={}) is None
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(from_file)


def test_bad_secrets_are_refused_without_showing_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="has 5 bytes; at least 16") as info:
        load_cluster_secret(value="short", env={})
    assert "short" not in str(info.value).replace("has 5 bytes", "")
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster_secret(file=tmp_path / "missing", env={})
    with pytest.raises(ConfigError, match="already exists"):
        write_secret_file(tmp_path / "s", "a" * 20)
        write_secret_file(tmp_path / "s", "b" * 20)
    loose = tmp_path / "loose.secret"
    loose.write_text("w" * 24)
    loose.chmod(0o644)
    caplog.set_level(logging.WARNING, logger="rmqha.security.secret")
    assert load_cluster_secret(file=loose, env={}) is not None
    assert "chmod 600" in caplog.text and "w" * 24 not in caplog.text


def test_constant_time_equals() -> None:
    assert constant_time_equals("abc", b"abc") and not constant_time_equals("abc", "abd")
