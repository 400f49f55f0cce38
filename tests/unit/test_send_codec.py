"""The client send codec (rmqha._core.send_codec twins): one test body over both twins.

A request frame is byte-identical to what the general codec writes for the command the
producer builds (``encode(Sender.command(req, mq))``), for plain, tagged and keyed,
delayed, compressed, batched and unicode sends; an answer reads as the general decoder
reads it (``answer_of(decode_frame(frame))``), including frames the compiled scanner
hands to the pure twin; UNIQ_KEYs keep their layout.  Negative controls show a changed
byte is noticed."""
from __future__ import annotations

import re
import struct
import time
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqha import _core
from rmqha._core import load_twin
from rmqha._core.send_codec_py import Answer
from rmqha.client.blocking_link import answer_of
from rmqha.client.model import Message, MessageQueue
from rmqha.client.producer import Producer
from rmqha.client.send_request import _PLAIN_PROPS, BatchEntry, SendRequest, _plain_entry
from rmqha.client.sender import Sender
from rmqha.errors import ProtocolError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import (
    SERIALIZE_ROCKETMQ,
    VERSION,
    RemotingCommand,
    decode_frame,
    encode,
)
from rmqha.protocol.message import decode_batch, encode_batch_entries, new_uniq_key, new_uniq_keys

#: Text as a header may carry it: quotes, backslashes, control characters, non-ASCII, emoji
#: (no lone surrogates: those are refused, tested apart).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
I64 = st.integers(-(2**63), 2**63 - 1)
BOTH = pytest.mark.skipif(_core.NO_EXTENSIONS,
                          reason="compares the two twins; RMQHA_NO_EXTENSIONS runs the pure one only")


def builder(group: str = "g") -> Producer:
    return Producer("127.0.0.1:9", group)  # never connects


def encoded(mod: object, req: SendRequest, opaque: int, queue_id: int) -> bytes:
    return mod.encode_send(req.code, opaque, VERSION, req.group, req.topic,  # type: ignore[attr-defined]
                           req.sys_flag, req.born_ms, req.flag, req.properties, req.batch,
                           queue_id, req.body)


def general(req: SendRequest, opaque: int, queue_id: int) -> bytes:
    """Today's general path: the command the sender builds, through command.encode."""
    cmd = Sender.command(req, MessageQueue(req.topic, "b", queue_id))
    cmd.opaque = opaque
    return encode(cmd)


def requests(group: str, topic: str) -> list[SendRequest]:
    rb = builder(group).sender.requests
    big = b"z" * 10_000  # over compress_over_bytes: lz4, marked in sysFlag
    return [
        rb.single(topic, b"plain", None),
        rb.single(topic, "unicodé bödy 😀", 3),
        rb.single(topic, Message(b"x", tags="TagA", keys="k1 k2", flag=9), None),
        rb.single(topic, Message(b"y", properties={"q\"uote": "back\\slash\n\t\x1f"}), 1),
        rb.single(topic, b"later", None, delay_level=3),
        rb.single(topic, big, None),
        *rb.batches(topic, [b"a", Message(b"b", tags="t"), "c"], None),
    ]


@pytest.mark.parametrize("group, topic", [("g", "T"), ("grüppe", "Tópic-😀"),
                                          ("g\"\\", "T%|_-")])
def test_request_frames_are_the_general_codecs_bytes(twin: str, group: str, topic: str) -> None:
    mod = load_twin("send_codec", twin)
    for req in requests(group, topic):
        for opaque, queue_id in ((1, 0), (2**31 - 1, 7), (123456, 1023)):
            assert encoded(mod, req, opaque, queue_id) == general(req, opaque, queue_id)
    # What the producer itself calls (the loaded twin) writes the same bytes.
    req = requests(group, topic)[2]
    assert req.frame(77, 2) == general(req, 77, 2)


@BOTH
@settings(max_examples=200, deadline=None)
@given(group=TEXT, topic=TEXT, props=TEXT, ints=st.tuples(I64, I64, I64, I64, I64, I64),
       batch=st.booleans(), body=st.binary(max_size=100))
