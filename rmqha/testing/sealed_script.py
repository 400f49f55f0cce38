"""The authenticated HA wire for tests that script one side of a link over plain sockets.

A scripted master or slave writes and reads plain ``framed`` frames (built with
:mod:`rmqha.ha.frames`, malformed ones included); :class:`ScriptedAuth` puts the link
authentication in front (the cluster-secret handshake of :mod:`rmqha.ha.auth`, either
side) and turns its byte stream into the sealed stream of an authenticated link and back:

* :meth:`ScriptedAuth.seal`: bytes go out as they were written (a frame written in pieces
  still arrives in pieces), and each frame's tag follows its last byte; a length no frame
  can have stops the tagging (the peer refuses the length before any tag matters);
* :meth:`ScriptedAuth.unseal`: the frames of what was read whose tags checked, as plain
  bytes for a decoder.

The handshake runs over any I/O: :meth:`ScriptedAuth.accept` / :meth:`ScriptedAuth.connect`
take async ``recv_exactly(n)`` and ``send(data)`` callables, their ``_sync`` twins blocking
ones (a plain socket in an executor thread).
"""
from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from rmqha.ha import frames as fr
from rmqha.ha.auth import CONTEXT, PREFACE, HAAuth, block_keys
from rmqha.ha.frame_mac import FrameMac, FrameUnsealer
from rmqha.security.link_auth import Handshake

#: A step of the handshake: ("send", bytes) or ("recv", byte count).
_Step = tuple[str, Any]
_LENGTH = struct.Struct(">H")


def _message_steps() -> Generator[_Step, bytes, bytes]:
    head = yield ("recv", _LENGTH.size)
    body = yield ("recv", _LENGTH.unpack(head)[0])
    return body


#: What a handshake's steps return: its HELLO and SERVER_AUTH (the block keys' salt).
_Transcript = tuple[bytes, bytes]


def _server_steps(hs: Handshake) -> Generator[_Step, bytes, _Transcript]:
    preface = yield ("recv", len(PREFACE))
    if preface != PREFACE:
        raise AssertionError(f"the slave did not authenticate: first bytes {preface!r}")
    hs.start()
    hello = yield from _message_steps()
    reply = hs.receive(hello)
    assert reply is not None
    yield ("send", _LENGTH.pack(len(reply)) + reply)
    hs.receive((yield from _message_steps()))
    return hello, reply


