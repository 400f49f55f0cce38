"""A pull answer's body, both twins: assembled on the broker in one checked pass (the same
answer, byte for byte, as the checked path it replaces; a damaged record or unit is
refused) and decoded on the client (the same messages as decoding record by record)."""
from __future__ import annotations

import functools
import struct
import types
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqha._core import load_twin
from rmqha.errors import ProtocolError
from rmqha.messaging.context import MessagingConfig
from rmqha.messaging.pull_path import PullPath
from rmqha.protocol import message as message_mod
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import PullHeader
from rmqha.protocol.message import (
    CompressionType,
    ReceivedMessage,
    compress,
    decode_record,
    tag_hash,
)
from rmqha.store import CommitLog
from rmqha.store import consume_queue as cq
from rmqha.store.consume_queue import ConsumeQueueIndex

SEGMENT = 64 * 1024
QUEUES = 3


@pytest.fixture
def store(tmp_path: Path, twin: str, monkeypatch: pytest.MonkeyPatch):
    """A log of 120 messages over three queues (bodies of 1-3 KiB, so answers cross
    64 KiB segments), indexed, with the pull_answer twin under test in the index."""
    monkeypatch.setattr(cq, "_pull_answer", load_twin("pull_answer", twin))
    log = CommitLog(tmp_path / "cl", segment_bytes=SEGMENT, prefault=False)
    placed = []
    for i in range(120):
        body = (b"%05d" % i) * (200 + 200 * (i % 3))
        tags = "A" if i % 4 else "B"
        placed.append(log.append("T", body, i % QUEUES, {"TAGS": tags, "KEYS": f"k{i}"}))
    idx = ConsumeQueueIndex(tmp_path / "cq")
    idx.advance(log, log.max_offset)
    try:
        yield log, idx, placed
    finally:
        idx.close()
        log.close()


def _pull_path(log: CommitLog, idx: ConsumeQueueIndex, max_pull_bytes: int) -> PullPath:
    ctx = types.SimpleNamespace(
        index=idx, log=log, config=MessagingConfig(max_pull_bytes=max_pull_bytes), metrics=None,
        broker_name="b", broker_id=0, closed=False)
    return PullPath(ctx, lambda *a, **k: None)  # type: ignore[arg-type]


def _pull(pp: PullPath, offset: int, max_msgs: int, hashes: set[int] | None, *,
          checked: bool = False) -> RemotingCommand | None:
    cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
    cmd.language = "PYTHON"
    h = PullHeader(consumer_group="g", topic="T", queue_id=0, queue_offset=offset,
                   max_msg_nums=max_msgs, sys_flag=0, commit_offset=0, suspend_timeout_ms=0,
                   subscription="*")
    if not checked:
        return pp._try_pull(cmd, h, max_msgs, hashes)
    q = pp.ctx.index.queue("T", 0)
    return pp._checked_pull(cmd, h, max_msgs, hashes, q, q.min_offset, q.max_offset)


def _same(a: RemotingCommand | None, b: RemotingCommand | None) -> None:
    assert a is not None and b is not None
    assert (a.code, a.ext_fields, a.remark, bytes(a.body or b"")) == (
        b.code, b.ext_fields, b.remark, bytes(b.body or b""))


@pytest.mark.parametrize("max_pull_bytes", [4 << 20, 5000, 1])
@pytest.mark.parametrize("hashes", [None, {tag_hash("A")}, {tag_hash("nope")}])
def test_one_pass_answer_is_the_checked_answer_byte_for_byte(store, max_pull_bytes, hashes):
    log, idx, _ = store
    pp = _pull_path(log, idx, max_pull_bytes)
    answers = 0
    for offset in range(0, 40, 3):
        for max_msgs in (1, 7, 32):
            fast = _pull(pp, offset, max_msgs, hashes)
            _same(fast, _pull(pp, offset, max_msgs, hashes, checked=True))
            answers += fast.code == ResponseCode.SUCCESS
    assert answers or hashes == {tag_hash("nope")}
    # The one pass did answer (not the checked path behind it): it reads across segments.
    q = idx.queue("T", 0)
    got = q.answer(0, 32, None, 4 << 20)
    assert got is not None and got[1] == 32
    assert len({log.segment_start(p) for p in q.slice(0, 32)[0]}) > 1


def _flip_body_byte(log: CommitLog, record_offset: int) -> None:
    path = log.segment_files()[record_offset // SEGMENT - log.min_offset // SEGMENT]
    at = record_offset % SEGMENT + 88 + 5
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x10]))


def test_a_record_changed_at_rest_is_refused(store):
    """Negative control: the one pass refuses a record whose body CRC fails, and the
    answer is the checked path's (the records before it, then an error naming it)."""
    log, idx, placed = store
    pp = _pull_path(log, idx, 4 << 20)
    q = idx.queue("T", 0)
    bad = placed[5 * QUEUES][0]  # queue 0, queue offset 5
    assert q.answer(0, 32, None, 4 << 20) is not None
    _flip_body_byte(log, bad)
    assert q.answer(0, 32, None, 4 << 20) is None
    before = _pull(pp, 0, 32, None)
    assert before.code == ResponseCode.SUCCESS and before.ext_fields["nextBeginOffset"] == "5"
    at = _pull(pp, 5, 32, None)
    assert at.code == ResponseCode.SYSTEM_ERROR and str(bad) in at.remark
    assert any(b.offset == bad for b in log.corrupt)


