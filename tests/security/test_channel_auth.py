"""Authenticated remoting channels (rmqha.security.channel_auth, rmqha.net.channel).

The sans-I/O endpoint first (handshake, tags, refusals), then a RemotingServer and
RemotingClient in one loop with a man in the middle (:class:`security_wire.Relay`): an
answer with one byte changed, or a request sent twice, closes the connection and never
reaches the caller or a handler; each has a negative control where the same relay works
on a plain connection.
"""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from security_wire import Relay

from rmqha.errors import AuthenticationError, PeerIdentityError, ProtocolError, RemotingError, RmqhaError
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity
from rmqha.net.connection import Connection
from rmqha.net.server import RemotingServer
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.command import RemotingCommand, decode_frame, encode
from rmqha.security.channel_auth import (
    PREFACE,
    TAG,
    ChannelEndpoint,
    ChannelKey,
    channel_refusal,
    key_from_text,
)
from rmqha.security.identity import Identity, Role

SECRET = "0123456789abcdef-channel-secret"
OTHER = "fedcba9876543210-another-secret"
BROKER = Identity.broker("C", "g1", "b1")
CONTROLLER = Identity.controller("n0")
MAX = 1 << 20


def _endpoints(client_secret: str = SECRET, server_secret: str = SECRET,
               client_roles: tuple[Role, ...] = (Role.CONTROLLER,),
               server_roles: tuple[Role, ...] = (Role.BROKER,)) -> tuple[ChannelEndpoint, ChannelEndpoint]:
    dialler = ChannelEndpoint(key_from_text(client_secret, BROKER, client_roles), dialler=True,
                              max_frame_bytes=MAX)
    acceptor = ChannelEndpoint(key_from_text(server_secret, CONTROLLER, server_roles), dialler=False,
                               max_frame_bytes=MAX, allow_plain=True)
    return dialler, acceptor


def _connect(dialler: ChannelEndpoint, acceptor: ChannelEndpoint) -> None:
    reply, frames = acceptor.feed(dialler.start())
    assert frames == []
    proof, _ = dialler.feed(reply)
    assert dialler.established and proof
    assert acceptor.feed(proof) == (b"", [])
    assert acceptor.established


def _frame(remark: str = "x") -> bytes:
    return encode(RemotingCommand.request(10, {"remark": remark}))


# --- the endpoint, sans I/O --------------------------------------------------------------


def test_handshake_then_tagged_frames_both_ways():
    dialler, acceptor = _endpoints()
    _connect(dialler, acceptor)
    assert acceptor.peer == BROKER and dialler.peer == CONTROLLER
    frames = [_frame("a"), _frame("b")]
    sealed = b"".join(dialler.seal(f) for f in frames)
    assert len(sealed) == sum(len(f) + TAG for f in frames)
    # In pieces, as TCP may deliver them.
    got: list[bytes] = []
    for i in range(0, len(sealed), 7):
        got += acceptor.feed(sealed[i:i + 7])[1]
    assert got == frames
    assert dialler.feed(acceptor.seal(frames[0])) == (b"", [frames[0]])


@pytest.mark.parametrize("attack", ["flip", "replay", "drop", "plain", "reflect"])
def test_an_altered_replayed_dropped_or_untagged_frame_fails(attack):
    dialler, acceptor = _endpoints()
    _connect(dialler, acceptor)
    first, second = dialler.seal(_frame("a")), dialler.seal(_frame("b"))
    if attack == "flip":
        data = first[:-TAG - 1] + bytes([first[-TAG - 1] ^ 1]) + first[-TAG:]
    elif attack == "replay":
        acceptor.feed(first)
        data = first
    elif attack == "drop":
        data = second
    elif attack == "plain":
        data = _frame("a")  # an unsealed frame: its "tag" is the next frame's first bytes
        data += b"\0" * TAG
    else:  # the acceptor's own frame sent back to it
        data = acceptor.seal(_frame("a"))
    with pytest.raises(AuthenticationError):
        acceptor.feed(data)
    with pytest.raises(AuthenticationError, match="failed authentication earlier"):
        acceptor.feed(dialler.seal(_frame("c")))  # nothing is taken after a failure


