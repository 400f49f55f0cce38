"""HA wire frames (rmqha._core twins): both dialects, both directions, both twins."""
from __future__ import annotations

import copy
import struct
from array import array

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqha.ha import frames as public
from rmqha._core import load_twin
from rmqha.errors import ProtocolError
from rmqha.ha.frames import (
    ConfirmTruncate,
    Direction,
    HandshakeMaster,
    HandshakeSlave,
    QueryEpoch,
    ReturnEpoch,
    RmqMasterHandshake,
    RmqMasterTransfer,
    RmqSlaveAck,
    RmqSlaveHandshake,
    TransferAck,
    TransferData,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
M2S = Direction.MASTER_TO_SLAVE
S2M = Direction.SLAVE_TO_MASTER

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
off = st.integers(0, 2**63 - 1)
small_off = st.integers(0, 1 << 40)
env = {"timestamp_ms": i64, "epoch": i64}
data = st.binary(max_size=300)

framed_frames = st.one_of(
    st.builds(HandshakeSlave, broker_id=i64, segment_bytes=off, address=st.text(max_size=40),
              sync_from_last_file=st.booleans(), async_learner=st.booleans(), **env),
    st.builds(HandshakeMaster, check_result=i32, master_max_offset=off, master_last_epoch=i32, **env),
    st.builds(QueryEpoch, **env),
    st.builds(ReturnEpoch, entries=st.lists(st.tuples(i32, off, off), max_size=8).map(tuple), **env),
    st.builds(ConfirmTruncate, offset=off, **env),
    st.builds(TransferData, block_start_offset=off, epoch_start_offset=off, confirm_offset=off, data=data, **env),
    st.builds(TransferAck, slave_max_offset=off, **env),
)
rmq_m2s = st.one_of(
    st.builds(RmqMasterHandshake, max_offset=off, last_epoch=i32,
              entries=st.lists(st.tuples(i32, off), max_size=8).map(tuple)),
    st.builds(RmqMasterTransfer, offset=off, epoch=i32, epoch_start_offset=off, confirm_offset=off,
              data=data),
)
rmq_s2m = st.one_of(
    st.builds(RmqSlaveHandshake, broker_id=i64, sync_from_last_file=st.booleans(), async_learner=st.booleans()),
    st.builds(RmqSlaveAck, max_offset=off),
)


def wire(codec, frame) -> bytes:
    """Everything sent for a frame: header (+ data for data frames)."""
    return b"".join(bytes(p) for p in codec.encode_parts(frame))


def values(frame) -> tuple:
    """Type name and field values of a frame of either twin (memoryviews as bytes), so twins'
    outputs are compared field by field and not only through ``__eq__``."""
    t = type(frame)
    vals = tuple(getattr(frame, name) for name in t.__match_args__)
    return (t.__name__,) + tuple(bytes(v) if isinstance(v, memoryview) else v for v in vals)


def codecs(twin: str):
    return public.codec("framed", twin), public.codec("rocketmq", twin)


def direction_of(frame) -> Direction:
    if isinstance(frame, (HandshakeSlave, QueryEpoch, ConfirmTruncate, TransferAck, RmqSlaveHandshake, RmqSlaveAck)):
        return S2M
    return M2S


# --- round trips -------------------------------------------------------------------------------


@FAST
@given(frame=framed_frames)
def test_framed_round_trip_and_twins_agree(twin: str, frame) -> None:
    fr, _ = codecs(twin)
    ref, _ = codecs("python")
    raw = wire(fr, frame)
    assert raw == wire(ref, frame)
    assert fr.decode(raw) == frame
    assert fr.decode(raw, direction_of(frame)) == frame
    assert struct.unpack_from(">i", raw)[0] == len(raw)


@FAST
@given(frame=st.one_of(rmq_m2s, rmq_s2m))
def test_rocketmq_round_trip_and_twins_agree(twin: str, frame) -> None:
    _, rq = codecs(twin)
    _, ref = codecs("python")
    raw = wire(rq, frame)
    assert raw == wire(ref, frame)
    assert rq.decode(raw, direction_of(frame)) == frame


def test_rocketmq_layouts_are_byte_exact(twin: str) -> None:
    _, rq = codecs(twin)
    assert rq.encode(RmqSlaveHandshake(7, True, False)) == struct.pack(">ihhq", 1, 1, 0, 7)
    assert rq.encode(RmqSlaveAck(1234)) == struct.pack(">iq", 2, 1234)
    assert rq.encode(RmqMasterHandshake(900, 3, ((1, 0), (3, 500)))) == (
        struct.pack(">iiqi", 1, 24, 900, 3) + struct.pack(">iq", 1, 0) + struct.pack(">iq", 3, 500)
    )
    body = b"x" * 10
    hdr = rq.encode(RmqMasterTransfer(100, 3, 50, 90, body))
    assert hdr == struct.pack(">iiqiqq", 2, 10, 100, 3, 50, 90) and len(hdr) == 36
    # An empty master's heartbeat carries -1 offsets (RocketMQ), which must decode.
    hb = rq.encode(RmqMasterTransfer(-1, 0, -1, -1, b""))
    assert rq.decode(hb, M2S) == RmqMasterTransfer(-1, 0, -1, -1, b"")


def test_framed_layouts_are_byte_exact(twin: str) -> None:
    fr, _ = codecs(twin)
    hs = HandshakeSlave(5, 1 << 30, "127.0.0.1:10912", True, True, 11, 2)
    addr = b"127.0.0.1:10912"
    assert fr.encode(hs) == struct.pack(">iiqq", 48 + len(addr), 1, 11, 2) + struct.pack(
        ">iqqi", 3, 5, 1 << 30, len(addr)) + addr
    td = TransferData(4096, 1024, 2048, b"abc", 99, 7)
    assert fr.encode(td) == struct.pack(">iiqqqqq", 51, 6, 99, 7, 4096, 1024, 2048)
    assert fr.encode_parts(td)[1] == b"abc"
    assert fr.encode(ReturnEpoch(((1, 0, 10),))) == struct.pack(">iiqq", 48, 4, 0, 0) + struct.pack(">iiqq", 1, 1, 0, 10)


def test_data_is_not_copied(twin: str) -> None:
    fr, rq = codecs(twin)
    block = bytes(range(256)) * 4
    view = memoryview(block)[100:900]
    frame = TransferData(100, 0, 0, view)
    header = fr.encode(frame)
    assert len(header) == 48 and fr.encode_parts(frame)[1] is view
    raw = header + bytes(view)
    got = fr.decode(raw)
    assert isinstance(got.data, memoryview) and got.data.obj is raw
    dec = fr.decoder(M2S)
    (got,) = dec.feed(raw)
    assert got.data.obj is raw and got.data == bytes(view)
    # A mutable receive buffer may be reused by the caller, so its data is copied.
    buf = bytearray(raw)
    (got,) = fr.decoder(M2S).feed(buf)
    buf[60] ^= 0xFF
    assert got.data == bytes(view)


# --- the TransferData type of each twin ----------------------------------------------------------


def test_public_transfer_data_is_the_decoders_type() -> None:
    # The HA layer dispatches on ``type(frame) is frames.TransferData``.
    raw = public.pack_transfer_header(10, 0, 5, 3, 2) + b"abc"
    (got,) = public.FramedDecoder(M2S).feed(raw)
    assert type(got) is public.TransferData
    assert type(public.framed.decode(raw)) is public.TransferData


def test_transfer_data_type_behaves_as_the_dataclass(twin: str) -> None:
    cls = load_twin("frames", twin).TransferData
    ref = load_twin("frames", "python").TransferData  # the dataclass
    args = (4096, 1024, 2048, b"abc", 99, 7)
    a, d = cls(*args), ref(*args)
    assert cls.__match_args__ == ref.__match_args__
    assert values(a) == values(d) == ("TransferData",) + args
    assert repr(a) == repr(d)
    assert a == d and d == a and not (a != d) and not (d != a)
    assert cls(block_start_offset=4096, epoch_start_offset=1024, confirm_offset=2048) == ref(4096, 1024, 2048)
    for i in range(len(args)):  # every field takes part in equality
        other = list(args)
        other[i] = b"abd" if i == 3 else other[i] + 1
        assert a != ref(*other) and ref(*other) != a and a != cls(*other)
    assert a != (4096, 1024, 2048, b"abc", 99, 7)
    with pytest.raises(TypeError):
        hash(a)
    with pytest.raises(AttributeError):
        a.extra = 1  # type: ignore[attr-defined]
    match a:
        case cls(block, estart, confirm, data, ts, epoch):
            assert (block, estart, confirm, data, ts, epoch) == args
        case _:
            pytest.fail("TransferData did not match its positional pattern")
    a.epoch, a.data = 8, b"xyz"
    assert values(a) == ("TransferData", 4096, 1024, 2048, b"xyz", 99, 8)
    assert copy.copy(a) == a and copy.copy(a) is not a
    # Either twin encodes either type, to the same bytes.
    header = struct.pack(">iiqqqqq", 51, 6, 99, 7, 4096, 1024, 2048)
    for mod in {load_twin("frames", twin), load_twin("frames", "python")}:
        assert mod.encode_framed(cls(*args)) == mod.encode_framed(ref(*args)) == header


def test_decoded_transfer_data_fields(twin: str) -> None:
    mod = load_twin("frames", twin)
    body = bytes(range(200))
    raw = mod.pack_transfer_header(1 << 40, 1 << 33, (1 << 40) - 1, len(body), 12, 1700000000000) + body
    for chunks in ([raw], [raw[:30], raw[30:]], [raw[:100], raw[100:]]):
        for mutable in (False, True):
            dec = mod.FramedDecoder(M2S)
            got = []
            for c in chunks:
                got += dec.feed(bytearray(c) if mutable else c)
            (f,) = got
            assert type(f) is mod.TransferData
            assert values(f) == ("TransferData", 1 << 40, 1 << 33, (1 << 40) - 1, body, 1700000000000, 12)
            assert f.data is f.data  # made once
            assert values(f) == values(load_twin("frames", "python").decode_framed(raw))
            if not mutable and len(chunks) == 1:
                assert isinstance(f.data, memoryview) and f.data.obj is raw
    # Assigning a field keeps the others.
    (f,) = mod.FramedDecoder(M2S).feed(raw)
    f.confirm_offset = 5
    assert values(f)[1:4] == (1 << 40, 1 << 33, 5) and f.epoch == 12 and bytes(f.data) == body


# --- incremental decoding ----------------------------------------------------------------------


def _stream(twin: str):
    fr, rq = codecs(twin)
    f_m2s = [HandshakeMaster(0, 900, 3, 1, 3), ReturnEpoch(((1, 0, 500), (3, 500, 900)), 2, 3),
             TransferData(500, 500, 400, b"A" * 37, 3, 3), TransferData(537, 500, 537, b"", 4, 3),
             TransferData(537, 500, 537, bytes(range(200)), 5, 3)]
    f_s2m = [HandshakeSlave(2, 1 << 20, "h:1", False, True, 1, 0), QueryEpoch(2, 0), ConfirmTruncate(500, 3, 0),
             TransferAck(537, 4, 3), TransferAck(737, 5, 3)]
    r_m2s = [RmqMasterHandshake(900, 3, ((1, 0), (3, 500))), RmqMasterTransfer(500, 3, 500, 400, b"B" * 33),
             RmqMasterTransfer(533, 3, 500, 533, b"")]
    r_s2m = [RmqSlaveHandshake(2, False, True), RmqSlaveAck(533), RmqSlaveAck(600)]
    return [
        (lambda: fr.decoder(M2S), f_m2s, b"".join(wire(fr, f) for f in f_m2s)),
        (lambda: fr.decoder(S2M), f_s2m, b"".join(wire(fr, f) for f in f_s2m)),
        (lambda: fr.decoder(None), f_m2s + f_s2m, b"".join(wire(fr, f) for f in f_m2s + f_s2m)),
        (lambda: rq.decoder(M2S), r_m2s, b"".join(wire(rq, f) for f in r_m2s)),
        (lambda: rq.decoder(S2M), r_s2m, b"".join(wire(rq, f) for f in r_s2m)),
    ]


def test_split_at_every_byte_boundary(twin: str) -> None:
    for make, expected, stream in _stream(twin):
        for cut in range(len(stream) + 1):
            dec = make()
            got = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
            assert got == expected, cut
            assert [values(f) for f in got] == [values(f) for f in expected], cut
            assert dec.buffered == 0 and dec.stream_offset == len(stream)
        dec = make()
        got = []
        for i in range(len(stream)):
            got += dec.feed(stream[i : i + 1])
        assert got == expected


@FAST
@given(cuts=st.lists(st.integers(0, 2000), max_size=8), mutable=st.booleans())
def test_random_chunking(twin: str, cuts, mutable) -> None:
    for make, expected, stream in _stream(twin):
        points = sorted({c % (len(stream) + 1) for c in cuts})
        dec = make()
        got, prev = [], 0
        for p in points + [len(stream)]:
            chunk = stream[prev:p]
            got += dec.feed(bytearray(chunk) if mutable else chunk)
            prev = p
        assert got == expected
        assert [values(f) for f in got] == [values(f) for f in expected]


# --- bad frames --------------------------------------------------------------------------------


def _hdr(length: int, ftype: int) -> bytes:
    return struct.pack(">iiqq", length, ftype, 0, 0)


@pytest.mark.parametrize(
    ("raw", "direction", "message"),
    [
        (_hdr(10, 3), None, "below the 24-byte header"),
        (_hdr(1 << 30, 6), None, "exceeds max_frame_bytes"),
        (_hdr(24, 9), None, "unknown frame type 9"),
        (_hdr(24, 0), None, "unknown frame type 0"),
        (_hdr(24, 3), M2S, "not sent in this direction"),
        (_hdr(32, 6) + b"\0" * 8, None, "shorter than its 24 bytes"),
        (_hdr(28, 7) + b"\0" * 4, None, "expected 8"),
        (_hdr(32, 7) + struct.pack(">q", -5), None, "negative offset"),
        (_hdr(32, 5) + struct.pack(">q", -1), None, "negative offset"),
        (_hdr(48, 6) + struct.pack(">qqq", 0, -1, 0), None, "negative offset"),
        (_hdr(48 + 3, 1) + struct.pack(">iqqi", 0, 1, 1, 9) + b"abc", None, "address length 9"),
        (_hdr(48, 1) + struct.pack(">iqqi", 4, 1, 1, 0), None, "unknown flag bits"),
        (_hdr(48 + 2, 1) + struct.pack(">iqqi", 0, 1, 1, 2) + b"\xff\xfe", None, "not UTF-8"),
        (_hdr(28, 4) + struct.pack(">i", 3), None, "count 3 does not fit"),
        (_hdr(28, 4) + struct.pack(">i", -1), None, "count -1"),
        (_hdr(48, 4) + struct.pack(">i", 1) + struct.pack(">iqq", 1, -3, 5), None, "negative offset"),
        (_hdr(25, 3) + b"\0", None, "expected 0"),
        (_hdr(36, 2) + b"\0" * 12, None, "expected 16"),
    ],
)
def test_bad_framed_frames(twin: str, raw: bytes, direction, message: str) -> None:
    fr, _ = codecs(twin)
    with pytest.raises(ProtocolError, match=message) as info:
        fr.decode(raw, direction, max_frame_bytes=1 << 20)
    with pytest.raises(ProtocolError) as ref:
        codecs("python")[0].decode(raw, direction, max_frame_bytes=1 << 20)
    assert str(info.value) == str(ref.value)  # the twins say the same thing
    dec = fr.decoder(direction, max_frame_bytes=1 << 20)
    good = wire(fr, TransferAck(5)) if direction in (None, Direction.SLAVE_TO_MASTER) else wire(fr, TransferData(0, 0, 0, b""))
    with pytest.raises(ProtocolError, match=rf"stream offset {len(good)}: .*{message}"):
        dec.feed(good + raw + b"\0" * min(64, max(0, struct.unpack(">i", raw[:4])[0] - len(raw))))
    with pytest.raises(ProtocolError, match="earlier error"):
        dec.feed(good)


@pytest.mark.parametrize(
    ("raw", "direction", "message"),
    [
        (struct.pack(">iq", 3, 5), S2M, "slave state 3"),
        (struct.pack(">ihhq", 1, 2, 0, 1), S2M, "not 0/1"),
        (struct.pack(">iq", 2, -4), S2M, "negative max_offset"),
        (struct.pack(">iiqi", 0, 0, 0, 0), M2S, "master state 0"),
        (struct.pack(">iiqi", 1, 13, 0, 0) + b"\0" * 13, M2S, "not a multiple of 12"),
        (struct.pack(">iiqi", 1, -12, 0, 0), M2S, "body size -12"),
        (struct.pack(">iiqi", 1, 1 << 30, 0, 0), M2S, "body size"),
        (struct.pack(">iiqi", 1, 12, 0, 0) + struct.pack(">iq", 1, -2), M2S, "negative start"),
        (struct.pack(">iiqiqq", 2, 1, -1, 0, 0, 0) + b"x", M2S, "negative offset"),
        (struct.pack(">iiqiqq", 2, 0, 0, 0, 0, -2), M2S, "negative offset"),
    ],
)
def test_bad_rocketmq_messages(twin: str, raw: bytes, direction, message: str) -> None:
    _, rq = codecs(twin)
    with pytest.raises(ProtocolError, match=message) as info:
        rq.decode(raw, direction, max_frame_bytes=1 << 20)
    with pytest.raises(ProtocolError) as ref:
        codecs("python")[1].decode(raw, direction, max_frame_bytes=1 << 20)
    assert str(info.value) == str(ref.value)
    with pytest.raises(ProtocolError, match=message):
        rq.decoder(direction, max_frame_bytes=1 << 20).feed(raw)


def test_decode_needs_exactly_one_frame(twin: str) -> None:
    fr, rq = codecs(twin)
    raw = wire(fr, TransferAck(9))
    with pytest.raises(ProtocolError, match="does not match"):
        fr.decode(raw + b"\0")
    with pytest.raises(ProtocolError, match="shorter than"):
        fr.decode(raw[:10])
    ack = wire(rq, RmqSlaveAck(3))
    with pytest.raises(ProtocolError):
        rq.decode(ack + b"\0", S2M)
    with pytest.raises(ProtocolError):
        rq.decode(ack[:5], S2M)


def test_never_buffers_beyond_the_bound(twin: str) -> None:
    fr, rq = codecs(twin)
    dec = fr.decoder(M2S, max_frame_bytes=4096)
    # A length above the bound is refused as soon as the 8 bytes that carry it arrive.
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes 4096"):
        dec.feed(struct.pack(">ii", 0x7FFFFFFF, 6))
    # A valid large length is not preallocated: only the bytes received are held.
    dec = fr.decoder(M2S, max_frame_bytes=1 << 20)
    assert dec.feed(_hdr(1 << 20, 6)[:30]) == [] and dec.buffered == 24
    dec = rq.decoder(M2S, max_frame_bytes=4096)
    with pytest.raises(ProtocolError, match="max_frame_bytes 4096"):
        dec.feed(struct.pack(">ii", 2, 5000))


def test_detect_dialect(twin: str) -> None:
    frames = load_twin("frames", twin)
    fr, rq = codecs(twin)
    assert public.detect_dialect(wire(fr, HandshakeSlave(1, 1, "a"))[:4]) is public.Dialect.FRAMED
    assert frames.detect_dialect(wire(rq, RmqSlaveHandshake(1))[:4]) == "rocketmq"
    for bad in (b"\0\0\0\0", b"\0\0\0\x02", b"\xff\xff\xff\xff", b"\0\0"):
        with pytest.raises(ProtocolError):
            frames.detect_dialect(bad)


def test_encode_refuses_bad_values(twin: str) -> None:
    fr, rq = codecs(twin)
    for frame in (TransferAck(-1), ConfirmTruncate(-2), TransferData(-1, 0, 0, b""),
                  HandshakeMaster(0, -1, 0), TransferData(0, 0, 0, b"", epoch=1 << 64)):
        with pytest.raises(ProtocolError):
            fr.encode(frame)
    for frame in (RmqSlaveAck(-1), RmqMasterTransfer(-1, 0, 0, 0, b"x"), RmqMasterHandshake(0, 1 << 40)):
        with pytest.raises(ProtocolError):
            rq.encode(frame)


# --- batch helpers -----------------------------------------------------------------------------


@FAST
@given(rows=st.lists(st.tuples(small_off, small_off, small_off, st.integers(0, 1 << 20), i64, i64), max_size=40))
def test_batch_headers_match_single_calls(twin: str, rows) -> None:
    mod = load_twin("frames", twin)
    ref = load_twin("frames", "python")
    cols = [array("q", [r[k] for r in rows]) for k in range(6)]
    packed = mod.pack_transfer_headers(*cols)
    assert packed == b"".join(mod.pack_transfer_header(*r) for r in rows)
    assert packed == ref.pack_transfer_headers(*cols)
    out = mod.unpack_transfer_headers(packed)
    assert [list(c) for c in out] == [list(c) for c in cols]
    for i, r in enumerate(rows):
        assert mod.unpack_transfer_header(packed, i * 48) == r


def test_batch_accepts_numpy_and_reports_bad_rows(twin: str) -> None:
    mod = load_twin("frames", twin)
    n = 50
    cols = [np.arange(n, dtype=np.int64) * 100, np.zeros(n, np.int64), np.zeros(n, np.int64),
            np.full(n, 100, np.int64), np.full(n, 2, np.int64), np.zeros(n, np.int64)]
    packed = mod.pack_transfer_headers(*cols)
    assert len(packed) == 48 * n
    cols[1][17] = -1
    with pytest.raises(ProtocolError, match="header 17"):
        mod.pack_transfer_headers(*cols)
    with pytest.raises(ValueError):
        mod.pack_transfer_headers(cols[0], cols[1][:3], *cols[2:])
    bad = bytearray(packed)
    bad[48 * 9 + 7] = 5  # type of header 9
    with pytest.raises(ProtocolError, match="header 9"):
        mod.unpack_transfer_headers(bytes(bad))
    with pytest.raises(ProtocolError, match="multiple"):
        mod.unpack_transfer_headers(packed[:-1])


@FAST
@given(rows=st.lists(st.tuples(small_off, i32, small_off, small_off, st.integers(0, 1 << 20)), max_size=40))
def test_rocketmq_batch_headers_match_single_calls(twin: str, rows) -> None:
    mod = load_twin("frames", twin)
    cols = [array("q", [r[k] for r in rows]) for k in range(5)]
    packed = mod.pack_rocketmq_transfer_headers(*cols)
    assert packed == b"".join(mod.pack_rocketmq_transfer_header(*r) for r in rows)
    assert packed == load_twin("frames", "python").pack_rocketmq_transfer_headers(*cols)
    if rows:
        cols[4][len(rows) - 1] = 5
        cols[0][len(rows) - 1] = -1
        with pytest.raises(ProtocolError, match=f"header {len(rows) - 1}"):
            mod.pack_rocketmq_transfer_headers(*cols)
