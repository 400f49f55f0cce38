"""The records codec, both twins: CRC, identical bytes, batch = singles, scanner verdicts."""
from __future__ import annotations

import struct
import zlib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqha import _core
from rmqha._core import load_twin
from rmqha.errors import CorruptRecordError, InvalidMessageError, MessageTooLargeError, StoreError

HOST_A = bytes([10, 0, 0, 1]) + struct.pack(">i", 1234)
HOST_B = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)


def parse_record(buf: bytes, pos: int) -> dict:
    """An independent reading of RocketMQ's v1 message layout (big-endian)."""
    names = ["total", "magic", "crc", "queue_id", "flag", "queue_offset", "physical_offset",
             "sys_flag", "born_ts", "born_ip", "born_port", "store_ts", "store_ip",
             "store_port", "reconsume", "prepared", "body_len"]
    vals = struct.unpack_from(">iIiiiqqiq4siq4siiqi", buf, pos)
    rec = dict(zip(names, vals))
    p = pos + 88
    rec["body"] = bytes(buf[p:p + rec["body_len"]])
    p += rec["body_len"]
    tlen = buf[p]
    rec["topic"] = bytes(buf[p + 1:p + 1 + tlen])
    p += 1 + tlen
    (plen,) = struct.unpack_from(">h", buf, p)
    rec["properties"] = bytes(buf[p + 2:p + 2 + plen])
    assert p + 2 + plen - pos == rec["total"]
    return rec


def msg_args(topic=b"TopicA", body=b"hello", props=b"", qoff=0, phys=0):
    return (topic, body, props, 3, 7, qoff, phys, 0, 1_700_000_000_000, HOST_A,
            1_700_000_000_001, HOST_B, 2, 0)


BOTH = pytest.mark.skipif(_core.NO_EXTENSIONS,
                          reason="compares the two twins; RMQHA_NO_EXTENSIONS runs the pure one only")


@BOTH
@given(data=st.binary(max_size=5000), seed=st.integers(0, 0xFFFFFFFF))
@settings(max_examples=200, deadline=None)
def test_crc32_matches_zlib(data: bytes, seed: int) -> None:
    for twin in ("cython", "python"):
        mod = load_twin("records", twin)
        assert mod.crc32(data) == zlib.crc32(data)
        assert mod.crc32(data, seed) == zlib.crc32(data, seed)
        assert mod.body_crc(data) == zlib.crc32(data) & 0x7FFFFFFF


@BOTH
@given(topic=st.binary(min_size=1, max_size=255).filter(lambda t: t[-1] != 0),  # the writers refuse a NUL last byte
       body=st.binary(max_size=3000),
       props=st.dictionaries(st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                                     min_size=1, max_size=8),
                             st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                                     max_size=8), max_size=4),
       qoff=st.integers(0, 2**62), phys=st.integers(0, 2**40))
@settings(max_examples=150, deadline=None)
def test_twins_write_identical_bytes(topic, body, props, qoff, phys) -> None:
    outs = []
    for twin in ("cython", "python"):
        mod = load_twin("records", twin)
        pb = mod.encode_properties(props)
        buf = bytearray(4 + 91 + len(topic) + len(body) + len(pb) + 4)
        size = mod.write_message(buf, 4, *msg_args(topic, body, pb, qoff, phys))
        assert size == mod.message_size(len(body), len(topic), len(pb))
        outs.append(bytes(buf))
        rec = parse_record(buf, 4)
        assert (rec["magic"], rec["total"], rec["body"], rec["topic"]) == (
            0xDAA320A7, size, body, topic)
        assert rec["crc"] == zlib.crc32(body) & 0x7FFFFFFF
        assert (rec["queue_offset"], rec["physical_offset"], rec["queue_id"], rec["flag"]) == (
            qoff, phys, 3, 7)
        assert (rec["born_ip"], rec["born_port"], rec["store_port"]) == (
            bytes([10, 0, 0, 1]), 1234, 10911)
        # Pairs with an empty value are left out (RocketMQ's readers drop them).
        assert mod.decode_properties(rec["properties"]) == {k: v for k, v in props.items() if v}
        dec = mod.decode(buf, 4, len(buf))
        assert dec[14:17] == (body, topic, pb) and dec[5:7] == (qoff, phys)
    assert outs[0] == outs[1]