def test_any_header_values_encode_as_the_general_codec(
        group: str, topic: str, props: str, ints: tuple[int, ...], batch: bool,
        body: bytes) -> None:
    code, opaque, sys_flag, born, flag, queue_id = ints
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    req = SendRequest(topic, code, group, sys_flag, born, flag, props, body, ["u"], None)
    want = general(req, opaque, queue_id)
    for twin in ("cython", "python"):
        assert encoded(load_twin("send_codec", twin), req, opaque, queue_id) == want, twin


def test_a_changed_byte_is_noticed(twin: str) -> None:
    """Negative control: the byte comparison above fires on one wrong byte, and so does
    the answer comparison below on one changed digit."""
    mod = load_twin("send_codec", twin)
    req = requests("g", "T")[0]
    good = encoded(mod, req, 5, 1)
    for at in (0, 9, len(good) // 2, len(good) - 1):
        bad = bytearray(good)
        bad[at] ^= 0x01
        assert bytes(bad) != general(req, 5, 1)
    assert encoded(mod, req, 5, 2) != general(req, 5, 1)  # another queue id: other bytes
    frame = encode(success(9, "41", "2"))[4:]
    wrong = frame.replace(b'"41"', b'"42"')
    assert mod.decode_send_answer(wrong) != answer_of(decode_frame(frame))


def test_lone_surrogates_are_refused(twin: str) -> None:
    mod = load_twin("send_codec", twin)
    with pytest.raises(ProtocolError, match="cannot encode the header of a send"):
        mod.encode_send(310, 1, VERSION, "g", "T\ud800", 0, 0, 0, "", False, 0, b"")


# --- answers ---------------------------------------------------------------------------------


def success(opaque: int, offset: str, queue_id: str) -> RemotingCommand:
    return RemotingCommand(ResponseCode.SUCCESS, opaque=opaque).reply(
        ResponseCode.SUCCESS, None,
        {"msgId": "7F000001000027AF0000000000000100", "queueId": queue_id,
         "queueOffset": offset, "putStatus": "PUT_OK", "commitLogOffset": "256"})


def refusal() -> RemotingCommand:
    return RemotingCommand(0, opaque=33).reply(
        ResponseCode.SERVICE_NOT_AVAILABLE,
        "broker-a is a slave; the master of broker-a is 127.0.0.1:10911",
        {"masterAddress": "127.0.0.1:10911", "putStatus": "SERVICE_NOT_AVAILABLE"})


def raw(header: bytes, serialize_type: int = 0) -> bytes:
    """A frame (without its total length) of this header bytes, no body."""
    return struct.pack(">i", serialize_type << 24 | len(header)) + header


def test_success_and_refusal_answers_read_as_the_general_decoder(twin: str) -> None:
    mod = load_twin("send_codec", twin)
    for cmd in (success(9, "41", "2"), refusal(), success(2**31 - 1, "0", "15")):
        frame = encode(cmd)[4:]
        assert mod.decode_send_answer(frame) == answer_of(decode_frame(frame))
        assert mod.decode_send_answer(bytearray(frame)) == answer_of(decode_frame(frame))
        assert mod.decode_send_answer(memoryview(frame)) == answer_of(decode_frame(frame))
    assert mod.decode_send_answer(encode(success(9, "41", "2"))[4:]) == (
        0, 9, 1, None, "7F000001000027AF0000000000000100", "2", "41", "PUT_OK", None)
    assert mod.decode_send_answer(encode(refusal())[4:])[:4] == (
        ResponseCode.SERVICE_NOT_AVAILABLE, 33, 1,
        "broker-a is a slave; the master of broker-a is 127.0.0.1:10911")


@pytest.mark.parametrize("header", [
    # What other brokers write: spaces, other keys, nulls, escapes, non-ASCII, numbers.
    b' { "code" : 0 , "flag":1, "opaque":5, "language":"JAVA", "version":453,'
    b' "serializeTypeCurrentRPC":"JSON", "remark":null, "extFields":{"queueOffset":"7",'
    b' "msgId":"A", "queueId":"1", "transactionId":null} } ',
    b'{"code":0,"flag":1,"opaque":5,"remark":"\\u00e9t\\u00e9 \\"quoted\\"","extFields":{}}',
    b'{"code":0,"flag":1,"opaque":5,"remark":"\xc3\xa9t\xc3\xa9","extFields":null}',
    b'{"code":0,"flag":1,"opaque":5,"extFields":{"queueOffset":7}}',
    b'{"code":0,"flag":1,"opaque":5,"extFields":{"queueOffset":"7","queueOffset":"8"}}',
    b'{"code":0,"flag":1,"opaque":5,"extFields":{"msgId":"A","msgId":null}}',
    b'{"code":0,"flag":1,"opaque":5,"extFields":{"a":"1"},"extFields":{"msgId":"B"}}',
    b'{"code":0.0,"flag":1,"opaque":5}',
    b'{"code":true,"flag":1,"opaque":5}',
    b'{"flag":1,"opaque":5}',
    b'{}',
    b'{"code":-0,"flag":1,"opaque":-17,"unknown":[1,2],"extFields":{"k":{"n":1}}}',
    b'{"code":123456789012345678901,"flag":1,"opaque":5}',
])
def test_unusual_json_reads_as_the_pure_twin_reads_it(twin: str, header: bytes) -> None:
    """The compiled scanner reads the common shape and hands the rest to the pure twin:
    both answer alike, and agree with the general decoder where they answer at all."""
    frame = raw(header)
    got = load_twin("send_codec", twin).decode_send_answer(frame)
    assert got == load_twin("send_codec", "python").decode_send_answer(frame)
    if got is not None:
        assert got == answer_of(decode_frame(frame))


def test_an_answer_has_named_fields_from_either_twin(twin: str) -> None:
    """Both twins make the same NamedTuple, and every way a producer gets an answer (the
    compiled read, the pure one, a decoded command) gives that type: the sender tells an
    answer from a command by it."""
    frame = encode(success(9, "41", "2"))[4:]
    got = load_twin("send_codec", twin).decode_send_answer(frame)
    assert type(got) is Answer
    assert type(answer_of(decode_frame(frame))) is Answer
    assert (got.code, got.opaque, got.queue_id, got.queue_offset, got.put_status) == (
        0, 9, "2", "41", "PUT_OK")
    assert got.msg_id == "7F000001000027AF0000000000000100" and got.master_address is None
    refused = load_twin("send_codec", twin).decode_send_answer(encode(refusal())[4:])
    assert refused.master_address == "127.0.0.1:10911"
    assert refused.put_status == "SERVICE_NOT_AVAILABLE"
    assert Answer._fields[4:] == ("msg_id", "queue_id", "queue_offset", "put_status",
                                  "master_address")


def test_a_binary_header_is_left_to_the_general_decoder(twin: str) -> None:
    cmd = success(9, "41", "2")
    cmd.serialize_type = SERIALIZE_ROCKETMQ
    frame = encode(cmd)[4:]
    assert load_twin("send_codec", twin).decode_send_answer(frame) is None
    assert answer_of(decode_frame(frame)).queue_offset == "41"


@pytest.mark.parametrize("frame, message", [
    (b"\x00\x00", "shorter than its header length"),
    (b"\x00\x00\x00\x20{}", "header length 32 exceeds the frame"),
    (raw(b'{"code":0,'), "header is not JSON"),
    (raw(b'{"code":0} x'), "header is not JSON"),
    (raw(b'{"code":0,"extFields":{"a":"\xff"}}'), "header is not JSON"),
    (raw(b'[1]'), "header JSON is not an object"),
])
def test_broken_answers_are_protocol_errors(twin: str, frame: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        load_twin("send_codec", twin).decode_send_answer(frame)


@BOTH
@settings(max_examples=200, deadline=None)
@given(code=st.integers(-(2**31), 2**31 - 1), opaque=st.integers(0, 2**31 - 1),
       remark=st.none() | TEXT,
       ext=st.dictionaries(st.sampled_from(["msgId", "queueId", "queueOffset", "putStatus",
                                            "masterAddress", "other", "transactionId"]), TEXT))
def test_any_answer_reads_as_the_general_decoder(code: int, opaque: int, remark: str | None,
                                                 ext: dict[str, str]) -> None:
    frame = encode(RemotingCommand(code, opaque=opaque, flag=1, remark=remark,
                                   ext_fields=ext))[4:]
    want = answer_of(decode_frame(frame))
    for twin in ("cython", "python"):
        assert load_twin("send_codec", twin).decode_send_answer(frame) == want, twin


def outcome(mod: object, frame: bytes) -> object:
    try:
        return mod.decode_send_answer(frame)  # type: ignore[attr-defined]
    except ProtocolError:
        return ProtocolError


@BOTH
@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 400))
def test_damaged_answers_read_alike_in_both_twins(edits: list[tuple[int, int]],
                                                  cut: int) -> None:
    """Any damage to an answer's header (changed bytes, a short header): the compiled
    scanner and the pure twin give the same fields, None, or ProtocolError."""
    header = bytearray(encode(refusal())[8:])
    for at, value in edits:
        header[at % len(header)] = value
    frame = raw(bytes(header[:cut] if cut < len(header) else header))
    assert outcome(load_twin("send_codec", "cython"), frame) == outcome(
        load_twin("send_codec", "python"), frame)