def _client_steps(hs: Handshake) -> Generator[_Step, bytes, _Transcript]:
    hello = hs.start()
    assert hello is not None
    yield ("send", PREFACE + _LENGTH.pack(len(hello)) + hello)
    answer = yield from _message_steps()
    proof = hs.receive(answer)
    assert proof is not None
    yield ("send", _LENGTH.pack(len(proof)) + proof)
    return hello, answer


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from a blocking socket (ConnectionResetError at EOF)."""
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise ConnectionResetError("the peer closed the connection")
        got += chunk
    return got


class ScriptedAuth:
    """One side of an authenticated link for a scripted peer; ``auth`` says who it is."""

    def __init__(self, auth: HAAuth, max_frame_bytes: int = 64 << 20) -> None:
        self.auth = auth
        self.max_frame_bytes = max_frame_bytes
        self.mac: FrameMac | None = None
        self._unsealer: FrameUnsealer | None = None
        self._frame = bytearray()  # the frame being written, until its last byte
        self._poisoned = False

    # --- the handshake -----------------------------------------------------------------------

    async def accept(self, recv: Callable[[int], Awaitable[bytes]], send: Callable[[bytes], Awaitable[Any]]) -> None:
        """The master's side of the handshake."""
        hs = Handshake.server(self.auth.secret, self.auth.identity, context=CONTEXT)
        hello, server_auth = await self._drive(_server_steps(hs), recv, send)
        from_slave, to_slave = block_keys(self.auth.secret, hello, server_auth)
        self._ready(hs, to_slave, from_slave)

    async def connect(self, recv: Callable[[int], Awaitable[bytes]], send: Callable[[bytes], Awaitable[Any]]) -> None:
        """The slave's side of the handshake."""
        hs = Handshake.client(self.auth.secret, self.auth.identity, context=CONTEXT)
        hello, server_auth = await self._drive(_client_steps(hs), recv, send)
        self._ready(hs, *block_keys(self.auth.secret, hello, server_auth))

    def connect_sync(self, sock: socket.socket) -> None:
        """:meth:`connect` over a blocking socket."""
        hs = Handshake.client(self.auth.secret, self.auth.identity, context=CONTEXT)
        steps = _client_steps(hs)
        value: Any = None
        try:
            while True:
                kind, arg = steps.send(value)
                if kind == "recv":
                    value = recv_exactly(sock, arg)
                else:
                    sock.sendall(arg)
                    value = None
        except StopIteration as done:
            hello, server_auth = done.value
        self._ready(hs, *block_keys(self.auth.secret, hello, server_auth))

    @staticmethod
    async def _drive(steps: Generator[_Step, bytes, _Transcript], recv: Callable[[int], Awaitable[bytes]],
                     send: Callable[[bytes], Awaitable[Any]]) -> _Transcript:
        value: Any = None
        try:
            while True:
                kind, arg = steps.send(value)
                value = await recv(arg) if kind == "recv" else await send(arg)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _ready(self, hs: Handshake, send_key: bytes, receive_key: bytes) -> None:
        self.mac = FrameMac(hs.session(), send_key, receive_key)
        self._unsealer = FrameUnsealer(self.mac, self.max_frame_bytes)

    # --- the byte stream ---------------------------------------------------------------------

    def seal(self, data: bytes) -> bytes:
        """``data`` as it goes out on the authenticated link: tags after the frames it ends."""
        out = bytearray()
        view = memoryview(data)
        while view.nbytes:
            if self._poisoned:
                out += view
                break
            take = self._wanted(view)
            out += view[:take]
            self._frame += view[:take]
            view = view[take:]
            tag = self._tag_if_whole()
            if tag:
                out += tag
        return bytes(out)

    def _wanted(self, view: memoryview) -> int:
        """How many of ``view``'s bytes belong to the frame being written."""
        frame = self._frame
        if len(frame) < 4:
            return min(4 - len(frame), view.nbytes)
        (length,) = struct.unpack_from(">i", frame, 0)
        return min(length - len(frame), view.nbytes)

    def _tag_if_whole(self) -> bytes:
        frame = self._frame
        if len(frame) < 4:
            return b""
        (length,) = struct.unpack_from(">i", frame, 0)
        if length < fr.HEADER_SIZE or length > self.max_frame_bytes:
            self._poisoned = True  # a length the peer refuses on sight: no tag will matter
            return b""
        if len(frame) < length:
            return b""
        assert self.mac is not None
        whole = bytes(frame)
        frame.clear()
        if struct.unpack_from(">i", whole, 4)[0] == fr.FrameType.TRANSFER_DATA:
            return self.mac.block_tag(whole[: fr.TRANSFER_HEADER_SIZE], whole[fr.TRANSFER_HEADER_SIZE:])
        return self.mac.seal(whole)[len(whole):]

    def unseal(self, data: bytes) -> bytes:
        """The whole frames in what was read, tags checked and removed (AuthenticationError
        for a bad one)."""
        assert self._unsealer is not None
        return b"".join(self._unsealer.feed(data))


class SealedReader:
    """An ``asyncio.StreamReader`` seen through :meth:`ScriptedAuth.unseal`."""

    def __init__(self, reader: Any, script: ScriptedAuth) -> None:
        self._reader = reader
        self._script = script

    async def read(self, n: int = -1) -> bytes:
        """Plain bytes of whole frames; b"" only at the end of the stream."""
        while True:
            data = await self._reader.read(n)
            if not data:
                return b""
            plain = self._script.unseal(data)
            if plain:
                return plain


class SealedWriter:
    """An ``asyncio.StreamWriter`` whose writes go through :meth:`ScriptedAuth.seal`."""

    def __init__(self, writer: Any, script: ScriptedAuth) -> None:
        self._writer = writer
        self.script = script

    def write(self, data: bytes) -> None:
        self._writer.write(self.script.seal(data))

    def write_raw(self, data: bytes) -> None:
        """Bytes as they are: a sealed frame altered, replayed or out of turn."""
        self._writer.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)  # drain, close, wait_closed, get_extra_info
