"""Authenticated remoting channels: the cluster-secret handshake on a remoting connection,
then a MAC on every frame both ways.  Sans-I/O; :mod:`rmqha.net.channel` runs it on a
:class:`~rmqha.net.connection.Connection`.

For the control links that may run without TLS (broker -> controller, broker -> name
server, the admin CLI -> controller).  A request signature
(:mod:`rmqha.protocol.request_auth`) proves a request; a channel also proves every
*answer*, so a man in the middle cannot feed a broker a forged register, elect or
heartbeat answer.  On the wire (lengths big-endian)::

    dialler  -> acceptor   PREFACE || u16 length || HELLO
    acceptor -> dialler               u16 length || SERVER_AUTH
    dialler  -> acceptor              u16 length || CLIENT_AUTH
    ... then remoting frames, each followed by its 16-byte tag:
        int32 length | rest of the frame (length bytes) | tag

The three messages and the tags are :mod:`rmqha.security.link_auth`'s, with context
``"remoting"`` (an HA transcript is no good here): nonces from both sides, proofs over the
whole transcript, compared in constant time, and per-direction keys fresh for each
connection.  A tag is HMAC-SHA256 (first 16 bytes) over the direction, a sequence number
each side counts (never sent) and the whole frame, length included: an altered, injected,
dropped, reordered or replayed frame fails its tag, and the side that reads it closes the
connection before anything of that read is used.

``PREFACE`` (``80 72 43 48``, ``\\x80rCH``) read as a remoting frame length is negative,
so an acceptor tells a channel from a plain client by the first four bytes, and a server
that knows no channels closes the connection at once ("malformed frame").  Its first byte
is no TLS record either, so a permissive TLS port serves it as plaintext.
"""
from __future__ import annotations

import enum
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from rmqha.errors import AuthenticationError, ProtocolError
from rmqha.security.identity import Identity, Role, authorize
from rmqha.security.link_auth import TAG_BYTES, Handshake, LinkSession
from rmqha.security.secret import ClusterSecret

#: First four bytes of an authenticating dialler (a negative int32: no remoting length).
PREFACE = b"\x80rCH"
#: The link_auth context of remoting channels.
CONTEXT = "remoting"
MAX_MESSAGE_BYTES = 4096
TAG = TAG_BYTES
_LENGTH = struct.Struct(">H")
_FRAME_LENGTH = struct.Struct(">i")


@dataclass(frozen=True)
class ChannelKey:
    """What one side of a channel proves with: the cluster secret and its own identity,
    and the roles it takes on the other end."""

    secret: ClusterSecret = field(repr=False)
    identity: Identity
    peer_roles: frozenset[Role] = frozenset(Role)

    def authorize(self, peer: Identity) -> Identity:
        """``peer`` if its role is one of :attr:`peer_roles` (PeerIdentityError if not)."""
        return authorize(peer, roles=self.peer_roles)

    def expecting(self, roles: Collection[Role]) -> ChannelKey:
        """This key, taking only peers of ``roles``."""
        return ChannelKey(self.secret, self.identity, frozenset(roles))


def message(body: bytes) -> bytes:
    """One handshake message as it travels: ``u16 length || body``."""
    return _LENGTH.pack(len(body)) + body


class _State(enum.Enum):
    PREFACE = "preface"      # acceptor: the first four bytes decide
    HANDSHAKE = "handshake"  # a handshake message is awaited
    SEALED = "sealed"        # frames with tags
    PLAIN = "plain"          # acceptor: a plain client (nothing to unseal)
    FAILED = "failed"