def test_batch_equals_singles(twin: str) -> None:
    mod = load_twin("records", twin)
    bodies = [bytes([i % 251]) * (i * 37 % 700) for i in range(60)]
    bodies[3] = bytearray(b"mutable body")
    bodies[4] = memoryview(b"a view")
    one = bytearray(40000)
    pos = 0
    for i, b in enumerate(bodies):
        pos += mod.write_message(one, pos, b"T", b, b"k\x01v\x02", 1, 0, 100 + i, 5000 + pos, 0,
                                 11, HOST_A, 12, HOST_B, 0, 0)
    two = bytearray(40000)
    offs = array("q", [0] * len(bodies))
    count, end = mod.write_batch(two, 0, len(two), b"T", bodies, 0, b"k\x01v\x02", 1, 0, 100,
                                 5000, 0, 11, HOST_A, 12, HOST_B, 0, 0, offs)
    assert (count, end) == (len(bodies), pos)
    assert one == two
    p = 0
    for i, b in enumerate(bodies):
        assert offs[i] == 5000 + p
        rec = parse_record(two, p)
        assert rec["body"] == bytes(b) and rec["queue_offset"] == 100 + i
        p += rec["total"]


def test_batch_stops_at_limit_and_resumes(twin: str) -> None:
    mod = load_twin("records", twin)
    bodies = [b"x" * 100] * 10
    buf = bytearray(2000)
    count, end = mod.write_batch(buf, 0, 600, b"T", bodies, 0, b"", 0, 0, 0, 0, 0, 1, HOST_A,
                                 1, HOST_B, 0, 0)
    assert count == 3 and end == 3 * 192
    count2, end2 = mod.write_batch(buf, end, 2000, b"T", bodies, count, b"", 0, 0, 3, 0, 0, 1,
                                   HOST_A, 1, HOST_B, 0, 0)
    assert count2 == 7 and end2 == 10 * 192
    assert parse_record(buf, 9 * 192)["queue_offset"] == 9


def test_bad_input_writes_nothing(twin: str) -> None:
    mod = load_twin("records", twin)
    buf = bytearray(1000)
    with pytest.raises(InvalidMessageError):
        mod.write_message(buf, 0, *msg_args(topic=b""))
    with pytest.raises(InvalidMessageError):
        mod.write_message(buf, 0, *msg_args(topic=b"t" * 256))
    with pytest.raises(StoreError):
        mod.write_message(buf, 950, *msg_args())
    with pytest.raises(StoreError):
        mod.write_message(buf, -1, *msg_args())
    with pytest.raises(InvalidMessageError):
        mod.write_batch(buf, 0, 1000, b"T", [b"ok", "not bytes"], 0, b"", 0, 0, 0, 0, 0, 0,
                        HOST_A, 0, HOST_B, 0, 0)
    with pytest.raises(MessageTooLargeError):
        mod.write_batch(buf, 0, 1000, b"T", [b"ok", b"x" * 500], 0, b"", 0, 0, 0, 0, 0, 0,
                        HOST_A, 0, HOST_B, 0, 0, None, 400)
    with pytest.raises(StoreError):
        mod.write_blank(buf, 0, 7)
    assert buf == bytearray(1000)
    for bad in ({"a\x01": "b"}, {"a": "b\x02"}, {"": "x"}, {"k": "v" * 40000}, {"\ud800": "x"},
                {"k": "\ud800"}):
        with pytest.raises(InvalidMessageError):
            mod.encode_properties(bad)


def _five_records_segment(mod, seg: int, base: int) -> tuple[bytearray, list[int]]:
    """A ``seg``-byte segment starting at log offset ``base``: five records of topic ``T``
    (queue offsets 0-4), then a blank to the end; returns it and each record's end."""
    good = bytearray(seg)
    pos = 0
    ends = []
    for i in range(5):
        pos += mod.write_message(good, pos, b"T", bytes([i]) * 50, b"", 0, 0, i, base + pos, 0,
                                 1, HOST_A, 1, HOST_B, 0, 0)
        ends.append(pos)
    mod.write_blank(good, pos, seg - pos)
    return good, ends


