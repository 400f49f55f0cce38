"""Mutual authentication of an internal link by a shared cluster secret, then a MAC on
every frame.  Sans-I/O: it turns received bytes into bytes to send; the caller frames them.

For links that run without TLS (HA replication, controller RPC, broker registration).
Three handshake messages, each one opaque byte string::

    client -> server   HELLO        version, context, client identity, client nonce
    server -> client   SERVER_AUTH  server identity, server nonce, server proof
    client -> server   CLIENT_AUTH  client proof

A proof is HMAC-SHA256 under a key derived from the secret, over the whole transcript so
far (protocol label, the caller's ``context``, both identities, both nonces) plus the
prover's side.  Fresh 32-byte nonces on both sides make an old transcript worthless (a
replayed HELLO meets a new server nonce, a replayed CLIENT_AUTH answers an old one); the
side label makes a server's proof useless as a client's (no reflection).

Then each direction has its own key (HKDF of the secret over both nonces and the
transcript), and every frame travels as ``frame || tag``, the tag being the first 16 bytes
of HMAC-SHA256(key, direction || sequence number || frame).  The sequence numbers are not
sent: each side counts, so a dropped, reordered, replayed or altered frame fails its tag.
After one failure the receiving side refuses every later frame: close the link.

Run inside a TLS session, the handshake binds itself to it: both sides pass the
session's channel binding (``binding``, e.g. its ``tls-unique``) and every proof covers it
(``u16 length || binding`` before the transcript; nothing of it is sent).  A relay that
terminates TLS on both sides, say with a stolen certificate key, holds two sessions whose
bindings differ, so the proofs it forwards fail; without a binding the proofs are as
before.

The secret must be random (see :mod:`rmqha.security.secret`): the transcript lets an
eavesdropper test guesses of it offline.  Frames are authenticated, not encrypted.

Usage (any framing, e.g. a length prefix per message)::

    client = Handshake.client(secret, Identity.broker("C", "g1", "b1"), context="ha")
    server = Handshake.server(secret, Identity.broker("C", "g1", "b0"), context="ha")
    m1 = client.start()                 # -> send
    m2 = server.receive(m1)             # -> send back
    m3 = client.receive(m2)             # -> send; client.complete
    server.receive(m3)                  # -> None; server.complete
    link = client.session()             # link.peer, link.seal(frame), link.open(data)
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rmqha.errors import AuthenticationError, ConfigError
from rmqha.security.identity import Identity
from rmqha.security.secret import ClusterSecret

LABEL = b"rmqha link-auth v1"
VERSION = 1
NONCE_BYTES = 32
TAG_BYTES = 16
_MAX_FIELD = 1024


class _Msg(enum.IntEnum):
    HELLO = 1
    SERVER_AUTH = 2
    CLIENT_AUTH = 3


class Side(enum.Enum):
    CLIENT = b"client"
    SERVER = b"server"


def _field(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


class _Reader:
    """Reads length-prefixed fields of one handshake message; names what is short."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, name: str) -> bytes:
        if self.pos + 2 > len(self.data):
            raise AuthenticationError(f"{self.what}: ends before {name}")
        (n,) = struct.unpack_from(">H", self.data, self.pos)
        start = self.pos + 2
        if n > _MAX_FIELD or start + n > len(self.data):
            raise AuthenticationError(f"{self.what}: {name} of {n} bytes does not fit")
        self.pos = start + n
        return self.data[start:self.pos]

    def end(self) -> None:
        if self.pos != len(self.data):
            raise AuthenticationError(f"{self.what}: {len(self.data) - self.pos} stray bytes at the end")


def _identity(raw: bytes, what: str) -> Identity:
    try:
        return Identity.parse(raw.decode("ascii"))
    except (UnicodeDecodeError, ConfigError) as exc:
        raise AuthenticationError(f"{what}: bad identity: {exc}") from None


def _hkdf(secret: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


#: The padded key blocks of HMAC (RFC 2104): the key XOR ipad and XOR opad, as byte maps.
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
_SHA256_BLOCK = 64


class _FrameTags:
    """The tags of one direction: HMAC-SHA256 under its key over ``direction || sequence
    number || frame``, first 16 bytes.  The two padded key blocks are hashed once, here:
    a tag then costs two copies of a hash state, two updates and two digests, where
    ``hmac.new(...).copy()`` runs a Python wrapper and OpenSSL's MAC context around them."""

    def __init__(self, key: bytes, direction: bytes) -> None:
        #: The key as given: a compiled twin of these tags (rmqha._core.slave_lane) takes it.
        self.key = key
        if len(key) > _SHA256_BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))
        self._head = struct.Struct(f">{len(direction)}sQ")
        self._direction = direction
        self.seq = 0

    @property
    def direction(self) -> bytes:
        return self._direction

    def _tag(self, frame: bytes | memoryview, more: bytes | memoryview | None) -> bytes:
        """The tag of frame number ``seq`` whose bytes are ``frame`` then ``more``."""
        inner = self._inner.copy()
        inner.update(self._head.pack(self._direction, self.seq))
        inner.update(frame)
        if more is not None:
            inner.update(more)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:TAG_BYTES]