class ChannelEndpoint:
    """One side of one channel, fed the bytes that arrive (see the module docstring).

    :meth:`feed` returns ``(to_send, frames)``: bytes of the handshake to write back
    before anything else, and the remoting frames (whole, length included) whose tags
    checked, in order.  AuthenticationError on a failed handshake or tag, ProtocolError on
    a length out of bounds; after either the endpoint refuses everything (close the
    connection).  An acceptor made with ``allow_plain`` hands a plain client's bytes
    through untouched (:attr:`plain` then says so).
    """

    def __init__(self, key: ChannelKey, *, dialler: bool, max_frame_bytes: int,
                 allow_plain: bool = False) -> None:
        self.key = key
        self.dialler = dialler
        self.max_frame_bytes = max_frame_bytes
        self._allow_plain = allow_plain
        self._hs = (Handshake.client if dialler else Handshake.server)(key.secret, key.identity,
                                                                       context=CONTEXT)
        self._state = _State.HANDSHAKE if dialler else _State.PREFACE
        self._buf = bytearray()
        self._session: LinkSession | None = None
        #: Who the peer proved to be (None until the handshake is complete).
        self.peer: Identity | None = None

    # --- state --------------------------------------------------------------------------

    @property
    def established(self) -> bool:
        return self._state is _State.SEALED

    @property
    def plain(self) -> bool:
        """An acceptor's plain client (no channel: the bytes are passed through)."""
        return self._state is _State.PLAIN

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def start(self) -> bytes:
        """The dialler's first bytes: PREFACE and HELLO (an acceptor sends nothing first)."""
        if not self.dialler:
            return b""
        hello = self._hs.start()
        assert hello is not None
        return PREFACE + message(hello)

    # --- out ----------------------------------------------------------------------------

    def seal(self, frame: bytes) -> bytes:
        """``frame || tag`` on an established channel; a plain client's frame unchanged."""
        if self._session is not None:
            return frame + self._session.sealer.tag(frame)
        if self._state is _State.PLAIN:
            return frame
        raise AuthenticationError("no frame may be sent before the channel handshake completes")

    # --- in -----------------------------------------------------------------------------

    def feed(self, data: bytes) -> tuple[bytes, list[bytes]]:
        if self._state is _State.FAILED:
            raise AuthenticationError("this channel failed authentication earlier")
        if self._state is _State.PLAIN:
            return b"", [data]
        self._buf += data
        try:
            return self._advance()
        except (AuthenticationError, ProtocolError):
            self._state = _State.FAILED
            self._buf.clear()
            raise

    def _advance(self) -> tuple[bytes, list[bytes]]:
        out = b""
        if self._state is _State.PREFACE:
            if len(self._buf) < len(PREFACE):
                return b"", []
            if not self._take_preface():
                rest = bytes(self._buf)
                self._buf.clear()
                return b"", [rest]
        while self._state is _State.HANDSHAKE:
            body = self._take_message()
            if body is None:
                return out, []
            out += self._on_message(body)
        return out, self._take_frames()

    def _take_preface(self) -> bool:
        """Whether this acceptor's peer opened a channel (False: a plain client)."""
        if bytes(self._buf[:len(PREFACE)]) == PREFACE:
            del self._buf[:len(PREFACE)]
            self._hs.start()
            self._state = _State.HANDSHAKE
            return True
        if not self._allow_plain:
            raise AuthenticationError("this port takes authenticated channels only; the peer "
                                      "sent no channel preface")
        self._state = _State.PLAIN
        return False

    def _take_message(self) -> bytes | None:
        buf = self._buf
        if len(buf) < _LENGTH.size:
            return None
        (n,) = _LENGTH.unpack_from(buf, 0)
        if not 0 < n <= MAX_MESSAGE_BYTES:
            raise AuthenticationError(f"channel handshake message of {n} bytes "
                                      f"(1..{MAX_MESSAGE_BYTES} allowed)")
        if len(buf) < _LENGTH.size + n:
            return None
        body = bytes(buf[_LENGTH.size:_LENGTH.size + n])
        del buf[:_LENGTH.size + n]
        return body

    def _on_message(self, body: bytes) -> bytes:
        reply = self._hs.receive(body)
        if self._hs.complete:
            session = self._hs.session()
            self.key.authorize(session.peer)
            self._session, self.peer = session, session.peer
            self._state = _State.SEALED
        return message(reply) if reply is not None else b""

    def _take_frames(self) -> list[bytes]:
        buf, session = self._buf, self._session
        assert session is not None
        frames: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 4:
            (length,) = _FRAME_LENGTH.unpack_from(buf, pos)
            if length < 4 or length > self.max_frame_bytes:
                raise ProtocolError(f"frame length {length} outside [4, {self.max_frame_bytes}]")
            end = pos + 4 + length
            if len(buf) < end + TAG:
                break
            frame = bytes(buf[pos:end])
            session.opener.verify(frame, bytes(buf[end:end + TAG]))
            frames.append(frame)
            pos = end + TAG
        del buf[:pos]
        return frames


def key_from_text(secret: str, identity: Identity, peer_roles: Collection[Role] = tuple(Role)) -> ChannelKey:
    """A key from the secret as configuration text (ConfigError when it is too short)."""
    return ChannelKey(ClusterSecret(secret.encode("utf-8"), "configuration"), identity,
                      frozenset(peer_roles))


def channel_refusal(peer: Identity | None, ext: Mapping[str, str],
                    roles: Collection[Role]) -> str | None:
    """Why a state-changing request from ``peer`` (None: a plain connection) is refused, or
    None when it may go on: the peer proved itself on an authenticated channel or by TLS,
    has one of ``roles``, and a broker acts only for its own cluster and group (the
    request's ``clusterName`` and ``brokerName``, where given)."""
    if peer is None:
        return ("it came over a plain connection: state-changing requests need an "
                "authenticated channel (the cluster secret's handshake) or TLS with a "
                "verified certificate")
    if peer.role not in roles:
        return f"peer {peer} may not send it (only {', '.join(sorted(r.value for r in roles))})"
    if peer.role is Role.BROKER:
        group, cluster = ext.get("brokerName"), ext.get("clusterName")
        if group and group != peer.group:
            return f"peer {peer} may not act for broker group {group!r}"
        if cluster and cluster != peer.cluster:
            return f"peer {peer} may not act for cluster {cluster!r}"
    return None
