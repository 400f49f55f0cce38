"""The producer's per-message path against a real broker: batches travel uncompressed by
default (RocketMQ's clients never compress a batch), ``compress_batches`` still works, and
BlockingProducer sends from several threads at once and from inside a running loop, and
answers transaction check-backs while its caller does nothing.  Also, built locally: a
batch's entries and ids, and the client package's imports (one way, protocol and net
below it)."""
from __future__ import annotations

import ast
import asyncio
import re
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

import rmqha.client
from cluster import Cluster
from rmqha.client import BlockingConsumer, BlockingProducer, LocalTransactionState, Message, Producer
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import decode
from rmqha.errors import ClientError
from rmqha.protocol.message import (
    SysFlag,
    decode_batch,
    encode_batch_entries,
    encode_properties,
    new_uniq_key,
    new_uniq_keys,
)


@pytest.fixture(scope="module")
def one_broker(tmp_path_factory: pytest.TempPathFactory):
    with Cluster(tmp_path_factory.mktemp("producer-paths")) as c:
        c.start_controllers(1)
        c.start_namesrv()
        # Quick transaction check-backs for the BlockingProducer transaction test.
        c.start_group("broker-a", 1, transaction_timeout_ms=300, transaction_check_interval_ms=300)
        c.wait_for(lambda: c.route("TBW102") is not None, what="TBW102 route")
        yield c


def _sent_sys_flags(producer: Producer) -> list[int]:
    """Wrap the sender so every SEND_BATCH_MESSAGE's sysFlag is recorded as its frame is
    made (every attempt's frame is made there, whichever way it then goes; the request
    still goes to the real broker)."""
    flags: list[int] = []
    real = producer.sender.frame

    def spy(req: Any, mq: Any, opaque: int) -> bytes | None:
        frame = real(req, mq, opaque)
        assert frame is not None
        cmd = decode(frame)
        if cmd.code == RequestCode.SEND_BATCH_MESSAGE:
            flags.append(int(cmd.ext_fields["f"]))
        return frame

    producer.sender.frame = spy  # type: ignore[method-assign]
    return flags


def test_batches_are_not_compressed_unless_asked(one_broker: Cluster) -> None:
    bodies = [bytes([65 + i % 26]) * 1024 for i in range(32)]  # 32 KiB, very compressible

    async def main() -> tuple[list[int], list[int]]:
        async with Producer(one_broker.namesrv_addresses) as plain, \
                Producer(one_broker.namesrv_addresses, compress_batches=True) as packed:
            plain_flags, packed_flags = _sent_sys_flags(plain), _sent_sys_flags(packed)
            a = await plain.send_batch("Batches", bodies)
            b = await packed.send_batch("Batches", bodies)
            assert all(r.ok for r in a + b)
            return plain_flags, packed_flags

    plain_flags, packed_flags = asyncio.run(main())
    assert plain_flags and not any(f & SysFlag.COMPRESSED for f in plain_flags)
    assert packed_flags and all(f & SysFlag.COMPRESSED for f in packed_flags)
    # Both batches read back whole (the compressed one was inflated by the broker).
    with BlockingConsumer(one_broker.namesrv_addresses, "batch-readers", "Batches") as c:
        got: list[bytes] = []
        deadline = 60
        while len(got) < 64 and deadline > 0:
            got += [m.body for m in c.poll(timeout=1.0)]
            deadline -= 1
    assert sorted(got) == sorted(bodies * 2)