def test_scan_verdicts(twin: str) -> None:
    mod = load_twin("records", twin)
    S = mod.ScanStop
    seg, base = 4096, 8192
    good, ends = _five_records_segment(mod, seg, base)
    table: dict = {}
    assert mod.scan(good, 0, seg, base, 0, table) == (seg, S.BLANK, 5)
    assert table == {(b"T", 0): 5}
    assert mod.scan(good, 0, ends[2], base, 0) == (ends[2], S.END, 3)
    low: dict = {}
    mod.scan(good, ends[1], ends[4], base, 0, low, True)
    assert low == {(b"T", 0): 2}
    # Zeros after the data: a clean end.
    zeros = bytearray(good)
    zeros[ends[2]:] = bytes(seg - ends[2])
    assert mod.scan(zeros, 0, seg, base, 0) == (ends[2], S.ZEROS, 3)

    def verdict(mutate, verify_from=0):
        b = bytearray(good)
        mutate(b)
        return mod.scan(b, 0, seg, base, verify_from)

    r3 = ends[2]
    assert verdict(lambda b: b.__setitem__(r3 + 4, 0)) == (r3, S.BAD_MAGIC, 3)
    assert verdict(lambda b: struct.pack_into(">i", b, r3, 20)) == (r3, S.BAD_SIZE, 3)
    assert verdict(lambda b: struct.pack_into(">i", b, r3, seg)) == (r3, S.BAD_SIZE, 3)
    assert verdict(lambda b: struct.pack_into(">i", b, r3 + 84, 49)) == (r3, S.BAD_LENGTHS, 3)
    assert verdict(lambda b: b.__setitem__(r3 + 100, 99)) == (r3, S.BAD_CRC, 3)
    # Below verify_from the body CRC is trusted.
    assert verdict(lambda b: b.__setitem__(r3 + 100, 99), base + seg)[1] == S.BLANK
    assert verdict(lambda b: struct.pack_into(">q", b, r3 + 28, 1)) == (r3, S.BAD_OFFSET, 3)
    assert verdict(lambda b: struct.pack_into(">i", b, ends[4], 100)) == (ends[4], S.BAD_SIZE, 5)
    # A record cut by the data end.
    assert mod.scan(good, 0, r3 + 60, base, 0) == (r3, S.TORN, 3)
    assert mod.scan(good, 0, r3 + 5, base, 0) == (r3, S.TORN, 3)
    # A header cut inside its zero high bytes cannot be told from the unwritten rest.
    assert mod.scan(good, 0, r3 + 3, base, 0) == (r3, S.ZEROS, 3)


def test_scan_of_a_segment_piece(twin: str) -> None:
    """``seg_end``: a block cut out of a segment scans as it would in place."""
    mod = load_twin("records", twin)
    S = mod.ScanStop
    seg, base = 4096, 8192
    good, ends = _five_records_segment(mod, seg, base)
    r1 = ends[0]
    piece = bytes(good[r1:])  # records 1..4 and the blank, as a replicated block
    table: dict = {}
    assert mod.scan(piece, 0, len(piece), base + r1, 0, table, False, seg - r1) == \
        (seg - r1, S.BLANK, 4)
    assert table == {(b"T", 0): 5}
    part = bytes(good[r1:ends[3] + 30])  # ends inside record 4
    assert mod.scan(part, 0, len(part), base + r1, 0, None, False, seg - r1) == \
        (ends[3] - r1, S.TORN, 3)
    # The wrong origin is a bad physical offset, a wrong segment end a bad blank.
    assert mod.scan(piece, 0, len(piece), base, 0, None, False, seg - r1)[1] == S.BAD_OFFSET
    tail = bytes(good[ends[4]:])
    assert mod.scan(tail, 0, len(tail), base + ends[4], 0, None, False, seg)[1] == S.BAD_SIZE
    with pytest.raises(StoreError):
        mod.scan(piece, 0, len(piece), base + r1, 0, None, False, len(piece) - 1)


# --- half records: a tail that never came, read back as the segment's zeros ---------------

#: Two properties: a cut anywhere inside them leaves the record's last byte 0.
HALF_PROPS = b"KEYS\x01order-17\x02TAGS\x01paid\x02"
SEG, BASE = 4096, 8192


def _victim(mod, props: bytes) -> tuple[bytearray, int, int, range]:
    """A segment holding a whole record, then the victim (topic ``TopicB``, ``props``):
    the segment, the victim's start and size, and the cut points (segment positions) that
    fall inside its properties or, without properties, inside its topic."""
    buf = bytearray(SEG)
    v = mod.write_message(buf, 0, b"TopicA", b"first", b"KEYS\x01k0\x02", 0, 0, 0, BASE, 0, 1,
                          HOST_A, 1, HOST_B, 0, 0)
    n = mod.write_message(buf, v, b"TopicB", b"victim body", props, 0, 0, 1, BASE + v, 0, 1,
                          HOST_A, 1, HOST_B, 0, 0)
    topic_at = v + 89 + len(b"victim body")
    props_at = topic_at + len(b"TopicB") + 2
    return buf, v, n, range(props_at, v + n) if props else range(topic_at, props_at - 2)