def _units_and_view(log: CommitLog, idx: ConsumeQueueIndex, n: int) -> tuple[bytes, memoryview, int]:
    q = idx.queue("T", 0)
    units = q.files.units(0, n)
    first = struct.unpack_from(">q", units, 0)[0]
    return units, log.read(first, log.segment_end(first) - first), first


def test_assemble_stops_at_what_fails_its_check(store, twin):
    log, idx, _ = store
    mod = load_twin("pull_answer", twin)
    units, view, base = _units_and_view(log, idx, 4)
    i, how, taken, total, records = mod.assemble(view, base, units, 0, 4, 0, 0, b"T", None,
                                                 1 << 20, 0, 0)
    assert (i, how, taken) == (4, mod.DONE, 4) and len(records) == total
    # Wrong queue id, wrong first queue offset, wrong topic: the first unit mismatches.
    for args in ((0, 1, b"T"), (1, 0, b"T"), (0, 0, b"U")):
        assert mod.assemble(view, base, units, 0, 4, *args, None, 1 << 20, 0, 0)[:2] == (
            0, mod.MISMATCH)
    # A unit pointing before the view, or past it.
    assert mod.assemble(view[1:], base + 1, units, 0, 4, 0, 0, b"T", None, 1 << 20, 0, 0)[:2] == (
        0, mod.MISMATCH)
    assert mod.assemble(view[:100], base, units, 0, 4, 0, 0, b"T", None, 1 << 20, 0, 0)[:2] == (
        0, mod.OUTSIDE)
    # A flipped body byte in the second record: BAD_RECORD there, the first one kept.
    size0 = struct.unpack_from(">i", units, 8)[0]
    rel1 = struct.unpack_from(">q", units, 20)[0] - base
    damaged = bytearray(view)
    damaged[rel1 + 88 + 3] ^= 1
    i, how, taken, total, records = mod.assemble(bytes(damaged), base, units, 0, 4, 0, 0, b"T",
                                                 None, 1 << 20, 0, 0)
    assert (i, how, taken, total) == (1, mod.BAD_RECORD, 1, size0)
    assert records == bytes(view[:size0])
    # Filtered and past the byte limit: still checked, not copied.
    i, how, taken, total, records = mod.assemble(bytes(damaged), base, units, 0, 4, 0, 0, b"T",
                                                 {tag_hash("nope")}, 1 << 20, 0, 0)
    assert (i, how, taken, total, records) == (4, mod.DONE, 4, 0, b"")
    assert mod.assemble(bytes(damaged), base, units, 0, 4, 0, 0, b"T", None, 1, 0, 0) == (
        4, mod.DONE, 1, size0, bytes(view[:size0]))
    with pytest.raises(ValueError):
        mod.assemble(view, base, units, 0, 5, 0, 0, b"T", None, 1 << 20, 0, 0)


def _record(topic: bytes, body: bytes, props: bytes, *, sys_flag: int = 0, qoff: int = 7,
            phys: int = 1000, born: bytes = b"\x0a\x00\x00\x01\x00\x00\x2a\xf8") -> bytes:
    tail = bytes([len(topic)]) + topic + struct.pack(">H", len(props)) + props
    total = 88 + len(body) + len(tail)
    head = struct.pack(">iIiiiqqiq8sq8siqi", total, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF,
                       3, 9, qoff, phys, sys_flag, 1700000000000, born, 1700000000001,
                       b"\x7f\x00\x00\x01\x00\x00\x2a\x9f", 2, 0, len(body))
    return head + body + tail


@functools.cache
def _pull_body() -> bytes:
    lz4_body, lz4_flags = compress(b"plain lz4" * 50, CompressionType.LZ4)
    zlib_body, zlib_flags = compress(b"plain zlib" * 50, CompressionType.ZLIB)
    return b"".join([
        _record(b"T", b"one", b"UNIQ_KEY\x01abc\x02TAGS\x01A\x02"),
        _record(b"T", b"two", b"TAGS\x01A\x02KEYS\x01\x02\x02x\x02TAGS\x01B\x01c\x02\x01v\x02",
                qoff=8, phys=2000),
        _record("tópico".encode(), b"", "K\x01välue\x02".encode() + b"bad\x01\xff\xfe\x02",
                born=b"\x01\x02\x03\x04\xff\xff\xff\xff"),
        _record(b"T", lz4_body, b"", sys_flag=lz4_flags),
        _record(b"T", zlib_body, b"", sys_flag=zlib_flags),
        _record(b"T", b"not zlib at all", b"", sys_flag=zlib_flags),
        _record(b"T", b"x", b"", sys_flag=0x1 | (6 << 8)),  # an unknown compression type
    ])