class FrameSealer(_FrameTags):
    """Adds the tag to each outgoing frame of one direction (not thread-safe: one writer)."""

    def tag(self, frame: bytes | memoryview, more: bytes | memoryview | None = None) -> bytes:
        """The tag of the next frame (for a writer that sends ``frame`` and tag separately);
        ``more``: the rest of the frame's bytes, when they lie apart."""
        tag = self._tag(frame, more)
        self.seq += 1
        return tag

    def seal(self, frame: bytes) -> bytes:
        return frame + self.tag(frame)


class FrameOpener(_FrameTags):
    """Checks the tag of each incoming frame of one direction, in order (one reader)."""

    def __init__(self, key: bytes, direction: bytes) -> None:
        super().__init__(key, direction)
        self._failed = False

    def verify(self, frame: bytes | memoryview, tag: bytes | bytearray | memoryview,
               more: bytes | memoryview | None = None) -> None:
        """Raise AuthenticationError unless ``tag`` is the next frame's tag for ``frame``
        (then ``more``, the rest of its bytes when they lie apart)."""
        if self._failed:
            raise AuthenticationError("an earlier frame on this link failed authentication")
        if not hmac.compare_digest(self._tag(frame, more), tag):
            self._failed = True
            raise AuthenticationError(
                f"frame #{self.seq} failed authentication (altered, dropped, reordered or "
                "replayed); close the link")
        self.seq += 1

    @property
    def failed(self) -> bool:
        """Whether a frame failed its tag (every later one is refused)."""
        return self._failed

    def open(self, data: bytes) -> bytes:
        """The frame inside ``data`` (frame || tag), once its tag checks."""
        if len(data) < TAG_BYTES:
            self._failed = True
            raise AuthenticationError(f"sealed frame of {len(data)} bytes is shorter than its tag")
        frame = data[:-TAG_BYTES]
        self.verify(frame, data[-TAG_BYTES:])
        return frame


@dataclass(frozen=True)
class LinkSession:
    """An authenticated link: who the peer proved to be, and both directions' MACs."""

    peer: Identity
    sealer: FrameSealer
    opener: FrameOpener

    def seal(self, frame: bytes) -> bytes:
        return self.sealer.seal(frame)

    def open(self, data: bytes) -> bytes:
        return self.opener.open(data)