def _torn(buf: bytearray, cut: int, end: int) -> bytearray:
    """``buf`` as a torn write leaves it: the bytes from ``cut`` to ``end`` never came."""
    half = bytearray(buf)
    half[cut:end] = bytes(end - cut)
    return half


def _rocketmq_check(buf: bytes | bytearray, pos: int) -> bool:
    """RocketMQ's record check, read independently (scan's before ZERO_TAIL): magic, the
    lengths adding up to the total size, the body CRC."""
    try:
        rec = parse_record(buf, pos)
    except AssertionError:  # the lengths do not add up
        return False
    return rec["magic"] == 0xDAA320A7 and rec["crc"] == zlib.crc32(rec["body"]) & 0x7FFFFFFF


@pytest.mark.parametrize("props", [HALF_PROPS, b""], ids=["cut-in-properties", "cut-in-topic"])
def test_scan_stops_at_a_half_record_whose_tail_reads_as_zeros(twin: str, props: bytes) -> None:
    mod = load_twin("records", twin)
    S = mod.ScanStop
    buf, v, n, cuts = _victim(mod, props)
    # Negative control: the victim whole passes (without properties its last two bytes are
    # the zero properties length: the check reads the topic's last byte instead).
    assert mod.scan(buf, 0, SEG, BASE, 0) == (v + n, S.ZEROS, 2)
    assert _rocketmq_check(buf, v) and (buf[v + n - 1] == 0) == (not props)
    assert len(cuts) >= 6
    for cut in cuts:
        half = _torn(buf, cut, v + n)
        # The old check takes the half record for a whole one ...
        assert _rocketmq_check(half, v), cut
        # ... the last byte does not: wholly past the flushed offset, or begun below it
        # (a slave flushes mid-record).
        assert mod.scan(half, 0, SEG, BASE, 0) == (v, S.ZERO_TAIL, 1), cut
        assert mod.scan(half, 0, SEG, BASE, BASE + cut) == (v, S.ZERO_TAIL, 1), cut
        with pytest.raises(CorruptRecordError, match="ZERO_TAIL"):
            mod.decode(half, v, v + n)
        # Below the flushed offset records are trusted: it is the check that stops it.
        assert mod.scan(half, 0, SEG, BASE, BASE + v + n) == (v + n, S.ZEROS, 2), cut


def test_scan_takes_a_zero_inside_a_value_or_the_properties_length(twin: str) -> None:
    """Only a zero where the record's last written byte is counts: a value ending in NUL
    is stored with the closing separator after it, and a record without properties whose
    cut falls in its (zero) properties length is byte for byte the whole record."""
    mod = load_twin("records", twin)
    S = mod.ScanStop
    props = mod.encode_properties({"k": "v\x00"})
    assert props == b"k\x01v\x00\x02"
    buf, v, n, _ = _victim(mod, props)
    assert mod.scan(buf, 0, SEG, BASE, 0) == (v + n, S.ZEROS, 2)
    buf, v, n, _ = _victim(mod, b"")
    assert _torn(buf, v + n - 2, v + n) == buf
    assert mod.scan(_torn(buf, v + n - 2, v + n), 0, SEG, BASE, 0) == (v + n, S.ZEROS, 2)


@BOTH
def test_twins_agree_on_every_cut_of_a_record() -> None:
    """Byte-identical behaviour: for a cut at every byte of both victims, scan (checked,
    and trusted below the flushed offset) and decode answer alike in the two twins."""
    twins = [load_twin("records", t) for t in ("cython", "python")]
    for props in (HALF_PROPS, b""):
        buf, v, n, _ = _victim(twins[1], props)
        for cut in range(v, v + n + 1):
            half = _torn(buf, cut, v + n)
            answers = []
            for mod in twins:
                try:
                    decoded: object = mod.decode(half, v, v + n)
                except CorruptRecordError as exc:
                    decoded = str(exc)
                answers.append((mod.scan(half, 0, SEG, BASE, 0),
                                mod.scan(half, 0, SEG, BASE, BASE + cut), decoded))
            assert answers[0] == answers[1], (props, cut)
            assert answers[0][0][1] != twins[0].ScanStop.END


