"""The MAC on every frame of an authenticated HA link (:class:`FrameMac`, :class:`FrameUnsealer`).

Once :mod:`rmqha.ha.auth` has authenticated a link, every frame of the ``framed``
dialect travels as ``frame || tag`` in both directions: the 16-byte tag of
:class:`rmqha.security.link_auth.LinkSession` (HMAC-SHA256 under the link's per-direction
key, over the direction, a sequence number each side counts and never sends, and the
frame's *MAC input*).  So a frame injected, altered, dropped, replayed or reordered fails
its tag, and the side that reads it closes the link before anything of the frame is used.

The MAC input of a frame is the frame itself, except for TRANSFER_DATA, where it is the
48-byte header followed by a GMAC of the block's data::

    mac_input(frame) = frame                                        (types 1-5, 7)
    mac_input(frame) = frame[:48] || GMAC(k_dir, n, frame[48:])     (TRANSFER_DATA, 6)

GMAC is AES-256-GCM with no plaintext and the data as associated data (its 16-byte tag);
``k_dir`` is the link's key for the direction (:func:`rmqha.ha.auth.block_keys`: fresh per
link, derived from the cluster secret and the handshake), ``n`` is 4 zero bytes and the
8-byte count of TRANSFER_DATA frames sent before in that direction, so no nonce repeats
under a key.  A changed block changes its GMAC (forging one without the key is hopeless),
hence the MAC input, hence fails the tag.  Each side takes the GMAC where the block lies:
the master from its mmap views (or through one for a ``sendfile`` range), the slave from
its receive buffer or from the commitlog mapping a large block was received into.

Why GMAC: it is what costs least per byte here.  Measured on the 2-core EPYC these
benchmarks run on, per 256 KiB in cache: GMAC 0.012 ms (AES-NI and carry-less multiply
through OpenSSL; about 0.04 ms over pages just received), SHA-256 0.145 ms (SHA-NI),
BLAKE2b (keyed or not) 0.28 ms, HMAC-SHA256 about as SHA-256.  A SHA-256 of every block on
both sides cut loopback catch-up (benches/bench_replication.py) from 1264 to 799 MB/s.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rmqha.errors import ProtocolError
from rmqha.ha import frames as fr
from rmqha.security.identity import Identity
from rmqha.security.link_auth import TAG_BYTES, LinkSession

#: Bytes of the tag after every frame.
TAG = TAG_BYTES
_DATA = int(fr.FrameType.TRANSFER_DATA)
_HEADER = fr.TRANSFER_HEADER_SIZE
_PEEK = struct.Struct(">ii")  # a framed frame's length and type
_NONCE = struct.Struct(">4xQ")  # a GMAC's nonce: 4 zero bytes, the block count


@dataclass(frozen=True)
class LaneMacState:
    """The keys and counters of one authenticated link, for the compiled slave lane
    (``SlaveLane.set_mac`` takes them in this order)."""

    in_key: bytes
    in_direction: bytes
    in_seq: int
    out_key: bytes
    out_direction: bytes
    out_seq: int
    block_key: bytes
    block_count: int


class BlockDigest:
    """The GMACs of one direction's blocks, in order (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        #: The key and the count of blocks digested: the compiled slave lane continues them.
        self.key = key
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def skip(self, blocks: int) -> None:
        """``blocks`` digests were taken elsewhere (the compiled slave lane), in order."""
        self._count += blocks

    def gmac(self, data: Any) -> bytes:
        """The GMAC of the next TRANSFER_DATA frame's data (its MAC input is the header,
        then this)."""
        nonce = _NONCE.pack(self._count)
        self._count += 1
        return self._aead.encrypt(nonce, b"", data)