def test_wrong_secret_fails_both_ways_and_no_proof_leaves():
    dialler, acceptor = _endpoints(client_secret=OTHER)
    reply, _ = acceptor.feed(dialler.start())
    with pytest.raises(AuthenticationError, match="proof is wrong"):
        dialler.feed(reply)
    # An impostor that answers with a proof of its own secret is refused by the acceptor.
    dialler, acceptor = _endpoints(server_secret=OTHER)
    reply, _ = acceptor.feed(dialler.start())
    with pytest.raises(AuthenticationError):
        dialler.feed(reply)


def test_a_replayed_handshake_is_worthless():
    dialler, acceptor = _endpoints()
    hello = dialler.start()
    reply, _ = acceptor.feed(hello)
    proof, _ = dialler.feed(reply)
    # The recorded HELLO and CLIENT_AUTH against a fresh acceptor: a new nonce, a wrong proof.
    _, fresh = _endpoints()
    fresh.feed(hello)
    with pytest.raises(AuthenticationError, match="client's proof is wrong"):
        fresh.feed(proof)


def test_peer_roles_are_checked_before_the_proof_leaves():
    dialler, acceptor = _endpoints(client_roles=(Role.NAMESRV,))
    reply, _ = acceptor.feed(dialler.start())
    with pytest.raises(PeerIdentityError, match="only namesrv"):
        dialler.feed(reply)
    dialler, acceptor = _endpoints(server_roles=(Role.ADMIN,))
    reply, _ = acceptor.feed(dialler.start())
    proof, _ = dialler.feed(reply)
    with pytest.raises(PeerIdentityError):
        acceptor.feed(proof)


def test_acceptor_passes_a_plain_client_through_and_bounds_lengths():
    _, acceptor = _endpoints()
    frame = _frame()
    assert acceptor.feed(frame[:2]) == (b"", [])
    assert acceptor.feed(frame[2:]) == (b"", [frame])
    assert acceptor.plain and acceptor.seal(frame) == frame
    strict = ChannelEndpoint(key_from_text(SECRET, CONTROLLER), dialler=False, max_frame_bytes=MAX)
    with pytest.raises(AuthenticationError, match="no channel preface"):
        strict.feed(frame)
    dialler, acceptor = _endpoints()
    _connect(dialler, acceptor)
    with pytest.raises(ProtocolError, match="outside"):
        acceptor.feed((MAX + 1).to_bytes(4, "big"))
    _, acceptor = _endpoints()
    with pytest.raises(AuthenticationError, match="handshake message of 0 bytes"):
        acceptor.feed(PREFACE + b"\0\0")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.sampled_from(["preface", "established", "dialler"]))
def test_garbage_is_refused_with_our_errors_only(data, where):
    """Whatever arrives, at any point: a frame list, or AuthenticationError/ProtocolError."""
    dialler, acceptor = _endpoints()
    target = acceptor
    if where == "preface":
        data = PREFACE + data
    elif where == "established":
        _connect(dialler, acceptor)
    else:
        target = dialler
        dialler.start()
    try:
        target.feed(data)
    except RmqhaError:
        pass


def test_channel_refusal_rules():
    writers = (Role.BROKER, Role.ADMIN)
    assert "plain connection" in (channel_refusal(None, {}, writers) or "")
    assert channel_refusal(BROKER, {"brokerName": "g1", "clusterName": "C"}, writers) is None
    assert "broker group 'g2'" in (channel_refusal(BROKER, {"brokerName": "g2"}, writers) or "")
    assert "cluster 'D'" in (channel_refusal(BROKER, {"clusterName": "D"}, writers) or "")
    assert channel_refusal(Identity.admin("ops"), {"brokerName": "g9"}, writers) is None
    assert "may not send" in (channel_refusal(CONTROLLER, {}, writers) or "")


def test_key_repr_hides_the_secret():
    key = key_from_text(SECRET, BROKER)
    assert SECRET not in repr(key) and isinstance(key, ChannelKey)


# --- over the network, with a man in the middle -------------------------------------------


def _security(secret: str = SECRET) -> ClientSecurity:
    return ClientSecurity().with_channel(key_from_text(secret, BROKER, (Role.CONTROLLER,)))


