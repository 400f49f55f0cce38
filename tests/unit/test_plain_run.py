"""Runs of plain sends, both twins: ``records.write_plain_run`` writes the bytes
``write_message`` writes one by one, stops where it must, and ``send_frames.encode_send_oks``
is ``encode_send_ok`` of each send, concatenated."""
from __future__ import annotations

import struct
from array import array

import pytest

from rmqha._core import load_twin
from rmqha.errors import InvalidMessageError, ProtocolError

HOST_A = bytes([10, 0, 0, 1]) + struct.pack(">i", 1234)
HOST_B = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
TWINS = ("cython", "python")
STORE_TS = 1_700_000_000_123
BORN_DEFAULT = 1_700_000_000_000


def send(topic: str = "TopicA", body: bytes = b"hello", props: bytes = b"KEYS\x01k1\x02",
         born: int = 1_600_000_000_000, flag: int = 0, sys_flag: int = 0,
         reconsume: int = 0, opaque: int = 7, st: int = 1) -> tuple:
    return (11, opaque, st, topic, 0, sys_flag, born, flag, props, reconsume, body, b"",
            None, None, None)


def sample_sends() -> list[tuple]:
    return [send(body=bytes([i]) * (i * 37 % 300), opaque=i, born=0 if i == 3 else 1000 + i,
                 flag=-5 if i == 2 else i, topic="TopicB" if i % 4 == 1 else "TopicA",
                 props=b"" if i == 5 else b"KEYS\x01k%d\x02" % i, reconsume=i % 2,
                 sys_flag=4 if i == 6 else 0)
            for i in range(12)]


def topic_table() -> dict:
    return {"TopicA": b"TopicA", "TopicB": b"TopicB"}


def singles(mod, sends: list[tuple], qids: list[int], size: int, base: int,
            table: dict) -> tuple[bytearray, list[tuple[int, int, int]]]:
    """The one-by-one reference: write_message per send, as CommitLog.append_plain does."""
    buf = bytearray(size)
    pos, placed = 0, []
    for s, qid in zip(sends, qids):
        tb = s[3].encode()
        qoff = table.get((tb, qid), 0)
        n = mod.write_message(buf, pos, tb, s[10], s[8], qid, s[7], qoff, base + pos, s[5],
                              s[6] or BORN_DEFAULT, HOST_A, STORE_TS, HOST_B, s[9], 0)
        table[(tb, qid)] = qoff + 1
        placed.append((base + pos, n, qoff))
        pos += n
    return buf, placed


def run(mod, buf, sends, qids, table, start=0, pos=0, limit=None, base=0, stop=None,
        topics=None):
    n = len(sends)
    outs = array("q", bytes(8 * n)), array("i", bytes(4 * n)), array("q", bytes(8 * n))
    res = mod.write_plain_run(buf, pos, len(buf) if limit is None else limit, base, sends,
                              start, n if stop is None else stop, array("i", qids),
                              topic_table() if topics is None else topics, table,
                              BORN_DEFAULT, HOST_A, STORE_TS, HOST_B, *outs)
    return res, outs


@pytest.mark.parametrize("twin", TWINS)
def test_run_equals_singles(twin: str) -> None:
    mod = load_twin("records", twin)
    sends = sample_sends()
    qids = [i % 3 for i in range(len(sends))]
    ref_table = {(b"TopicA", 1): 40}
    ref, placed = singles(mod, sends, qids, 1 << 14, 4096, dict(ref_table))
    buf = bytearray(1 << 14)
    table = dict(ref_table)
    (count, end, why), (offs, sizes, qoffs) = run(mod, buf, sends, qids, table, base=4096)
    assert (count, why) == (len(sends), mod.RUN_STOP_DONE)
    assert end == sum(p[1] for p in placed)
    assert buf == ref
    assert list(zip(offs, sizes, qoffs)) == placed
    assert table[(b"TopicA", 1)] == 40 + sum(
        1 for s, q in zip(sends, qids) if s[3] == "TopicA" and q == 1)
    # Negative control: another store timestamp gives other bytes, which the check sees.
    other = bytearray(1 << 14)
    mod.write_plain_run(other, 0, len(other), 4096, sends, 0, len(sends),
                        array("i", qids), topic_table(), dict(ref_table), BORN_DEFAULT,
                        HOST_A, STORE_TS + 1, HOST_B, offs, sizes, qoffs)
    assert other != ref


