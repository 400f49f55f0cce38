"""The controllers' Raft port as a listening socket: where it binds and whom it keeps.

pysyncobj 0.3.17 left to itself binds its port on every interface (``0.0.0.0``, or ``::``
for an IPv6 self address) unless ``bindAddress`` is set, and keeps an accepted connection
for as long as it stays silent: its ``TcpConnection`` checks its read timeout only when
the socket has an event, so a peer that connects and says nothing (or stops in the middle
of a frame) holds a descriptor and a slot in pysyncobj's unknown-connections set forever.
On an insecure loopback-only group (``allow_insecure``) such a port, reachable from the
network, would unpickle whatever a stranger sent.  This module decides, for every
controller:

* **bind host** (:func:`bind_address`): the Raft port listens on the host the controller
  listens on (``listen_host``), never on a wildcard it was not given;
* **deadlines** (:class:`DeadlineTransport`, swept every :data:`SWEEP_PERIOD_S` from
  pysyncobj's tick): an accepted link must say which member it is (after TLS and the
  key exchange) within :data:`HANDSHAKE_DEADLINE_S`, as the remoting ports' 10 s TLS
  deadline; an accepted link from which nothing was read for :data:`IDLE_DEADLINE_S` is
  dropped.  Members' links are never that quiet while it matters: a leader sends a
  heartbeat every 50 ms and its followers answer each; a link between two followers
  carries nothing between elections, is dropped after 20 s and dialled again within
  pysyncobj's retry time (0.3 s) by the member that dials it;
* **caps**: at most :data:`MAX_UNIDENTIFIED_PER_HOST` accepted links from one host may be
  waiting to identify at once, and at most ``max_connections_per_peer`` accepted links
  from one host may be open at all (:mod:`rmqha.net.peer_limit`, the rule of every port);
  more are closed at accept.  A group has one link per pair of members (the member with
  the greater address dials), so even the loopback groups of the tests, every member on
  127.0.0.1, need at most two.

Every drop logs one line naming the peer and why: WARNING for links that never
identified; DEBUG for idle members' links (two followers' link drops every 20 s between
elections, which is no news).
"""
from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any

from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.transport import TCPTransport

from rmqha.net.peer_limit import DEFAULT_MAX_PER_PEER, PeerLimit, Slot
from rmqha.net.server import HANDSHAKE_TIMEOUT_S
from rmqha.protocol.request_auth import RefusalLog

log = logging.getLogger(__name__)

#: An accepted link must identify itself as a member within this many seconds.
HANDSHAKE_DEADLINE_S = HANDSHAKE_TIMEOUT_S
#: An accepted link from which nothing was read for this long is dropped.
IDLE_DEADLINE_S = 20.0
#: Accepted links from one host that may be waiting to identify at once.
MAX_UNIDENTIFIED_PER_HOST = 4
#: How often the deadlines are checked (pysyncobj ticks every 50 ms).
SWEEP_PERIOD_S = 0.5

#: pysyncobj 0.3.17's names (rmqha.controller.raft's version guard covers them).
_SOCKET_ATTR = "_TcpConnection__socket"
_LAST_READ_ATTR = "_TcpConnection__lastReadTime"


def bind_address(listen_host: str | None, self_address: str) -> str:
    """pysyncobj's ``bindAddress``: ``listen_host`` (the controller's) with the Raft port
    of ``self_address``; the self address's own host when no listen host is given, so
    the port never listens on a wildcard nobody asked for."""
    host, _, port = self_address.rpartition(":")
    return f"{listen_host or host}:{port}"


@dataclass
class _Accepted:
    """An accepted link as this port tracks it."""

    host: str
    since: float
    slot: Slot


class DeadlineTransport(TCPTransport):
    """pysyncobj's TCP transport with the handshake and idle deadlines and the per-host
    cap of the module docstring (mixed in front of the transport class a node uses)."""

    #: Accepted links one host may hold open (set by :func:`deadline_transport`).
    max_per_peer = DEFAULT_MAX_PER_PEER

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._accepted: dict[Any, _Accepted] = {}
        #: Refused links, logged at most once per kind per period.
        self._refusals = RefusalLog(log)
        self._next_sweep = 0.0
        self.peer_limit = PeerLimit("Raft port", self.max_per_peer)
        super().__init__(*args, **kwargs)

    def _onNewIncomingConnection(self, conn: Any) -> None:  # noqa: N802 (pysyncobj's name)
        host = _peer_host(conn)
        slot = self.peer_limit.admit(host)
        if slot is None:
            conn.disconnect()
            return
        waiting = sum(1 for c, a in self._accepted.items()
                      if a.host == host and c in self._unknownConnections)
        if waiting >= MAX_UNIDENTIFIED_PER_HOST:
            self._refusals.warn("unidentified", "Raft link from %s refused: %d links from that host are already "
                                "waiting to identify (at most %d)", host, waiting, MAX_UNIDENTIFIED_PER_HOST)
            slot.release()
            conn.disconnect()
            return
        self._accepted[conn] = _Accepted(host, monotonic_time(), slot)
        super()._onNewIncomingConnection(conn)

    def _onDisconnected(self, conn: Any) -> None:  # noqa: N802
        self._forget(conn)
        super()._onDisconnected(conn)

    def _forget(self, conn: Any) -> None:
        accepted = self._accepted.pop(conn, None)
        if accepted is not None:
            accepted.slot.release()

    def _onTick(self) -> None:  # noqa: N802
        super()._onTick()
        now = monotonic_time()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_PERIOD_S
            self.sweep(now)

    def sweep(self, now: float) -> None:
        """Drop the accepted links past a deadline."""
        for conn, accepted in list(self._accepted.items()):
            why = self._overdue(conn, accepted, now)
            if why is None:
                continue
            level = logging.WARNING if conn in self._unknownConnections else logging.DEBUG
            log.log(level, "Raft link from %s dropped: %s", accepted.host, why)
            self._forget(conn)
            conn.disconnect()
            self._unknownConnections.discard(conn)

    def _overdue(self, conn: Any, accepted: _Accepted, now: float) -> str | None:
        if conn in self._unknownConnections and now - accepted.since > HANDSHAKE_DEADLINE_S:
            return f"it did not identify as a member within {HANDSHAKE_DEADLINE_S:.0f} s"
        last_read = getattr(conn, _LAST_READ_ATTR, now)
        if now - last_read > IDLE_DEADLINE_S:
            return f"nothing read from it for {IDLE_DEADLINE_S:.0f} s"
        return None

    @property
    def accepted_links(self) -> int:
        """Accepted links still open (for tests and status)."""
        return len(self._accepted)


def deadline_transport(base: type[TCPTransport], max_per_peer: int = DEFAULT_MAX_PER_PEER) -> type[TCPTransport]:
    """``base`` (pysyncobj's transport or a subclass) with the deadlines and the caps."""
    return type(f"Deadline{base.__name__}", (DeadlineTransport, base), {"max_per_peer": max_per_peer})


def _peer_host(conn: Any) -> str:
    sock = getattr(conn, _SOCKET_ATTR, None)
    raw = getattr(sock, "sock", sock)  # a TlsSocket keeps the raw socket as .sock
    if not isinstance(raw, socket.socket):
        return "?"
    try:
        return str(raw.getpeername()[0])
    except OSError:
        return "?"