class _Server:
    """A server with channels whose handler answers ``master=127.0.0.1:1`` and counts calls."""

    def __init__(self, channels: bool = True) -> None:
        self.calls = 0
        self.peers: list[Identity | None] = []
        key = key_from_text(SECRET, CONTROLLER, (Role.BROKER,)) if channels else None
        self.server = RemotingServer(port=0, handler=self._handle, channels=key)

    async def _handle(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.calls += 1
        self.peers.append(conn.channel_peer)
        return cmd.response(remark="master=127.0.0.1:1")


def _forge(chunk: bytes) -> bytes:
    return chunk.replace(b"127.0.0.1:1", b"127.0.0.6:6")


def test_channel_serves_and_names_the_peer_and_plain_clients_still_work():
    async def main() -> None:
        srv = _Server()
        async with srv.server:
            async with RemotingClient(srv.server.address, security=_security()) as client:
                resp = await client.request(RemotingCommand.request(11), 3)
                assert resp.remark == "master=127.0.0.1:1"
                resp = await client.request(RemotingCommand.request(12), 3)
                assert resp.code == ResponseCode.SUCCESS
                # A request sent encoded goes through the seal; its answer through the check.
                req = RemotingCommand.request(13)
                raw = await client.request_frame(encode(req), req.opaque, 3)
                assert decode_frame(raw).remark == "master=127.0.0.1:1"
            async with RemotingClient(srv.server.address) as plain:
                assert (await plain.request(RemotingCommand.request(11), 3)).code == ResponseCode.SUCCESS
                req = RemotingCommand.request(13)
                raw = await plain.request_frame(encode(req), req.opaque, 3)
                assert decode_frame(raw).opaque == req.opaque
        assert srv.peers == [BROKER, BROKER, BROKER, None, None]

    asyncio.run(main())


def test_forged_answer_closes_the_channel_and_never_reaches_the_caller(caplog):
    async def main() -> None:
        srv = _Server()
        async with srv.server, Relay(srv.server.address, rewrite=_forge) as mitm:
            # Negative control: over a plain connection the forged answer is taken.
            async with RemotingClient(mitm.address) as plain:
                resp = await plain.request(RemotingCommand.request(11), 3)
                assert resp.remark == "master=127.0.0.6:6"
            async with RemotingClient(mitm.address, security=_security()) as client:
                with pytest.raises(RemotingError, match="authentication failed"):
                    await client.request(RemotingCommand.request(11), 3)
                assert not client.connected
                req = RemotingCommand.request(11)  # the same for a request sent encoded
                with pytest.raises(RemotingError, match="authentication failed"):
                    await client.request_frame(encode(req), req.opaque, 3)
                assert not client.connected
            assert mitm.rewritten == 3 and srv.calls == 3

    asyncio.run(main())
    assert "failed authentication (altered, dropped, reordered or replayed)" in caplog.text


def test_replayed_request_closes_the_channel_and_is_handled_once(caplog):
    async def main() -> None:
        srv = _Server()
        # The relay sends the client's bytes twice once the server sent its SERVER_AUTH and
        # the first answer: the second request arrives twice.
        async with srv.server, Relay(srv.server.address, replay_after=2) as mitm:
            async with RemotingClient(mitm.address, security=_security()) as client:
                await client.request(RemotingCommand.request(11), 3)
                try:
                    await client.request(RemotingCommand.request(11), 3)
                except RemotingError:
                    pass  # closed before its answer left: the copy and it came in one read
                await _until(lambda: not client.connected)
            assert srv.calls in (1, 2)  # never the copy
            # Negative control: on a plain connection the copy is handled too.
            calls = srv.calls
            async with Relay(srv.server.address, replay_after=1) as plain_mitm:
                async with RemotingClient(plain_mitm.address) as plain:
                    await plain.request(RemotingCommand.request(11), 3)
                    await plain.request(RemotingCommand.request(11), 3)
                    await _until(lambda: srv.calls == calls + 3)

    asyncio.run(main())
    assert "authentication failed" in caplog.text


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("case", ["no channels", "wrong secret"])
def test_dialler_refuses_a_server_that_cannot_prove_the_secret(case):
    async def main() -> None:
        srv = _Server(channels=case != "no channels")
        secret = OTHER if case == "wrong secret" else SECRET
        async with srv.server:
            client = RemotingClient(srv.server.address, security=_security(secret), connect_timeout=3)
            with pytest.raises(RemotingError):
                await client.request(RemotingCommand.request(11), 3)
            await client.close()
        assert srv.calls == 0

    asyncio.run(main())
