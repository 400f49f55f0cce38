"""Authenticated remoting channels on a :class:`~rmqha.net.connection.Connection`.

:class:`ChannelLayer` is a connection's frame layer (see ``Connection.use_layer``): it runs
the handshake of :mod:`rmqha.security.channel_auth`, then checks the tag of every frame
that arrives before the frame is decoded, and tags every frame that leaves.  A frame whose
tag fails raises AuthenticationError out of :meth:`ChannelLayer.feed`: the connection
closes with the reason logged and nothing of that read is dispatched.

- Dialling (:func:`dial`): the client writes the preface and HELLO, and no request leaves
  before the acceptor proved the secret and a role the dialler accepts.
- Accepting (:func:`accepting_layer`, given to :class:`~rmqha.net.server.RemotingServer`
  as ``channels``): a connection opening with the preface gets the handshake; any other
  is served as plain remoting (``conn.channel_peer`` stays None; the layer steps aside,
  ``Connection.drop_layer``, so a plain client's path is the one without channels), and a
  server decides per request what needs a channel.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Container, Sequence
from typing import TYPE_CHECKING

from rmqha.errors import AuthenticationError, RemotingError
from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import ResponseCode, code_name
from rmqha.protocol.command import RawAnswer, RemotingCommand, SendFrame, read_frame
from rmqha.security.channel_auth import ChannelEndpoint, ChannelKey, channel_refusal
from rmqha.security.identity import Role

if TYPE_CHECKING:
    from rmqha.net.connection import Connection

log = logging.getLogger(__name__)


def refused_off_channel(cmd: RemotingCommand, conn: RequestPeer,
                        roles: Collection[Role]) -> RemotingCommand | None:
    """NO_PERMISSION naming why, for a state-changing request that did not come over a
    channel (or TLS with a verified certificate) from a peer of ``roles`` acting for itself
    (:func:`~rmqha.security.channel_auth.channel_refusal`); None when it may go on."""
    reason = channel_refusal(conn.channel_peer or conn.peer_identity, cmd.ext_fields, roles)
    if reason is None:
        return None
    return cmd.response(ResponseCode.NO_PERMISSION, f"{code_name(cmd.code)} refused: {reason}")


class ChannelLayer:
    """One connection's side of a channel: handshake, then tags (see the module doc)."""

    def __init__(self, conn: Connection, endpoint: ChannelEndpoint) -> None:
        self._conn = conn
        self._endpoint = endpoint
        #: Opaques whose responses come back undecoded (the connection's, see use_layer).
        self.raw_answers: Container[int] = ()
        loop = asyncio.get_running_loop()
        #: Done when the handshake completes (or fails, with the reason).
        self.ready: asyncio.Future[None] = loop.create_future()
        conn.add_close_callback(self._closed)

    @property
    def buffered(self) -> int:
        return self._endpoint.buffered

    def seal(self, frame: bytes) -> bytes:
        return self._endpoint.seal(frame)

    def feed(self, data: bytes) -> Sequence[RemotingCommand | SendFrame | RawAnswer]:
        try:
            reply, frames = self._endpoint.feed(data)
        except AuthenticationError as exc:
            self._fail(exc)
            raise
        if reply:
            self._conn.write_raw(reply)
        if self._endpoint.plain:
            # A plain client: the connection's own decoder from here on (a broker's plain
            # sends keep their fast lane), and nothing of the layer on its path.
            return self._conn.drop_layer(b"".join(frames))
        if self._endpoint.established and not self.ready.done():
            self._conn.channel_peer = self._endpoint.peer
            self.ready.set_result(None)
        raw = self.raw_answers
        return [read_frame(memoryview(f)[4:], raw) for f in frames]

    def _fail(self, exc: Exception) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()  # the dialler reads it; an acceptor's is only logged

    def _closed(self, conn: Connection) -> None:
        self._fail(RemotingError(f"{conn.name} closed the connection during the channel "
                                 f"handshake ({conn.close_reason})"))


async def dial(conn: Connection, key: ChannelKey, timeout: float) -> None:
    """Authenticate a connection just made (nothing sent on it yet) as a channel's dialler.
    RemotingError naming why when the acceptor does not complete it in ``timeout``."""
    endpoint = ChannelEndpoint(key, dialler=True, max_frame_bytes=conn.max_frame_bytes)
    layer = ChannelLayer(conn, endpoint)
    conn.use_layer(layer)
    conn.write_raw(endpoint.start())
    try:
        await asyncio.wait_for(asyncio.shield(layer.ready), timeout)
    except asyncio.TimeoutError:
        await conn.close("channel handshake timed out")
        raise _refused(conn, f"no channel handshake answer within {timeout:g}s") from None
    except AuthenticationError as exc:
        await conn.close(f"channel authentication failed: {exc}")
        raise _refused(conn, f"channel authentication failed: {exc}") from exc
    except RemotingError as exc:
        raise _refused(conn, f"{exc} (the peer has another cluster secret, none, or no "
                             "authenticated channels)") from None


def _refused(conn: Connection, reason: str) -> RemotingError:
    """The error of a failed dial, logged as a warning: a peer that cannot prove the secret
    is a misconfiguration or an impostor, and either needs an operator."""
    log.warning("authenticated channel to %s refused: %s", conn.name, reason)
    return RemotingError(f"{conn.name}: {reason}")


def accepting_layer(key: ChannelKey) -> Callable[[Connection], ChannelLayer]:
    """A server's layer factory: ``factory(conn)`` gives each accepted connection an
    acceptor's :class:`ChannelLayer` that also serves plain clients."""
    def make(conn: Connection) -> ChannelLayer:
        return ChannelLayer(conn, ChannelEndpoint(key, dialler=False,
                                                  max_frame_bytes=conn.max_frame_bytes,
                                                  allow_plain=True))
    return make