def _reference(body: bytes, broker_name: str) -> list[ReceivedMessage]:
    out, pos = [], 0
    while pos < len(body):
        msg, size = decode_record(body, pos, broker_name=broker_name)
        out.append(msg)
        pos += size
    return out


def test_decode_gives_what_decoding_record_by_record_gives(twin):
    mod = load_twin("pull_answer", twin)
    body = _pull_body()
    got = mod.decode(body, "broker-a", ReceivedMessage, message_mod._inflate, 100)
    want = _reference(body, "broker-a")
    assert got == want and len(got) == 7
    assert got[1].properties == {"TAGS": "B\x01c"}
    assert got[2].topic == "tópico" and got[2].properties == {"K": "välue", "bad": "\ufffd\ufffd"}
    assert got[3].body == b"plain lz4" * 50 and got[5].decompress_error
    assert got[2].born_host == "1.2.3.4:-1" and got[0].store_host == "127.0.0.1:10911"
    assert mod.decode(memoryview(body), "", ReceivedMessage, message_mod._inflate, 100) == \
        _reference(body, "")
    assert mod.decode(b"", "", ReceivedMessage, message_mod._inflate, 100) == []


@pytest.mark.parametrize("cut", ["short", "magic", "sizes", "topic", "props", "count"])
def test_decode_refuses_what_is_not_whole_records(twin, cut):
    mod = load_twin("pull_answer", twin)
    good = _record(b"T", b"body", b"A\x01b\x02")
    data = bytearray(good * 2)
    if cut == "short":
        data = data[:len(good) + 50]
    elif cut == "magic":
        data[len(good) + 4] ^= 1
    elif cut == "sizes":
        struct.pack_into(">i", data, len(good) + 84, 10_000)
    elif cut == "topic":
        data[len(good) + 88 + 4] = 200
    elif cut == "props":
        struct.pack_into(">H", data, len(good) + 88 + 4 + 2, 3)
    limit = 1 if cut == "count" else 100
    with pytest.raises(ProtocolError) as got:
        mod.decode(bytes(data), "", ReceivedMessage, message_mod._inflate, limit)
    if cut != "count":
        with pytest.raises(ProtocolError) as want:
            _reference(bytes(data), "")
        assert str(got.value) == str(want.value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), max_size=6),
       st.binary(max_size=40))
def test_both_twins_decode_damaged_bodies_alike(flips, props) -> None:
    """Property: a pull body with bytes changed (properties of any bytes, UTF-8 or not)
    decodes to the same messages, or fails with the same error, in both twins and in the
    record-by-record reference."""
    data = bytearray(_record(b"T", b"abc", props) + _pull_body())
    for at, value in flips:
        data[at % len(data)] = value
    results = []
    for decode in (load_twin("pull_answer", "python").decode, _compiled().decode,
                   lambda d, name, *_: _reference(d, name)):
        try:
            results.append(decode(bytes(data), "b", ReceivedMessage, message_mod._inflate, 100))
        except ProtocolError as exc:
            results.append(str(exc))
    assert results[0] == results[1] == results[2]


@functools.cache
def _log_and_units(n: int) -> tuple[bytes, bytes]:
    """n records of queue 0 of topic T (offsets 0..n-1) at global offset 4096, with one of
    another queue between each two, and their consume-queue units."""
    rec = load_twin("records", "python")
    host = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
    buf, units, pos = bytearray(n * 400), bytearray(), 0
    for i in range(n):
        for qid, qoff in ((0, i), (1, i)):
            props = b"TAGS\x01%s\x02" % (b"A" if i % 2 else b"B")
            size = rec.write_message(buf, pos, b"T", b"body%d" % i * (i + 1), props, qid, 0,
                                     qoff, 4096 + pos, 0, 1, host, 2, host, 0, 0)
            if qid == 0:
                units += struct.pack(">qiq", 4096 + pos, size, tag_hash("A" if i % 2 else "B"))
            pos += size
    return bytes(buf[:pos]), bytes(units)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 30), st.integers(0, 255)),
                max_size=4),
       st.integers(1, 3000), st.booleans(), st.integers(0, 6))
def test_both_twins_assemble_damaged_logs_alike(flips, max_bytes, filtered, start) -> None:
    """Property: with bytes changed in the log or the units, both twins stop at the same
    unit for the same reason and copy the same records."""
    view, units = _log_and_units(6)
    view_b, units_b = bytearray(view), bytearray(units)
    for in_units, at, value in flips:
        target = units_b if in_units else view_b
        target[at % len(target)] = value
    hashes = {tag_hash("A")} if filtered else None
    results = [mod.assemble(bytes(view_b), 4096, bytes(units_b), start, 6, 0, 0, b"T", hashes,
                            max_bytes, 0, start)
               for mod in (load_twin("pull_answer", "python"), _compiled())]
    assert results[0] == results[1]


def _compiled():
    try:
        return load_twin("pull_answer", "cython")
    except ImportError:  # the pure-only run (RMQHA_NO_EXTENSIONS=1)
        return load_twin("pull_answer", "python")
