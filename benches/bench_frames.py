"""HA frame codec benchmarks: compiled vs pure twin vs a plain ``struct`` baseline, one run.

Groups: TRANSFER_DATA header encode/decode one at a time and 10,000 per call, and the
incremental decoding of a 64 MiB stream of framed TRANSFER_DATA frames fed in 64 KiB
chunks (8 MiB with RMQHA_BENCH_QUICK=1), once only counting the frames and once reading
every field and the data of each (the compiled twin makes those on first read).  Speed is
reported, never asserted.
"""
from __future__ import annotations

import struct
from array import array

import pytest

from benches.conftest import QUICK, describe
from rmqha._core import load_twin

TWINS = ("cython", "python")
BATCH = 10_000
STREAM_BYTES = (8 if QUICK else 64) << 20
CHUNK = 64 << 10
BODY = 4096
_TD = struct.Struct(">iiqqqqq")


def _single(benchmark, fn, *args):
    # Same calibration for every implementation: many calls per round, so timer overhead
    # and pytest-benchmark's own call wrapper do not swamp a ~100 ns call.
    return benchmark.pedantic(fn, args=args, iterations=2000, rounds=200, warmup_rounds=5)


def _info(benchmark, implementation: str, *, message_bytes: int, batch: int) -> None:
    describe(benchmark, implementation, message_bytes=message_bytes, batch=batch, replicas=2)


# --- single header -----------------------------------------------------------------------------


@pytest.mark.benchmark(group="frames-transfer-header-encode-1")
@pytest.mark.parametrize("impl", TWINS + ("struct",))
def test_encode_header_single(benchmark, impl: str) -> None:
    _info(benchmark, impl, message_bytes=48, batch=1)
    if impl == "struct":
        _single(benchmark, _TD.pack, 48 + 4096, 6, 1700000000000, 7, 1 << 33, 1 << 32, 1 << 33)
        return
    pack = load_twin("frames", impl).pack_transfer_header
    _single(benchmark, pack, 1 << 33, 1 << 32, 1 << 33, 4096, 7, 1700000000000)


@pytest.mark.benchmark(group="frames-transfer-header-decode-1")
@pytest.mark.parametrize("impl", TWINS + ("struct",))
def test_decode_header_single(benchmark, impl: str) -> None:
    _info(benchmark, impl, message_bytes=48, batch=1)
    raw = _TD.pack(48 + 4096, 6, 1700000000000, 7, 1 << 33, 1 << 32, 1 << 33)
    if impl == "struct":
        _single(benchmark, _TD.unpack_from, raw, 0)
        return
    unpack = load_twin("frames", impl).unpack_transfer_header
    assert unpack(raw, 0)[3] == 4096
    _single(benchmark, unpack, raw, 0)


# --- 10,000 headers per call -------------------------------------------------------------------


def _columns(n: int) -> list[array]:
    return [array("q", [i * 4096 for i in range(n)]), array("q", [0] * n), array("q", [i * 4096 for i in range(n)]),
            array("q", [4096] * n), array("q", [7] * n), array("q", [1700000000000 + i for i in range(n)])]


@pytest.mark.benchmark(group="frames-transfer-header-encode-10000")
@pytest.mark.parametrize("impl", TWINS + ("struct",))
def test_encode_headers_batch(benchmark, impl: str) -> None:
    _info(benchmark, impl, message_bytes=48, batch=BATCH)
    cols = _columns(BATCH)
    if impl == "struct":
        def run() -> bytes:
            out = bytearray(BATCH * 48)
            pack_into = _TD.pack_into
            bs, es, co, dl, ep, ts = cols
            for i in range(BATCH):
                pack_into(out, i * 48, 48 + dl[i], 6, ts[i], ep[i], bs[i], es[i], co[i])
            return bytes(out)
        benchmark(run)
        return
    pack = load_twin("frames", impl).pack_transfer_headers
    benchmark(lambda: pack(*cols))


