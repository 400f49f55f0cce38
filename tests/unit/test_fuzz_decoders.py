"""Every decoder and file loader fed garbage: refused with the project's own errors only.

Property tests (Hypothesis; derandomised when ``CI`` is set, see ``conftest.py``): remoting
frames, both HA dialects in both directions and both twins, message records, batches and
properties, the record scanner, the epoch checkpoint file, ``.broker.meta`` and config
files.  A decoder either returns something or raises an :class:`rmqha.errors.RmqhaError`;
anything else (IndexError, struct.error, UnicodeDecodeError, MemoryError, ...) is a bug.
Lengths read from the input are bounded before anything is allocated, so a huge length
costs nothing: the frame limits below are small and the inputs declare far larger ones.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqha import _core
from rmqha.ha import frames
from rmqha.broker.identity import IdentityStore
from rmqha.config import read_file
from rmqha.errors import RmqhaError
from rmqha.protocol.message import decode_batch, decode_properties, decode_record
from rmqha.protocol.command import FrameDecoder, decode
from rmqha.store.epoch_map import decode_checkpoint

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
garbage = st.binary(max_size=600)
#: Garbage that starts like a frame: a length (often huge or negative) and then noise.
framed = st.builds(lambda n, rest: struct.pack(">i", n) + rest,
                   st.one_of(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(0, 64)), garbage)
inputs = st.one_of(garbage, framed)


def _only_our_errors(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except RmqhaError:
        pass


@FUZZ
@given(data=inputs, chunk=st.integers(1, 64))
def test_remoting_decoders(data: bytes, chunk: int) -> None:
    _only_our_errors(decode, data)
    dec = FrameDecoder(max_frame_bytes=4096)
    try:
        for i in range(0, len(data), chunk):
            dec.feed(data[i:i + chunk])
    except RmqhaError:
        pass


TWINS = ["python"] if _core.NO_EXTENSIONS else ["cython", "python"]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("dialect", ["framed", "rocketmq"])
@pytest.mark.parametrize("direction", list(frames.Direction))
def test_ha_frame_decoders(twin: str, dialect: str, direction: frames.Direction) -> None:
    codec = frames.codec(dialect, twin)

    @FUZZ
    @given(data=inputs, chunk=st.integers(1, 64))
    def run(data: bytes, chunk: int) -> None:
        _only_our_errors(codec.decode, data, direction)
        dec = codec.decoder(direction, max_frame_bytes=4096)
        try:
            for i in range(0, len(data), chunk):
                dec.feed(data[i:i + chunk])
        except RmqhaError:
            pass

    run()


@FUZZ
@given(data=inputs)
def test_message_decoders(data: bytes) -> None:
    _only_our_errors(decode_record, data)
    _only_our_errors(decode_batch, data, max_items=64)
    _only_our_errors(decode_properties, data)


@pytest.mark.parametrize("twin", TWINS)
def test_record_scanner_never_raises_on_garbage(twin: str) -> None:
    codec = _core.load_twin("records", twin)

    @FUZZ
    @given(data=inputs)
    def run(data: bytes) -> None:
        buf = bytearray(data) + bytearray(64)
        pos, stop, count = codec.scan(buf, 0, len(data), 0, 0, {})
        assert 0 <= pos <= len(buf) and count >= 0
        codec.ScanStop(stop)

    run()


@FUZZ
@given(data=st.one_of(garbage, st.text(max_size=300).map(str.encode)))
def test_epoch_checkpoint_loader(data: bytes) -> None:
    _only_our_errors(decode_checkpoint, data)


@FUZZ
@given(text=st.text(max_size=200))
def test_broker_meta_loader(tmp_path_factory, text: str) -> None:
    store = tmp_path_factory.mktemp("meta")
    (store / ".broker.meta").write_bytes(text.encode("utf-8"))
    ids = IdentityStore(store, "c", "broker-a")
    _only_our_errors(ids.read_meta)


@FUZZ
@given(data=garbage, suffix=st.sampled_from([".toml", ".properties", ".conf"]))
def test_config_file_loader(tmp_path_factory, data: bytes, suffix: str) -> None:
    path = tmp_path_factory.mktemp("conf") / f"broker{suffix}"
    path.write_bytes(data)
    _only_our_errors(read_file, path)