def test_twins_agree() -> None:
    sends = sample_sends()
    qids = [i % 5 for i in range(len(sends))]
    bufs = []
    for twin in TWINS:
        buf = bytearray(1 << 14)
        run(load_twin("records", twin), buf, sends, qids, {})
        bufs.append(buf)
    assert bufs[0] == bufs[1]


@pytest.mark.parametrize("twin", TWINS)
def test_run_stops_at_limit_and_resumes(twin: str) -> None:
    mod = load_twin("records", twin)
    sends = sample_sends()
    qids = [0] * len(sends)
    ref, placed = singles(mod, sends, qids, 1 << 14, 0, {})
    limit = placed[5][0] + placed[5][1] + 3  # six fit, the seventh does not
    buf = bytearray(1 << 14)
    table: dict = {}
    (count, end, why), _ = run(mod, buf, sends, qids, table, limit=limit)
    assert (count, end, why) == (6, placed[6][0], mod.RUN_STOP_FULL)
    assert not any(buf[end:])
    (count, end2, why), _ = run(mod, buf, sends, qids, table, start=6, pos=end)
    assert (count, why) == (6, mod.RUN_STOP_DONE)
    assert buf == ref


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("bad", [
    send(props=b"KEYS\x01a\x02KEYS\x01b\x02"),   # a repeated key: not canonical
    send(props=b"KEYS\x01a"),                    # no closing separator
    send(topic="Unknown"),                       # no topic bytes yet
    send(sys_flag=0x10),                         # IPv6 hosts
    send(reconsume=-1),
    send(flag=1 << 31),
    send(born=-1),
    send(body=bytearray(b"x")),                  # not bytes: one by one
])
def test_run_leaves_what_a_check_refuses(twin: str, bad: tuple) -> None:
    mod = load_twin("records", twin)
    sends = [send(), send(), bad, send()]
    buf = bytearray(4096)
    table: dict = {}
    (count, end, why), (offs, _, qoffs) = run(mod, buf, sends, [0, 1, 0, 0], table)
    assert (count, why) == (2, mod.RUN_STOP_SINGLE)
    assert not any(buf[end:])
    assert table == {(b"TopicA", 0): 1, (b"TopicA", 1): 1}
    # Negative control: the same run with a good third send takes all four.
    (count, _, why), _ = run(mod, bytearray(4096), [send()] * 4, [0, 1, 0, 0], {})
    assert (count, why) == (4, mod.RUN_STOP_DONE)


@pytest.mark.parametrize("twin", TWINS)
def test_run_leaves_a_topic_ending_in_nul_to_the_single_path(twin: str) -> None:
    """A record without properties ends in its topic's last byte (then the zero length):
    a run never writes one whose topic ends in NUL; the single path refuses it by name."""
    mod = load_twin("records", twin)
    sends = [send(), send(topic="TopicN", props=b""), send()]
    topics = {**topic_table(), "TopicN": b"TopicN\x00"}
    buf = bytearray(4096)
    (count, end, why), _ = run(mod, buf, sends, [0, 0, 0], {}, topics=topics)
    assert (count, why) == (1, mod.RUN_STOP_SINGLE) and not any(buf[end:])
    with pytest.raises(InvalidMessageError, match="^topic ends in a NUL byte: recovery tells"):
        mod.write_message(buf, end, b"TopicN\x00", b"hello", b"", 0, 0, 0, end, 0, 1, HOST_A,
                          1, HOST_B, 0, 0)
    # Negative control: the same topic without the NUL is taken with the rest.
    topics["TopicN"] = b"TopicN"
    (count, _, why), _ = run(mod, bytearray(4096), sends, [0, 0, 0], {}, topics=topics)
    assert (count, why) == (3, mod.RUN_STOP_DONE)


