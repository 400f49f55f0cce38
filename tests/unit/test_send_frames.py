"""The broker's plain-send frames (rmqha._core.send_frames twins): one body over both twins.

What a twin takes as a plain send must be exactly what the ordinary codec and header parse
make of the frame (checked against them, and over random mutations of real frames, where
the twins must also agree with each other); everything else is left to the codec, in
order; the SUCCESS answer is byte for byte the codec's.
"""
from __future__ import annotations

import random
import struct

import pytest

from rmqha._core import load_twin
from rmqha.errors import ProtocolError
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    VERSION,
    RemotingCommand,
    decode_frame,
    encode,
)
from rmqha.protocol.headers import SendHeader
from rmqha.security.signature import compute_signature, sign, signed_content, signed_fields

REFUSE = (b"DELAY\x01", b"TIMER_", b"TRAN_PREPARED_QUEUE_OFFSET")
PROPS = "KEYS\x01k1\x02UNIQ_KEY\x01AB12\x02TAGS\x01tagA\x02WAIT\x01true\x02"


def send_cmd(code: int = RequestCode.SEND_MESSAGE_V2, st: int = SERIALIZE_JSON,
             body: bytes = b"hello", **fields: str) -> RemotingCommand:
    h = SendHeader("pg", "TopicA", 3, 0, 1700000000123, 7, PROPS, 2, False)
    ext = h.build(v2=code != RequestCode.SEND_MESSAGE)
    for k, v in fields.items():
        if v is None:
            ext.pop(k, None)
        else:
            ext[k] = v
    cmd = RemotingCommand.request(code, ext, body)
    cmd.serialize_type = st
    cmd.opaque = 4242  # fixed: the mutation test's frames must not depend on test order
    return cmd


def frame_of(cmd: RemotingCommand) -> bytes:
    return encode(cmd)[4:]


def expected(frame: bytes) -> tuple | None:
    """What the ordinary path makes of a frame, as a SendFrame (None: it raises)."""
    cmd = decode_frame(frame)
    h = SendHeader.parse(cmd.ext_fields, v2=cmd.code != RequestCode.SEND_MESSAGE)
    hlen = struct.unpack_from(">i", frame, 0)[0] & 0xFFFFFF
    return (cmd.code, cmd.opaque, cmd.serialize_type, h.topic, h.queue_id, h.sys_flag,
            h.born_timestamp, h.flag, h.properties.encode(), h.reconsume_times, cmd.body,
            bytes(frame[:4 + hlen]), None, None, None)


@pytest.mark.parametrize("st", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
                                  RequestCode.SEND_BATCH_MESSAGE], ids=["v1", "v2", "batch"])
def test_a_plain_send_parses_as_the_codec_reads_it(twin: str, st: int, code: int) -> None:
    mod = load_twin("send_frames", twin)
    frame = frame_of(send_cmd(code, st, body=b"x" * 300))
    got = mod.parse_send(frame, REFUSE)
    assert got is not None and got == expected(frame)
    assert got[3] == "TopicA" and got[4] == 3 and got[10] == b"x" * 300
    # A frame rebuilt from the head and body is the frame.
    assert got[11] + got[10] == frame


def test_json_quirks_of_other_clients_parse_the_same(twin: str) -> None:
    """Numbers for header values (C++), escapes, whitespace, unicode, missing fields."""
    mod = load_twin("send_frames", twin)
    header = ('{ "code" : 310, "language":"CPP", "extFields": {"a":"g", "b":"T\\u00e9\\/x",'
              ' "e": 2, "f":0, "g":-5, "i":"K\\u0001v\\u0002\\"q\\u0001\\\\\\u0002",'
              ' "zz": 12, "n":"broker-a"}, "flag":0,"opaque":-7,"remark":null,'
              ' "serializeTypeCurrentRPC":"JSON", "version": 453 }\n').encode()
    frame = struct.pack(">i", len(header)) + header + b"body"
    got = mod.parse_send(frame, REFUSE)
    assert got == expected(frame)
    assert got is not None and got[3] == "T\u00e9/x" and got[4] == 2 and got[6] == -5
    assert got[7] == 0 and got[9] == 0  # absent: 0 (the queue id: -1)
    bare = b'{"code":10,"extFields":{"topic":"T"}}'
    cpp = b'{"code":10,"extFields":{"topic":"T"},"remark":"","version":63}'  # the C++ client
    assert mod.parse_send(struct.pack(">i", len(cpp)) + cpp, REFUSE) == expected(
        struct.pack(">i", len(cpp)) + cpp)
    got = mod.parse_send(struct.pack(">i", len(bare)) + bare, REFUSE)
    assert got is not None and got[4] == -1 and got[8] == b"" and got[1] == 0


