"""The message index (rmqha.store.message_index) on a real commitlog, and lookups by
key and unique id over the wire (QUERY_MESSAGE with RocketMQ's field names,
VIEW_MESSAGE_BY_ID), also after a broker restart."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rmqha._core import load_twin
from rmqha.client import Message, Producer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import decode_records, parse_offset_msg_id
from rmqha.store.message_index import MessageIndex
from rmqha.net.client import RemotingClient
from rmqha.protocol.command import RemotingCommand
from rmqha.store import CommitLog
from test_messaging import Env, LocalBroker, create_topic, run
from tmpfs import grow, tmpfs

SEG = 64 * 1024


def _fill(cl: CommitLog, n: int, start: int = 0) -> dict[str, list[int]]:
    """n records on topics A/B with KEYS "k<i%7> all" and UNIQ_KEY u<i>; key -> offsets."""
    where: dict[str, list[int]] = {}
    for i in range(start, start + n):
        topic = "A" if i % 2 else "B"
        off, _ = cl.append(topic, b"body%d" % i, 0, {"KEYS": f"k{i % 7} all", "UNIQ_KEY": f"u{i}"})
        for key in (f"k{i % 7}", "all", f"u{i}"):
            where.setdefault(f"{topic}#{key}", []).append(off)
    return where


def _found(idx: MessageIndex, topic: str, key: str) -> list[int]:
    return list(idx.candidates(topic, key))


_ODD_PROPS = [
    {"UNIQ_KEY": "U1", "KEYS": "a b  a U1 " + "x" * 2000},  # repeats, empty words, a long key
    {"XKEYS": "not-a-key", "KEYS": "real"},                  # a name that ends in KEYS
    {"TAGS": "t"},                                            # no keys at all
    {"KEYS": " ".join(f"k{i}" for i in range(100))},          # more words than are indexed
    {},                                                       # no properties
]


def test_twins_write_identical_index_bytes(tmp_path: Path, twin: str) -> None:
    """Both twins of the scan hot path give the same results and the same file bytes, on
    ordinary and odd records, a skipped topic, a file filling up and a partial record."""
    ref = load_twin("message_index", "python")
    mine = load_twin("message_index", twin)
    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        for i in range(60):
            cl.append("T" if i % 5 else "SKIP", b"b%d" % i, 0, _ODD_PROPS[i % 5] if i % 3 == 0
                      else {"UNIQ_KEY": f"u{i}", "KEYS": f"k{i % 4} all"})
        view = bytes(cl.read(0, cl.max_offset))
    finally:
        cl.close()
    size = 128 + 4 * 7 + 24 * 50
    for end in (len(view), len(view) - 10):  # the second ends inside the last record
        out = []
        for impl in (ref, mine):
            mm = bytearray(size)
            res = impl.add_records(view, 0, end, 1000, mm, 7, 128 + 4 * 7, 50, 0, 0, 0,
                                   (b"SKIP",), 1024)
            out.append((res, bytes(mm)))
        assert out[0] == out[1]
        (pos, count, _, _, added, status), _ = out[0]
        assert status == ref.FULL and count == added <= 50 and 0 < pos < end
    assert mine.prop(b"a\x01b\x02KEYS\x01x y\x02", b"KEYS\x01") == b"x y"
    assert mine.prop(b"XKEYS\x01no", b"KEYS\x01") is None
    with pytest.raises(ValueError):
        mine.add_records(view, 0, len(view), 0, bytearray(100), 7, 156, 50, 0, 0, 0, (), 1024)


def test_twins_agree_on_damaged_records(tmp_path: Path, twin: str) -> None:
    """Bytes changed at random (lengths included): both twins stop or skip alike, and
    never read outside the record."""
    import random

    ref = load_twin("message_index", "python")
    mine = load_twin("message_index", twin)
    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        for i in range(20):
            cl.append("T", b"b%d" % i, 0, {"UNIQ_KEY": f"u{i}", "KEYS": f"k{i} x"})
        clean = bytes(cl.read(0, cl.max_offset))
    finally:
        cl.close()
    rng = random.Random(7)
    size = 128 + 4 * 5 + 24 * 200
    for _ in range(300):
        data = bytearray(clean)
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        end = rng.randrange(len(data) + 1)
        out = []
        for impl in (ref, mine):
            mm = bytearray(size)
            out.append((impl.add_records(bytes(data), 0, end, 0, mm, 5, 148, 200, 0, 0, 0,
                                         (), 1024), bytes(mm)))
        assert out[0] == out[1]


def test_index_finds_keys_across_files_and_segments(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        where = _fill(cl, 600)
        idx = MessageIndex(tmp_path / "idx", slots_per_file=64, entries_per_file=500)
        idx.advance(cl, cl.max_offset)
        assert len(idx.files) >= 3  # 1800 entries, 500 per file
        assert idx.indexed_offset == cl.max_offset
        for key in ("A#k3", "B#all", "A#u301", "B#u300"):
            topic, k = key.split("#")
            got = _found(idx, topic, k)
            # Candidates: every record with that hash, newest first (collisions are
            # filtered by the lookup, which reads the record).
            assert set(where[key]) <= set(got)
            assert got == sorted(got, reverse=True)
        assert _found(idx, "A", "nope") == [] or all(
            o not in where.get("A#nope", []) for o in _found(idx, "A", "nope"))
        idx.close()
        # Reopened cleanly: the same answers, nothing rescanned.
        idx = MessageIndex(tmp_path / "idx", slots_per_file=64, entries_per_file=500)
        assert idx.indexed_offset == cl.max_offset
        assert set(where["A#k3"]) <= set(_found(idx, "A", "k3"))
        idx.close()
    finally:
        cl.close()


def test_index_recovers_after_an_unclean_stop_and_follows_truncation(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        where = _fill(cl, 200)
        idx = MessageIndex(tmp_path / "idx", slots_per_file=32, entries_per_file=4096,
                           flush_interval_s=3600)
        idx.advance(cl, cl.max_offset)
        idx.flush()  # the checkpoint: 200 records
        checkpoint = idx.indexed_offset
        more = _fill(cl, 100, start=200)
        idx.advance(cl, cl.max_offset)  # not checkpointed
        # A crash: the files as they are now (unclean flag set, entries past the checkpoint).
        shutil.copytree(tmp_path / "idx", tmp_path / "crashed")
        idx.close()
        rec = MessageIndex(tmp_path / "crashed", slots_per_file=32, entries_per_file=4096)
        assert rec.indexed_offset == checkpoint  # only what the checkpoint vouches for
        rec.advance(cl, cl.max_offset)  # rescanned from the checkpoint
        for key, offsets in {**where, **more}.items():
            topic, k = key.split("#")
            assert set(offsets) <= set(_found(rec, topic, k)), key
        # A slave cuts its log: entries at or past the cut go, the chains stay whole.
        cut = more["A#u201"][0]
        rec.truncate(cut)
        assert rec.indexed_offset == cut
        assert _found(rec, "A", "u201") == [] and _found(rec, "B", "u202") == []
        assert set(where["B#all"]) <= set(_found(rec, "B", "all"))
        assert all(o < cut for o in _found(rec, "B", "all"))
        rec.close()
    finally:
        cl.close()


def _table_bytes(directory: Path) -> dict[str, bytes]:
    """Slots and entries of every index file (the header's timestamps may differ)."""
    return {p.name: p.read_bytes()[128:] for p in sorted(directory.glob("[0-9]" * 20))}


@pytest.mark.parametrize("boot", ["same", "other"])
def test_an_unclean_open_undoes_exactly_what_followed_the_checkpoint(tmp_path: Path, boot: str,
                                                                     caplog) -> None:
    """After a process crash the entries written since the checkpoint are unlinked one by
    one (work bounded by them, not by the file); after a reboot every chain is rebuilt from
    the checkpointed entries.  Either way the table is, byte for byte, the one the
    checkpoint vouched for."""
    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        _fill(cl, 300)
        idx = MessageIndex(tmp_path / "idx", slots_per_file=32, entries_per_file=4096,
                           flush_interval_s=3600)
        idx.advance(cl, cl.max_offset)
        idx.flush()
        at_checkpoint = _table_bytes(tmp_path / "idx")
        before = idx.stats()["entries"]
        _fill(cl, 40, start=300)
        idx.advance(cl, cl.max_offset)
        later = idx.stats()["entries"] - before
        shutil.copytree(tmp_path / "idx", tmp_path / "crashed")
        idx.close()
        if boot == "other":
            for f in (tmp_path / "crashed").glob("[0-9]" * 20):
                with open(f, "r+b") as fh:
                    fh.seek(72)
                    fh.write(b"\xee" * 16)  # written during another boot
        rec = MessageIndex(tmp_path / "crashed", slots_per_file=32, entries_per_file=4096)
        if boot == "same":
            assert f"unlinked {later} later ones" in caplog.text and later == 120
        else:
            assert "rebuilding its slots" in caplog.text
        rec.close()
        assert _table_bytes(tmp_path / "crashed") == at_checkpoint
    finally:
        cl.close()


def test_periodic_flush_checkpoints_on_its_thread(tmp_path: Path) -> None:
    """The periodic flush runs off the caller's thread; once it is done the checkpoint
    vouches for what was indexed before it started, and a crash keeps exactly that."""
    import threading
    import time

    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        where = _fill(cl, 200)
        idx = MessageIndex(tmp_path / "idx", slots_per_file=32, entries_per_file=4096,
                           flush_interval_s=0)
        idx.advance(cl, cl.max_offset)  # due at once: handed to the flush thread
        checkpoint = idx.indexed_offset
        deadline = time.monotonic() + 30
        while idx._flushing and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not idx._flushing
        assert any(t.name.startswith("message-index-flush") for t in threading.enumerate())
        idx.flush_interval_s = 3600
        _fill(cl, 50, start=200)
        idx.advance(cl, cl.max_offset)  # not checkpointed
        shutil.copytree(tmp_path / "idx", tmp_path / "crashed")
        idx.close()
        rec = MessageIndex(tmp_path / "crashed", slots_per_file=32, entries_per_file=4096)
        assert rec.indexed_offset == checkpoint
        assert set(where["A#k3"]) <= set(_found(rec, "A", "k3"))
        rec.close()
    finally:
        cl.close()


async def _query(c: RemotingClient, topic: str, key: str, unique: bool = False) -> RemotingCommand:
    ext = {"topic": topic, "key": key, "maxNum": 32, "beginTimestamp": 0,
           "endTimestamp": 2**63 - 1}
    if unique:
        ext["_UNIQUE_KEY_QUERY"] = "true"
    return await c.request(RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext))