def test_scrub_steps_over_a_zero_tail(twin: str) -> None:
    """The at-rest check names a record whose tail reads as zeros and goes on past it (its
    sizes add up), as it does past a bad CRC."""
    from rmqha.store.scrub import bad_records

    mod = load_twin("records", twin)
    buf, v, n, cuts = _victim(mod, HALF_PROPS)
    after = mod.write_message(buf, v + n, b"TopicC", b"after", b"", 0, 0, 0, BASE + v + n, 0,
                              1, HOST_A, 1, HOST_B, 0, 0)
    bad, count = bad_records(mod, _torn(buf, cuts[3], v + n), 0, v + n + after, BASE)
    assert [(b.offset, b.reason, b.size) for b in bad] == [(BASE + v, "ZERO_TAIL", n)]
    assert count == 3
    assert bad_records(mod, buf, 0, v + n + after, BASE) == ([], 3)  # negative control


def test_decode_refuses_blank_and_garbage(twin: str) -> None:
    mod = load_twin("records", twin)
    buf = bytearray(512)
    mod.write_blank(buf, 0, 512)
    with pytest.raises(CorruptRecordError):
        mod.decode(buf, 0, 512)
    with pytest.raises(CorruptRecordError):
        mod.decode(bytearray(b"\x01" * 200), 0, 200)
    size = mod.write_message(buf, 0, *msg_args())
    buf[90] ^= 0xFF  # inside the body
    with pytest.raises(CorruptRecordError):
        mod.decode(buf, 0, 512)
    assert mod.decode(buf, 0, size, False)[0] == size


def test_prefault_keeps_bytes(twin: str) -> None:
    import mmap

    mod = load_twin("records", twin)
    mm = mmap.mmap(-1, 1 << 20)
    try:
        mm[5000:5005] = b"hello"
        mod.prefault(mm)
        mod.prefault(mm, 4097)
        mod.prefault(bytearray(10000), 3)
        mod.prefault(mm, 4000, 9000)  # a range, as the commitlog's warm-up asks
        assert mm[5000:5005] == b"hello"
        with pytest.raises(StoreError):
            mod.prefault(mm, len(mm) + 1)
        with pytest.raises(StoreError):
            mod.prefault(mm, 0, len(mm) + 1)
        with pytest.raises(StoreError):
            mod.prefault(mm, 9000, 4000)
    finally:
        mm.close()


# --- batch bodies stored as they came ------------------------------------------------------

RESERVED = ((b"DELAY", b"TRAN_PREPARED_QUEUE_OFFSET"), (b"TIMER_",))


def batch_body(entries: list[tuple[bytes, bytes, int]]) -> bytes:
    """A SEND_BATCH body written independently of the codec under test."""
    out = b""
    for body, props, flag in entries:
        total = 22 + len(body) + len(props)
        out += struct.pack(">iiiii", total, 0, 0, flag, len(body)) + body
        out += struct.pack(">h", len(props)) + props
    return out


@pytest.mark.parametrize("props, plain", [
    (b"", True),
    (b"k\x01v\x02", True),
    (b"KEYS\x01a b\x02UNIQ_KEY\x01AB12\x02", True),
    (b"KEYS\x01a b\x02k\x01\x02", False),   # an empty value (decoding drops it)
    ("clé\x01välue\x02".encode(), True),
    (b"k\x01v", False),                    # no closing separator
    (b"\x02k\x01v\x02", False),            # an empty pair
    (b"\x01v\x02", False),                 # an empty key
    (b"k\x02", False),                     # no name/value separator
    (b"k\x01v\x01w\x02", False),           # a value holding the separator
    (b"k\x01v\x02k\x01w\x02", False),      # a repeated key
    (b"k\x01\xff\xfe\x02", False),         # not UTF-8
    (b"k\x01\xed\xa0\x80\x02", False),     # a UTF-8 encoded surrogate
    (b"DELAY\x013\x02", False),
    (b"TIMER_DELIVER_MS\x011\x02", False),
    (b"a\x01b\x02TRAN_PREPARED_QUEUE_OFFSET\x017\x02", False),
    (b"DELAYED\x01x\x02", True),           # only the exact key is reserved
    (b"".join(b"k%d\x01v\x02" % i for i in range(64)), True),
    (b"".join(b"k%d\x01v\x02" % i for i in range(65)), False),
])
def test_batch_plain_accepts_only_canonical_properties(twin: str, props: bytes,
                                                       plain: bool) -> None:
    mod = load_twin("records", twin)
    other = load_twin("records", "python")
    body = batch_body([(b"first", b"a\x01b\x02", 0), (b"x", props, 3)])
    assert mod.batch_plain(body, 100, *RESERVED) == (2 if plain else -1)
    assert mod.properties_plain(props, *RESERVED) is plain
    if plain:  # canonical: decoding and encoding again gives the same bytes
        assert other.encode_properties(other.decode_properties(props)) == props