# --- answers matched to their sends ----------------------------------------------------------


class Waiting:
    """What a pending send's future does for match_answers (no loop needed)."""

    def __init__(self, cancelled: bool = False) -> None:
        self.cancelled = cancelled
        self.results: list[object] = []

    def done(self) -> bool:
        return self.cancelled or bool(self.results)

    def set_result(self, answer: object) -> None:
        assert not self.done()
        self.results.append(answer)


def matched(twin: str, data: bytes, opaques: list[int], limit: int = 32,
            max_frame: int = 1 << 20) -> tuple[int, int, dict[int, list[object]], list[int]]:
    """(pos, count) of match_answers, what each future got, and the opaques left pending
    (their deadlines go with them)."""
    pending: dict[int, Any] = {o: Waiting() for o in opaques}
    futures = dict(pending)
    deadlines = {o: float(o) for o in opaques}
    pos, count = load_twin("send_codec", twin).match_answers(data, pending, deadlines,
                                                             max_frame, limit)
    assert sorted(deadlines) == sorted(pending)
    return pos, count, {o: f.results for o, f in futures.items()}, sorted(pending)


def test_answers_go_to_their_sends_by_opaque(twin: str) -> None:
    """Whole answers to pending sends reach their futures, as decode_send_answer reads
    them; the first frame that is not one (or not whole, or past the limit) stops it,
    where the general decoder takes over."""
    a, b, c = (encode(success(o, str(o), "1")) for o in (5, 6, 7))
    unusual = raw(b'{"code":0,"flag":1,"opaque":8,"remark":"\\u00e9","extFields":{}}')
    d = struct.pack(">i", len(unusual)) + unusual  # the pure twin reads it, in both twins
    want = {o: [decode_send_answer_of(f)] for o, f in ((5, a), (6, b), (7, c), (8, d))}
    assert matched(twin, a + b + d + c, [5, 6, 7, 8]) == (len(a + b + d + c), 4, want, [])
    assert matched(twin, a + b + c, [5, 6, 7, 8], limit=2) == (
        len(a + b), 2, {5: want[5], 6: want[6], 7: [], 8: []}, [7, 8])
    # Negative controls: each stops it at that frame, nothing after it is taken.
    request = encode(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "g"}))
    binary = success(6, "6", "1")
    binary.serialize_type = SERIALIZE_ROCKETMQ
    for stop in (encode(success(99, "9", "1")),  # nobody waits for it
                 request, encode(binary), request[:-1], request[:3],
                 encode(RemotingCommand(0, opaque=6, flag=0))):  # a request, opaque 6
        assert matched(twin, a + stop + b, [5, 6]) == (len(a), 1, {5: want[5], 6: []}, [6])
    assert matched(twin, a + b, [5, 6], max_frame=len(a) - 5) == (0, 0, {5: [], 6: []}, [5, 6])
    broken = struct.pack(">ii", 12, 40) + b"{}" + b"\x00" * 6  # its header overruns the frame
    assert matched(twin, broken + a, [5]) == (0, 0, {5: []}, [5])