def test_lookup_by_key_and_id_over_the_wire_and_after_restart(tmp_path: Path, caplog) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "orders", 2)
            async with Producer(env.namesrv) as p:
                sent = [await p.send("orders", Message(b"order %d" % i, keys=f"order-{i % 3} cust-{i}"))
                        for i in range(12)]
                other = await p.send("other", Message(b"x", keys="order-0"))

            async def check(addr: str) -> None:
                async with RemotingClient(addr) as c:
                    resp = await _query(c, "orders", "order-0")
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                    got = decode_records(resp.body)
                    want = [s.msg_id for s in sent[::3]]
                    assert sorted(m.msg_id for m in got) == sorted(want)
                    assert other.msg_id not in {m.msg_id for m in got}  # topic must match
                    assert int(resp.ext_fields["indexLastUpdatePhyoffset"]) > 0
                    one = await _query(c, "orders", "cust-7")
                    assert [m.body for m in decode_records(one.body)] == [b"order 7"]
                    uniq = await _query(c, "orders", sent[5].msg_id, unique=True)
                    assert [m.msg_id for m in decode_records(uniq.body)] == [sent[5].msg_id]
                    miss = await _query(c, "orders", "no-such-key")
                    assert miss.code == ResponseCode.QUERY_NOT_FOUND
                    # The offset form of a message id: store host + commit offset.
                    _, offset = parse_offset_msg_id(sent[4].offset_msg_id)
                    view = await c.request(RemotingCommand.request(
                        RequestCode.VIEW_MESSAGE_BY_ID, {"topic": "orders", "offset": offset}))
                    assert [m.msg_id for m in decode_records(view.body)] == [sent[4].msg_id]

            await check(b.address)
            # Restart on the same store: the index is reopened, not rebuilt.
            store = b.store
            await b.stop()
            env.brokers.remove(b)
            again = LocalBroker(tmp_path, "broker-a", env.namesrv)
            again.store = store
            env.brokers.append(again)
            await again.start()
            assert again.svc is not None
            await check(again.address)
            # A crash: the service is never closed, so its index files keep the unclean
            # flag; the next start keeps what the checkpoint vouches for and rescans the rest.
            assert again.server is not None and again.log is not None
            await again.server.stop()
            again.log.close()
            crashed, again.svc = again.svc, None  # never closed: as after a SIGKILL
            env.brokers.remove(again)
            third = LocalBroker(tmp_path, "broker-a", env.namesrv)
            third.store = store
            env.brokers.append(third)
            with caplog.at_level("WARNING", logger="rmqha.store.message_index"):
                await third.start()
            assert "was not closed cleanly" in caplog.text
            await check(third.address)
            assert crashed is not None and not crashed.ctx.closed

    run(main())