NOT_PLAIN = {
    "transaction": dict(f="4"),
    "rollback bits": dict(f="12"),
    "delay": dict(i="DELAY\x013\x02"),
    "timer": dict(i="TIMER_DELIVER_MS\x011\x02"),
    "timer in a value": dict(i="K\x01TIMER_x\x02"),
    "committed mark": dict(i="TRAN_PREPARED_QUEUE_OFFSET\x011\x02"),
    "batch": dict(m="true"),
    "batch 1": dict(m="1"),
    "no topic": dict(b=None),
    "empty topic": dict(b=""),
    "bad int": dict(e="3x"),
    "plus sign": dict(e="+3"),
    "spaces": dict(e=" 3"),
    "too many digits": dict(g="1" * 19),
    "bad max reconsume": dict(l="--1"),
    "bad utf-8": dict(b="T\udcff"),
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN))
def test_what_is_not_a_plain_send_is_left_to_the_codec(twin: str, case: str) -> None:
    mod = load_twin("send_frames", twin)
    for st in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        fields = NOT_PLAIN[case]
        try:
            frame = frame_of(send_cmd(st=st, **fields))
        except (ProtocolError, UnicodeEncodeError):
            continue  # the codec cannot even write it
        assert mod.parse_send(frame, REFUSE) is None, (case, st)
    # The control: the same frame without the fault is taken.
    assert mod.parse_send(frame_of(send_cmd()), REFUSE) is not None


def raw_json(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">i", len(header)) + header + body


MALFORMED_JSON = [
    b'{"code":310,"extFields":{"b":"T"},"flag":1}',  # a response
    b'{"code":310,"extFields":{"b":"T"},"flag":2}',  # one-way
    b'{"code":311,"extFields":{"b":"T"}}',  # not a send
    b'{"extFields":{"b":"T"},"code":310}',  # extFields before the code
    b'{"code":310,"extFields":{"b":"T","b":"U"}}',  # a repeated field
    b'{"code":310,"code":310,"extFields":{"b":"T"}}',
    b'{"code":310.0,"extFields":{"b":"T"}}',
    b'{"code":310,"extFields":{"b":"T","e":1.5}}',
    b'{"code":310,"extFields":{"b":"T","e":01}}',
    b'{"code":310,"extFields":{"b":"T","e":-0}}',
    b'{"code":310,"extFields":{"b":"T","e":true}}',
    b'{"code":310,"extFields":{"b":"T","e":null}}',
    b'{"code":310,"extFields":{"b":"T\\ud800"}}',  # a surrogate escape
    b'{"code":310,"extFields":{"b":"T\\x"}}',  # a bad escape
    b'{"code":310,"extFields":{"b":"T\x01"}}',  # a raw control character
    b'{"code":310,"extFields":{"b":"T\xc3"}}',  # bad UTF-8
    b'{"code":310,"extFields":{"b":"T\xed\xa0\x80"}}',  # an encoded surrogate
    b'{"code":310,"extFields":{"b":"T"},"remark":"r"}',
    b'{"code":310,"extFields":{"b":"T"},"other":1}',
    b'{"code":310,"extFields":{"b":"T"}} x',
    b'{"code":310,"extFields":{"b":"T"},}',
    b'{"code":310,"extFields":{}}',
    b'{"code":310,"opaque":2147483648,"extFields":{"b":"T"}}',
    b'{"code":310,"extFields":{"b":"T"}',
    b'[310]',
    b'',
]


@pytest.mark.parametrize("header", MALFORMED_JSON)
def test_odd_or_malformed_json_headers_are_not_plain(twin: str, header: bytes) -> None:
    mod = load_twin("send_frames", twin)
    assert mod.parse_send(raw_json(header), REFUSE) is None