def test_a_send_no_longer_waiting_is_taken_off(twin: str) -> None:
    frame = encode(success(5, "5", "1"))
    pending: dict[int, Any] = {5: Waiting(cancelled=True)}
    assert load_twin("send_codec", twin).match_answers(frame, pending, {5: 1.0}, 1 << 20,
                                                       32) == (len(frame), 1)
    assert pending == {} and pending.get(5) is None


def decode_send_answer_of(frame: bytes) -> object:
    return load_twin("send_codec", "python").decode_send_answer(frame[4:])


@BOTH
@settings(max_examples=200, deadline=None)
@given(kinds=st.lists(st.sampled_from(["answer", "unknown", "request", "binary", "damaged"]),
                      max_size=6),
       cut=st.integers(0, 2000), limit=st.integers(0, 8),
       damage=st.tuples(st.integers(0, 300), st.integers(0, 255)))
def test_matching_stops_alike_in_both_twins(kinds: list[str], cut: int, limit: int,
                                            damage: tuple[int, int]) -> None:
    frames = []
    for i, kind in enumerate(kinds):
        cmd = success(100 + i if kind != "unknown" else 999, str(i), "3")
        if kind == "request":
            cmd.flag = 0
        if kind == "binary":
            cmd.serialize_type = SERIALIZE_ROCKETMQ
        frame = bytearray(encode(cmd))
        if kind == "damaged":
            frame[8 + damage[0] % (len(frame) - 8)] = damage[1]
        frames.append(bytes(frame))
    data = b"".join(frames)[:cut]
    opaques = [100 + i for i in range(len(kinds))]
    assert matched("cython", data, opaques, limit) == matched("python", data, opaques, limit)


