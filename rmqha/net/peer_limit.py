"""The cap on connections per peer host, the one rule every listening port applies.

A stranger that opens connection after connection (and completes no handshake, or one
and then stays) holds one descriptor each until a deadline drops it: 10 to 20 s on every
port (:mod:`rmqha.net.server`, :mod:`rmqha.controller.raft_port`), long enough to fill a
process's descriptor table (1024 under many service managers) from one host.  So each
port counts the connections it holds per peer *host* (the address, whatever the source
port) from the accept on, through TLS and any handshake, to the close, and closes at
accept the one past :data:`DEFAULT_MAX_PER_PEER` (``max_connections_per_peer``), before
reading a byte of it, while every other host still gets in.

Who uses it: the remoting server of the broker, name server and controller
(:class:`rmqha.net.server.RemotingServer`), the broker's HA port
(:mod:`rmqha.ha.acceptor`) and the controllers' Raft port
(:mod:`rmqha.controller.raft_port`).  The proxy's gRPC port is not capped: grpcio
accepts inside its C core and shows Python no connection before its first call.

The default leaves room for what one host legitimately holds: a RocketMQ client instance
keeps one connection per broker and name server, a test cluster on 127.0.0.1 a few dozen
in all; 512 from one host is a host full of clients, or an attack.

A refusal logs one WARNING naming the port, the peer and the cap, at most once per peer
per :data:`LOG_EVERY_S` (a flood is one line every 10 s, with the count it stood for).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rmqha.errors import ConfigError

log = logging.getLogger(__name__)

#: Connections one peer host may hold on one port (``max_connections_per_peer``).
DEFAULT_MAX_PER_PEER = 512
#: A peer's refusals are logged at most this often.
LOG_EVERY_S = 10.0
#: Peers whose log times are kept (more: forgotten all at once; a line may come early).
MAX_LOGGED_PEERS = 4096


@dataclass
class Slot:
    """One admitted connection's place in its peer's count; :meth:`release` is idempotent,
    so every path that ends the connection may call it."""

    limit: PeerLimit
    host: str
    released: bool = False

    def release(self, *_: object) -> None:
        """Give the place back (extra arguments: usable as any close callback)."""
        if not self.released:
            self.released = True
            self.limit.release(self.host)


@dataclass
class _Refusals:
    next_log: float
    unlogged: int = 0


@dataclass
class PeerLimit:
    """The connections of one listening port, counted per peer host."""

    #: The port, as log lines name it ("remoting port 127.0.0.1:9876").
    where: str
    max_per_peer: int = DEFAULT_MAX_PER_PEER
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, int] = field(default_factory=dict)
    _refused: dict[str, _Refusals] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_per_peer < 1:
            raise ConfigError(f"max_connections_per_peer must be at least 1, not {self.max_per_peer}")

    def admit(self, host: str) -> Slot | None:
        """A slot for one more connection from ``host``, or None (logged, rate-limited):
        the caller closes the connection at once."""
        held = self._held.get(host, 0)
        if held >= self.max_per_peer:
            self._log_refusal(host)
            return None
        self._held[host] = held + 1
        return Slot(self, host)

    def release(self, host: str) -> None:
        held = self._held.get(host, 0) - 1
        if held > 0:
            self._held[host] = held
        else:
            self._held.pop(host, None)

    def held(self, host: str) -> int:
        """Connections ``host`` holds now."""
        return self._held.get(host, 0)

    def _log_refusal(self, host: str) -> None:
        now = self.clock()
        seen = self._refused.get(host)
        if seen is not None and now < seen.next_log:
            seen.unlogged += 1
            return
        if len(self._refused) >= MAX_LOGGED_PEERS:
            self._refused.clear()
        more = f" ({seen.unlogged} more refused since the last line)" if seen is not None and seen.unlogged else ""
        self._refused[host] = _Refusals(now + LOG_EVERY_S)
        log.warning("%s: refused a connection from %s: it already holds %d, the most one peer may "
                    "(max_connections_per_peer = %d)%s", self.where, host, self.max_per_peer,
                    self.max_per_peer, more)


def host_of(peer: str | tuple[object, ...] | None) -> str:
    """The host of a peer address (``host:port`` text, or a socket's ``getpeername()``)."""
    if isinstance(peer, tuple):
        return str(peer[0]) if peer else "?"
    if not peer:
        return "?"
    return peer.rpartition(":")[0].strip("[]") or peer