class FrameMac:
    """Tags frames going out and checks frames coming in, for one authenticated link:
    ``session`` from the handshake, and the block keys of what this side sends and
    receives."""

    def __init__(self, session: LinkSession, send_key: bytes, receive_key: bytes) -> None:
        self._sealer = session.sealer
        self._opener = session.opener
        self._sent_blocks = BlockDigest(send_key)
        self._received_blocks = BlockDigest(receive_key)
        #: Who the peer proved to be.
        self.peer: Identity = session.peer

    # --- the compiled slave lane ------------------------------------------------------------

    def lane_state(self) -> LaneMacState | None:
        """What the compiled slave lane needs to check received blocks and tag its acks, in
        the state this MAC is in now (None after a failed frame: every later one fails)."""
        opener, sealer = self._opener, self._sealer
        if opener.failed:
            return None
        return LaneMacState(opener.key, opener.direction, opener.seq, sealer.key, sealer.direction, sealer.seq,
                            self._received_blocks.key, self._received_blocks.count)

    @property
    def failed(self) -> bool:
        """Whether a received frame failed its tag (every later one fails too)."""
        return self._opener.failed

    def lane_advance(self, frames_in: int, blocks_in: int, frames_out: int) -> None:
        """The lane checked ``frames_in`` frames (``blocks_in`` block digests) and tagged
        ``frames_out`` acks: continue after them."""
        self._opener.seq += frames_in
        self._received_blocks.skip(blocks_in)
        self._sealer.seq += frames_out

    # --- out -------------------------------------------------------------------------------

    def seal(self, frame: bytes) -> bytes:
        """``frame || tag`` for a frame that is not TRANSFER_DATA (see :meth:`block_tag`)."""
        return frame + self._sealer.tag(frame)

    def block_tag(self, header: Any, data: Any) -> bytes:
        """The tag to send after a TRANSFER_DATA frame: ``header`` then ``data`` (empty for
        a heartbeat).  Tags are numbered: send each one, in the order they were made."""
        return self._sealer.tag(header, self._sent_blocks.gmac(data))

    # --- in --------------------------------------------------------------------------------

    def check(self, frame: Any, tag: Any) -> None:
        """AuthenticationError unless ``tag`` is the next tag of the whole frame ``frame``."""
        if len(frame) >= _HEADER and _PEEK.unpack_from(frame, 0)[1] == _DATA:
            view = memoryview(frame)
            self.check_block(view[:_HEADER], view[_HEADER:], tag)
        else:
            self._opener.verify(frame, tag)

    def check_block(self, header: Any, data: Any, tag: Any) -> None:
        """:meth:`check` for a TRANSFER_DATA frame whose data lies elsewhere."""
        self._opener.verify(header, tag, self._received_blocks.gmac(data))

    def check_frames(self, buf: Any, count: int, size: int) -> None:
        """:meth:`check` for ``count`` frames of ``size`` bytes (not TRANSFER_DATA) back to
        back in ``buf``, each followed by its tag, in order."""
        verify = self._opener.verify
        view = memoryview(buf)
        step = size + TAG
        for pos in range(0, count * step, step):
            verify(view[pos : pos + size], view[pos + size : pos + step])

    def check_run(self, view: memoryview, spans: Any) -> None:
        """:meth:`check_block` for each frame of a run in a receive buffer, in order
        (``frames.scan_transfer_run``'s spans: data position and size, then a confirm
        offset; the header lies before the data, the tag after it)."""
        verify = self._opener.verify
        gmac = self._received_blocks.gmac
        for i in range(0, len(spans), 3):
            body = spans[i]
            end = body + spans[i + 1]
            verify(view[body - _HEADER : body], view[end : end + TAG], gmac(view[body:end]))


class FrameUnsealer:
    """Cuts a byte stream of ``frame || tag`` into frames whose tags checked, in order.

    For the decoding paths (the handshake, the master's acks); the slave's transfer path
    checks tags in its own receive buffer.  A length outside ``24..max_frame_bytes`` is a
    ProtocolError before anything is buffered for it, a bad tag an AuthenticationError.
    """

    def __init__(self, mac: FrameMac, max_frame_bytes: int) -> None:
        self._mac = mac
        self._max = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def take_buffered(self) -> bytes:
        """The bytes of an incomplete frame held here, handed over (for another reader)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf
        buf += chunk
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 4:
            (length,) = struct.unpack_from(">i", buf, pos)
            if length < fr.HEADER_SIZE or length > self._max:
                raise ProtocolError(f"frame length {length} is outside {fr.HEADER_SIZE}..{self._max} "
                                    "(max_frame_bytes)")
            end = pos + length + TAG
            if len(buf) < end:
                break
            frame = bytes(buf[pos : pos + length])
            self._mac.check(frame, buf[pos + length : end])
            out.append(frame)
            pos = end
        del buf[:pos]
        return out