def test_batch_plain_refuses_bad_sizes_and_too_many(twin: str) -> None:
    mod = load_twin("records", twin)
    good = batch_body([(b"a" * 10, b"k\x01v\x02", 0)] * 3)
    assert mod.batch_plain(good, 3, *RESERVED) == 3
    assert mod.batch_plain(good, 2, *RESERVED) == -1
    assert mod.batch_plain(b"", 2, *RESERVED) == 0
    assert mod.batch_plain(good[:-1], 3, *RESERVED) == -1
    bad_total = bytearray(good)
    struct.pack_into(">i", bad_total, 0, 5)
    assert mod.batch_plain(bytes(bad_total), 3, *RESERVED) == -1
    bad_plen = bytearray(good)
    struct.pack_into(">h", bad_plen, 20 + 10, -1)
    assert mod.batch_plain(bytes(bad_plen), 3, *RESERVED) == -1


def test_batch_entries_equal_singles(twin: str) -> None:
    """Entries stored as they came are the records write_message makes of them."""
    mod = load_twin("records", twin)
    entries = [(bytes([i % 251]) * (i * 37 % 700), b"" if i % 5 == 0 else b"k\x01v%d\x02" % i,
                i % 3) for i in range(60)]
    body = batch_body(entries)
    one = bytearray(50000)
    pos = 0
    for i, (b, props, flag) in enumerate(entries):
        pos += mod.write_message(one, pos, b"T", b, props, 1, flag, 100 + i, 5000 + pos, 4,
                                 11, HOST_A, 12, HOST_B, 0, 0)
    two = bytearray(50000)
    offs = array("q", [0] * len(entries))
    sizes = array("i", [0] * len(entries))
    count, end, src = mod.write_batch_entries(two, 0, len(two), b"T", body, 0, 1, 100, 5000, 4,
                                              11, HOST_A, 12, HOST_B, offs, sizes, 0)
    assert (count, end, src) == (len(entries), pos, len(body))
    assert one == two
    p = 0
    for i in range(len(entries)):
        rec = parse_record(two, p)
        assert (offs[i], sizes[i], rec["flag"]) == (5000 + p, rec["total"], entries[i][2])
        p += rec["total"]


def test_batch_entries_stop_at_limit_and_resume(twin: str) -> None:
    mod = load_twin("records", twin)
    body = batch_body([(b"x" * 100, b"", 0)] * 10)
    buf = bytearray(2000)
    offs = array("q", [0] * 10)
    sizes = array("i", [0] * 10)
    count, end, src = mod.write_batch_entries(buf, 0, 600, b"T", body, 0, 0, 0, 0, 0, 1,
                                              HOST_A, 1, HOST_B, offs, sizes, 0)
    assert (count, end, src) == (3, 3 * 192, 3 * 122)
    count2, end2, src2 = mod.write_batch_entries(buf, end, 2000, b"T", body, src, 0, 3, 0, 0,
                                                 1, HOST_A, 1, HOST_B, offs, sizes, count)
    assert (count2, end2, src2) == (7, 10 * 192, len(body))
    assert list(offs) == [i * 192 for i in range(10)] and set(sizes) == {192}
    assert parse_record(buf, 9 * 192)["queue_offset"] == 9