def test_blocking_producer_from_many_threads_and_inside_a_loop(one_broker: Cluster) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []
    with BlockingProducer(one_broker.namesrv_addresses) as p:
        def sender(n: int) -> None:
            try:
                for i in range(n):
                    r = p.send("Threads", b"t%d" % i)
                    assert r.ok, r.status
                    ids.append(r.msg_id)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=sender, args=(25,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(set(ids)) == 100
        # Those four threads ended: the next new thread frees their loops and connections.
        t = threading.Thread(target=sender, args=(1,))
        t.start()
        t.join(60)
        assert not errors, errors
        assert len(p._loop._all) <= 2  # the new thread's (and the main thread's, if any)

        async def inside_a_loop() -> str:
            # A thread that runs a loop cannot block in it: the send goes through a
            # shared loop thread instead of failing.
            return p.send("Threads", b"from a coroutine").msg_id

        ids.append(asyncio.run(inside_a_loop()))
        ids += [r.msg_id for r in p.send_batch("Threads", [b"x", b"y"])]
    assert len(set(ids)) == 104
    with pytest.raises(ClientError, match="closed"):
        p.send("Threads", b"after close")


def test_blocking_producer_answers_check_backs_between_calls(one_broker: Cluster) -> None:
    """A transaction left UNKNOW is settled by the broker's check-back, which must be
    answered while the application sends nothing (the per-thread loops do not run then:
    transactions go through the producer's own loop thread)."""
    checked: list[bytes] = []

    def check(msg: Any) -> LocalTransactionState:
        checked.append(msg.body)
        return LocalTransactionState.COMMIT_MESSAGE

    with BlockingProducer(one_broker.namesrv_addresses, "PG_BLOCKING_TXN") as p:
        assert p.send("TxnBlocking", b"plain").ok  # a per-thread send first
        p.set_transaction_check_listener(check)
        r = p.send_transaction("TxnBlocking", b"decided later",
                               lambda m, a: LocalTransactionState.UNKNOW)
        assert r.state is LocalTransactionState.UNKNOW
        one_broker.wait_for(lambda: checked, 30, what="the check-back")
        assert p.send("TxnBlocking", b"after").ok
    with BlockingConsumer(one_broker.namesrv_addresses, "txn-readers", "TxnBlocking") as c:
        got: list[bytes] = []
        deadline = 60
        while len(got) < 3 and deadline > 0:
            got += [m.body for m in c.poll(timeout=1.0)]
            deadline -= 1
    assert sorted(got) == [b"after", b"decided later", b"plain"]


def test_auto_batch_sends_concurrent_calls_as_batches(one_broker: Cluster) -> None:
    """256 concurrent sends with auto_batch travel as a few SEND_BATCH requests; every
    caller gets its own result (id, queue offset) and every message reads back with its
    tags, keys and properties; a delayed send and a lone send go as single sends."""
    from rmqha.client import Message

    async def main():
        async with Producer(one_broker.namesrv_addresses, auto_batch=True) as p:
            batch_flags = _sent_sys_flags(p)
            msgs = [Message(b"auto-%d" % i, tags=f"t{i % 3}", keys=f"k{i}",
                            properties={"n": str(i)}) for i in range(256)]
            results = await asyncio.gather(*(p.send("AutoBatch", m) for m in msgs))
            acc = p.accumulator
            assert acc is not None and acc.messages == 256
            batched = (acc.batches, len(batch_flags))
            alone = await p.send("AutoBatch", b"alone")
            after_alone = (acc.batches, acc.messages, len(batch_flags))
            delayed = await p.send("AutoBatch", Message(b"later", properties={"DELAY": "1"}))
            return results, batched, alone, after_alone, delayed, acc.batches

    results, (batches, batch_requests), alone, after_alone, delayed, final = asyncio.run(main())
    assert all(r.ok for r in results) and alone.ok and delayed.ok
    assert batches < 64 and batch_requests >= 1  # coalesced, not one request per send
    assert after_alone == (batches + 1, 257, batch_requests)  # alone: a plain single send
    assert final == batches + 1  # the delayed send bypassed the accumulator
    by_queue: dict[tuple[str, int], list[int]] = {}
    for r in results:
        by_queue.setdefault((r.queue.broker_name, r.queue.queue_id), []).append(r.queue_offset)
    for offsets in by_queue.values():
        assert len(set(offsets)) == len(offsets)  # each message its own queue offset
    assert len({r.msg_id for r in results}) == 256
    with BlockingConsumer(one_broker.namesrv_addresses, "auto-readers", "AutoBatch") as c:
        got: dict[bytes, Any] = {}
        for _ in range(60):
            for m in c.poll(timeout=1.0):
                got[m.body] = m
            if len(got) >= 257:
                break
    for i, r in enumerate(results):
        m = got[b"auto-%d" % i]
        assert (m.properties["TAGS"], m.properties["KEYS"], m.properties["n"]) == (
            f"t{i % 3}", f"k{i}", str(i))
        assert (m.msg_id, m.queue_id, m.queue_offset) == (r.msg_id, r.queue.queue_id,
                                                          r.queue_offset)


def test_auto_batch_failure_reaches_every_caller(one_broker: Cluster) -> None:
    from rmqha.errors import SendError

    async def main() -> list[BaseException | Any]:
        async with Producer(one_broker.namesrv_addresses, auto_batch=True, max_attempts=1) as p:
            # An internal topic: the broker refuses the whole batch, no retry can help.
            return await asyncio.gather(*(p.send("RMQ_SYS_TRANS_HALF_TOPIC", b"x%d" % i)
                                          for i in range(20)), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert len(outcomes) == 20 and all(isinstance(o, SendError) for o in outcomes)


def test_batch_entry_shortcut_writes_what_the_general_path_writes() -> None:
    """A message with no properties of its own skips building and sorting a property map;
    its entry, id and chunk size are what the general path makes of it."""
    build = Producer("127.0.0.1:9", "g").sender.requests  # never connects
    msgs = [Message(b"a"), Message(b"b" * 300, flag=7), Message(b"")]
    for msg, uid in zip(msgs, new_uniq_keys(len(msgs))):
        props = build.properties(msg, uid)  # the general path: a map (in key order), encoded
        general = ((msg.body, encode_properties(props), msg.flag), uid,
                   22 + len(msg.body) + 4 * sum(len(k) + len(v) + 2 for k, v in props.items()))
        assert build.batch_entry(msg, uid) == general
    # Bodies alone and the same bodies as messages: the same request body.
    bodies = [b"one", b"", b"three" * 50]
    plain = next(build.batches("T", bodies, None))
    wrapped = next(build.batches("T", [Message(b) for b in bodies], None))
    uid_free = [(e.body, {k: v for k, v in e.properties.items() if k != "UNIQ_KEY"}, e.flag)
                for e in decode_batch(plain.body)]
    assert uid_free == [(b, {"WAIT": "true"}, 0) for b in bodies]
    assert uid_free == [(e.body, {k: v for k, v in e.properties.items() if k != "UNIQ_KEY"},
                         e.flag) for e in decode_batch(wrapped.body)]
    assert [e.properties["UNIQ_KEY"] for e in decode_batch(plain.body)] == plain.uniq_keys
    # Tags, keys or properties of its own: the general path, and its own UNIQ_KEY stays.
    own = Message(b"x", tags="t", keys="k", properties={"UNIQ_KEY": "MINE", "a": "b"})
    entry, uid, _ = build.batch_entry(own, "UNUSED")
    assert uid == "MINE"
    assert decode_batch(encode_batch_entries([entry]))[0].properties == {
        "UNIQ_KEY": "MINE", "a": "b", "TAGS": "t", "KEYS": "k", "WAIT": "true"}


def test_batch_entries_layout() -> None:
    """RocketMQ's batch body, written out by hand: TOTALSIZE MAGIC BODYCRC FLAG BODYLEN
    body PROPLEN properties, per entry."""
    entries = [(b"hello", b"UNIQ_KEY\x01K1\x02", 3), (b"", b"", 0)]
    expected = b"".join(
        struct.pack(">iiiii", 22 + len(body) + len(props), 0, 0, flag, len(body)) + body
        + struct.pack(">h", len(props)) + props for body, props, flag in entries)
    assert encode_batch_entries(entries) == expected


def test_uniq_keys_of_a_batch_are_distinct_ids_of_this_process() -> None:
    keys = new_uniq_keys(1000)
    assert len(set(keys)) == 1000
    one = new_uniq_key()
    for key in keys:
        assert re.fullmatch(r"[0-9A-F]{32}", key)
        assert key[:20] == one[:20]  # ip, pid and the per-process random part


def test_single_request_shortcut_writes_what_the_general_path_writes() -> None:
    """A single send with no properties of its own takes the same shortcut as a batch
    entry; its header is what the general path makes for the same id."""
    build = Producer("127.0.0.1:9", "g").sender.requests
    for msg in (Message(b"body"), Message(b"flagged", flag=5)):
        fast = build.single("T", msg, 3)
        uid = fast.uniq_keys[0]
        general = build.message("T", msg, build.properties(msg, uid), 3)
        assert re.fullmatch(r"[0-9A-F]{32}", uid)
        assert {**fast.header, "g": ""} == {**general.header, "g": ""}  # "g": born time
        assert (fast.body, fast.uniq_keys, fast.code, fast.queue_id) == (
            general.body, general.uniq_keys, general.code, general.queue_id)
    # Delayed or carrying tags: the general path (the delay is a property).
    delayed = build.single("T", Message(b"x"), None, delay_level=2)
    assert "DELAY\x012\x02" in delayed.header["i"]


def test_auto_batch_requests_are_what_send_and_send_batch_make() -> None:
    """The accumulator builds each entry when the message is sent (plain ones from the
    template): a held batch is the SEND_BATCH_MESSAGE send_batch makes of the same
    messages and ids, and a message alone in its turn is the single send's request."""
    p = Producer("127.0.0.1:9", "g", auto_batch=True)  # never connects
    sent: list[Any] = []

    async def capture(req: Any) -> list[Any]:
        sent.append(req)
        raise ClientError("captured, not sent")

    p.sender.send = capture  # type: ignore[method-assign]
    msgs = [Message(b"plain"), Message(b"flagged", flag=5), b"a body alone",
            Message(b"own", tags="t", keys="k", properties={"UNIQ_KEY": "MINE", "a": "b"})]

    async def main() -> None:
        await asyncio.gather(*(p.send("T", m) for m in msgs), return_exceptions=True)
        await asyncio.gather(p.send("T", Message(b"alone", flag=2)), return_exceptions=True)

    asyncio.run(main())
    batch, alone = sent
    assert batch.code == RequestCode.SEND_BATCH_MESSAGE and len(batch.uniq_keys) == 4
    assert batch.uniq_keys[3] == "MINE" and len(set(batch.uniq_keys)) == 4
    as_messages = [m if isinstance(m, Message) else Message(m) for m in msgs]
    requests = p.sender.requests
    entries = [requests.batch_entry(m, uid)[0] for m, uid in zip(as_messages, batch.uniq_keys)]
    general = requests.chunk("T", entries, batch.uniq_keys, None)
    assert batch.body == general.body == encode_batch_entries(entries)
    assert {**batch.header, "g": ""} == {**general.header, "g": ""}  # "g": born time
    (uid,) = alone.uniq_keys
    single = requests.message("T", Message(b"alone", flag=2),
                              requests.properties(Message(b"alone"), uid), None)
    assert alone.code == RequestCode.SEND_MESSAGE_V2
    assert {**alone.header, "g": ""} == {**single.header, "g": ""}
    assert (alone.body, alone.uniq_keys) == (single.body, single.uniq_keys)


# --- the client package's imports ------------------------------------------------------------

#: What the client may import besides itself: the wire protocol, transports, errors, the
#: hot paths (never the broker's packages).
_CLIENT_MAY_IMPORT = ("rmqha.protocol", "rmqha.net", "rmqha.errors", "rmqha._core",
                      "rmqha.client")
#: A client module imports only modules of a lower rank: the producer's pieces run one
#: way (producer -> transaction/accumulator -> sender -> send_request), as aiokafka's
#: producer package does, and consumer-side modules do not reach into them.
_CLIENT_RANK = {
    "model": 0, "route": 1, "blocking_link": 1, "pull_buffer": 1, "idempotence": 1,
    "send_request": 2, "consumer": 2, "message_query": 2, "admin": 2,
    "sender": 3, "accumulator": 4, "transaction": 4, "producer": 5, "blocking_producer": 6,
    "__init__": 7,
}


def _import_problems(module: str, source: str) -> list[str]:
    """What client ``module`` (its source) imports that it must not."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "rmqha":
            targets = [f"rmqha.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != "rmqha":
                continue
            if not any(target == p or target.startswith(p + ".") for p in _CLIENT_MAY_IMPORT):
                problems.append(f"{module} imports {target}")
            elif len(parts) > 2 and parts[1] == "client" and (
                    _CLIENT_RANK[parts[2]] >= _CLIENT_RANK[module]):
                problems.append(f"{module} imports {target} (same or higher rank)")
    return problems


def test_client_imports_run_one_way() -> None:
    root = Path(rmqha.client.__path__[0])
    # Every module has a rank (a new one gets its place here).
    assert sorted(f.stem for f in root.glob("*.py")) == sorted(_CLIENT_RANK)
    sources = {name: (root / f"{name}.py").read_text() for name in _CLIENT_RANK}
    assert [p for name, src in sources.items() for p in _import_problems(name, src)] == []
    # Negative controls: the checker fires on the imports this layout forbids.
    bad = ("from rmqha.client.producer import Producer\n"
           "from rmqha.messaging.state import STATE_TOPIC\n"
           "import rmqha.client.accumulator\n"
           "from rmqha import config\n"
           "def lazy():\n    from rmqha.client.transaction import TransactionSupport\n")
    assert _import_problems("sender", bad) == [
        "sender imports rmqha.client.producer (same or higher rank)",
        "sender imports rmqha.messaging.state",
        "sender imports rmqha.client.accumulator (same or higher rank)",
        "sender imports rmqha.config",
        "sender imports rmqha.client.transaction (same or higher rank)",
    ]
    assert _import_problems("transaction", "from rmqha.client.accumulator import X") == [
        "transaction imports rmqha.client.accumulator (same or higher rank)"]
