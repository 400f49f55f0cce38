"""The slave's receive run in one call (``scan_transfer_run``) and its ack (``pack_transfer_ack``),
both twins: the same results, and every frame the slave's checks would not simply append
(a torn frame, a wrong offset, another epoch, a heartbeat, a bad type or length) stops the
run exactly where today's general path takes over."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqha import _core
from rmqha._core import load_twin
from rmqha.errors import ProtocolError
from rmqha.ha.frames import TransferAck

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SEG = 1 << 20
TAG = 16
EPOCH, ESTART = 3, 100
TWINS = ["python"] if _core.NO_EXTENSIONS else list(_core.TWINS)


def _frame(block: int, size: int, *, epoch: int = EPOCH, estart: int = ESTART, confirm: int = 0,
           tag: int = TAG, fill: int = 0xAB) -> bytes:
    frames = load_twin("frames", "python")
    return frames.pack_transfer_header(block, estart, confirm, size, epoch, 7) + bytes([fill]) * size + b"\x5a" * tag


def _scan(twin: str, buf: bytes | bytearray, log_end: int = 1000, *, start: int = 0, end: int | None = None,
          tag: int = TAG, max_frame: int = 1 << 16) -> tuple[int, list[int], int, int]:
    frames = load_twin("frames", twin)
    stop, spans, consumed, need = frames.scan_transfer_run(buf, start, len(buf) if end is None else end, max_frame,
                                                          tag, log_end, EPOCH, ESTART, SEG)
    return stop, list(spans), consumed, need


def test_a_run_of_plain_blocks_is_taken_whole(twin: str) -> None:
    f = load_twin("frames", twin)
    buf = bytearray(_frame(1000, 10, confirm=900) + _frame(1010, 20, confirm=2000) + _frame(1030, 5, confirm=1020))
    stop, spans, consumed, need = _scan(twin, buf)
    one = 48 + 10 + TAG
    two = 48 + 20 + TAG
    # Data positions and sizes; the confirm learnt is the running max of min(confirm, block end).
    assert spans == [48, 10, 900, one + 48, 20, 1030, one + two + 48, 5, 1030]
    assert (stop, consumed, need) == (f.RUN_END, len(buf), 0)
    assert buf[spans[0] : spans[0] + 10] == b"\xab" * 10


def test_an_incomplete_frame_ends_the_run_and_says_what_it_needs(twin: str) -> None:
    f = load_twin("frames", twin)
    whole = _frame(1000, 10)
    torn = _frame(1010, 40)[:-3]
    stop, spans, consumed, need = _scan(twin, whole + torn)
    assert (stop, spans[:2], consumed, need) == (f.RUN_PARTIAL, [48, 10], len(whole), 48 + 40 + TAG)
    # Under 8 bytes of the next frame: nothing to know yet, the run simply ends.
    stop, spans, consumed, need = _scan(twin, whole + torn[:5])
    assert (stop, consumed, need) == (f.RUN_END, len(whole), 0)


@pytest.mark.parametrize("log_end,second", [
    pytest.param(1000, dict(block=1011, size=10), id="wrong-offset"),
    pytest.param(1000, dict(block=1010, size=10, epoch=EPOCH + 1), id="newer-epoch"),
    pytest.param(1000, dict(block=1010, size=10, epoch=EPOCH - 1), id="older-epoch"),
    pytest.param(1000, dict(block=1010, size=10, estart=ESTART + 1), id="other-epoch-start"),
    pytest.param(1000, dict(block=1010, size=0), id="heartbeat"),
    pytest.param(SEG - 20, dict(block=SEG - 10, size=20), id="crosses-segment-end"),
])
def test_a_frame_that_is_not_plain_leaves_the_whole_buffer_to_the_general_path(twin: str, log_end: int,
                                                                               second: dict) -> None:
    f = load_twin("frames", twin)
    second = dict(second)
    block, size = second.pop("block"), second.pop("size")
    buf = _frame(log_end, 10) + _frame(block, size, **second)
    assert _scan(twin, buf, log_end) == (f.RUN_OTHER, [], 0, 0)
    # Negative control: the same first frame alone is plain.
    assert _scan(twin, buf[: 48 + 10 + TAG], log_end)[0] == f.RUN_END


def test_an_epoch_that_starts_after_the_block_is_not_plain(twin: str) -> None:
    f = load_twin("frames", twin)
    late = f.pack_transfer_header(50, ESTART, 0, 10, EPOCH) + b"\0" * 10 + b"\x5a" * TAG
    assert f.scan_transfer_run(late, 0, len(late), 1 << 16, TAG, 50, EPOCH, ESTART, SEG)[0] == f.RUN_OTHER
    assert f.scan_transfer_run(late, 0, len(late), 1 << 16, TAG, 50, EPOCH, 50, SEG)[0] == f.RUN_OTHER
    ok = f.pack_transfer_header(50, 50, 0, 10, EPOCH) + b"\0" * 10 + b"\x5a" * TAG
    assert f.scan_transfer_run(ok, 0, len(ok), 1 << 16, TAG, 50, EPOCH, 50, SEG)[0] == f.RUN_END


@pytest.mark.parametrize("header", [
    pytest.param(struct.pack(">ii", 72, 7), id="not-transfer-data"),
    pytest.param(struct.pack(">ii", 40, 6), id="length-below-header"),
    pytest.param(struct.pack(">ii", (1 << 16) + 1, 6), id="length-above-max"),
])
def test_a_bad_type_or_length_stops_even_a_torn_frame(twin: str, header: bytes) -> None:
    f = load_twin("frames", twin)
    assert _scan(twin, _frame(1000, 10) + header)[0] == f.RUN_OTHER


def test_offsets_into_a_receive_buffer_and_bad_arguments(twin: str) -> None:
    f = load_twin("frames", twin)
    body = _frame(1000, 10) + _frame(1010, 10)
    buf = bytearray(b"\0" * 30 + body + b"\0" * 9)
    stop, spans, consumed, need = _scan(twin, buf, start=30, end=30 + len(body))
    assert (stop, spans[0], spans[3], consumed) == (f.RUN_END, 30 + 48, 30 + 74 + 48, len(body))
    with pytest.raises(ValueError):
        _scan(twin, buf, start=10, end=len(buf) + 1)
    with pytest.raises(ValueError):
        _scan(twin, buf, log_end=-1)
    with pytest.raises(ValueError):
        _scan(twin, buf, max_frame=10)


@FAST
@given(sizes=st.lists(st.integers(0, 300), min_size=0, max_size=6), cut=st.integers(0, 2000),
       tag=st.sampled_from([0, TAG]), skip=st.integers(0, 7))
def test_twins_agree(sizes: list[int], cut: int, tag: int, skip: int) -> None:
    """Random runs, some cut short, some with a heartbeat or a gap: both twins say the same."""
    buf = b""
    at = 1000
    for i, n in enumerate(sizes):
        block = at + (1 if i == skip else 0)
        buf += _frame(block, n, confirm=at + n // 2, tag=tag)
        at = block + n
    buf = buf[: max(len(buf) - cut, 0)] if cut < len(buf) else buf
    results = {repr(_scan(t, buf, tag=tag)) for t in TWINS}
    assert len(results) == 1


@pytest.mark.parametrize("offset,ts,epoch", [(0, 0, 0), (123456789, 1700000000000, 7), ((1 << 63) - 1, -1, -5)])
def test_the_ack_is_the_framed_encoders_bytes(twin: str, offset: int, ts: int, epoch: int) -> None:
    f = load_twin("frames", twin)
    want = load_twin("frames", "python").encode_framed(TransferAck(offset, ts, epoch))
    assert f.pack_transfer_ack(offset, ts, epoch) == want
    assert f.encode_framed(TransferAck(offset, ts, epoch)) == want
    with pytest.raises(ProtocolError):
        f.pack_transfer_ack(-1, ts, epoch)


def _ack(offset: int, epoch: int = EPOCH, tag: int = TAG) -> bytes:
    return load_twin("frames", "python").pack_transfer_ack(offset, 5, epoch) + b"\x5a" * tag


def test_a_read_of_sensible_acks_is_taken_in_one_call(twin: str) -> None:
    f = load_twin("frames", twin)
    assert f.scan_transfer_acks(_ack(10) + _ack(10) + _ack(30), TAG, 5, 30, EPOCH) == (3, 30)
    assert f.scan_transfer_acks(_ack(0, tag=0), 0, -1, 0, EPOCH) == (1, 0)


@pytest.mark.parametrize("chunk,why", [
    pytest.param(_ack(10) + _ack(9), "goes back", id="backwards"),
    pytest.param(_ack(4), "below the last ack", id="below-acked"),
    pytest.param(_ack(31), "beyond what was sent", id="beyond-sent"),
    pytest.param(_ack(10, epoch=EPOCH + 1), "newer epoch", id="newer-epoch"),
    pytest.param(_ack(10)[:-1], "torn", id="torn"),
    pytest.param(_ack(10) + _ack(11)[:7], "torn second", id="torn-second"),
    pytest.param(struct.pack(">iiqq", 32, 5, 0, 0) + struct.pack(">q", 10) + b"\x5a" * TAG, "another type",
                 id="confirm-truncate"),
    pytest.param(struct.pack(">iiqq", 40, 7, 0, 0) + struct.pack(">q", 10) + b"\x5a" * 8, "length", id="length-40"),
    pytest.param(struct.pack(">iiqq", 32, 7, 0, 0) + struct.pack(">q", -1) + b"\x5a" * TAG, "negative",
                 id="negative"),
    pytest.param(b"", "empty", id="empty"),
])
def test_anything_else_leaves_the_read_to_the_decoder(twin: str, chunk: bytes, why: str) -> None:
    f = load_twin("frames", twin)
    assert f.scan_transfer_acks(chunk, TAG, 5, 30, EPOCH) == (-1, 5), why
    with pytest.raises(ValueError):
        f.scan_transfer_acks(chunk, -1, 5, 30, EPOCH)