def test_odd_or_malformed_frames_are_not_plain(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    good = frame_of(send_cmd(st=SERIALIZE_ROCKETMQ))
    assert mod.parse_send(good, REFUSE) is not None  # the control
    hlen = struct.unpack_from(">i", good, 0)[0] & 0xFFFFFF
    bad_type = struct.pack(">i", (2 << 24) | hlen) + good[4:]
    too_long = struct.pack(">i", (1 << 24) | (len(good))) + good[4:]
    with_remark = RemotingCommand(**{**send_cmd(st=SERIALIZE_ROCKETMQ).__dict__, "remark": "r"})
    for frame in (b"", b"\x00\x00", bad_type, too_long, good[:4 + hlen - 1],
                  frame_of(with_remark)):
        assert mod.parse_send(frame, REFUSE) is None


def test_twins_agree_with_each_other_and_the_codec_on_mutated_frames() -> None:
    pure, comp = load_twin("send_frames", "python"), load_twin("send_frames", "cython")
    rng = random.Random(29)
    seeds = [frame_of(send_cmd(code, st)) for code in (10, 310, 320) for st in (0, 1)]
    seeds.append(frame_of(send_cmd(320, m="true")))
    seeds.append(raw_json(b'{"code":310,"extFields":{"b":"T","e":"1","i":"A\\u0001b\\u0002"}}'))
    taken = 0
    for _ in range(6000):
        frame = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(frame))
            op = rng.random()
            if op < 0.5:
                frame[i] = rng.choice(b'0129"\\:,{}-. \x01\x02abefu\x80\xff')
            elif op < 0.75:
                del frame[i]
            else:
                frame.insert(i, rng.randrange(256))
        raw = bytes(frame)
        got = pure.parse_send(raw, REFUSE)
        assert comp.parse_send(raw, REFUSE) == got, raw
        if got is not None:
            taken += 1
            assert got == expected(raw), raw
    assert taken > 400  # the mutations leave many frames plain: the comparison ran