# --- UNIQ_KEYs -------------------------------------------------------------------------------

PREFIX = "7F0000010A2BDEADBEEF"


def test_uniq_keys_layout(twin: str) -> None:
    mod = load_twin("send_codec", twin)
    keys = mod.UniqKeys(PREFIX)
    before = time.time_ns() // 1_000_000
    one, many = keys.next(), keys.take(3)
    after = time.time_ns() // 1_000_000
    start, end = mod.month_bounds(before)
    for key in [one, *many]:
        assert re.fullmatch(r"[0-9A-F]{32}", key) and key.startswith(PREFIX)
        assert before - start <= int(key[20:28], 16) <= after - start
    assert [int(k[28:], 16) for k in [one, *many]] == [0, 1, 2, 3]
    assert len({k[:28] for k in many}) == 1  # one clock read for a batch
    assert keys.prefix == PREFIX


def test_uniq_key_counter_wraps_at_16_bits(twin: str) -> None:
    keys = load_twin("send_codec", twin).UniqKeys(PREFIX)
    ids = keys.take(0x10001)
    assert ids[0][28:] == "0000" and ids[0xFFFF][28:] == "FFFF" and ids[0x10000][28:] == "0000"


def test_month_bounds(twin: str) -> None:
    mod = load_twin("send_codec", twin)
    dec31 = 1_703_980_800_000 + 86_399_999  # 2023-12-31 23:59:59.999 UTC
    assert mod.month_bounds(dec31) == (1_701_388_800_000, 1_704_067_200_000)
    assert mod.month_bounds(1_704_067_200_000)[0] == 1_704_067_200_000  # 2024-01-01


@pytest.mark.parametrize("prefix", ["", "7F000001", PREFIX.lower(), PREFIX[:-1] + "G",
                                    " " + PREFIX[1:], PREFIX[:10] + "_" + PREFIX[11:]])
def test_a_bad_prefix_is_refused(twin: str, prefix: str) -> None:
    with pytest.raises(ValueError, match="20 upper-case hex digits"):
        load_twin("send_codec", twin).UniqKeys(prefix)


def test_the_process_ids_come_from_one_maker() -> None:
    """The producer's ids (send_request's shortcut) and new_uniq_key share one counter."""
    a = new_uniq_key()
    req = builder().sender.requests.single("T", b"x", None)
    b = new_uniq_key()
    counters = [int(k[28:], 16) for k in (a, req.uniq_keys[0], b)]
    assert counters[1] == (counters[0] + 1) & 0xFFFF and counters[2] == (counters[1] + 1) & 0xFFFF
    assert orjson.dumps(a)  # ASCII str


# --- plain batches ---------------------------------------------------------------------------


