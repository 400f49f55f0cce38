"""Who may open an HA link: the cluster-secret handshake in front of the HA hello.

With a cluster secret (:class:`HAAuth`), a slave proves to its master, and the master to
the slave, that it holds the secret and is a broker of the same cluster and group
(identity ``rmqha:broker/<cluster>/<group>/<name>``, :mod:`rmqha.security.identity`),
before the first byte of the HA protocol; on a plaintext link every frame after it
carries a MAC (:mod:`rmqha.ha.frame_mac`).  The handshake is :mod:`rmqha.security.link_auth`'s, with
context ``"ha"``, its three messages framed on the raw socket as::

    slave  -> master   PREFACE || u16 length || HELLO
    master -> slave               u16 length || SERVER_AUTH
    slave  -> master              u16 length || CLIENT_AUTH
    ... then the framed dialect, every frame followed by its 16-byte tag

The tags are those of the link_auth session; the GMAC keys of the blocks' data
(:mod:`rmqha.ha.frame_mac`) are, per direction, the two halves of
``HKDF-SHA256(cluster secret, salt = SHA-256(u16 len || HELLO || u16 len || SERVER_AUTH),
info = "rmqha ha block keys v1", 64 bytes)``: slave-to-master first.  The handshake's
messages carry both sides' fresh nonces, so every link has keys of its own, and only
holders of the secret can compute them.

``PREFACE`` (``80 72 48 41``) read as the first int32 of a connection is negative: neither
a framed length nor the rocketmq HANDSHAKE state, so a master of either kind tells an
authenticating slave from a plain hello by its first four bytes (a master without this
code closes on it as an unknown dialect).  Lengths are big-endian, 1..4096.

On a TLS link (:class:`rmqha.ha.tls_link.TlsLink`, both certificates verified) the
handshake runs inside the session and is bound to it (its ``tls-unique`` enters every
proof, :mod:`rmqha.security.link_auth`), and the frames then travel without tags: TLS
authenticates every byte of the stream, and the bound proofs tie the session to the
secret, so a stolen certificate key alone cannot relay a real broker's handshake and then
feed the stream.  Both ends know whether their link is TLS (the master's port and the
slave's dial are TLS together or not at all), so they agree on the tags without a word.

The master's rules (:func:`admit`), per connection, before its hello is read:

* PREFACE and a secret here: the handshake, then the slave's identity is checked;
* PREFACE and no secret here: refused (the slave expects an authenticated link);
* a plain hello and no secret here: served unauthenticated, as before secrets existed;
* a plain hello and a secret here: refused, except a rocketmq-dialect hello when
  ``ha_allow_unauthenticated_rocketmq_dialect`` is set (RocketMQ's own HA wire has no room
  for authentication; that link is then as open to an impostor as any link without a secret).

A refused or failed link gets no byte of the log and changes nothing: it never reaches the
link table, the acks or the SyncStateSet.  The slave's side is :func:`authenticate`: it
checks the master's identity before its own proof goes out.
"""
from __future__ import annotations

import hashlib
import logging
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rmqha.errors import AuthenticationError, ConfigError
from rmqha.ha import frames as fr
from rmqha.ha.frame_mac import FrameMac
from rmqha.ha.link import Link, LinkClosed
from rmqha.security.identity import Identity, Role, authorize
from rmqha.security.link_auth import Handshake
from rmqha.security.secret import ClusterSecret

log = logging.getLogger("rmqha.ha.master")

#: First four bytes of an authenticating slave (a negative int32: no dialect starts so).
PREFACE = b"\x80rHA"
#: The link_auth context of HA links (a transcript of another kind of link is no good here).
CONTEXT = "ha"
MAX_MESSAGE_BYTES = 4096
_LENGTH = struct.Struct(">H")


@dataclass(frozen=True)
class HAAuth:
    """What authenticates this broker's HA links: the cluster secret, this broker's
    identity (its cluster and group are what the peer must match), and whether a
    rocketmq-dialect link may run without authentication."""

    secret: ClusterSecret
    identity: Identity
    allow_unauthenticated_rocketmq: bool = False

    def __post_init__(self) -> None:
        if self.identity.role is not Role.BROKER:
            raise ConfigError(f"an HA link authenticates a broker, not {self.identity}")

    def check_group(self, group: str) -> None:
        """ConfigError unless this identity is of broker group ``group``."""
        if self.identity.group != group:
            raise ConfigError(f"HA identity {self.identity} is not of broker group {group!r}")

    def authorize(self, peer: Identity) -> Identity:
        """``peer`` if it is a broker of this cluster and group (PeerIdentityError if not)."""
        me = self.identity
        return authorize(peer, roles=(Role.BROKER,), cluster=me.cluster, group=me.group)


