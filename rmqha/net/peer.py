"""What a request handler may use of the connection its request came on.

Handlers in ``messaging``, ``controller`` and ``client`` take the connection as their second
argument; typed ``Any`` it let any attribute through unchecked, and typed as
:class:`rmqha.net.connection.Connection` it would hand them the whole transport (frames,
layers, the dispatcher's lanes). :class:`RequestPeer` is the part they use: who the peer is,
a place to keep per-connection state, a request sent back the other way, and a callback
when the connection closes. ``Connection`` satisfies it (mypy checks that wherever a
handler is registered with a dispatcher).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rmqha.protocol.command import RemotingCommand
from rmqha.security.identity import Identity


class RequestPeer(Protocol):
    """The connection a request came on, as its handler sees it."""

    #: ``host:port`` of the other end.
    peer: str
    #: Per-connection state handlers keep (a client's watch, a broker's heartbeat keys).
    attributes: dict[str, Any]
    #: The identity a verified TLS certificate names, else None.
    peer_identity: Identity | None
    #: The identity the peer proved with the cluster secret on a channel, else None.
    channel_peer: Identity | None
    #: Why the connection closed (a log line's words); None while it is open.
    close_reason: str | None

    async def send(self, cmd: RemotingCommand) -> None:
        """Send a request to the peer (a check-back, a notice), without waiting for an answer."""
        ...

    def add_close_callback(self, cb: Callable[[RequestPeer], None]) -> None:
        """Call ``cb`` with this connection once it closes."""
        ...