@pytest.mark.parametrize("twin", TWINS)
def test_run_too_large_and_bad_arrays(twin: str) -> None:
    mod = load_twin("records", twin)
    sends = [send(), send(body=b"x" * 500)]
    n = len(sends)
    outs = array("q", bytes(8 * n)), array("i", bytes(4 * n)), array("q", bytes(8 * n))
    res = mod.write_plain_run(bytearray(4096), 0, 4096, 0, sends, 0, n, array("i", [0, 0]),
                              topic_table(), {}, 0, HOST_A, 0, HOST_B, *outs, 300)
    assert res[0] == 1 and res[2] == mod.RUN_STOP_SINGLE
    with pytest.raises(mod.StoreError):
        mod.write_plain_run(bytearray(4096), 0, 4096, 0, sends, 0, n, array("i", [0]),
                            topic_table(), {}, 0, HOST_A, 0, HOST_B, *outs)
    with pytest.raises(mod.StoreError):
        mod.write_plain_run(bytearray(4096), 0, 4096, 0, sends, 0, 3, array("i", [0, 0]),
                            topic_table(), {}, 0, HOST_A, 0, HOST_B, *outs)


@pytest.mark.parametrize("twin", TWINS)
def test_run_key_table_full(twin: str) -> None:
    mod = load_twin("records", twin)
    n = mod.RUN_MAX_KEYS + 2
    sends = [send()] * n
    table: dict = {}
    (count, _, why), _ = run(mod, bytearray(1 << 14), sends, list(range(n)), table)
    assert (count, why) == (mod.RUN_MAX_KEYS, mod.RUN_STOP_SINGLE)
    assert len(table) == mod.RUN_MAX_KEYS


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("status", ["PUT_OK", "FLUSH_SLAVE_TIMEOUT"])
def test_encode_send_oks_equals_each(twin: str, status: str) -> None:
    mod = load_twin("send_frames", twin)
    sends = [send(opaque=o, st=st) for o, st in ((1, 0), (-7, 1), (2**31 - 1, 1), (5, 0))]
    qids = array("i", [0, 3, 17, 2**31 - 1])
    qoffs = array("q", [0, 9, 2**40, 12])
    offs = array("q", [0, 255, 2**50 + 3, 77])
    prefix = "7F0000010000115F"
    want = b"".join(mod.encode_send_ok(s[2], s[1], 453, f"{prefix}{o:016X}", q, qo, status, o)
                    for s, q, qo, o in zip(sends, qids, qoffs, offs))
    assert mod.encode_send_oks(sends, 0, 4, 453, prefix, qids, qoffs, offs, status) == want
    part = mod.encode_send_oks(sends, 1, 3, 453, prefix, qids, qoffs, offs, status)
    assert part == b"".join(
        mod.encode_send_ok(s[2], s[1], 453, f"{prefix}{o:016X}", q, qo, status, o)
        for s, q, qo, o in list(zip(sends, qids, qoffs, offs))[1:3])
    # Negative control: another status is other bytes.
    assert mod.encode_send_oks(sends, 0, 4, 453, prefix, qids, qoffs, offs, "X") != want
    assert mod.encode_send_oks(sends, 2, 2, 453, prefix, qids, qoffs, offs, status) == b""


@pytest.mark.parametrize("twin", TWINS)
def test_encode_send_oks_refuses(twin: str) -> None:
    mod = load_twin("send_frames", twin)
    a = array("q", [0])
    with pytest.raises(ProtocolError, match="serialize type 2"):
        mod.encode_send_oks([send(st=2)], 0, 1, 1, "P", array("i", [0]), a, a, "PUT_OK")
    with pytest.raises(ProtocolError, match="outside"):
        mod.encode_send_oks([send()], 0, 2, 1, "P", array("i", [0]), a, a, "PUT_OK")