class Handshake:
    """One side of the handshake; make it with :meth:`client` or :meth:`server`."""

    def __init__(self, side: Side, secret: ClusterSecret, identity: Identity, context: str,
                 binding: bytes = b"") -> None:
        self.side = side
        self.identity = identity
        self.context = context.encode("utf-8")
        if len(binding) > _MAX_FIELD:
            raise ConfigError(f"a channel binding of {len(binding)} bytes (at most {_MAX_FIELD})")
        self._bound = _field(binding) if binding else b""
        self._secret = secret.reveal()
        self._auth_key = _hkdf(self._secret, LABEL, b"proof key")
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self._transcript = b""
        self._peer: Identity | None = None
        self._peer_nonce = b""
        self._session: LinkSession | None = None
        self._expect: _Msg | None = _Msg.SERVER_AUTH if side is Side.CLIENT else _Msg.HELLO
        self._started = False

    @classmethod
    def client(cls, secret: ClusterSecret, identity: Identity, context: str = "",
               binding: bytes = b"") -> Handshake:
        """The side that connects; ``context`` names the link's purpose (both sides must
        give the same, so a transcript of one kind of link is no good on another);
        ``binding``: the channel binding of the TLS session it runs in (b"": none)."""
        return cls(Side.CLIENT, secret, identity, context, binding)

    @classmethod
    def server(cls, secret: ClusterSecret, identity: Identity, context: str = "",
               binding: bytes = b"") -> Handshake:
        """The side that accepts."""
        return cls(Side.SERVER, secret, identity, context, binding)

    @property
    def complete(self) -> bool:
        return self._session is not None

    @property
    def peer(self) -> Identity | None:
        """The identity the peer claims (proved only once :attr:`complete`)."""
        return self._peer

    def session(self) -> LinkSession:
        if self._session is None:
            raise AuthenticationError("the link handshake has not completed")
        return self._session

    def start(self) -> bytes | None:
        """The first message to send: HELLO for a client, nothing for a server."""
        if self._started:
            raise AuthenticationError("start() was already called")
        self._started = True
        if self.side is Side.SERVER:
            return None
        hello = (bytes([_Msg.HELLO, VERSION]) + _field(self.context)
                 + _field(str(self.identity).encode()) + _field(self._nonce))
        self._transcript = _field(hello)
        return hello

    def receive(self, message: bytes) -> bytes | None:
        """Take the peer's next message; return the reply to send, if any.  Raises
        AuthenticationError on anything wrong (the link must then be closed)."""
        if self._expect is None or (self.side is Side.CLIENT and not self._started):
            raise AuthenticationError("no handshake message is expected now")
        if len(message) < 2 or message[0] != self._expect:
            got = message[0] if message else "nothing"
            raise AuthenticationError(f"expected handshake message {self._expect.name}, got {got}")
        handler = {_Msg.HELLO: self._on_hello, _Msg.SERVER_AUTH: self._on_server_auth,
                   _Msg.CLIENT_AUTH: self._on_client_auth}[self._expect]
        self._expect = None  # a failure below leaves the handshake dead
        return handler(message)

    # --- steps ---------------------------------------------------------------------------

    def _proof(self, prover: Side) -> bytes:
        message = LABEL + prover.value + self._bound + self._transcript
        return hmac.new(self._auth_key, message, hashlib.sha256).digest()

    def _on_hello(self, hello: bytes) -> bytes:
        self._started = True
        if hello[1] != VERSION:
            raise AuthenticationError(f"HELLO: link-auth version {hello[1]}, this side speaks {VERSION}")
        r = _Reader(hello[2:], "HELLO")
        context, identity, nonce = r.take("context"), r.take("identity"), r.take("nonce")
        r.end()
        if not hmac.compare_digest(context, self.context):
            raise AuthenticationError(f"HELLO: link context {context!r}, expected {self.context!r}")
        if len(nonce) != NONCE_BYTES:
            raise AuthenticationError(f"HELLO: nonce of {len(nonce)} bytes")
        self._peer = _identity(identity, "HELLO")
        self._peer_nonce = nonce
        reply_head = bytes([_Msg.SERVER_AUTH]) + _field(str(self.identity).encode()) + _field(self._nonce)
        self._transcript = _field(hello) + _field(reply_head)
        self._expect = _Msg.CLIENT_AUTH
        return reply_head + _field(self._proof(Side.SERVER))

    def _on_server_auth(self, message: bytes) -> bytes:
        r = _Reader(message[1:], "SERVER_AUTH")
        identity, nonce = r.take("identity"), r.take("nonce")
        head_end = r.pos + 1
        proof = r.take("proof")
        r.end()
        if len(nonce) != NONCE_BYTES:
            raise AuthenticationError(f"SERVER_AUTH: nonce of {len(nonce)} bytes")
        self._transcript += _field(message[:head_end])
        if not hmac.compare_digest(proof, self._proof(Side.SERVER)):
            raise AuthenticationError("SERVER_AUTH: the server's proof is wrong (another cluster "
                                      "secret, link context or TLS session, or a replayed message)")
        self._peer = _identity(identity, "SERVER_AUTH")
        self._peer_nonce = nonce
        self._finish()
        return bytes([_Msg.CLIENT_AUTH]) + _field(self._proof(Side.CLIENT))

    def _on_client_auth(self, message: bytes) -> None:
        r = _Reader(message[1:], "CLIENT_AUTH")
        proof = r.take("proof")
        r.end()
        if not hmac.compare_digest(proof, self._proof(Side.CLIENT)):
            raise AuthenticationError("CLIENT_AUTH: the client's proof is wrong (another cluster "
                                      "secret, link context or TLS session, or a replayed message)")
        self._finish()

    def _finish(self) -> None:
        client_nonce, server_nonce = ((self._nonce, self._peer_nonce) if self.side is Side.CLIENT
                                      else (self._peer_nonce, self._nonce))
        salt = client_nonce + server_nonce
        digest = hashlib.sha256(self._transcript).digest()
        c2s = _hkdf(self._secret, salt, LABEL + b" c2s " + digest)
        s2c = _hkdf(self._secret, salt, LABEL + b" s2c " + digest)
        send, recv = (c2s, s2c) if self.side is Side.CLIENT else (s2c, c2s)
        send_dir, recv_dir = (b"C", b"S") if self.side is Side.CLIENT else (b"S", b"C")
        assert self._peer is not None
        self._session = LinkSession(self._peer, FrameSealer(send, send_dir), FrameOpener(recv, recv_dir))
        self._secret = b""