def test_scan_splits_a_read_in_order_and_leaves_the_rest(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    plain = encode(send_cmd())
    other = encode(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
    batch = encode(send_cmd(m="true"))
    buf = bytearray(plain + other + batch + plain + plain[:10])
    items, used = mod.scan(buf, 1 << 20, decode_frame, REFUSE)
    assert used == len(buf) - 10
    assert [type(x).__name__ for x in items] == ["tuple", "RemotingCommand",
                                                 "RemotingCommand", "tuple"]
    assert items[1].code == RequestCode.GET_ROUTEINFO_BY_TOPIC and items[2].ext_fields["m"] == "true"
    assert mod.scan(b"\x00\x00", 100, decode_frame, REFUSE) == ([], 0)


@pytest.mark.parametrize("total", [3, -1, 1001])
def test_scan_refuses_a_frame_length_out_of_bounds(twin: str, total: int) -> None:
    mod = load_twin("send_frames", twin)
    buf = encode(send_cmd(body=b"")) + struct.pack(">i", total) + b"\x00" * 8
    with pytest.raises(ProtocolError, match=f"frame length {total} outside \\[4, 1000\\]"):
        mod.scan(buf, 1000, decode_frame, REFUSE)


def test_scan_passes_the_codec_error_of_another_frame_through(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    bad = raw_json(b'{"code":')
    with pytest.raises(ProtocolError, match="not JSON"):
        mod.scan(struct.pack(">i", len(bad)) + bad, 1000, decode_frame, REFUSE)


@pytest.mark.parametrize("st", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
@pytest.mark.parametrize("opaque", [0, 17, 2**31 - 1, -2**31])
def test_the_answer_is_the_codecs_byte_for_byte(twin: str, st: int, opaque: int) -> None:
    mod = load_twin("send_frames", twin)
    req = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, serialize_type=st)
    ids = "7F00000100002A9F0000000000001234,7F00000100002A9F0000000000001300"
    ext = {"msgId": ids, "queueId": "3", "queueOffset": "123456789012",
           "putStatus": "PUT_OK", "commitLogOffset": "4660"}
    resp = req.reply(0, None, ext)
    resp.flag |= FLAG_RESPONSE
    want = encode(resp)
    assert mod.encode_send_ok(st, opaque, VERSION, ids, 3, 123456789012, "PUT_OK", 4660) == want
    # The control: another offset is other bytes.
    assert mod.encode_send_ok(st, opaque, VERSION, ids, 3, 123456789013, "PUT_OK", 4660) != want


def test_the_answer_refuses_an_unknown_serialize_type(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    with pytest.raises(ProtocolError, match="serialize type 2"):
        mod.encode_send_ok(2, 1, VERSION, "X", 0, 0, "PUT_OK", 0)


@pytest.mark.parametrize("st", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
def test_a_batch_is_plain_only_as_send_batch_message_and_uncompressed(twin: str, st: int) -> None:
    mod = load_twin("send_frames", twin)
    batch = RequestCode.SEND_BATCH_MESSAGE
    for value in ("true", "1", "false", "0", ""):
        frame = frame_of(send_cmd(batch, st, m=value))
        assert mod.parse_send(frame, REFUSE) == expected(frame), value
    for fields in (dict(m="yes"), dict(f="1"), dict(f="5"), dict(f="4")):
        assert mod.parse_send(frame_of(send_cmd(batch, st, **fields)), REFUSE) is None, fields
    # The control: compression keeps only a batch off (a single message is stored as it came).
    assert mod.parse_send(frame_of(send_cmd(st=st, f="1")), REFUSE) is not None


def test_a_one_way_flag_is_what_keeps_a_frame_off(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    cmd = send_cmd()
    assert mod.parse_send(frame_of(cmd), REFUSE) is not None
    cmd.flag |= FLAG_ONEWAY
    assert mod.parse_send(frame_of(cmd), REFUSE) is None


# --- signed sends (RocketMQ ACL 1.0) ------------------------------------------------------


def signed_frame(code: int = RequestCode.SEND_MESSAGE_V2, st: int = SERIALIZE_JSON,
                 version: int = VERSION, body: bytes = b"hello", **fields: str) -> bytes:
    cmd = send_cmd(code, st, body, **fields)
    cmd.ext_fields = sign(cmd.ext_fields, body, "producer-ak", "secret-key-1")
    cmd.version = version
    return frame_of(cmd)


def signing_of(frame: bytes) -> tuple:
    """What today's ACL check reads and signs for a frame: (AccessKey, Signature, the
    content before the body)."""
    cmd = decode_frame(frame)
    sig = cmd.ext_fields.get("Signature")
    return (cmd.ext_fields.get("AccessKey"), None if sig is None else sig.encode(),
            signed_fields(cmd.ext_fields, cmd.version))


@pytest.mark.parametrize("st", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
                                  RequestCode.SEND_BATCH_MESSAGE], ids=["v1", "v2", "batch"])
@pytest.mark.parametrize("version", [VERSION, 401, 400, 0])
def test_the_signed_content_is_what_the_acl_check_signs(twin: str, st: int, code: int,
                                                         version: int) -> None:
    mod = load_twin("send_frames", twin)
    extra = {"OnsChannel": "ALIYUN", "_UNIQUE_KEY_QUERY": "uniq-flag", "zz": "caf\u00e9 \"q\"\\",
             "Z": "\u4e2d", "a0": "1"}
    frame = signed_frame(code, st, version, body=b"\x00body\xff" * 50, **extra)
    got = mod.parse_send(frame, REFUSE, True)
    assert got is not None and got[:12] == expected(frame)[:12]
    assert got[12:] == signing_of(frame)
    # The fields, then the body (hashed where it is): the content the ACL check signs.
    cmd = decode_frame(frame)
    content = got[14] + got[10]
    assert got[12] == "producer-ak" and content == signed_content(cmd.ext_fields, cmd.body,
                                                                  cmd.version)
    assert got[10] == b"\x00body\xff" * 50 and not got[14].endswith(b"\xff")
    # Old clients signed without _UNIQUE_KEY_QUERY; its value is signed otherwise.
    assert (b"uniq-flag" in got[14]) == (version > 400)
    # The signature verifies over it with the account's secret (and only with it).
    assert (compute_signature(content, "secret-key-1").encode() == got[13]) == (version > 400)
    assert compute_signature(content, "secret-key-2").encode() != got[13]
    # Unsigned parsing leaves all three out.
    assert mod.parse_send(frame, REFUSE)[12:] == (None, None, None)


def test_json_escapes_and_numbers_in_values_are_signed_as_decoded(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    header = ('{"code":310,"version":453,"extFields":{"b":"T\\u00e9\\/x","e":2,'
              '"AccessKey":"a\\u0062c","g":-5,"i":"K\\u0001v\\u0002","Signature":"s\\/ig=",'
              '"OnsChannel":"\\"\\\\\\n"}}').encode()
    frame = struct.pack(">i", len(header)) + header + b"body"
    got = mod.parse_send(frame, REFUSE, True)
    assert got is not None and got[12:] == signing_of(frame)
    assert got[12] == "abc" and got[13] == b"s/ig="


UNUSUAL = {
    "escaped key": b'"\\u0041ccessKey":"x",',
    "non-ASCII key": b'"k\xc3\xa9":"x",',
    "repeated key": b'"zz":"1","zz":"2",',
    "too many": b"".join(b'"k%d":"v",' % i for i in range(61)),  # 65 entries
}


@pytest.mark.parametrize("case", sorted(UNUSUAL))
def test_an_unusual_header_is_left_to_the_ordinary_check(twin: str, case: str) -> None:
    mod = load_twin("send_frames", twin)

    def frame_with(entries: bytes) -> bytes:
        header = (b'{"code":310,"extFields":{' + entries
                  + b'"b":"T","AccessKey":"ak","Signature":"c2ln","f":0}}')
        return struct.pack(">i", len(header)) + header + b"x"

    got = mod.parse_send(frame_with(UNUSUAL[case]), REFUSE, True)
    assert got is not None and got[12:] == (None, None, None)  # plain, but not signed here
    control = mod.parse_send(frame_with(b'"k":"x",'), REFUSE, True)
    assert control is not None and control[12:] == signing_of(frame_with(b'"k":"x",'))


def test_a_binary_header_past_the_entry_limit_or_with_a_non_ascii_key(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    many = {f"k{i}": "v" for i in range(mod.MAX_SIGNED_FIELDS)}
    assert mod.parse_send(signed_frame(st=SERIALIZE_ROCKETMQ, **many), REFUSE, True)[12:] == (
        None, None, None)
    odd = signed_frame(st=SERIALIZE_ROCKETMQ, **{"k\u00e9": "v"})
    assert mod.parse_send(odd, REFUSE, True)[12:] == (None, None, None)
    fewer = signed_frame(st=SERIALIZE_ROCKETMQ, **dict(list(many.items())[:40]))
    assert mod.parse_send(fewer, REFUSE, True)[12:] == signing_of(fewer)  # the control


@pytest.mark.parametrize("st", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
def test_a_missing_access_key_or_signature_is_none(twin: str, st: int) -> None:
    mod = load_twin("send_frames", twin)
    no_sig = send_cmd(st=st, AccessKey="producer-ak")
    assert mod.parse_send(frame_of(no_sig), REFUSE, True)[12:] == ("producer-ak", None, None)
    no_key = send_cmd(st=st, Signature="c2ln")
    assert mod.parse_send(frame_of(no_key), REFUSE, True)[12:] == (None, b"c2ln", None)
    assert mod.parse_send(frame_of(send_cmd(st=st)), REFUSE, True)[12:] == (None, None, None)


def test_twins_agree_on_the_signing_of_mutated_frames() -> None:
    pure, comp = load_twin("send_frames", "python"), load_twin("send_frames", "cython")
    rng = random.Random(31)
    seeds = [signed_frame(code, st, version, OnsChannel="ALIYUN", _UNIQUE_KEY_QUERY="true")
             for code in (10, 310) for st in (0, 1) for version in (VERSION, 400)]
    signed = 0
    for _ in range(4000):
        frame = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 2)):
            i = rng.randrange(len(frame))
            if rng.random() < 0.6:
                frame[i] = rng.choice(b'0129"\\:,{}-. \x01abAKSu\x80')
            else:
                del frame[i]
        raw = bytes(frame)
        got = pure.parse_send(raw, REFUSE, True)
        assert comp.parse_send(raw, REFUSE, True) == got, raw
        if got is not None and got[14] is not None:
            signed += 1
            assert got[12:] == signing_of(raw), raw
    assert signed > 300  # many mutations leave a signed plain send: the comparison ran


def test_scan_signs_when_asked(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    frame = signed_frame()
    buf = struct.pack(">i", len(frame)) + frame
    (item,), _ = mod.scan(buf, 1 << 20, decode_frame, REFUSE, True)
    assert item[12:] == signing_of(frame)
    (item,), _ = mod.scan(buf, 1 << 20, decode_frame, REFUSE)
    assert item[12:] == (None, None, None)