def reference_chunks(bodies: list[bytes], uids: list[str],
                     max_bytes: int) -> list[tuple[bytes, int]]:
    """The producer's general path: one entry per body (_plain_entry), cut by its sizes."""
    out: list[tuple[bytes, int]] = []
    chunk: list[BatchEntry] = []
    size = 0
    for i, (body, uid) in enumerate(zip(bodies, uids)):
        entry, item = _plain_entry(body, 0, uid)
        if chunk and size + item > max_bytes:
            out.append((encode_batch_entries(chunk), i))
            chunk, size = [], 0
        chunk.append(entry)
        size += item
    if chunk:
        out.append((encode_batch_entries(chunk), len(bodies)))
    return out


def codec_chunks(mod: object, bodies: list[bytes], uids: list[str],
                 max_bytes: int) -> list[tuple[bytes, int]]:
    out, start = [], 0
    while start < len(bodies):
        body, start = mod.encode_plain_batch(  # type: ignore[attr-defined]
            bodies, uids, _PLAIN_PROPS[0], _PLAIN_PROPS[1], start, max_bytes)
        out.append((body, start))
    return out


@BOTH
@settings(max_examples=100, deadline=None)
@given(bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=40),
       max_bytes=st.integers(0, 3000))
def test_plain_batches_are_the_general_paths_chunks(bodies: list[bytes], max_bytes: int) -> None:
    uids = new_uniq_keys(len(bodies))
    want = reference_chunks(bodies, uids, max_bytes)
    for twin in ("cython", "python"):
        assert codec_chunks(load_twin("send_codec", twin), bodies, uids, max_bytes) == want


def test_plain_batch_cut_and_bytes(twin: str) -> None:
    mod = load_twin("send_codec", twin)
    bodies = [b"one", b"", "tw\u00f6".encode(), b"x" * 5000]
    uids = new_uniq_keys(4)
    item = 22 + 4 * len(_PLAIN_PROPS[0] + uids[0] + _PLAIN_PROPS[1])
    assert codec_chunks(mod, bodies, uids, 10**9) == reference_chunks(bodies, uids, 10**9)
    # Two entries fit exactly; the big body goes alone, over the limit (the first always does).
    limit = 2 * item + 3
    assert [end for _, end in codec_chunks(mod, bodies, uids, limit)] == [2, 3, 4]
    body, _ = mod.encode_plain_batch(bodies, uids, _PLAIN_PROPS[0], _PLAIN_PROPS[1], 0, 10**9)
    assert [(e.body, e.properties["UNIQ_KEY"]) for e in decode_batch(body)] == list(
        zip(bodies, uids))
    wrong = bytearray(body)
    wrong[-1] ^= 1  # negative control: one changed byte is not the general path's bytes
    assert bytes(wrong) != reference_chunks(bodies, uids, 10**9)[0][0]


def test_plain_batch_refusals(twin: str) -> None:
    mod = load_twin("send_codec", twin)
    head, tail = _PLAIN_PROPS
    with pytest.raises(ValueError, match="outside"):
        mod.encode_plain_batch([b"a"], ["U"], head, tail, 1, 100)
    with pytest.raises(ValueError, match="outside"):
        mod.encode_plain_batch([b"a"], [], head, tail, 0, 100)
    with pytest.raises(TypeError, match="not bytes"):
        mod.encode_plain_batch([b"a", "b"], ["U", "V"], head, tail, 0, 100)
    with pytest.raises(ProtocolError, match="exceed 32767"):
        mod.encode_plain_batch([b"a"], ["U" * 40000], head, tail, 0, 100)


def test_send_batch_of_bodies_cuts_as_of_messages() -> None:
    """RequestBuilder.batches: bodies alone (the codec) and the same bodies as messages
    (entry by entry) make the same chunks."""
    rb = Producer("127.0.0.1:9", "g", max_batch_bytes=700).sender.requests
    bodies = [bytes([65 + i]) * (i * 37 % 200) for i in range(30)]
    fast = list(rb.batches("T", bodies, None))
    slow = list(rb.batches("T", [Message(b) for b in bodies], None))
    assert len(fast) > 3 and [len(r.uniq_keys) for r in fast] == [len(r.uniq_keys) for r in slow]
    for f in fast:
        entries = decode_batch(f.body)
        assert [e.properties["UNIQ_KEY"] for e in entries] == f.uniq_keys
        assert all(e.properties["WAIT"] == "true" and e.flag == 0 for e in entries)
    assert [e.body for f in fast for e in decode_batch(f.body)] == bodies
