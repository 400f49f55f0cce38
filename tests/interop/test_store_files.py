"""RocketMQ 5's store files and rmqha's, each opened by the other program (issue 36, part 2).

An operator who moves a broker group between RocketMQ and rmqha one broker at a time needs the
files on disk to mean the same to both: the commitlog (RocketMQ's v1 records in segment files
named by their first offset) and the epoch file (``epochFileCheckpoint``, which says which
master epoch wrote which offsets).  Both directions, with real processes:

* **RocketMQ writes, rmqha reads.**  A real RocketMQ 5.5.0 broker in controller mode (a group
  of one under the name server's embedded controller, ``benches/peers/rocketmq_cluster.py``)
  stores messages that rmqha's own client sends it.  Its store is copied after it is killed
  (SIGKILL: what a crash leaves), and rmqha's :class:`~rmqha.store.commitlog.CommitLog` opens
  the copy, running the recovery a broker runs at start: every acknowledged message is at the
  physical offset its offsetMsgId names, with its body, queue, queue offset, tags, keys,
  properties and UNIQ_KEY.  The epoch file loads into rmqha's
  :class:`~rmqha.store.epoch_map.EpochMap` equal to the broker's own answer to
  GET_BROKER_EPOCH_CACHE.
* **rmqha writes, RocketMQ reads.**  An rmqha broker (one controller, a name server, a group of
  one) stores messages; its commitlog seeds a RocketMQ broker's ``storePathRootDir``.  RocketMQ
  recovers it, checks every record while it builds its consume queues (a record it cannot
  parse would be cut by ``truncateInvalidMsg`` when it becomes master) and serves every message
  back by PULL_MESSAGE, at the queue offsets and commitlog offsets rmqha gave them.  The epoch
  file is read by RocketMQ's own ``EpochFileCache`` (``interop/store-files/ReadEpochFile.java``
  on rocketmq-store's classpath): entry for entry what rmqha wrote; from a copy with one digit
  changed it reads nothing, which shows the reader checks what it reads (the negative control).

Run by ``make test-interop``; the RocketMQ jars come from ``make peers-jars``.  A RocketMQ
name server and broker take one to two minutes to start on two busy cores.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqha.client import BlockingProducer, Message
from rmqha.client.model import SendResult
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.message import Prop, ReceivedMessage, decode_records, parse_offset_msg_id
from rmqha.store.commitlog import CommitLog
from rmqha.store.epoch_map import EpochMap
from rmqha.testing.local_cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

from peers.jvm import TEST_HEAPS, classpath  # noqa: E402
from peers.rocketmq_cluster import COMMITLOG_FILE_BYTES, GROUP, RocketmqCluster  # noqa: E402

pytestmark = pytest.mark.timeout(1200)

TOPIC = "store-files"
QUEUES = 4
N = 60
EPOCH_READER = Path(__file__).resolve().parents[2] / "interop" / "store-files" / "ReadEpochFile.java"
BROKER = f"{GROUP}-0"
#: PullSysFlag's FLAG_SUBSCRIPTION: the request carries its own subscription, so the broker
#: serves a reader that never sent a consumer heartbeat.
PULL_WITH_SUBSCRIPTION = 4


def _messages(tag: str) -> list[Message]:
    """N messages whose every field is its own: a body of growing size, tags, keys and a user
    property, so a field read from the wrong place cannot match by chance."""
    return [Message(f"{tag}-{i}-".encode() + bytes(range(256)) * (i % 5), tags=f"t{i % 3}",
                    keys=f"{tag}-key-{i}", properties={"origin": tag, "n": str(i)})
            for i in range(N)]


def _send_all(namesrv: list[str] | str, messages: list[Message]) -> list[SendResult]:
    with BlockingProducer(namesrv) as producer:
        results = [producer.send(TOPIC, m) for m in messages]
    assert all(r.ok for r in results), [r.status for r in results if not r.ok]
    return results


def _assert_same(sent: Message, result: SendResult, got: ReceivedMessage) -> None:
    assert got.topic == TOPIC
    assert got.body == sent.body
    assert (got.queue_id, got.queue_offset) == (result.queue.queue_id, result.queue_offset)
    assert got.commit_offset == parse_offset_msg_id(result.offset_msg_id)[1]
    assert got.properties.get(Prop.UNIQ_KEY) == result.msg_id
    assert (got.properties.get(Prop.TAGS), got.properties.get(Prop.KEYS)) == (sent.tags, sent.keys)
    assert {k: got.properties.get(k) for k in sent.properties} == sent.properties


def _epoch_file_in_rocketmq(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["java", "-Xmx128m", "-cp", classpath("rocketmq"), str(EPOCH_READER), str(path)],
                          capture_output=True, text=True, timeout=180)


# --- RocketMQ writes, rmqha reads -----------------------------------------------------------------


@pytest.fixture(scope="module")
def rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketmqCluster]:
    cluster = RocketmqCluster(tmp_path_factory.mktemp("rocketmq"), TEST_HEAPS, brokers=1)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.stop()


def test_a_rocketmq_store_opens_in_rmqha(rocketmq: RocketmqCluster, tmp_path: Path) -> None:
    rocketmq.create_topic(TOPIC, QUEUES)
    sent = _messages("rocketmq")
    results = _send_all(rocketmq.namesrv_address, sent)
    master = rocketmq.master()
    assert master is not None
    epochs = rocketmq.request(rocketmq.broker_address(master), RequestCode.GET_BROKER_EPOCH_CACHE)
    assert epochs.code == ResponseCode.SUCCESS, epochs.remark
    answered = [(e["epoch"], e["startOffset"]) for e in epochs.json_body()["epochList"]]
    proc = rocketmq.brokers[BROKER]
    proc.kill()
    store = rocketmq.workdir / BROKER / "store"
    copy = tmp_path / "store"
    shutil.copytree(store / "commitlog", copy / "commitlog")
    shutil.copy2(store / "epochFileCheckpoint", copy / "epochFileCheckpoint")

    log = CommitLog(copy / "commitlog", segment_bytes=COMMITLOG_FILE_BYTES, prefault=False)
    try:
        stored = {m.physical_offset: m for m in log.iter_messages() if m.topic == TOPIC}
        for message, result in zip(sent, results):
            offset = parse_offset_msg_id(result.offset_msg_id)[1]
            raw = log.read(offset, stored[offset].size)
            _assert_same(message, result, decode_records(bytes(raw))[0])
        assert len(stored) == N
    finally:
        log.close()
    epoch_map = EpochMap.load(copy / "epochFileCheckpoint")
    assert epoch_map.pairs() == answered and answered, (epoch_map.pairs(), answered)


# --- rmqha writes, RocketMQ reads -----------------------------------------------------------------


@pytest.fixture(scope="module")
def rmqha_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Message], list[SendResult]]]:
    """An rmqha broker's store after it stored N messages, and what was sent."""
    base = tmp_path_factory.mktemp("rmqha")
    with Cluster(base / "cluster") as cluster:
        cluster.start_controllers(1)
        cluster.start_namesrv()
        (broker,) = cluster.start_group("broker-a", 1, segment_bytes=COMMITLOG_FILE_BYTES)
        resp = cluster.request(broker.address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": TOPIC, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        cluster.wait_for(lambda: cluster.route(TOPIC) is not None, what=f"a route for {TOPIC}")
        sent = _messages("rmqha")
        results = _send_all(cluster.namesrv_addresses, sent)
        store = Path(broker.config["store_dir"])
        cluster.stop_all()
        seed = base / "seed"
        shutil.copytree(store / "commitlog", seed / "commitlog")
        shutil.copy2(store / "epochFileCheckpoint", seed / "epochFileCheckpoint")
    yield seed, sent, results


def _pull_queue(rocketmq: RocketmqCluster, addr: str, queue_id: int,
                ended: list[tuple[object, ...]]) -> list[ReceivedMessage]:
    """Every message of one queue from offset 0, by PULL_MESSAGE until the broker has no more."""
    got: list[ReceivedMessage] = []
    offset = 0
    while True:
        resp = rocketmq.request(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "store-files-reader", "topic": TOPIC, "queueId": queue_id,
            "queueOffset": offset, "maxMsgNums": 32, "sysFlag": PULL_WITH_SUBSCRIPTION, "commitOffset": 0,
            "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0, "expressionType": "TAG"})
        if resp.code != ResponseCode.SUCCESS:
            ended.append((queue_id, offset, resp.code, resp.remark, dict(resp.ext_fields)))
            return got
        batch = decode_records(resp.body)
        got += batch
        offset = batch[-1].queue_offset + 1


def test_an_rmqha_store_opens_in_rocketmq(rmqha_store: tuple[Path, list[Message], list[SendResult]],
                                          tmp_path: Path) -> None:
    seed, sent, results = rmqha_store
    cluster = RocketmqCluster(tmp_path / "rocketmq", TEST_HEAPS, brokers=1, seed_stores={BROKER: seed})
    try:
        cluster.start()
        cluster.create_topic(TOPIC, QUEUES)
        master = cluster.master()
        assert master is not None
        addr = cluster.broker_address(master)
        ended: list[tuple[object, ...]] = []
        got = {m.commit_offset: m for q in range(QUEUES) for m in _pull_queue(cluster, addr, q, ended)}
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.stop()
    missing = [r.offset_msg_id for r in results if parse_offset_msg_id(r.offset_msg_id)[1] not in got]
    assert not missing, (f"{len(missing)} of {N} not served back", sorted(got)[:8], ended)
    for message, result in zip(sent, results):
        _assert_same(message, result, got[parse_offset_msg_id(result.offset_msg_id)[1]])
    assert len(got) == N


def test_an_rmqha_epoch_file_loads_in_rocketmqs_reader(rmqha_store: tuple[Path, list[Message], list[SendResult]],
                                                        tmp_path: Path) -> None:
    seed, _, _ = rmqha_store
    written = EpochMap.load(seed / "epochFileCheckpoint")
    assert written.pairs(), "the rmqha broker wrote no epoch"
    read = _epoch_file_in_rocketmq(seed / "epochFileCheckpoint")
    assert read.returncode == 0, read.stderr[-2000:]
    entries = [tuple(int(x) for x in line.split()) for line in read.stdout.splitlines() if line.strip()]
    assert [(e, start) for e, start, _ in entries] == written.pairs()
    # Negative control: one digit of an entry changed, the checksum no longer matches, and
    # RocketMQ's reader takes nothing from the file (CheckpointFile falls back to the missing
    # .bak: no entries), so the equality above could not have come from a reader that ignores
    # what rmqha wrote in the header (entry count and CRC32 of the entry lines).
    bad = tmp_path / "epochFileCheckpoint"
    lines = (seed / "epochFileCheckpoint").read_text().splitlines()
    epoch, _, start = lines[2].partition("-")
    lines[2] = f"{epoch}-{int(start) + 1}"
    bad.write_text("\n".join(lines) + "\n")
    refused = _epoch_file_in_rocketmq(bad)
    assert refused.returncode == 0 and not refused.stdout.strip(), (refused.stdout, refused.stderr[-2000:])