def test_python_client_and_cli_lookups(tmp_path: Path, capsys) -> None:
    import asyncio
    import json

    from rmqha.cli import main as cli_main
    from rmqha.client import MessageQuery

    async def main() -> None:
        async with Env(tmp_path) as env:
            a = await env.broker("broker-a")
            b = await env.broker("broker-b")
            for br in (a, b):
                await create_topic(br.address, "pay", 2)
            async with Producer(env.namesrv) as p:
                sent = [await p.send("pay", Message(b"p%d" % i, keys=f"bill-{i % 2}"))
                        for i in range(8)]
            groups = {s.queue.broker_name for s in sent}
            async with MessageQuery(env.namesrv) as q:
                got = await q.by_key("pay", "bill-1")
                assert sorted(m.msg_id for m in got) == sorted(s.msg_id for s in sent[1::2])
                assert {m.store_host for m in got} <= {a.address, b.address}
                assert len(groups) == 2 or got  # both groups asked when both hold some
                uniq = await q.by_unique_key("pay", sent[3].msg_id)
                assert [m.body for m in uniq] == [b"p3"]
                by_offset = await q.by_id(sent[6].offset_msg_id)
                assert [m.msg_id for m in by_offset] == [sent[6].msg_id]
                assert [m.msg_id for m in await q.by_id(sent[2].msg_id, "pay")] == [sent[2].msg_id]
                assert await q.by_key("pay", "nobody") == []
            capsys.readouterr()
            code = await asyncio.to_thread(cli_main, ["queryMsgByKey", "-n", env.namesrv, "-t", "pay",
                                                      "-k", "bill-0", "--json"])
            out = json.loads(capsys.readouterr().out)
            assert code == 0 and sorted(m["msgId"] for m in out) == sorted(s.msg_id for s in sent[::2])
            code = await asyncio.to_thread(cli_main, ["query-msg-by-id", "-n", env.namesrv, "-t", "pay",
                                                      "-i", f"{sent[5].msg_id},{sent[4].offset_msg_id}"])
            text = capsys.readouterr().out
            assert code == 0 and "Message Body:        p5" in text and "Message Body:        p4" in text
            code = await asyncio.to_thread(cli_main, ["queryMsgByUniqueKey", "-n", env.namesrv, "-t",
                                                      "pay", "-i", "00" * 16])
            assert code == 1 and "no message with id" in capsys.readouterr().out

    run(main())


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 256 KiB tmpfs for the index (the log stays on the normal disk)."""
    with tmpfs(tmp_path / "fs", "256k") as path:
        yield path


def test_a_full_disk_stops_the_index_cleanly_and_it_catches_up(tmp_path: Path, small_fs: Path,
                                                              caplog) -> None:
    """Entry blocks are allocated before they are written: a full filesystem stops the
    index where it is (logged, no SIGBUS), and it catches up once there is room."""
    cl = CommitLog(tmp_path / "log", segment_bytes=SEG, prefault=False)
    try:
        where = _fill(cl, 8000)  # 24k entries = 576 KiB, over the filesystem's 256 KiB
        idx = MessageIndex(small_fs / "idx", slots_per_file=1024, entries_per_file=40_000)
        with caplog.at_level("ERROR", logger="rmqha.store.message_index"):
            idx.advance(cl, cl.max_offset)
        assert "message index stopped" in caplog.text
        stuck = idx.indexed_offset
        assert 0 < stuck < cl.max_offset
        grow(small_fs, "4m")
        idx.advance(cl, cl.max_offset)
        assert idx.indexed_offset == cl.max_offset
        for key in ("A#k3", "B#u7998", "A#u1"):
            topic, k = key.split("#")
            assert set(where[key]) <= set(_found(idx, topic, k)), key
        idx.close()
    finally:
        cl.close()