@pytest.mark.parametrize(("pos", "limit"), [(-1, 100), (0, 1001), (200, 100)])
def test_batches_refuse_a_range_outside_the_buffer(twin: str, pos: int, limit: int) -> None:
    """Both batch writers name a range the buffer does not hold and write nothing."""
    mod = load_twin("records", twin)
    buf = bytearray(1000)
    with pytest.raises(StoreError, match=f"batch range {pos}..{limit} outside a buffer of 1000"):
        mod.write_batch(buf, pos, limit, b"T", [b"x"], 0, b"", 0, 0, 0, 0, 0, 1, HOST_A, 1,
                        HOST_B, 0, 0)
    with pytest.raises(StoreError, match=f"batch range {pos}..{limit} outside a buffer of 1000"):
        mod.write_batch_entries(buf, pos, limit, b"T", batch_body([(b"x", b"", 0)]), 0, 0, 0,
                                0, 0, 1, HOST_A, 1, HOST_B, None, None, 0)
    assert buf == bytearray(1000)


def test_batch_entries_bad_input_writes_nothing(twin: str) -> None:
    mod = load_twin("records", twin)
    buf = bytearray(3000)
    body = batch_body([(b"ok", b"", 0), (b"y" * 900, b"", 0)])
    with pytest.raises(MessageTooLargeError):
        mod.write_batch_entries(buf, 0, 3000, b"T", body, 0, 0, 0, 0, 0, 1, HOST_A, 1, HOST_B,
                                None, None, 0, 500)
    with pytest.raises(InvalidMessageError):
        mod.write_batch_entries(buf, 0, 3000, b"T", body[:-3], 0, 0, 0, 0, 0, 1, HOST_A, 1,
                                HOST_B, None, None, 0)
    with pytest.raises(StoreError):
        mod.write_batch_entries(buf, 0, 3000, b"T", body, 0, 0, 0, 0, 0, 1, HOST_A, 1, HOST_B,
                                array("q", [0]), None, 0)
    assert not any(buf)


def test_writers_refuse_a_record_that_would_end_in_zero(twin: str) -> None:
    """Every writer keeps a record's last written byte non-zero (scan tells a torn tail by
    it): a topic or properties ending in NUL are refused by name and nothing is written."""
    mod = load_twin("records", twin)
    buf = bytearray(3000)
    why = "ends in a NUL byte: recovery tells a torn record by its zero last byte"
    with pytest.raises(InvalidMessageError, match=f"^topic {why}$"):
        mod.write_message(buf, 0, *msg_args(topic=b"TopicA\x00"))
    with pytest.raises(InvalidMessageError, match=f"^property 'TAGS' {why}$"):
        mod.write_message(buf, 0, *msg_args(props=b"KEYS\x01a\x02TAGS\x01b\x00"))
    with pytest.raises(InvalidMessageError, match=f"^property 'KEYS' {why}$"):
        mod.write_batch(buf, 0, 3000, b"T", [b"x"], 0, b"KEYS\x01a\x00", 0, 0, 0, 0, 0, 1,
                        HOST_A, 1, HOST_B, 0, 0)
    with pytest.raises(InvalidMessageError, match=f"^topic {why}$"):
        mod.write_batch(buf, 0, 3000, b"T\x00", [b"x"], 0, b"", 0, 0, 0, 0, 0, 1, HOST_A, 1,
                        HOST_B, 0, 0)
    first = batch_body([(b"ok", b"k\x01v\x02", 0)])
    body = first + batch_body([(b"y", b"k\x01v\x02k2\x01w\x00", 0)])
    with pytest.raises(InvalidMessageError, match=f"^batch entry at {len(first)}: property 'k2' {why}$"):
        mod.write_batch_entries(buf, 0, 3000, b"T", body, 0, 0, 0, 0, 0, 1, HOST_A, 1, HOST_B,
                                None, None, 0)
    with pytest.raises(InvalidMessageError, match=f"^topic {why}$"):
        mod.write_batch_entries(buf, 0, 3000, b"T\x00", first, 0, 0, 0, 0, 0, 1, HOST_A, 1,
                                HOST_B, None, None, 0)
    assert not any(buf)
    # Negative control: the same records, their last bytes not NUL, are written.
    assert mod.write_message(buf, 0, *msg_args(topic=b"TopicA")) > 0
    assert mod.write_message(buf, 0, *msg_args(props=b"KEYS\x01a\x02TAGS\x01b\x00\x02")) > 0
    fixed = first + batch_body([(b"y", b"k\x01v\x02k2\x01w\x00\x02", 0)])
    assert mod.write_batch_entries(buf, 0, 3000, b"T", fixed, 0, 0, 0, 0, 0, 1, HOST_A, 1,
                                   HOST_B, None, None, 0)[0] == 2
