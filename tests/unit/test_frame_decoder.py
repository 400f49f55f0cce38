"""FrameDecoder: the same commands whatever the reads' boundaries, each frame copied once."""
from __future__ import annotations

import random
import struct

import pytest

from rmqha.errors import ProtocolError
from rmqha.protocol.command import (
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RawAnswer,
    RemotingCommand,
    decode,
    encode,
)


def _frames() -> list[bytes]:
    cmds = [
        RemotingCommand(code=10, opaque=1, ext_fields={"a": "x"}, body=b"hello"),
        RemotingCommand(code=0, opaque=2, flag=1, remark="r\u00e9", body=b""),
        RemotingCommand(code=11, opaque=3, ext_fields={"k": "v" * 300}, body=bytes(range(256)) * 40),
        RemotingCommand(code=12, opaque=4, ext_fields={"b": "1"}, body=b"z" * 7,
                        serialize_type=SERIALIZE_ROCKETMQ),
        RemotingCommand(code=13, opaque=5, body=b"q" * 70_000),
    ]
    return [encode(c) for c in cmds]


def _split(data: bytes, rng: random.Random, most: int) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        step = rng.randint(1, most)
        out.append(data[pos:pos + step])
        pos += step
    return out


@pytest.mark.parametrize("most", [1, 3, 7, 100, 5000, 200_000])
def test_any_split_gives_the_frames_decoded_one_by_one(most: int) -> None:
    frames = _frames() * 2
    want = [decode(f) for f in frames]
    rng = random.Random(most)
    for _ in range(5 if most > 1 else 1):
        dec = FrameDecoder()
        got: list[RemotingCommand] = []
        for chunk in _split(b"".join(frames), rng, most):
            got += dec.feed(chunk)
        assert got == want
        assert dec.buffered == 0
        assert all(type(c.body) is bytes for c in got)


def test_buffered_counts_a_frame_begun_and_a_length_begun() -> None:
    frame = _frames()[0]
    dec = FrameDecoder()
    assert dec.feed(frame[:2]) == [] and dec.buffered == 2
    assert dec.feed(frame[2:9]) == [] and dec.buffered == 9
    assert dec.feed(frame[9:] + frame[:3]) == [decode(frame)] and dec.buffered == 3
    assert dec.feed(bytearray(frame[3:])) == [decode(frame)] and dec.buffered == 0


def test_a_bad_length_is_refused_before_its_frame_is_held() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(ProtocolError, match="outside"):
        dec.feed(struct.pack(">i", 101) + b"x" * 10)
    dec = FrameDecoder(max_frame_bytes=100)
    dec.feed(b"\x00\x00")
    with pytest.raises(ProtocolError, match="outside"):
        dec.feed(b"\x00\x02")  # a length of 2, completed by the second read
    with pytest.raises(ProtocolError, match="header length"):
        FrameDecoder().feed(struct.pack(">ii", 8, 99) + b"abcd")


@pytest.mark.parametrize("most", [1, 5, 100_000])
@pytest.mark.parametrize("serialize_type", [0, SERIALIZE_ROCKETMQ])
def test_responses_to_raw_opaques_come_back_undecoded(most: int, serialize_type: int) -> None:
    answer = RemotingCommand(code=0, opaque=7, flag=1, ext_fields={"msgId": "A"}, body=b"b" * 900,
                             serialize_type=serialize_type)
    other = RemotingCommand(code=0, opaque=8, flag=1, body=b"c")
    request = RemotingCommand(code=10, opaque=7, body=b"a request with opaque 7")
    frames = [encode(answer), encode(other), encode(request)]
    dec = FrameDecoder()
    dec.raw_answers = {7: None}
    got: list[object] = []
    for chunk in _split(b"".join(frames), random.Random(most), most):
        got += dec.feed_answers(chunk)
    raw = got[0]
    assert isinstance(raw, RawAnswer) and raw.opaque == 7 and raw.frame == frames[0][4:]
    assert got[1:] == [other, request]  # another opaque, and a request: decoded as ever
    dec.raw_answers = {}
    assert dec.feed_answers(frames[0]) == [answer]  # no raw request pending: decoded