@pytest.mark.benchmark(group="frames-transfer-header-decode-10000")
@pytest.mark.parametrize("impl", TWINS + ("struct",))
def test_decode_headers_batch(benchmark, impl: str) -> None:
    _info(benchmark, impl, message_bytes=48, batch=BATCH)
    raw = load_twin("frames", "python").pack_transfer_headers(*_columns(BATCH))
    if impl == "struct":
        benchmark(lambda: list(_TD.iter_unpack(raw)))
        return
    unpack = load_twin("frames", impl).unpack_transfer_headers
    benchmark(unpack, raw)


# --- incremental stream decoding ---------------------------------------------------------------


@pytest.fixture(scope="module")
def stream_chunks() -> list[bytes]:
    enc = load_twin("frames", "python").pack_transfer_header
    body = bytes(range(256)) * (BODY // 256)
    frame_len = 48 + BODY
    n = STREAM_BYTES // frame_len
    stream = b"".join(enc(i * BODY, 0, i * BODY, BODY, 7, 0) + body for i in range(n))
    return [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]


@pytest.mark.benchmark(group="frames-stream-decode-64MiB")
@pytest.mark.parametrize("impl", TWINS + ("struct",))
def test_stream_decode(benchmark, impl: str, stream_chunks: list[bytes]) -> None:
    _info(benchmark, impl, message_bytes=48 + BODY, batch=len(stream_chunks))
    benchmark.extra_info["stream_bytes"] = sum(map(len, stream_chunks))
    if impl == "struct":
        hdr = struct.Struct(">ii")

        def run() -> int:
            # Minimal reassembly with struct: no validation, data as memoryview slices.
            buf = b""
            count = 0
            for chunk in stream_chunks:
                buf = buf + chunk if buf else chunk
                pos, n = 0, len(buf)
                mv = memoryview(buf)
                while n - pos >= 8:
                    length, _ = hdr.unpack_from(buf, pos)
                    if n - pos < length:
                        break
                    _TD.unpack_from(buf, pos)
                    mv[pos + 48 : pos + length]
                    count += 1
                    pos += length
                buf = buf[pos:]
            return count
    else:
        dec_cls = load_twin("frames", impl).FramedDecoder

        def run() -> int:
            dec = dec_cls(None, 1 << 20)
            count = 0
            for chunk in stream_chunks:
                count += len(dec.feed(chunk))
            return count
    n = benchmark.pedantic(run, rounds=3 if QUICK else 5, iterations=1, warmup_rounds=1)
    assert n == STREAM_BYTES // (48 + BODY)


@pytest.mark.benchmark(group="frames-stream-decode-read-fields-64MiB")
@pytest.mark.parametrize("impl", TWINS + ("struct",))
def test_stream_decode_read_fields(benchmark, impl: str, stream_chunks: list[bytes]) -> None:
    """As test_stream_decode, but the consumer reads every field and the data of every frame
    (as the HA slave does), so work a twin defers until a field is read is counted too."""
    _info(benchmark, impl, message_bytes=48 + BODY, batch=len(stream_chunks))
    benchmark.extra_info["stream_bytes"] = sum(map(len, stream_chunks))
    if impl == "struct":
        hdr = struct.Struct(">ii")

        def run() -> int:
            buf = b""
            total = 0
            for chunk in stream_chunks:
                buf = buf + chunk if buf else chunk
                pos, n = 0, len(buf)
                mv = memoryview(buf)
                while n - pos >= 8:
                    length, _ = hdr.unpack_from(buf, pos)
                    if n - pos < length:
                        break
                    _, _, ts, epoch, block, estart, confirm = _TD.unpack_from(buf, pos)
                    total += len(mv[pos + 48 : pos + length])
                    pos += length
                buf = buf[pos:]
            return total
    else:
        dec_cls = load_twin("frames", impl).FramedDecoder

        def run() -> int:
            dec = dec_cls(None, 1 << 20)
            total = 0
            for chunk in stream_chunks:
                for f in dec.feed(chunk):
                    f.block_start_offset, f.epoch_start_offset, f.confirm_offset, f.timestamp_ms, f.epoch
                    total += len(f.data)
            return total
    total = benchmark.pedantic(run, rounds=3 if QUICK else 5, iterations=1, warmup_rounds=1)
    assert total == STREAM_BYTES // (48 + BODY) * BODY