@dataclass(frozen=True)
class Proof:
    """What the handshake leaves a link with: who the peer proved to be, and the MAC of
    its frames (None on a TLS link: its frames travel bare, see the module docstring)."""

    peer: Identity
    mac: FrameMac | None


def _message(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


def block_keys(secret: ClusterSecret, hello: bytes, server_auth: bytes) -> tuple[bytes, bytes]:
    """The (slave-to-master, master-to-slave) GMAC keys of one link's blocks."""
    salt = hashlib.sha256(_message(hello) + _message(server_auth)).digest()
    okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt, info=b"rmqha ha block keys v1")
    keys = okm.derive(secret.reveal())
    return keys[:32], keys[32:]


async def _read_message(link: Link, timeout: float) -> bytes:
    (n,) = _LENGTH.unpack(await link.recv_exactly(_LENGTH.size, timeout))
    if not 0 < n <= MAX_MESSAGE_BYTES:
        raise AuthenticationError(f"authentication message of {n} bytes (1..{MAX_MESSAGE_BYTES} allowed)")
    return await link.recv_exactly(n, timeout)


# --- master --------------------------------------------------------------------------------------


async def admit(link: Link, auth: HAAuth | None, timeout: float) -> tuple[Proof | None, bytes]:
    """Decide about a new connection before its hello is read: its proof (None: the link
    runs unauthenticated) and the bytes read of the hello (b"" after a handshake).
    AuthenticationError (or ProtocolError for bytes of no dialect) when it is refused."""
    first = await link.recv_exactly(4, timeout)
    if first == PREFACE:
        if auth is None:
            raise AuthenticationError("the slave asks to authenticate, and this master has no cluster "
                                      "secret (set cluster_secret on every broker of the group)")
        return await _serve_handshake(link, auth, timeout), b""
    dialect = fr.detect_dialect(first)
    if auth is None:
        return None, first
    if dialect is fr.Dialect.ROCKETMQ and auth.allow_unauthenticated_rocketmq:
        log.info("HA link from %s speaks the rocketmq dialect: unauthenticated "
                 "(ha_allow_unauthenticated_rocketmq_dialect)", link.peer)
        return None, first
    hint = (" and ha_allow_unauthenticated_rocketmq_dialect is off" if dialect is fr.Dialect.ROCKETMQ
            else ": the slave has no cluster secret, or another version")
    raise AuthenticationError(f"unauthenticated {dialect.value}-dialect hello; this master requires the "
                              f"cluster secret{hint}")


def _proof(link: Link, auth: HAAuth, hs: Handshake, keys: tuple[bytes, bytes]) -> Proof:
    """The finished handshake's proof; ``keys``: this side's (send, receive) block keys."""
    session = hs.session()
    peer = auth.authorize(session.peer)
    return Proof(peer, None if link.tls else FrameMac(session, *keys))


async def _serve_handshake(link: Link, auth: HAAuth, timeout: float) -> Proof:
    hs = Handshake.server(auth.secret, auth.identity, context=CONTEXT, binding=link.channel_binding())
    hs.start()
    hello = await _read_message(link, timeout)
    reply = hs.receive(hello)
    assert reply is not None
    await link.send([_message(reply)], timeout)
    hs.receive(await _read_message(link, timeout))
    from_slave, to_slave = block_keys(auth.secret, hello, reply)
    return _proof(link, auth, hs, (to_slave, from_slave))


# --- slave ---------------------------------------------------------------------------------------


async def authenticate(link: Link, auth: HAAuth, timeout: float) -> Proof:
    """The slave's side: prove this broker to the master and check the master's identity
    (before this side's proof goes out).  AuthenticationError when either fails."""
    hs = Handshake.client(auth.secret, auth.identity, context=CONTEXT, binding=link.channel_binding())
    hello = hs.start()
    assert hello is not None
    await link.send([PREFACE + _message(hello)], timeout)
    try:
        answer = await _read_message(link, timeout)
    except (LinkClosed, ConnectionResetError):
        raise AuthenticationError(
            "the master closed the link during authentication: it has another cluster secret, "
            "none, or does not know this broker's cluster and group") from None
    own_proof = hs.receive(answer)
    assert own_proof is not None
    proof = _proof(link, auth, hs, block_keys(auth.secret, hello, answer))
    await link.send([_message(own_proof)], timeout)
    return proof
