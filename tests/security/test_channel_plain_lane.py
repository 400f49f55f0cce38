"""A port that takes authenticated channels serves its plain clients as a port without them.

A broker holding the cluster secret takes channels on its client port (the controller's
role notices), so every client connection starts behind an accepting
:class:`~rmqha.net.channel.ChannelLayer`.  Once the first bytes show a plain client the
layer steps aside (``Connection.drop_layer``): the connection's own decoder reads on, so a
plain send still takes the broker's fast lane (parsed from its frame, no command made) and
nothing it writes passes a seal.  The negative control is a channel's preface on the same
kind of connection: the handshake answers, and no send is taken before it completes.
"""
from __future__ import annotations

import asyncio
from typing import Any

from rmqha.net.channel import accepting_layer
from rmqha.net.connection import Connection
from rmqha.net.dispatcher import Dispatcher
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand, encode
from rmqha.protocol.headers import SendHeader
from rmqha.security.channel_auth import PREFACE, ChannelEndpoint, key_from_text
from rmqha.security.identity import Identity, Role
from rmqha.testing.recording_transport import RecordingTransport

SECRET = "0123456789abcdef-plain-lane-secret"
BROKER = Identity.broker("C", "g1", "b-1")


def _send(i: int) -> bytes:
    h = SendHeader("pg", "T", 0, 0, 1700000000000 + i, 0, f"UNIQ_KEY\x01U{i:08d}\x02", 0, False)
    return encode(RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=100 + i,
                                  ext_fields=h.build(v2=True), body=b"m%d" % i))


def _connection(taken: list[int]) -> tuple[Connection, RecordingTransport]:
    """A broker-like accepted connection: the plain-send lane, then the channel layer."""
    d = Dispatcher({})

    def plain(send: Any, conn: Connection) -> bool:
        taken.append(1)
        return True

    d.register_plain_send(plain, ())
    conn = Connection(d, 1 << 20)
    conn.use_layer(accepting_layer(key_from_text(SECRET, BROKER, (Role.CONTROLLER,)))(conn))
    transport = RecordingTransport()
    conn.connection_made(transport)
    return conn, transport


def test_a_plain_client_keeps_the_fast_lane_behind_an_accepting_layer():
    async def main() -> None:
        taken: list[int] = []
        conn, transport = _connection(taken)
        first = _send(1)
        conn.data_received(first[:3])  # too short to tell: held
        assert taken == []
        conn.data_received(first[3:] + _send(2))
        conn.data_received(_send(3))
        assert taken == [1, 1, 1] and conn.channel_peer is None
        # Frames leave unsealed: what the connection writes is the encoding, no tag.
        cmd = RemotingCommand.request(RequestCode.HEART_BEAT, oneway=True)
        await conn.oneway(cmd)
        for _ in range(10):  # written at the end of the loop turn
            if transport.out:
                break
            await asyncio.sleep(0)
        assert bytes(transport.out) == encode(cmd)

    asyncio.run(main())


def test_negative_control_a_channel_preface_gets_the_handshake_and_no_send_is_taken():
    async def main() -> None:
        taken: list[int] = []
        conn, transport = _connection(taken)
        dialler = ChannelEndpoint(key_from_text(SECRET, Identity.controller("n0"), (Role.BROKER,)),
                                  dialler=True, max_frame_bytes=1 << 20)
        hello = dialler.start()
        assert hello.startswith(PREFACE)
        conn.data_received(hello)
        assert transport.out and not conn.closed  # the SERVER_AUTH went out
        conn.data_received(_send(1))  # a send in place of CLIENT_AUTH: never taken
        assert taken == [] and conn.closed

    asyncio.run(main())
